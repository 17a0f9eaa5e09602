"""The measurement of a harness: the only place S, cost and valid rate are computed.

Pure: the loop, the screens and the API load trial rows or per-split totals and hand them here.

- **S** (``score``) honours the recipe's ``score_metric``: ``pass_at_1`` is the share of trials that passed;
  ``mean_score`` is the mean rubric score, an error trial counting 0 (an error is an infrastructure failure,
  never a score: its stored score is ignored whatever it is).
- **C** (``cost``) is mean policy tokens per trial, over the trials that reported tokens; None when none did.
- **valid rate** and **no-submission rate** are shares of all trials.

Totals are what the database can sum (``Totals``), so a query that groups thousands of candidates and this
module agree to the last bit; ``score_sql`` writes the same formula for a query that ranks in the database.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "ERROR",
    "MIN_PAIRS",
    "DeltaEstimate",
    "paired_delta",
    "PASS",
    "SCORE_METRICS",
    "Measurement",
    "TrialRow",
    "Totals",
    "cost",
    "measure",
    "score",
    "score_sql",
    "totals",
    "trial_value",
]

SCORE_METRICS: tuple[str, ...] = ("pass_at_1", "mean_score")
PASS = "pass"  # Trial.Outcome values (this module imports no model)
ERROR = "error"


class TrialRow(NamedTuple):
    """One trial as the measurement reads it."""

    outcome: str
    score: float | None
    tokens: int | None = None
    valid_output: bool = True
    submitted: bool = True


@dataclass(frozen=True)
class Totals:
    """Sums over a set of trials: what S, C and the rates are computed from."""

    trials: int = 0
    passed: int = 0
    score_sum: float = 0.0  # the scores of trials that are not errors
    tokens_sum: int = 0
    tokens_count: int = 0  # trials that reported tokens
    valid: int = 0
    submitted: int = 0

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.trials + other.trials,
            self.passed + other.passed,
            self.score_sum + other.score_sum,
            self.tokens_sum + other.tokens_sum,
            self.tokens_count + other.tokens_count,
            self.valid + other.valid,
            self.submitted + other.submitted,
        )


def _check_metric(metric: str) -> None:
    if metric not in SCORE_METRICS:
        raise ValueError(f"unknown score metric {metric!r}: expected one of {', '.join(SCORE_METRICS)}")


def totals(rows: Iterable[TrialRow]) -> Totals:
    """The totals of ``rows``."""
    trials = passed = tokens_sum = tokens_count = valid = submitted = 0
    score_sum = 0.0
    for row in rows:
        trials += 1
        passed += row.outcome == PASS
        if row.outcome != ERROR:
            score_sum += row.score or 0.0
        if row.tokens is not None:
            tokens_sum += row.tokens
            tokens_count += 1
        valid += bool(row.valid_output)
        submitted += bool(row.submitted)
    return Totals(trials, passed, score_sum, tokens_sum, tokens_count, valid, submitted)


def score(t: Totals, metric: str) -> float | None:
    """S of the trials summed in ``t`` under ``metric``; None when there is no trial. The one formula for S."""
    _check_metric(metric)
    if not t.trials:
        return None
    return (t.score_sum if metric == "mean_score" else t.passed) / t.trials


def trial_value(row: TrialRow, metric: str) -> float:
    """What one trial adds to S under ``metric`` (S is the mean of these): 1 or 0 for pass@1, the rubric
    score for mean_score, 0 for an error. The noise bootstrap resamples these."""
    _check_metric(metric)
    if metric == "pass_at_1":
        return float(row.outcome == PASS)
    return 0.0 if row.outcome == ERROR else float(row.score or 0.0)


def score_sql(metric: str, *, passed: str, score_sum: str, trials: str) -> str:
    """``score`` as an SQL expression over columns (or expressions) holding the totals, for a query that
    ranks or samples candidates in the database. The columns are the caller's; they must be double
    precision (or cast to it) so the division is not an integer division."""
    _check_metric(metric)
    return f"({score_sum if metric == 'mean_score' else passed}) / ({trials})"


def cost(t: Totals) -> float | None:
    """C: mean policy tokens per trial over the trials that reported tokens; None when none did."""
    return t.tokens_sum / t.tokens_count if t.tokens_count else None


@dataclass(frozen=True)
class Measurement:
    """S, C and the rates of one harness on a set of trials."""

    score: float
    cost: float | None
    valid_rate: float
    no_submission_rate: float
    trials: int


def measure(t: Totals, metric: str) -> Measurement | None:
    """The measurement of the trials summed in ``t``; None when there is no trial."""
    s = score(t, metric)
    if s is None:
        return None
    return Measurement(
        score=s,
        cost=cost(t),
        valid_rate=t.valid / t.trials,
        no_submission_rate=(t.trials - t.submitted) / t.trials,
        trials=t.trials,
    )


# --- dS and its interval ----------------------------------------------------------------------

MIN_PAIRS = 5  # fewer tasks measured on both sides give "not enough data", never an interval


@dataclass(frozen=True)
class DeltaEstimate:
    """dS = S(new) - S(base) in one metric over all their trials (the number the gate computes), with a paired
    bootstrap interval of that same quantity over the tasks both were measured on (``pairs``). ``low`` and
    ``high`` are None when there are fewer than ``MIN_PAIRS`` pairs: not enough data for an interval."""

    delta: float
    low: float | None
    high: float | None
    pairs: int
    metric: str
    confidence: float

    @property
    def enough(self) -> bool:
        return self.low is not None


def _quantile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (position - below)


def _bootstrap(base: list[list[float]], new: list[list[float]], *, seed: int, resamples: int) -> list[float]:
    """The ``resamples`` differences S(new) - S(base) of the paired bootstrap, each side's tasks given as their
    trial values (``trial_value``), paired by position.

    It draws the same numbers in the same order as drawing with ``random.Random(seed).choices`` (the tasks,
    then within each drawn task the base's trials and the new's), and sums in the same order as ``totals``, so
    it gives the bootstrap of summing ``Totals`` of drawn rows to the last bit; it only skips building rows and
    totals (``choices(population, k=n)`` is ``population[floor(random() * n)]``, n times; ``int`` is ``floor``
    for these non-negative numbers). Pure; deterministic given ``seed``.
    """
    draw = random.Random(seed).random
    tasks = len(base)
    task_range = float(tasks)
    sizes = [(len(b), float(len(b)), len(n), float(len(n))) for b, n in zip(base, new, strict=True)]
    differences = []
    for _ in range(resamples):
        base_sum = new_sum = 0.0
        base_count = new_count = 0
        for task in [int(draw() * task_range) for _ in range(tasks)]:
            base_values, new_values = base[task], new[task]
            base_size, base_range, new_size, new_range = sizes[task]
            drawn = 0.0
            for _ in range(base_size):
                drawn += base_values[int(draw() * base_range)]
            base_sum += drawn
            drawn = 0.0
            for _ in range(new_size):
                drawn += new_values[int(draw() * new_range)]
            new_sum += drawn
            base_count += base_size
            new_count += new_size
        differences.append(new_sum / new_count - base_sum / base_count)
    return differences


def paired_delta(
    base: dict[str, list[TrialRow]],
    new: dict[str, list[TrialRow]],
    metric: str,
    *,
    seed: int = 0,
    resamples: int = 2000,
    confidence: float = 0.95,
) -> DeltaEstimate | None:
    """dS of ``new`` against ``base`` (trial rows by task) and its interval; None when either has no trial.

    The interval resamples the paired tasks with replacement and, within each drawn task, each side's trials
    with replacement (the two sources of noise in S: which tasks, and each trial's luck), computes S on both
    sides as ``score`` does, and takes the percentile interval of the differences. Deterministic given
    ``seed``: the tasks are taken in sorted order.
    """
    s_base = score(totals(row for rows in base.values() for row in rows), metric)
    s_new = score(totals(row for rows in new.values() for row in rows), metric)
    if s_base is None or s_new is None:
        return None
    shared = sorted(task for task in base.keys() & new.keys() if base[task] and new[task])
    if len(shared) < MIN_PAIRS:
        return DeltaEstimate(s_new - s_base, None, None, len(shared), metric, confidence)
    differences = _bootstrap(
        [[trial_value(row, metric) for row in base[task]] for task in shared],
        [[trial_value(row, metric) for row in new[task]] for task in shared],
        seed=seed,
        resamples=resamples,
    )
    differences.sort()
    tail = (1.0 - confidence) / 2.0
    return DeltaEstimate(
        s_new - s_base,
        _quantile(differences, tail),
        _quantile(differences, 1.0 - tail),
        len(shared),
        metric,
        confidence,
    )
