"""Unit tests for evolution.metrics: pure functions, no database."""

from __future__ import annotations

import math

import pytest

from evolution.metrics import (
    SplitSummary,
    TrialRecord,
    mean_score,
    mean_steps,
    mean_tokens,
    paired_bootstrap_ci,
    pass_at_1,
    pass_at_k,
    pass_hat_k,
    relative_cost_change,
    split_contribution,
    split_rate,
    split_summaries,
    task_mean_scores,
)


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
    trials = runs(THREE_BY_TWO)

    assert pass_at_1(trials) == 3 / 6
    assert pass_at_k(trials) == 2 / 3
    assert pass_hat_k(trials) == 1 / 3


def test_pass_metrics_with_one_trial_per_task_coincide() -> None:
    trials = runs({"a": [True], "b": [False], "c": [True], "d": [False]})

    assert pass_at_1(trials) == pass_at_k(trials) == pass_hat_k(trials) == 2 / 4


def test_pass_metrics_ignore_input_order() -> None:
    trials = runs(THREE_BY_TWO)

    assert pass_hat_k(reversed(trials)) == pass_hat_k(trials)
    assert pass_at_1(iter(trials)) == 3 / 6


def test_mean_score_is_mean_over_trials() -> None:
    trials = [
        trial("a", 0, True, score=1.0),
        trial("a", 1, False, score=0.5),
        trial("b", 0, False, score=0.25),
        trial("b", 1, False, score=0.25),
    ]

    assert mean_score(trials) == 2.0 / 4
    assert task_mean_scores(trials) == {"a": 0.75, "b": 0.25}


def test_error_trial_counts_as_failure_with_score_zero() -> None:
    # The harness reported passed/score 1.0, but the trial errored.
    trials = [
        trial("a", 0, True, score=1.0, tokens=100, steps=4, error=True),
        trial("a", 1, True, score=1.0, tokens=300, steps=6),
    ]

    assert trials[0].succeeded is False
    assert trials[0].effective_score == 0.0
    assert pass_at_1(trials) == 1 / 2
    assert pass_at_k(trials) == 1.0
    assert pass_hat_k(trials) == 0.0
    assert mean_score(trials) == 0.5
    assert task_mean_scores(trials) == {"a": 0.5}
    # The tokens of the errored trial were spent, so they count as cost.
    assert mean_tokens(trials) == 200.0
    assert mean_steps(trials) == 5.0


def test_split_rate_and_contribution_differ_and_contributions_sum_to_pass_at_1() -> None:
    assert split_rate(TWO_SPLITS, "train") == 3 / 6
    assert split_rate(TWO_SPLITS, "sealed") == 2 / 2
    assert split_contribution(TWO_SPLITS, "train", total_tasks=4) == 3 / 8
    assert split_contribution(TWO_SPLITS, "sealed", total_tasks=4) == 2 / 8

    total = split_contribution(TWO_SPLITS, "train", 4) + split_contribution(TWO_SPLITS, "sealed", 4)
    assert total == pass_at_1(TWO_SPLITS) == 5 / 8


def test_split_rate_is_pass_at_1_of_the_split_alone() -> None:
    train_only = [t for t in TWO_SPLITS if t.split == "train"]

    assert split_rate(TWO_SPLITS, "train") == pass_at_1(train_only)


def test_split_contribution_counts_tasks_without_trials_as_failures() -> None:
    # The benchmark has 8 tasks, only 4 were run.
    assert split_contribution(TWO_SPLITS, "sealed", total_tasks=8) == 2 / 16
    # The rate does not depend on the benchmark size.
    assert split_rate(TWO_SPLITS, "sealed") == 1.0


def test_split_without_trials_has_no_rate_and_zero_contribution() -> None:
    assert split_rate(TWO_SPLITS, "gate") is None
    assert split_contribution(TWO_SPLITS, "gate", total_tasks=4) == 0.0


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
    assert sum(s.contribution for s in summaries.values()) == pass_at_1(trials)


def test_empty_input_gives_no_data() -> None:
    assert pass_at_1([]) is None
    assert pass_at_k([]) is None
    assert pass_hat_k([]) is None
    assert mean_score([]) is None
    assert mean_tokens([]) is None
    assert mean_steps([]) is None
    assert task_mean_scores([]) == {}
    assert split_rate([], "train") is None
    assert split_contribution([], "train", total_tasks=3) == 0.0
    assert split_summaries([], total_tasks=3) == {}


def test_mean_tokens_and_steps_ignore_missing_values() -> None:
    trials = [
        trial("a", 0, True, tokens=10, steps=None),
        trial("b", 0, True, tokens=None, steps=None),
        trial("c", 0, True, tokens=20, steps=None),
    ]

    assert mean_tokens(trials) == 15.0
    assert mean_steps(trials) is None


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


def test_mismatched_k_is_rejected_by_every_task_metric() -> None:
    trials = runs({"a": [True, True], "b": [True]})

    for metric in (pass_at_1, pass_at_k, pass_hat_k, mean_score, task_mean_scores):
        with pytest.raises(ValueError, match="same number of trials"):
            metric(trials)
    with pytest.raises(ValueError, match="same number of trials"):
        split_rate(trials, "train")
    with pytest.raises(ValueError, match="same number of trials"):
        split_contribution(trials, "train", total_tasks=2)
    with pytest.raises(ValueError, match="same number of trials"):
        split_summaries(trials, total_tasks=2)


def test_mismatched_k_in_another_split_is_rejected() -> None:
    trials = runs({"a": [True, True]}) + runs({"b": [True]}, split="sealed")

    with pytest.raises(ValueError, match="same number of trials"):
        split_rate(trials, "train")


def test_duplicate_trial_is_rejected() -> None:
    trials = [trial("a", 0, True), trial("a", 0, False)]

    with pytest.raises(ValueError, match="duplicate trial 0 of task 'a'"):
        pass_at_1(trials)


def test_task_in_two_splits_is_rejected() -> None:
    trials = [trial("a", 0, True, split="train"), trial("a", 1, True, split="sealed")]

    with pytest.raises(ValueError, match="appears in splits"):
        pass_at_1(trials)


@pytest.mark.parametrize("total_tasks", [0, -1, 3])
def test_total_tasks_must_cover_the_tasks_in_the_trials(total_tasks: int) -> None:
    # TWO_SPLITS has 4 tasks.
    with pytest.raises(ValueError, match="total_tasks"):
        split_contribution(TWO_SPLITS, "train", total_tasks=total_tasks)
    with pytest.raises(ValueError, match="total_tasks"):
        split_summaries(TWO_SPLITS, total_tasks=total_tasks)


# Parent and child per-task mean scores for the bootstrap tests. The child
# gains on most tasks but not all: diffs are 0.5, 0.25, 0.25, 0, -0.25, 0.5,
# 0.25, 0.5, mean 2.0 / 8 = 0.25.
PARENT = {"t1": 0.0, "t2": 0.25, "t3": 0.5, "t4": 0.5, "t5": 0.75, "t6": 0.25, "t7": 0.5, "t8": 0.0}
CHILD = {"t1": 0.5, "t2": 0.5, "t3": 0.75, "t4": 0.5, "t5": 0.5, "t6": 0.75, "t7": 0.75, "t8": 0.5}


def test_bootstrap_ci_contains_the_mean_difference() -> None:
    diff, low, high = paired_bootstrap_ci(PARENT, CHILD)

    assert diff == 0.25
    assert -0.25 <= low < diff < high <= 0.5


def test_bootstrap_ci_on_two_tasks_hand_computed() -> None:
    # Diffs 0 and 1: a resample of 2 tasks has mean 0, 0.5 or 1 with
    # probability 1/4, 1/2, 1/4, so the 2.5% and 97.5% quantiles of 2000
    # resamples are 0 and 1.
    diff, low, high = paired_bootstrap_ci({"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 1.0})

    assert (diff, low, high) == (0.5, 0.0, 1.0)


def test_bootstrap_ci_is_degenerate_when_every_task_moves_by_the_same_amount() -> None:
    parent = {"a": 0.0, "b": 0.25, "c": 0.5}
    child = {"a": 0.125, "b": 0.375, "c": 0.625}

    assert paired_bootstrap_ci(parent, child) == (0.125, 0.125, 0.125)


def test_bootstrap_ci_with_one_shared_task_is_degenerate() -> None:
    assert paired_bootstrap_ci({"a": 0.25}, {"a": 0.75}) == (0.5, 0.5, 0.5)


def test_bootstrap_ci_uses_only_shared_tasks() -> None:
    parent = {**PARENT, "only-parent": 1.0}
    child = {**CHILD, "only-child": 0.0}

    assert paired_bootstrap_ci(parent, child) == paired_bootstrap_ci(PARENT, CHILD)


def test_bootstrap_ci_is_deterministic_for_a_seed() -> None:
    first = paired_bootstrap_ci(PARENT, CHILD, seed=7)
    reordered_parent = dict(reversed(list(PARENT.items())))

    assert paired_bootstrap_ci(PARENT, CHILD, seed=7) == first
    assert paired_bootstrap_ci(reordered_parent, CHILD, seed=7) == first
    # The seed does reach the resampling: another seed moves the bounds
    # (same mean difference).
    other = paired_bootstrap_ci(PARENT, CHILD, seed=8, samples=50)
    assert other[0] == first[0]
    assert other[1:] != paired_bootstrap_ci(PARENT, CHILD, seed=7, samples=50)[1:]


def test_bootstrap_ci_narrows_with_lower_confidence() -> None:
    _, low_95, high_95 = paired_bootstrap_ci(PARENT, CHILD, confidence=0.95)
    _, low_50, high_50 = paired_bootstrap_ci(PARENT, CHILD, confidence=0.5)

    assert low_95 <= low_50 < high_50 <= high_95
    assert high_50 - low_50 < high_95 - low_95


@pytest.mark.parametrize(
    ("parent", "child", "kwargs", "message"),
    [
        ({"a": 0.5}, {"b": 0.5}, {}, "no task in common"),
        ({}, {}, {}, "no task in common"),
        ({"a": 1.5}, {"a": 0.5}, {}, "parent score of 'a'"),
        ({"a": 0.5}, {"a": -0.5}, {}, "child score of 'a'"),
        ({"a": 0.5}, {"a": math.nan}, {}, "child score of 'a'"),
        ({"a": 0.5}, {"a": 0.5}, {"samples": 0}, "samples"),
        ({"a": 0.5}, {"a": 0.5}, {"confidence": 1.0}, "confidence"),
        ({"a": 0.5}, {"a": 0.5}, {"confidence": 0.0}, "confidence"),
    ],
)
def test_bootstrap_ci_rejects_impossible_input(
    parent: dict[str, float], child: dict[str, float], kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        paired_bootstrap_ci(parent, child, **kwargs)  # type: ignore[arg-type]
