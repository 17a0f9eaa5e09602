"""Money cost of tokens from a price table per model (as Inspect keeps one): ``evolution/prices.json`` by
default, or the JSON file ``RSI_PRICE_TABLE`` names, each row with its source. Pure reads, no database."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

DEFAULT_TABLE = Path(__file__).resolve().parent / "prices.json"


@dataclass(frozen=True)
class Price:
    model: str
    input_per_mtok: float  # US dollars per million prompt tokens
    output_per_mtok: float  # US dollars per million completion tokens
    source: str
    as_of: str


@dataclass(frozen=True)
class Cost:
    usd: float
    price: Price


@lru_cache(maxsize=4)
def _table(path: str) -> dict[str, Price]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {
        name: Price(
            model=name,
            input_per_mtok=float(row["input_per_mtok"]),
            output_per_mtok=float(row["output_per_mtok"]),
            source=str(row.get("source", "")),
            as_of=str(row.get("as_of", "")),
        )
        for name, row in data.get("models", {}).items()
    }


def price_table() -> dict[str, Price]:
    """The table in use (read once per path)."""
    return _table(str(getattr(settings, "RSI_PRICE_TABLE", "") or DEFAULT_TABLE))


def token_cost(*, model: str, prompt_tokens: int | None, completion_tokens: int | None) -> Cost | None:
    """What the tokens cost at the model's listed prices, or None when the table has no price for the model or
    there are no token counts."""
    price = price_table().get(model)
    if price is None or (prompt_tokens is None and completion_tokens is None):
        return None
    usd = ((prompt_tokens or 0) * price.input_per_mtok + (completion_tokens or 0) * price.output_per_mtok) / 1e6
    return Cost(usd=usd, price=price)
