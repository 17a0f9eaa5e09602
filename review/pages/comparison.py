"""The comparison page: one stored ``compare_recipes`` comparison (evolution.loop.compare) as tables.

Recipes by proposer seed and split draw, each recipe's mean and 95% interval (over all its runs and per split
draw), the paired difference against the first recipe, the leaky edits judged by sealed transfer beside the
critic's flag, and how often each regularizer fired. Every number comes from the stored JSON; nothing is
recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.shortcuts import get_object_or_404

from evolution.models import Experiment, RecipeComparison
from review.pages import Page

SCORE_COLUMNS = ("train", "gate", "sealed", "held_out")
COUNT_COLUMNS = ("cost", "leaky_accepted", "leaky_by_transfer")
COLUMN_WORDS = {
    "train": "train",
    "gate": "gate",
    "sealed": "sealed",
    "held_out": "held-out",
    "cost": "cost (tokens/trial)",
    "leaky_accepted": "leaky (critic)",
    "leaky_by_transfer": "leaky (sealed transfer)",
}
RULE_WORDS = {
    "edit_budget": "edit budget (A): candidates over the round's budget",
    "ledger_refusals": "ledger (B): refuted hypotheses shown to the proposer",
    "stall_exploration": "stall exploration (C): rounds proposed while stalled",
    "critic": "critic (D): candidates flagged",
    "noise_band": "noise band (E/F): decisions inside the band",
    "floor": "floor (E): candidates below S_best - delta",
    "cost_admissibility": "cost admissibility (F): cost rise too high",
    "novelty_bonus": "novelty bonus (F): a new structural kind counted",
    "guards": "guards (F): valid output or submissions fell",
    "pruning": "pruning (G): rounds that advised a deletion",
}


@dataclass(frozen=True)
class Row:
    label: str
    seed: int | None
    draw: int | None
    run: int | None
    status: str
    cells: tuple[str, ...]
    kind: str = "run"  # run, start, mean, interval, paired
    experiment: int | None = None  # the run's twin


@dataclass(frozen=True)
class RecipeBlock:
    name: str
    rows: tuple[Row, ...]


@dataclass(frozen=True)
class EditRow:
    recipe: str
    seed: int
    draw: int
    candidate: int
    parent: int
    evolve_gain: str
    sealed_gain: str
    critic_flagged: bool
    leaky: bool


@dataclass(frozen=True)
class RuleRow:
    rule: str
    words: str
    cells: tuple[str, ...]


@dataclass(frozen=True)
class ComparisonPage(Page):
    comparison: RecipeComparison
    experiment: Experiment
    params: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]
    column_words: tuple[str, ...]
    reference: str
    starts: tuple[Row, ...]
    blocks: tuple[RecipeBlock, ...]
    recipes: tuple[str, ...]
    rules: tuple[RuleRow, ...]
    edits: tuple[EditRow, ...]


def _cell(column: str, value: Any, *, signed: bool = False) -> str:
    if value is None:
        return "–"
    if column in COUNT_COLUMNS:
        return f"{value:+.0f}" if signed else f"{value:.0f}"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def _interval(column: str, summary: Mapping[str, Any], *, signed: bool = False) -> str:
    low, high = summary.get("low"), summary.get("high")
    if low is None or high is None:
        return "–"
    return f"[{_cell(column, low, signed=signed)}, {_cell(column, high, signed=signed)}]"


def _summary_rows(
    label: str, summary: Mapping[str, Mapping[str, Any]], columns: Sequence[str], *, signed: bool = False
) -> list[Row]:
    mean = tuple(_cell(c, summary[c]["mean"], signed=signed) for c in columns)
    interval = tuple(_interval(c, summary[c], signed=signed) for c in columns)
    kind = "paired" if signed else "mean"
    return [
        Row(label, None, None, None, "", mean, kind),
        Row("95% interval", None, None, None, "", interval, "interval"),
    ]


def comparison_page(*, pk: int) -> ComparisonPage:
    """The page of comparison ``pk`` (404 when there is none)."""
    comparison = get_object_or_404(RecipeComparison.objects.select_related("experiment"), pk=pk)
    result: dict[str, Any] = comparison.result or {}
    recipes = tuple(result.get("recipes", {}))
    runs = [r for name in recipes for r in result["recipes"][name]["runs"]]
    has_held_out = any(r.get("held_out") is not None for r in runs)
    columns = tuple(c for c in (*SCORE_COLUMNS, *COUNT_COLUMNS) if c != "held_out" or has_held_out)
    reference = str(result.get("reference", recipes[0] if recipes else ""))
    draws = sorted(int(d) for d in result.get("starts", {}))
    starts = tuple(
        Row(
            "start (seed harness)",
            None,
            d,
            None,
            "",
            tuple(_cell(c, result["starts"][str(d)].get(c)) for c in columns),
            "start",
        )
        for d in draws
    )
    blocks = []
    edits = []
    for name in recipes:
        data = result["recipes"][name]
        rows = [
            Row(
                name,
                r["seed"],
                r.get("split_draw", 0),
                r["run"],
                r["status"],
                tuple(_cell(c, r.get(c)) for c in columns),
                experiment=r["experiment"],
            )
            for r in data["runs"]
        ]
        rows += _summary_rows("mean", data["summary"], columns)
        if len(draws) > 1:
            for d in draws:
                rows += _summary_rows(f"mean, split draw {d}", data["by_draw"][str(d)], columns)
        if data.get("paired"):
            rows += _summary_rows(f"paired: {name} − {reference}", data["paired"], columns, signed=True)
        blocks.append(RecipeBlock(name, tuple(rows)))
        edits += [
            EditRow(
                recipe=name,
                seed=r["seed"],
                draw=r.get("split_draw", 0),
                candidate=e["candidate"],
                parent=e["parent"],
                evolve_gain=_cell("train", e["evolve_gain"], signed=True),
                sealed_gain=_cell("sealed", e["sealed_gain"], signed=True),
                critic_flagged=bool(e["critic_flagged"]),
                leaky=bool(e["leaky"]),
            )
            for r in data["runs"]
            for e in r.get("edits", [])
        ]
    rules = tuple(
        RuleRow(
            rule,
            words,
            tuple(
                f"{f['total']:.0f} in {f['runs']:.0f} run{'s' if f['runs'] != 1 else ''}"
                if (f := result["recipes"][name].get("rules", {}).get(rule))
                else "–"
                for name in recipes
            ),
        )
        for rule, words in RULE_WORDS.items()
    )
    params = tuple(
        (key.replace("_", " "), "default" if value is None else str(value)) for key, value in comparison.params.items()
    )
    return ComparisonPage(
        comparison=comparison,
        experiment=comparison.experiment,
        params=params,
        columns=columns,
        column_words=tuple(COLUMN_WORDS[c] for c in columns),
        reference=reference,
        starts=starts,
        blocks=tuple(blocks),
        recipes=recipes,
        rules=rules if recipes else (),
        edits=tuple(edits),
    )
