"""Benchmark metrics over trial records (docs/concepts.md, section 2).

Pure functions and dataclasses, no ORM, so they are tested without a database
and every function is safe to call repeatedly on the same input.

Conventions shared by every function here:

- A benchmark run is a set of ``TrialRecord`` rows: each task was attempted k
  times (trial indices distinct per task) and every task was attempted the
  same number of times. Input that breaks this (two trials with the same
  ``(task, index)``, one task listed under two splits, tasks with different
  trial counts) raises ``ValueError`` rather than giving a silently skewed
  number.
- An error trial (``error=True``: the harness or the policy crashed, timed
  out, ...) counts as a failure with score 0, whatever ``passed`` and
  ``score`` say. Its ``tokens`` and ``steps``, when recorded, still count
  towards cost: the tokens were spent.
- "No data" is ``None``, never ``0.0``: the score of an empty set of trials is
  unknown, not zero. Callers must handle it explicitly.
- Task-level rates divide integers once (``successes / (tasks * k)``), so a
  hand-computed fraction like ``3 / 8`` compares equal, not just close.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from evolution.loop import measure

__all__ = [
    "SplitSummary",
    "TrialRecord",
    "mean_score",
    "mean_steps",
    "mean_tokens",
    "paired_bootstrap_ci",
    "pass_at_1",
    "pass_at_k",
    "pass_hat_k",
    "relative_cost_change",
    "split_contribution",
    "split_rate",
    "split_summaries",
    "task_mean_scores",
]


@dataclass(frozen=True)
class TrialRecord:
    """One attempt of one task.

    ``score`` is the graded score in [0, 1]; ``tokens`` (policy tokens) and
    ``steps`` are ``None`` when the harness did not report them. When
    ``error`` is true the trial counts as not passed with score 0 (see
    ``succeeded`` and ``effective_score``); the recorded ``passed`` and
    ``score`` are kept as reported.

    Raises ``ValueError`` on a score outside [0, 1] (or NaN), a negative
    index, or negative tokens/steps.
    """

    task: str
    split: str
    index: int
    passed: bool
    score: float
    tokens: int | None
    steps: int | None
    error: bool = False

    def __post_init__(self) -> None:
        _check_unit_interval(self.score, f"score of {self.task!r} trial {self.index}")
        if self.index < 0:
            raise ValueError(f"trial index must be >= 0, got {self.index} for {self.task!r}")
        if self.tokens is not None and self.tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {self.tokens} for {self.task!r}")
        if self.steps is not None and self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps} for {self.task!r}")

    @property
    def succeeded(self) -> bool:
        """Passed and did not error."""
        return self.passed and not self.error

    @property
    def effective_score(self) -> float:
        """The score metrics use: 0 for an error trial, else ``score``."""
        return 0.0 if self.error else self.score


@dataclass(frozen=True)
class SplitSummary:
    """Metrics of one split.

    ``rate`` and ``contribution`` are different numbers, do not swap them:

    - ``rate``: successes in the split / (tasks in the split x k), i.e. pass@1
      restricted to the split. Compare it across splits.
    - ``contribution``: successes in the split / (tasks in the whole benchmark
      x k). Contributions of all splits add up to the overall pass@1, so a
      drop in a split's contribution is not the same as a drop in its rate.

    ``pass_at_k``, ``pass_hat_k`` and the means are restricted to the split.
    ``trials`` is the number of trials in the split (tasks x k).
    """

    split: str
    tasks: int
    trials: int
    rate: float
    contribution: float
    pass_at_k: float
    pass_hat_k: float
    mean_tokens: float | None
    mean_steps: float | None


def _check_unit_interval(value: float, what: str) -> None:
    # `not 0 <= x <= 1` is also true for NaN, which must not slip through.
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what} must be in [0, 1], got {value!r}")


def _group(trials: Iterable[TrialRecord]) -> tuple[dict[str, list[TrialRecord]], int]:
    """Trials by task (tasks in sorted order) and the common trial count k.

    k is 0 for empty input. Raises ``ValueError`` on a duplicate
    ``(task, index)``, a task in two splits, or tasks with different k.
    """
    by_task: dict[str, list[TrialRecord]] = {}
    seen: set[tuple[str, int]] = set()
    for trial in trials:
        key = (trial.task, trial.index)
        if key in seen:
            raise ValueError(f"duplicate trial {trial.index} of task {trial.task!r}")
        seen.add(key)
        rows = by_task.setdefault(trial.task, [])
        if rows and rows[0].split != trial.split:
            raise ValueError(f"task {trial.task!r} appears in splits {rows[0].split!r} and {trial.split!r}")
        rows.append(trial)
    counts = {len(rows) for rows in by_task.values()}
    if len(counts) > 1:
        per_task = {task: len(rows) for task, rows in sorted(by_task.items())}
        raise ValueError(f"every task needs the same number of trials (k), got {per_task}")
    k = counts.pop() if counts else 0
    return dict(sorted(by_task.items())), k


def _successes(by_task: Mapping[str, list[TrialRecord]]) -> int:
    return sum(trial.succeeded for rows in by_task.values() for trial in rows)


def _in_split(by_task: Mapping[str, list[TrialRecord]], split: str) -> dict[str, list[TrialRecord]]:
    return {task: rows for task, rows in by_task.items() if rows[0].split == split}


# The three helpers below need at least one task; public callers return None first.
def _pass_at_1(by_task: Mapping[str, list[TrialRecord]], k: int) -> float:
    score = measure.score(measure.Totals(trials=len(by_task) * k, passed=_successes(by_task)), "pass_at_1")
    assert score is not None  # by_task has a task
    return score


def _pass_at_k(by_task: Mapping[str, list[TrialRecord]]) -> float:
    return sum(any(t.succeeded for t in rows) for rows in by_task.values()) / len(by_task)


def _pass_hat_k(by_task: Mapping[str, list[TrialRecord]]) -> float:
    return sum(all(t.succeeded for t in rows) for rows in by_task.values()) / len(by_task)


def _mean_of(values: Iterable[int | None]) -> float | None:
    present = [value for value in values if value is not None]
    if not present:
        return None
    return sum(present) / len(present)


def _contribution(successes: int, k: int, total_tasks: int) -> float:
    # One division of integers, so contributions are exact fractions rounded once.
    return successes / (k * total_tasks) if successes else 0.0


def _check_total_tasks(by_task: Mapping[str, list[TrialRecord]], total_tasks: int) -> None:
    if total_tasks <= 0:
        raise ValueError(f"total_tasks must be positive, got {total_tasks}")
    if total_tasks < len(by_task):
        raise ValueError(f"total_tasks={total_tasks} is less than the {len(by_task)} tasks in the trials")


def pass_at_1(trials: Iterable[TrialRecord]) -> float | None:
    """pass@1: successes / all trials (with k trials per task, the mean over all trials).

    ``None`` for no trials. Error trials count as failures. Raises
    ``ValueError`` on inconsistent trials (see module docstring).
    """
    by_task, k = _group(trials)
    return _pass_at_1(by_task, k) if by_task else None


def pass_at_k(trials: Iterable[TrialRecord]) -> float | None:
    """pass@k (capability): share of tasks with at least one success among their k trials.

    ``None`` for no trials. Error trials count as failures. Raises
    ``ValueError`` on inconsistent trials.
    """
    by_task, _ = _group(trials)
    return _pass_at_k(by_task) if by_task else None


def pass_hat_k(trials: Iterable[TrialRecord]) -> float | None:
    """pass^k (consistency): share of tasks whose k trials all succeeded.

    ``None`` for no trials. Error trials count as failures. Raises
    ``ValueError`` on inconsistent trials.
    """
    by_task, _ = _group(trials)
    return _pass_hat_k(by_task) if by_task else None


def mean_score(trials: Iterable[TrialRecord]) -> float | None:
    """Mean per-trial score (equal to the mean of per-task mean scores, as k is uniform).

    ``None`` for no trials. Error trials score 0. Raises ``ValueError`` on
    inconsistent trials.
    """
    by_task, _ = _group(trials)
    scores = [trial.effective_score for rows in by_task.values() for trial in rows]
    return measure.score(measure.Totals(trials=len(scores), score_sum=math.fsum(scores)), "mean_score")


def task_mean_scores(trials: Iterable[TrialRecord]) -> dict[str, float]:
    """Mean score of each task over its k trials, keyed by task (the input of
    ``paired_bootstrap_ci``). Error trials score 0. Empty for no trials."""
    by_task, k = _group(trials)
    return {task: math.fsum(t.effective_score for t in rows) / k for task, rows in by_task.items()}


def split_rate(trials: Iterable[TrialRecord], split: str) -> float | None:
    """Rate of a split: successes in the split / (tasks in the split x k).

    This is pass@1 restricted to the split; it does not depend on the other
    splits (contrast ``split_contribution``). ``None`` when the split has no
    trials. The whole input is validated, not only the split.
    """
    by_task, k = _group(trials)
    tasks = _in_split(by_task, split)
    return _pass_at_1(tasks, k) if tasks else None


def split_contribution(trials: Iterable[TrialRecord], split: str, total_tasks: int) -> float:
    """Contribution of a split: successes in the split / (total_tasks x k).

    Equivalently (successes in the split / k) / tasks in the whole benchmark.
    The contributions of all splits add up to the overall pass@1 when
    ``total_tasks`` is the number of tasks in ``trials``; tasks of the
    benchmark without trials count as failures. ``0.0`` when the split has no
    trials or no successes.

    Raises ``ValueError`` when ``total_tasks`` is not positive or is less than
    the number of distinct tasks in ``trials``, or on inconsistent trials.
    """
    by_task, k = _group(trials)
    _check_total_tasks(by_task, total_tasks)
    return _contribution(_successes(_in_split(by_task, split)), k, total_tasks)


def split_summaries(trials: Iterable[TrialRecord], total_tasks: int) -> dict[str, SplitSummary]:
    """A ``SplitSummary`` for every split that has trials, keyed by split name
    in sorted order. Empty for no trials.

    ``total_tasks`` is the number of tasks in the whole benchmark, as for
    ``split_contribution`` (same ``ValueError`` cases).
    """
    by_task, k = _group(trials)
    _check_total_tasks(by_task, total_tasks)
    summaries: dict[str, SplitSummary] = {}
    for split in sorted({rows[0].split for rows in by_task.values()}):
        tasks = _in_split(by_task, split)
        split_trials = [trial for rows in tasks.values() for trial in rows]
        summaries[split] = SplitSummary(
            split=split,
            tasks=len(tasks),
            trials=len(split_trials),
            rate=_pass_at_1(tasks, k),
            contribution=_contribution(_successes(tasks), k, total_tasks),
            pass_at_k=_pass_at_k(tasks),
            pass_hat_k=_pass_hat_k(tasks),
            mean_tokens=_mean_of(trial.tokens for trial in split_trials),
            mean_steps=_mean_of(trial.steps for trial in split_trials),
        )
    return summaries


def mean_tokens(trials: Iterable[TrialRecord]) -> float | None:
    """Cost C: mean policy tokens per trial, over trials that reported tokens.

    Trials with ``tokens=None`` are left out (not counted as 0); error trials
    that reported tokens are included. ``None`` when no trial reported tokens.
    """
    return _mean_of(trial.tokens for trial in trials)


def mean_steps(trials: Iterable[TrialRecord]) -> float | None:
    """Mean steps per trial, over trials that reported steps (as ``mean_tokens``)."""
    return _mean_of(trial.steps for trial in trials)


def relative_cost_change(new: float, old: float) -> float | None:
    """Relative change ``(new - old) / old``; 0.25 means 25% more expensive.

    When ``old`` is 0: ``0.0`` if ``new`` is 0 too (no change), ``None`` if
    ``new`` is positive, since no finite relative change exists; a gate
    should treat that ``None`` as an increase. Raises ``ValueError`` on a
    negative or NaN cost.
    """
    for name, value in (("new", new), ("old", old)):
        if not value >= 0:  # also true for NaN
            raise ValueError(f"{name} cost must be a non-negative number, got {value!r}")
    if old == 0:
        return 0.0 if new == 0 else None
    return (new - old) / old


def _quantile(ordered: list[float], q: float) -> float:
    # Linear interpolation between closest ranks (numpy's default "linear").
    position = q * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    fraction = position - below
    return ordered[below] + (ordered[above] - ordered[below]) * fraction


def paired_bootstrap_ci(
    parent: Mapping[str, float],
    child: Mapping[str, float],
    *,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Paired bootstrap confidence interval of the mean score difference child - parent.

    ``parent`` and ``child`` map task to per-task mean score in [0, 1] (see
    ``task_mean_scores``). Only tasks present in both are compared; the pairing
    is what makes the interval tight when both versions find the same tasks
    hard. Each of ``samples`` resamples draws as many tasks as are shared, with
    replacement, from ``random.Random(seed)`` over the tasks in sorted order,
    so the result depends only on the inputs and ``seed``, not on mapping
    order. The interval is the percentile interval (linear interpolation) of
    the resampled mean differences.

    Returns ``(mean_diff, low, high)`` with ``low <= high``. When every shared
    task moves by exactly the same amount (including a single shared task)
    the interval is degenerate: ``low == high == mean_diff``.

    Raises ``ValueError`` when no task is shared, a score is outside [0, 1],
    ``samples < 1`` or ``confidence`` is not strictly between 0 and 1.
    """
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    for name, scores in (("parent", parent), ("child", child)):
        for task, score in scores.items():
            _check_unit_interval(score, f"{name} score of {task!r}")
    shared = sorted(parent.keys() & child.keys())
    if not shared:
        raise ValueError("parent and child have no task in common")

    diffs = [child[task] - parent[task] for task in shared]
    if min(diffs) == max(diffs):
        # Every resample is the same point; say so exactly instead of letting
        # float summation wobble in the last bit.
        return diffs[0], diffs[0], diffs[0]

    n = len(diffs)
    mean_diff = math.fsum(diffs) / n
    rng = random.Random(seed)
    means = sorted(math.fsum(rng.choices(diffs, k=n)) / n for _ in range(samples))
    tail = (1.0 - confidence) / 2.0
    return mean_diff, _quantile(means, tail), _quantile(means, 1.0 - tail)
