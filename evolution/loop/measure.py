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

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "ERROR",
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
