"""Per-candidate metrics against hand-computed numbers on the tiny benchmark."""

from __future__ import annotations

import pytest

from evolution import selectors
from evolution.models import Candidate, Evaluation
from evolution.services import evaluation as evaluation_services
from evolution.services.candidates import EditInput, candidate_accept, candidate_create, candidate_transition
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry
from tests.factories import evaluate_seed_inline, make_tiny_experiment, run_evaluation_inline, seed_id

pytestmark = pytest.mark.django_db

IDS = [f"t{i:02d}" for i in range(8)]
SPLITS = {"train": IDS[:4], "gate": IDS[4:6], "sealed": IDS[6:]}


def test_seed_metrics_label_rate_and_contribution_apart() -> None:
    experiment = make_tiny_experiment(tasks=8, k=2, split_lists=SPLITS)
    evaluate_seed_inline(experiment)
    result = selectors.candidate_metrics(candidate=Candidate.objects.get(pk=seed_id(experiment)))
    # The seed answers "yes": even task numbers pass. train t00..t03: 2 of 4 tasks pass.
    train = result.splits["train"]
    assert (train.tasks, train.trials, train.rate, train.contribution) == (4, 8, 0.5, 2 / 8)
    assert (train.pass_at_k, train.pass_hat_k) == (0.5, 0.5)
    gate = result.splits["gate"]  # t04 passes, t05 fails
    assert (gate.rate, gate.contribution) == (0.5, 1 / 8)
    assert sum(s.contribution for s in result.splits.values()) == 0.5
    assert result.delta is None  # the seed is compared with nothing


def test_child_metrics_carry_ds_dc_and_a_bootstrap_interval() -> None:
    experiment = make_tiny_experiment(tasks=8, k=2, split_lists=SPLITS)
    evaluate_seed_inline(experiment)
    seed = Candidate.objects.get(pk=seed_id(experiment))
    candidate_accept(candidate=seed)
    # The child also answers t01 and t03 (train) and t05 (gate) correctly.
    files = [FileEntry("default.txt", "100644", b"yes\n")] + [
        FileEntry(f"answers/{t}.txt", "100644", b"no\n") for t in ("t01", "t03", "t05")
    ]
    child = candidate_create(
        parent=seed,
        tree=tree_store(entries=files),
        round=1,
        edits=[EditInput("memory", "Answering three tasks with no fixes them.", ["answers/t01.txt"])],
    )
    candidate_transition(candidate=child, to=Candidate.State.APPROVED)
    run_evaluation_inline(
        evaluation_services.evaluation_start(
            candidate=child, splits=["train", "gate"], purpose=Evaluation.Purpose.CANDIDATE
        )
    )
    result = selectors.candidate_metrics(candidate=Candidate.objects.get(pk=child.pk))
    assert result.splits["train"].rate == 1.0
    delta = result.delta
    assert delta is not None
    # Not gated: against its parent, in pass@1 over train + gate (6 tasks, 12 trials a side).
    assert (delta.base_id, delta.gated, delta.splits, delta.estimate.metric) == (
        seed.pk,
        False,
        ("train", "gate"),
        "pass_at_1",
    )
    assert delta.estimate.delta == pytest.approx(1.0 - 0.5)
    assert delta.estimate.pairs == 6
    low, high = delta.estimate.low, delta.estimate.high
    assert low is not None and high is not None
    # Three of six tasks gain 1, three gain 0: the resampled mean gain lies in [0, 1] around 0.5.
    assert 0.0 <= low < 0.5 < high <= 1.0
    assert delta.delta_cost is not None
