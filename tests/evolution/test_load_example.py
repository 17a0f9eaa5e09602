"""The offline example loads idempotently, with every harness file on its surface."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from evolution.models import Benchmark, Blob, Candidate, Experiment, Task, Tree
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


def test_example_has_at_least_48_tasks_split_three_ways() -> None:
    load()
    experiment = Experiment.objects.get(name="example-routing")
    assert Benchmark.objects.get(pk=experiment.benchmark_id).tasks.count() >= 48
    splits = {s: experiment.split_memberships.filter(split=s).count() for s in ("train", "gate", "sealed")}
    assert all(count > 0 for count in splits.values())
    assert sum(splits.values()) == experiment.benchmark.tasks.count()
    assert seed_of(experiment).origin == Candidate.Origin.SEED


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
