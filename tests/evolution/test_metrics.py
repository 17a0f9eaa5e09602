"""Unit tests for evolution.metrics: pure functions, no database.

S, cost and the interval of dS are evolution.loop.measure's (test_measure); a candidate's numbers are read
through evolution.measurements."""

from __future__ import annotations

import math

import pytest

from evolution.metrics import SplitSummary, TrialRecord, relative_cost_change, split_summaries


def trial(
    task: str,
    index: int,
    passed: bool,
    *,
    split: str = "train",
    score: float | None = None,
    tokens: int | None = None,
    steps: int | None = None,
    error: bool = False,
) -> TrialRecord:
    return TrialRecord(
        task=task,
        split=split,
        index=index,
        passed=passed,
        score=(1.0 if passed else 0.0) if score is None else score,
        tokens=tokens,
        steps=steps,
        error=error,
    )


def runs(patterns: dict[str, list[bool]], *, split: str = "train") -> list[TrialRecord]:
    """Trials from {task: [passed of trial 0, passed of trial 1, ...]}."""
    return [
        trial(task, i, passed, split=split) for task, outcomes in patterns.items() for i, passed in enumerate(outcomes)
    ]


# 3 tasks x 2 trials: a passes both, b one of two, c none.
THREE_BY_TWO = {"a": [True, True], "b": [True, False], "c": [False, False]}

# 4 tasks x 2 trials over two splits of different sizes, so rate != contribution:
#   train:  a [T, T], b [T, F], c [F, F] -> 3 successes / 6 trials
#   sealed: d [T, T]                     -> 2 successes / 2 trials
#   overall pass@1 = 5 / 8
TWO_SPLITS = runs({"a": [True, True], "b": [True, False], "c": [False, False]}) + runs(
    {"d": [True, True]}, split="sealed"
)


def test_pass_metrics_hand_computed() -> None:
    summary = split_summaries(runs(THREE_BY_TWO), total_tasks=3)["train"]

    assert (summary.rate, summary.pass_at_k, summary.pass_hat_k) == (3 / 6, 2 / 3, 1 / 3)


def test_pass_metrics_with_one_trial_per_task_coincide() -> None:
    summary = split_summaries(runs({"a": [True], "b": [False], "c": [True], "d": [False]}), total_tasks=4)["train"]

    assert summary.rate == summary.pass_at_k == summary.pass_hat_k == 2 / 4


def test_pass_metrics_ignore_input_order() -> None:
    trials = runs(THREE_BY_TWO)

    assert split_summaries(reversed(trials), total_tasks=3) == split_summaries(iter(trials), total_tasks=3)


def test_error_trial_counts_as_failure_with_score_zero() -> None:
    # The harness reported passed/score 1.0, but the trial errored.
    trials = [
        trial("a", 0, True, score=1.0, tokens=100, steps=4, error=True),
        trial("a", 1, True, score=1.0, tokens=300, steps=6),
    ]

    assert trials[0].succeeded is False
    assert trials[0].effective_score == 0.0
    summary = split_summaries(trials, total_tasks=1)["train"]
    assert (summary.rate, summary.pass_at_k, summary.pass_hat_k) == (1 / 2, 1.0, 0.0)
    # The tokens of the errored trial were spent, so they count as cost.
    assert (summary.mean_tokens, summary.mean_steps) == (200.0, 5.0)


def test_split_rate_and_contribution_differ_and_contributions_sum_to_pass_at_1() -> None:
    summaries = split_summaries(TWO_SPLITS, total_tasks=4)

    assert (summaries["train"].rate, summaries["sealed"].rate) == (3 / 6, 2 / 2)
    assert (summaries["train"].contribution, summaries["sealed"].contribution) == (3 / 8, 2 / 8)
    assert summaries["train"].contribution + summaries["sealed"].contribution == 5 / 8


def test_split_contribution_counts_tasks_without_trials_as_failures() -> None:
    # The benchmark has 8 tasks, only 4 were run; the rate does not depend on the benchmark size.
    sealed = split_summaries(TWO_SPLITS, total_tasks=8)["sealed"]

    assert (sealed.contribution, sealed.rate) == (2 / 16, 1.0)


def test_split_without_trials_has_no_summary() -> None:
    assert "gate" not in split_summaries(TWO_SPLITS, total_tasks=4)


def test_split_summaries_hand_computed() -> None:
    trials = [
        trial("a", 0, True, tokens=100, steps=2),
        trial("a", 1, True, tokens=200, steps=None),
        trial("b", 0, True, tokens=None, steps=4),
        trial("b", 1, False, tokens=300, steps=6),
        trial("c", 0, False, tokens=400, steps=8),
        trial("c", 1, False, tokens=500, steps=10),
        trial("d", 0, True, split="sealed", tokens=None, steps=None),
        trial("d", 1, True, split="sealed", tokens=None, steps=None),
    ]

    summaries = split_summaries(trials, total_tasks=4)

    assert list(summaries) == ["sealed", "train"]
    assert summaries["train"] == SplitSummary(
        split="train",
        tasks=3,
        trials=6,
        rate=3 / 6,
        contribution=3 / 8,
        pass_at_k=2 / 3,
        pass_hat_k=1 / 3,
        mean_tokens=1500 / 5,
        mean_steps=30 / 5,
    )
    assert summaries["sealed"] == SplitSummary(
        split="sealed",
        tasks=1,
        trials=2,
        rate=1.0,
        contribution=2 / 8,
        pass_at_k=1.0,
        pass_hat_k=1.0,
        mean_tokens=None,
        mean_steps=None,
    )
    assert sum(s.contribution for s in summaries.values()) == 5 / 8


def test_empty_input_gives_no_data() -> None:
    assert split_summaries([], total_tasks=3) == {}


def test_mean_tokens_and_steps_ignore_missing_values() -> None:
    trials = [
        trial("a", 0, True, tokens=10, steps=None),
        trial("b", 0, True, tokens=None, steps=None),
        trial("c", 0, True, tokens=20, steps=None),
    ]

    summary = split_summaries(trials, total_tasks=3)["train"]
    assert (summary.mean_tokens, summary.mean_steps) == (15.0, None)


def test_relative_cost_change() -> None:
    assert relative_cost_change(125.0, 100.0) == 0.25
    assert relative_cost_change(50.0, 100.0) == -0.5
    assert relative_cost_change(100.0, 100.0) == 0.0
    assert relative_cost_change(0.0, 0.0) == 0.0
    assert relative_cost_change(10.0, 0.0) is None


@pytest.mark.parametrize(("new", "old"), [(-1.0, 100.0), (100.0, -1.0), (math.nan, 100.0), (100.0, math.nan)])
def test_relative_cost_change_rejects_negative_or_nan(new: float, old: float) -> None:
    with pytest.raises(ValueError, match="cost"):
        relative_cost_change(new, old)


@pytest.mark.parametrize("score", [-0.1, 1.5, math.nan])
def test_trial_rejects_score_outside_unit_interval(score: float) -> None:
    with pytest.raises(ValueError, match="score"):
        trial("a", 0, False, score=score)


@pytest.mark.parametrize(
    ("field", "value"),
    [("index", -1), ("tokens", -5), ("steps", -1)],
)
def test_trial_rejects_negative_counts(field: str, value: int) -> None:
    fields = {"task": "a", "split": "train", "index": 0, "passed": True, "score": 1.0, "tokens": 1, "steps": 1}
    fields[field] = value
    with pytest.raises(ValueError, match=field):
        TrialRecord(**fields)  # type: ignore[arg-type]


def test_mismatched_k_is_rejected() -> None:
    with pytest.raises(ValueError, match="same number of trials"):
        split_summaries(runs({"a": [True, True], "b": [True]}), total_tasks=2)


def test_mismatched_k_in_another_split_is_rejected() -> None:
    trials = runs({"a": [True, True]}) + runs({"b": [True]}, split="sealed")

    with pytest.raises(ValueError, match="same number of trials"):
        split_summaries(trials, total_tasks=2)


def test_duplicate_trial_is_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate trial 0 of task 'a'"):
        split_summaries([trial("a", 0, True), trial("a", 0, False)], total_tasks=1)


def test_task_in_two_splits_is_rejected() -> None:
    with pytest.raises(ValueError, match="appears in splits"):
        split_summaries([trial("a", 0, True, split="train"), trial("a", 1, True, split="sealed")], total_tasks=1)


@pytest.mark.parametrize("total_tasks", [0, -1, 3])
def test_total_tasks_must_cover_the_tasks_in_the_trials(total_tasks: int) -> None:
    # TWO_SPLITS has 4 tasks.
    with pytest.raises(ValueError, match="total_tasks"):
        split_summaries(TWO_SPLITS, total_tasks=total_tasks)
