"""Per-split summaries of one evaluation's trial records (docs/concepts.md, section 2), and dC.

What is left here is what the product calls: ``split_summaries`` of one evaluation (the ``evaluate`` command,
external results) and ``relative_cost_change``, the one dC formula. S and cost are
``evolution.loop.measure``'s; a candidate's numbers on every screen come from ``evolution.measurements``.

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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from evolution.loop import measure

__all__ = [
    "SplitSummary",
    "TrialRecord",
    "relative_cost_change",
    "split_summaries",
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
