"""The one reader of measurements: which trials count, and S, cost and counts of a candidate on some splits.

Every number a screen, the API, the gate or a run's report shows of a harness comes from here, so they agree:

- **What counts.** The trials of a candidate's *certified* evaluations whose purpose is in ``COUNTED_PURPOSES``
  (its baseline, candidate and transfer evaluations), on the splits asked for. The seed's noise repeats only
  estimate the noise band (their k may differ, and they would weigh the start more than a candidate); an
  evaluation that is running, cancelled, failed or external is never counted (its finished trials included).
- **How.** ``evolution.loop.measure`` computes S, cost and the rates from the totals: trial rows for the gate
  and the interval (``candidate_totals``; ``counted_trials`` under ``loop.load.comparison``), the totals
  stored at certification for screens that rank thousands of candidates (``evolution.selectors.candidate_scores``
  and its siblings filter on ``counted_evaluations`` too).

Reads only; every function is safe to call repeatedly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Exists, OuterRef, QuerySet

from evolution.loop import measure
from evolution.metrics import SplitSummary
from evolution.models import (
    EVALUATION_UNFINISHED,
    Candidate,
    Evaluation,
    LeakageFlag,
    SplitMembership,
    SplitName,
    Trial,
)

__all__ = [
    "COUNTED_PURPOSES",
    "UNFINISHED_EVALUATIONS",
    "RoundCounts",
    "round_counts",
    "candidate_cost",
    "candidate_split_summaries",
    "candidate_totals",
    "counted_evaluations",
    "counted_trials",
    "split_scores",
]

# The evaluations a harness is measured by, on every screen and in the gate (noise repeats estimate delta only).
COUNTED_PURPOSES: tuple[str, ...] = (
    Evaluation.Purpose.BASELINE,
    Evaluation.Purpose.CANDIDATE,
    Evaluation.Purpose.TRANSFER,
)
UNFINISHED_EVALUATIONS = EVALUATION_UNFINISHED  # evolution.models defines it
ROW = ("outcome", "score", "tokens", "valid_output", "submitted")


def counted_evaluations() -> QuerySet[Evaluation]:
    """The evaluations whose trials count (certified, of ``COUNTED_PURPOSES``)."""
    return Evaluation.objects.filter(state=Evaluation.State.CERTIFIED, purpose__in=COUNTED_PURPOSES)


def counted_trials(**filters: Any) -> QuerySet[Trial]:
    """The trials that count (of ``counted_evaluations``), narrowed by ``filters``."""
    return Trial.objects.filter(
        evaluation__state=Evaluation.State.CERTIFIED, evaluation__purpose__in=COUNTED_PURPOSES, **filters
    )


def candidate_totals(candidate_id: int, splits: Sequence[str]) -> measure.Totals:
    """The totals of the candidate's counted trials on ``splits``."""
    rows = counted_trials(candidate_id=candidate_id, split__in=list(splits)).values_list(*ROW)
    return measure.totals(measure.TrialRow(*row) for row in rows)


def split_scores(*, candidate_id: int, metric: str) -> dict[str, float]:
    """S per split over the candidate's counted trials, by split name (splits without a trial left out)."""
    by_split: dict[str, list[measure.TrialRow]] = {}
    for split, *row in counted_trials(candidate_id=candidate_id).values_list("split", *ROW):
        by_split.setdefault(split, []).append(measure.TrialRow(*row))
    scores = {split: measure.score(measure.totals(rows), metric) for split, rows in sorted(by_split.items())}
    return {split: value for split, value in scores.items() if value is not None}


def candidate_cost(candidate_id: int, splits: Sequence[str]) -> float | None:
    """C of the candidate over its counted trials on ``splits``; None when none reported tokens."""
    return measure.cost(candidate_totals(candidate_id, splits))


def _summary(split: str, rows: list[tuple[str, str, float | None, int | None, int | None]], total: int) -> SplitSummary:
    """One split's summary over pooled trials (tasks may have different trial counts when a harness was measured
    by more than one evaluation): the rate is S under pass@1, as ``measure.score``; the contribution is the
    split's share of passes weighed by its share of the benchmark's tasks (passes / (tasks x k) when k is
    uniform); pass@k and pass^k ask, per task, whether any or every one of its trials passed."""
    by_task: dict[str, list[str]] = {}
    for task, outcome, *_ in rows:
        by_task.setdefault(task, []).append(outcome)
    totals = measure.totals(measure.TrialRow(outcome, score, tokens) for _, outcome, score, tokens, _ in rows)
    rate = measure.score(totals, "pass_at_1") or 0.0
    steps = [s for *_, s in rows if s is not None]
    return SplitSummary(
        split=split,
        tasks=len(by_task),
        trials=len(rows),
        rate=rate,
        contribution=rate * len(by_task) / total if total else 0.0,
        pass_at_k=sum(measure.PASS in outcomes for outcomes in by_task.values()) / len(by_task),
        pass_hat_k=sum(all(o == measure.PASS for o in outcomes) for outcomes in by_task.values()) / len(by_task),
        mean_tokens=measure.cost(totals),
        mean_steps=sum(steps) / len(steps) if steps else None,
    )


def candidate_split_summaries(*, candidate_id: int, experiment_id: int) -> dict[str, SplitSummary]:
    """Per split of the candidate's counted trials: rate and contribution (labelled apart), pass@k, pass^k,
    tokens and steps; in split-name order. Contributions are against the experiment's own benchmark (held-out
    tasks against their own benchmarks), so train + gate + sealed add up to the benchmark-wide pass@1."""
    sizes: dict[str, int] = {}
    for split in SplitMembership.objects.filter(experiment_id=experiment_id).values_list("split", flat=True):
        sizes[split] = sizes.get(split, 0) + 1
    own_total = sum(n for split, n in sizes.items() if split != SplitName.HELDOUT)
    by_split: dict[str, list[tuple[str, str, float | None, int | None, int | None]]] = {}
    rows: Iterable[tuple[Any, ...]] = counted_trials(candidate_id=candidate_id).values_list(
        "split", "task__external_id", "outcome", "score", "tokens", "steps"
    )
    for split, *row in rows:
        by_split.setdefault(split, []).append(tuple(row))
    return {
        split: _summary(split, found, sizes.get(SplitName.HELDOUT, 0) if split == SplitName.HELDOUT else own_total)
        for split, found in sorted(by_split.items())
    }


@dataclass
class RoundCounts:
    """What a round proposed and what became of it, each count defined once (the loop's round summary and the
    dashboard's round in progress both count with ``round_counts``, so a round's numbers do not change when it
    finishes)."""

    proposed: int = 0
    flagged: int = 0  # a leakage flag on it, whatever a reviewer decided later
    rejected_surface: int = 0
    rejected_budget: int = 0
    evaluated: int = 0  # a certified evaluation of it
    accepted: int = 0


def round_counts(*, run_id: int, rounds: Sequence[int] | None = None) -> dict[int, RoundCounts]:
    """Per round of the run (all, or ``rounds``): its proposed candidates (the start is not proposed) and what
    became of them; one query."""
    candidates = Candidate.objects.filter(run_id=run_id).exclude(origin=Candidate.Origin.SEED)
    if rounds is not None:
        candidates = candidates.filter(round__in=list(rounds))
    rows = (
        candidates.annotate(
            is_flagged=Exists(LeakageFlag.objects.filter(candidate=OuterRef("pk"))),
            is_evaluated=Exists(counted_evaluations().filter(candidate=OuterRef("pk"))),
        )
        .values_list("round", "state", "is_flagged", "is_evaluated")
        .annotate(n=Count("pk"))
        .order_by()
    )
    found: dict[int, RoundCounts] = {}
    for round_number, state, flagged, evaluated, n in rows:
        counts = found.setdefault(round_number or 0, RoundCounts())
        counts.proposed += n
        counts.flagged += n if flagged else 0
        counts.evaluated += n if evaluated else 0
        counts.rejected_surface += n if state == Candidate.State.REJECTED_SURFACE else 0
        counts.rejected_budget += n if state == Candidate.State.REJECTED_BUDGET else 0
        counts.accepted += n if state == Candidate.State.ACCEPTED else 0
    return found
