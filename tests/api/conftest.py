"""Fixtures of the API tests: users in each role with tokens, and a small world.

``api_world`` is a tiny experiment whose seed was evaluated for real (trials
in subprocesses, certification), plus a trajectory on a train trial and one
on a sealed trial, a flagged candidate in the review queue with a flag
pointing at a sealed task, and a ledger entry. The sealed trial, its steps
and the flag's evidence carry ``CANARY``: it must never reach a viewer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from evolution.access import roles_ensure
from evolution.models import (
    AtomicEdit,
    Candidate,
    CertifiedResult,
    Experiment,
    LeakageFlag,
    ReviewItem,
    SplitName,
    Trajectory,
    TrajectoryStep,
    Trial,
)
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry
from tests.factories import evaluate_seed_inline, make_tiny_experiment, seed_of
from tests.worlds import WorldRows, world_dump, world_load, world_rows

CANARY = "CANARY-sealed-7f3a9c"


@dataclass
class World:
    experiment: Experiment
    record: CertifiedResult
    train_trial: Trial  # failed, with a trajectory
    sealed_trial: Trial  # with a trajectory carrying the canary
    flagged: Candidate
    edits: list[AtomicEdit]


def _trajectory(trial: Trial, text: str, steps: int = 3) -> Trajectory:
    trajectory = Trajectory.objects.create(trial=trial, schema_version="ATIF-v1.4", step_count=steps, notes=text)
    TrajectoryStep.objects.bulk_create(
        TrajectoryStep(trajectory=trajectory, step_id=i + 1, source="agent", message=f"{text} step {i + 1}")
        for i in range(steps)
    )
    return trajectory


def _build_world() -> None:
    # Four tasks, one trial each: t01 fails (the seed answers "yes", t01 expects "no").
    splits = {"train": ["t00", "t01"], "gate": ["t02"], "sealed": ["t03"]}
    experiment = make_tiny_experiment(tasks=4, k=1, split_lists=splits)
    evaluation = evaluate_seed_inline(experiment)
    trials = Trial.objects.filter(evaluation=evaluation).select_related("task").order_by("pk")
    train_trial = next(t for t in trials if t.split == SplitName.TRAIN and t.outcome == Trial.Outcome.FAIL)
    sealed_trial = next(t for t in trials if t.split == SplitName.SEALED)
    Trial.objects.filter(pk=sealed_trial.pk).update(error=f"sealed detail {CANARY}")
    _trajectory(train_trial, "train trajectory")
    _trajectory(sealed_trial, f"sealed {CANARY}")
    seed = seed_of(experiment)
    tree = tree_store(
        entries=[
            FileEntry("default.txt", "100644", b"yes\n"),
            FileEntry("notes/a.md", "100644", b"generic advice\n"),
            FileEntry("notes/b.md", "100644", b"more advice\n"),
        ]
    )
    flagged = Candidate.objects.create(
        experiment=experiment,
        parent=seed,
        tree=tree,
        origin=Candidate.Origin.PROPOSED,
        state=Candidate.State.FLAGGED,
        round=1,
    )
    edits = [
        AtomicEdit.objects.create(
            candidate=flagged, index=i, component="memory", hypothesis=f"note {name} helps", paths=[f"notes/{name}.md"]
        )
        for i, name in enumerate(("a", "b"))
    ]
    LeakageFlag.objects.create(
        candidate=flagged,
        edit=edits[0],
        rule="task_id",
        path="notes/a.md",
        line="generic advice",
        matched=CANARY,
        task=sealed_trial.task,
        evidence={"task": sealed_trial.task.external_id, "evidence": CANARY},
    )
    ReviewItem.objects.create(candidate=flagged)


@pytest.fixture(scope="session")
def api_world_rows(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> WorldRows:
    """The world built once per session (its trials run in subprocesses), dumped
    and rolled back; each test inserts the rows again in about 50 ms."""
    path = tmp_path_factory.mktemp("api-world") / "world.json"
    world_dump(_build_world, path=path, django_db_blocker=django_db_blocker)
    return world_rows(path)


@pytest.fixture
def api_world(db: Any, api_world_rows: WorldRows) -> World:
    world_load(api_world_rows)
    experiment = Experiment.objects.get()
    trials = Trial.objects.filter(candidate__experiment=experiment)
    flagged = Candidate.objects.get(state=Candidate.State.FLAGGED)
    return World(
        experiment=experiment,
        record=CertifiedResult.objects.get(),
        train_trial=trials.get(split=SplitName.TRAIN, outcome=Trial.Outcome.FAIL),
        sealed_trial=trials.get(split=SplitName.SEALED),
        flagged=flagged,
        edits=list(flagged.edits.order_by("index")),
    )


@pytest.fixture
def make_user(db: Any) -> Callable[..., User]:
    """``make_user("reviewer")``: a user in those role groups (``extra_perms`` adds single ones)."""

    def make(*roles: str, username: str | None = None, extra_perms: tuple[str, ...] = ()) -> User:
        roles_ensure()
        name = username or "-".join(roles) or "nobody"
        user = User.objects.create(username=name)  # no password: tokens and force_login, no slow hashing
        for role in roles:
            user.groups.add(Group.objects.get(name=role))
        for perm in extra_perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        return User.objects.get(pk=user.pk)

    return make


@pytest.fixture
def api_as(make_user: Callable[..., User]) -> Callable[..., APIClient]:
    """``api_as("viewer")``: an API client authenticated by a token of a new user in that role."""

    def client(*roles: str, **kwargs: Any) -> APIClient:
        user = make_user(*roles, **kwargs)
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
        api.user = user  # type: ignore[attr-defined]
        return api

    return client
