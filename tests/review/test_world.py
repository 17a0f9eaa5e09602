"""The shared example world is a real, finished run with every kind of candidate."""

from __future__ import annotations

import pytest

from evolution.models import Candidate, CertifiedResult, LeakageFlag, ReviewItem, Run, TrajectoryStep

pytestmark = pytest.mark.django_db


def test_the_example_world_has_every_kind_of_candidate(example_world) -> None:
    states = set(example_world.candidates.values_list("state", flat=True))
    assert {Candidate.State.ACCEPTED, Candidate.State.FLAGGED} <= states
    assert example_world.runs.get().status == Run.Status.FINISHED
    assert CertifiedResult.objects.filter(experiment=example_world).exists()
    assert LeakageFlag.objects.filter(candidate__experiment=example_world).exists()
    assert ReviewItem.objects.filter(candidate__experiment=example_world, state=ReviewItem.State.OPEN).exists()
    assert TrajectoryStep.objects.filter(trajectory__trial__candidate__experiment=example_world).exists()


def test_grow_adds_candidates_trials_and_a_long_trajectory(example_world) -> None:
    from evolution.models import Trial
    from tests.review.world import grow

    before = example_world.candidates.count()
    grow(example_world, candidates=6, steps=300)
    assert example_world.candidates.count() == before + 6
    assert ReviewItem.objects.filter(candidate__label__startswith="grown").count() == 2
    long = Trial.objects.get(steps=300)
    assert long.trajectory.steps.count() == 300
