"""The offline example loads idempotently, with every harness file on its surface."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from evolution.models import (
    Benchmark,
    Blob,
    Candidate,
    CertifiedResult,
    Evaluator,
    Experiment,
    Run,
    Task,
    Tree,
    Trial,
)
from evolution.services.snapshots import tree_entries
from evolution.surfaces import component_for, in_surface, parse_surface
from tests.factories import seed_of

pytestmark = pytest.mark.django_db


def load() -> str:
    out = io.StringIO()
    call_command("load_example", stdout=out)
    return out.getvalue()


def test_example_loads_once_and_a_second_load_changes_nothing() -> None:
    first = load()
    counts = (Experiment.objects.count(), Task.objects.count(), Blob.objects.count(), Tree.objects.count())
    second = load()
    assert "loaded example experiment 'example-routing'" in first
    assert "exists" in second and "nothing to do" in second
    assert (Experiment.objects.count(), Task.objects.count(), Blob.objects.count(), Tree.objects.count()) == counts


def test_after_an_upgrade_changed_the_bundled_files_a_new_example_experiment_loads_beside_the_old() -> None:
    """A database kept across an upgrade holds the earlier example's
    evaluator and tasks under the bundled names, and they cannot change
    (results bind them): a new experiment of the example was refused
    ("evaluator ... exists with different settings"). The bundled files of
    this version now get names of their own, with their digest; the old
    experiment and its evaluator and tasks stay as they were."""
    out = io.StringIO()
    call_command("load_example", "--tasks", "6", "--name", "before", stdout=out)
    old = Experiment.objects.select_related("evaluator", "benchmark").get(name="before")
    # What the earlier version bundled: another timeout, another instruction for one task.
    timeout = old.evaluator.timeout_seconds
    Evaluator.objects.filter(pk=old.evaluator_id).update(timeout_seconds=timeout + 1)
    first_task = old.benchmark.tasks.order_by("pk").first()
    assert first_task is not None
    Task.objects.filter(pk=first_task.pk).update(instruction="an earlier wording")
    call_command("load_example", "--tasks", "6", "--name", "after", stdout=out)
    call_command("load_example", "--tasks", "6", "--name", "after-again", stdout=out)
    new = Experiment.objects.select_related("evaluator", "benchmark").get(name="after")
    again = Experiment.objects.get(name="after-again")
    # Named after their content: the same in both new experiments.
    assert (
        new.evaluator.name.startswith(f"{old.evaluator.name}-")
        and len(new.evaluator.name) == len(old.evaluator.name) + 13
    )
    assert new.benchmark.name.startswith(f"{old.benchmark.name}-") and new.benchmark.tasks.count() == 6
    assert (again.evaluator_id, again.benchmark_id) == (new.evaluator_id, new.benchmark_id)
    assert new.evaluator.timeout_seconds == timeout
    assert Evaluator.objects.get(pk=old.evaluator_id).timeout_seconds == timeout + 1
    # The old ones unchanged: its changed task as it was.
    assert Task.objects.get(pk=first_task.pk).instruction == "an earlier wording"


def test_example_has_at_least_48_tasks_split_three_ways() -> None:
    load()
    experiment = Experiment.objects.get(name="example-routing")
    assert Benchmark.objects.get(pk=experiment.benchmark_id).tasks.count() >= 48
    splits = {s: experiment.split_memberships.filter(split=s).count() for s in ("train", "gate", "sealed")}
    assert all(count > 0 for count in splits.values())
    assert sum(splits.values()) == experiment.benchmark.tasks.count()
    assert seed_of(experiment).origin == Candidate.Origin.SEED
    # Stratified by task kind: every kind (normal, hard, from_ticket) has tasks in every split.
    assert experiment.split_stratify_by == "kind"
    kinds = {
        split: set(experiment.split_memberships.filter(split=split).values_list("task__metadata__kind", flat=True))
        for split in ("train", "gate", "sealed")
    }
    assert kinds == {split: {"normal", "hard", "from_ticket"} for split in kinds}


def test_every_seed_harness_file_is_on_the_surface_with_a_component_kind() -> None:
    load()
    experiment = Experiment.objects.get(name="example-routing")
    spec = parse_surface(experiment.surface.spec)
    kinds = set()
    for entry in tree_entries(tree=seed_of(experiment).tree):
        assert in_surface(spec, entry.path), entry.path
        kind = component_for(spec, entry.path)
        assert kind is not None, entry.path
        kinds.add(kind)
    assert len(kinds) >= 5, kinds


def test_example_evaluator_files_are_not_in_the_harness() -> None:
    load()
    experiment = Experiment.objects.get(name="example-routing")
    harness_paths = {entry.path for entry in tree_entries(tree=seed_of(experiment).tree)}
    evaluator_paths = {entry.path for entry in tree_entries(tree=experiment.evaluator.files)}
    assert {"agent.py", "verify.py"} <= evaluator_paths
    assert not harness_paths & evaluator_paths


def load_rounds(*, through_workers: bool) -> str:
    out = io.StringIO()
    call_command("load_example", rounds=1, candidates=1, through_workers=through_workers, stdout=out)
    return out.getvalue()


def test_through_workers_starts_the_run_and_runs_nothing_in_this_process() -> None:
    output = load_rounds(through_workers=True)

    run = Run.objects.get(experiment__name="example-routing")
    assert f"started the example's run {run.pk}: 1 round(s) through the workers" in output
    assert (run.status, run.rounds) == (Run.Status.RUNNING, 1)
    # Serving comes first: no trial ran and nothing was certified before the command returned.
    assert not Trial.objects.filter(evaluation__run=run).exclude(state=Trial.State.PENDING).exists()
    assert not CertifiedResult.objects.exists()


def test_an_interrupted_example_run_is_continued_then_left_alone_once_finished() -> None:
    load_rounds(through_workers=True)
    run = Run.objects.get(experiment__name="example-routing")

    # The start that launched it was stopped before any worker took it: the next load continues it.
    continued = load_rounds(through_workers=False)
    assert f"continuing the example's run {run.pk}, interrupted at round 1 of 1, in this process" in continued
    assert "not running it again" not in continued
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED
    assert CertifiedResult.objects.filter(experiment=run.experiment).exists()
    records = CertifiedResult.objects.count()

    again = load_rounds(through_workers=True)
    assert f"the example's run {run.pk} is finished" in again
    assert "continuing" not in again and "started" not in again
    assert Run.objects.filter(experiment=run.experiment).count() == 1
    assert CertifiedResult.objects.count() == records
