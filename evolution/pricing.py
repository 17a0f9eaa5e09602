"""Money cost of tokens from a price table per model (as Inspect keeps one): ``evolution/prices.json`` by
default, or the JSON file ``RSI_PRICE_TABLE`` names, each row with its source. Pure reads, no database."""

from __future__ import annotations

import json
from collections.abc import Iterable
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


@dataclass(frozen=True)
class ModelTokens:
    """Prompt and completion tokens summed over ``steps`` steps that named ``model`` ("" when they named none)."""

    model: str
    prompt: int
    completion: int
    steps: int


@dataclass(frozen=True)
class Money:
    """Tokens of many steps at their models' list prices: ``usd`` sums what could be priced (None when nothing
    could), over ``priced_steps`` steps; ``unpriced`` says, one line each, which tokens are left out and why."""

    usd: float | None
    priced_steps: int
    unpriced: tuple[str, ...]


def tokens_money(rows: Iterable[ModelTokens]) -> Money:
    """The money cost of token sums per model, each at its model's price; what has no price (no model named, or
    no price for the model in the table) is left out and said. Pure."""
    usd: float | None = None
    priced_steps = 0
    unpriced = []
    for row in rows:
        tokens = f"{row.prompt + row.completion:,} tokens of {row.steps:,} step{'s' if row.steps != 1 else ''}"
        if not row.model:
            unpriced.append(f"{tokens} name no model: no price")
            continue
        cost = token_cost(model=row.model, prompt_tokens=row.prompt, completion_tokens=row.completion)
        if cost is None:
            unpriced.append(f"no price for {row.model} in the price table: {tokens} left out")
            continue
        usd = (usd or 0.0) + cost.usd
        priced_steps += row.steps
    if usd is None and not unpriced:
        unpriced.append("no step reports its tokens: no money cost")
    return Money(usd=usd, priced_steps=priced_steps, unpriced=tuple(unpriced))
