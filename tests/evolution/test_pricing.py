from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evolution.pricing import price_table, token_cost


def test_the_bundled_table_names_a_source_for_every_price() -> None:
    table = price_table()
    assert table and all(price.source.startswith("https://") and price.as_of for price in table.values())


def test_token_cost_uses_the_models_prices_per_million_tokens(settings: Any, tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"models": {"m": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "source": "s"}}}))
    settings.RSI_PRICE_TABLE = str(path)
    cost = token_cost(model="m", prompt_tokens=1_500, completion_tokens=250)
    assert cost is not None and cost.usd == (1_500 * 2.0 + 250 * 8.0) / 1e6 and cost.price.source == "s"
    assert token_cost(model="unknown", prompt_tokens=10, completion_tokens=10) is None
    assert token_cost(model="m", prompt_tokens=None, completion_tokens=None) is None
