"""Experiment set-up services: splits frozen with digests, refusals that write nothing."""

from __future__ import annotations

from typing import Any

import pytest

from evolution.models import Candidate, Evaluation, Experiment, SplitMembership, SplitName, Task
from evolution.services import evaluation as evaluation_services
from evolution.services.experiments import (
    ExperimentError,
    SplitsFrozenError,
    TaskInput,
    benchmark_upsert,
    evaluator_from_config,
    evaluator_upsert,
    split_digests_compute,
    split_digests_store,
    splits_assign,
)
from tests.factories import make_tiny_experiment, seed_id, seed_of

pytestmark = pytest.mark.django_db


def test_experiment_has_a_seed_and_frozen_split_digests() -> None:
    experiment = make_tiny_experiment(tasks=8)
    memberships = SplitMembership.objects.filter(experiment=experiment)
    assert memberships.count() == 8
    assert {m.split for m in memberships} == {"train", "gate", "sealed"}
    assert sorted(experiment.split_digests) == ["gate", "sealed", "train"]
    assert experiment.split_digests == split_digests_compute(experiment=experiment)
    seed = seed_of(experiment)
    assert seed.origin == Candidate.Origin.SEED and seed.parent is None
    assert seed.state == Candidate.State.APPROVED


def test_explicit_split_lists_change_the_digests() -> None:
    ids = [f"t{i:02d}" for i in range(4)]
    experiment = make_tiny_experiment(tasks=4, split_lists={"train": ids[:2], "gate": ids[2:3], "sealed": ids[3:]})
    before = dict(experiment.split_digests)
    digests = splits_assign(experiment=experiment, lists={"train": ids[:1], "gate": ids[1:3], "sealed": ids[3:]})
    assert digests["sealed"] == before["sealed"]
    assert digests["train"] != before["train"]
    assert digests["gate"] != before["gate"]


def test_a_stratified_split_puts_every_value_of_the_attribute_in_every_split_and_twins_keep_it() -> None:
    from evolution.services.experiments import experiment_twin

    experiment = make_tiny_experiment(tasks=9)
    tasks = experiment.benchmark.tasks.order_by("external_id")
    for number, task in enumerate(tasks):
        Task.objects.filter(pk=task.pk).update(metadata={"kind": "rare" if number % 3 == 0 else "common"})

    def rare_by_split(e: Experiment) -> dict[str, int]:
        rows = SplitMembership.objects.filter(experiment=e, task__metadata__kind="rare")
        return {split: rows.filter(split=split).count() for split in ("train", "gate", "sealed")}

    for seed in (1, 2, 3):
        splits_assign(experiment=experiment, seed=seed, stratify_by="kind")
        assert rare_by_split(experiment) == {"train": 1, "gate": 1, "sealed": 1}, seed
    assert Experiment.objects.get(pk=experiment.pk).split_stratify_by == "kind"
    # A comparison's new split draw is stratified as the experiment's split is.
    drawn = experiment_twin(like=experiment, name="drawn again", split_seed=7)
    assert drawn.split_stratify_by == "kind"
    assert rare_by_split(drawn) == {"train": 1, "gate": 1, "sealed": 1}
    # "" cuts all tasks together again: with seed 1 the three rare tasks are not one in each split.
    splits_assign(experiment=experiment, seed=1, stratify_by="")
    assert experiment.split_stratify_by == ""
    assert sorted(rare_by_split(experiment).values()) != [1, 1, 1]


def test_splits_cannot_change_once_results_exist() -> None:
    experiment = make_tiny_experiment(tasks=4)
    evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    before = list(SplitMembership.objects.filter(experiment=experiment).values_list("task_id", "split"))
    with pytest.raises(ExperimentError, match="after results exist"):
        splits_assign(experiment=experiment, seed=99, ratios={"train": 1.0})
    after = list(SplitMembership.objects.filter(experiment=experiment).values_list("task_id", "split"))
    assert after == before


def _task_added_to_train(experiment: Experiment) -> Task:
    task = Task.objects.create(benchmark=experiment.benchmark, external_id="added", instruction="x", expected={})
    SplitMembership.objects.create(experiment=experiment, task=task, split=SplitName.TRAIN)
    return task


def test_frozen_split_digests_are_never_rewritten() -> None:
    experiment = make_tiny_experiment(tasks=4)
    evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    frozen = dict(experiment.split_digests)
    _task_added_to_train(experiment)
    with pytest.raises(SplitsFrozenError) as error:
        split_digests_store(experiment=experiment)
    assert str(error.value) == (
        f"experiment {experiment.name!r}: results exist, so the task set of split(s) train cannot change "
        "(its digest is frozen)"
    )
    assert Experiment.objects.get(pk=experiment.pk).split_digests == frozen
    assert experiment.split_digests == frozen
    assert split_digests_compute(experiment=experiment)["train"] != frozen["train"]


def test_split_digests_follow_the_tasks_until_results_exist() -> None:
    experiment = make_tiny_experiment(tasks=4)
    before = dict(experiment.split_digests)
    _task_added_to_train(experiment)
    stored = split_digests_store(experiment=experiment)
    assert stored == split_digests_compute(experiment=experiment)
    assert (stored["gate"], stored["sealed"]) == (before["gate"], before["sealed"])
    assert stored["train"] != before["train"]
    assert Experiment.objects.get(pk=experiment.pk).split_digests == stored


def test_benchmark_upsert_is_idempotent_and_refuses_silent_changes() -> None:
    tasks = [TaskInput(external_id="a", instruction="do a", expected={"x": 1})]
    first = benchmark_upsert(name="upsert", tasks=tasks)
    again = benchmark_upsert(name="upsert", tasks=tasks)
    assert first.pk == again.pk and again.tasks.count() == 1
    with pytest.raises(ExperimentError, match="exists with different content"):
        benchmark_upsert(name="upsert", tasks=[TaskInput(external_id="a", instruction="do a", expected={"x": 2})])
    assert first.tasks.get().expected == {"x": 1}


def test_evaluation_creates_k_trials_per_task_with_stable_seeds() -> None:
    experiment = make_tiny_experiment(tasks=6, k=3)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train", "gate"])
    tasks = SplitMembership.objects.filter(experiment=experiment, split__in=["train", "gate"]).count()
    assert evaluation.trials_total == tasks * 3
    assert evaluation.trials.count() == tasks * 3
    trial = evaluation.trials.select_related("task").first()
    assert trial is not None
    assert trial.seed == evaluation_services.trial_seed(evaluation.seed, trial.task.external_id, trial.index)
    assert Candidate.objects.get(pk=seed_id(experiment)).state == Candidate.State.EVALUATING


def test_a_candidate_not_approved_for_evaluation_cannot_be_evaluated() -> None:
    experiment = make_tiny_experiment(tasks=4)
    Candidate.objects.filter(pk=seed_id(experiment)).update(state=Candidate.State.FLAGGED)
    with pytest.raises(evaluation_services.EvaluationError, match="is flagged; it cannot be evaluated"):
        evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    assert not Evaluation.objects.filter(experiment=experiment).exists()


def test_repeated_evaluations_of_one_candidate_keep_it_evaluating_until_all_finish() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    first = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    second = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"], repeat=1)
    for trial_id in first.trials.values_list("pk", flat=True):
        evaluation_services.trial_execute(trial_id=trial_id, owner="test")
    assert Candidate.objects.get(pk=seed_id(experiment)).state == Candidate.State.EVALUATING
    for trial_id in second.trials.values_list("pk", flat=True):
        evaluation_services.trial_execute(trial_id=trial_id, owner="test")
    assert Candidate.objects.get(pk=seed_id(experiment)).state == Candidate.State.EVALUATED


def test_heldout_benchmark_tasks_are_reported_like_sealed() -> None:
    from evolution.models import SplitName
    from evolution.services.experiments import experiment_create, surface_create
    from evolution.services.snapshots import tree_store
    from evolution.trees import FileEntry
    from tests.factories import TINY_SURFACE

    base = make_tiny_experiment(tasks=4)
    heldout = benchmark_upsert(
        name="ood",
        tasks=[TaskInput(external_id=f"o{i}", instruction="ood", expected={"answer": "yes"}) for i in range(3)],
    )
    experiment = experiment_create(
        name="with held-out",
        benchmark=base.benchmark,
        evaluator=base.evaluator,
        surface=surface_create(name="tiny", spec=TINY_SURFACE),
        seed_tree=tree_store(entries=[FileEntry("default.txt", "100644", b"maybe\n")]),
        heldout=[heldout],
    )
    memberships = SplitMembership.objects.filter(experiment=experiment)
    assert memberships.filter(split=SplitName.HELDOUT).count() == 3
    assert memberships.exclude(split=SplitName.HELDOUT).count() == 4
    assert "heldout" in experiment.split_digests
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["heldout"], k=1)
    assert evaluation.trials_total == 3
    # A twin (a comparison's run) keeps the held-out benchmark and the same splits; a new split draw too.
    from evolution.services.experiments import experiment_twin

    def splits(e: Any) -> set[tuple[str, str]]:
        return set(SplitMembership.objects.filter(experiment=e).values_list("task__external_id", "split"))

    twin = experiment_twin(like=experiment, name="with held-out, twin")
    assert splits(twin) == splits(experiment) and twin.split_digests == experiment.split_digests
    drawn = experiment_twin(like=experiment, name="with held-out, drawn", split_seed=7)
    assert {t for t, s in splits(drawn) if s == SplitName.HELDOUT} == {"o0", "o1", "o2"}


def test_the_own_benchmark_cannot_also_be_held_out() -> None:
    from evolution.services.experiments import experiment_create

    base = make_tiny_experiment(tasks=2)
    with pytest.raises(ExperimentError, match="cannot also be held out"):
        experiment_create(
            name="self held out",
            benchmark=base.benchmark,
            evaluator=base.evaluator,
            surface=base.surface,
            seed_tree=seed_of(base).tree,
            heldout=[base.benchmark],
        )
    assert not type(base).objects.filter(name="self held out").exists()


def test_an_evaluator_table_may_give_its_agent_the_network() -> None:
    files = make_tiny_experiment(tasks=2, k=1).evaluator.files
    config = {"name": "hosted-model", "runner_argv": ["agent"], "verifier_argv": ["verify"]}
    assert evaluator_from_config(config=config, files=files).agent_network is False
    with_network = evaluator_from_config(
        config={**config, "name": "hosted-model-2", "agent_network": True}, files=files
    )
    assert with_network.agent_network is True
    # Evaluators are immutable: the same name with the other setting is refused, not changed.
    with pytest.raises(ExperimentError, match="exists with different settings"):
        evaluator_upsert(
            name="hosted-model", files=files, runner_argv=["agent"], verifier_argv=["verify"], agent_network=True
        )
    with pytest.raises(ExperimentError, match="agent_network must be true or false"):
        evaluator_from_config(config={**config, "name": "hosted-model-3", "agent_network": "yes"}, files=files)
