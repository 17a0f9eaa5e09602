"""A throwaway database and the small fixtures the screen benchmarks share.

Benchmarks that write rows (thousands of candidates, a million trials) run in
a database of their own, created from the migrations and dropped at the end,
so ``manage.py bench`` never leaves rows in the user's database.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import override_settings

from evolution.models import Candidate, Experiment, Tree
from evolution.services.experiments import (
    TaskInput,
    benchmark_upsert,
    evaluator_upsert,
    experiment_create,
    surface_create,
)
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry

SURFACE = """
include: ["**"]
components: {"**": prompt}
"""


@contextmanager
def scratch_database(*, keep: bool = False, reuse: str = "") -> Iterator[str]:
    """Create an empty, migrated database with a unique name, point the
    default connection at it, and drop it on the way out (also on error).
    Yields the database's name.

    ``keep``: leave it in place on the way out (its name is yielded so the
    caller can say so). ``reuse``: the name of a database a kept run left,
    migrated to the current code and left in place; an error when it does
    not exist (no empty database is made in its stead)."""
    test_settings = connection.settings_dict.setdefault("TEST", {})
    saved_test_name = test_settings.get("NAME")
    old_name = connection.settings_dict["NAME"]
    unique = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    if reuse:
        if not _database_exists(reuse):
            raise RuntimeError(f"no database {reuse!r} to reuse (a run with --keep-data prints the name it kept)")
        test_settings["NAME"] = reuse
    elif connection.vendor == "sqlite":
        test_settings["NAME"] = os.path.join(tempfile.gettempdir(), f"rsiweb_bench_{unique}.sqlite3")
    else:
        test_settings["NAME"] = f"rsiweb_bench_{unique}"
    keepdb = bool(reuse)  # an existing database is migrated, not recreated
    try:
        name = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=keepdb)
        try:
            yield name
        finally:
            connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=keep or keepdb)
    finally:
        test_settings["NAME"] = saved_test_name
        if saved_test_name is None:
            test_settings.pop("NAME", None)


def _database_exists(name: str) -> bool:
    if connection.vendor == "sqlite":
        return os.path.exists(name)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        return cursor.fetchone() is not None


@contextmanager
def maybe_scratch(scratch: bool) -> Iterator[None]:
    """``scratch_database()`` when asked (the command), else the current
    database (a test that already runs in its own)."""
    if scratch:
        with scratch_database():
            yield
    else:
        yield


def bench_experiment(*, name: str, seed_tree: Tree, tasks: int = 1) -> Experiment:
    """A minimal real experiment (benchmark, evaluator, surface, splits, seed)
    whose seed harness is ``seed_tree``."""
    benchmark = benchmark_upsert(
        name=f"{name}-tasks",
        tasks=[
            TaskInput(
                external_id=f"t{i:05d}",
                instruction=f"Answer task t{i:05d}.",
                expected={"answer": "yes"},
                criteria=[],
                files={},
            )
            for i in range(tasks)
        ],
    )
    evaluator = evaluator_upsert(
        name=f"{name}-evaluator",
        files=tree_store(entries=[FileEntry("agent.py", "100644", b"print('yes')\n")]),
        runner_argv=["{python}", "{evaluator}/agent.py"],
        verifier_argv=["{python}", "{evaluator}/agent.py"],
        env_allowlist=["PATH"],
        timeout_seconds=30,
    )
    return experiment_create(
        name=name,
        benchmark=benchmark,
        evaluator=evaluator,
        surface=surface_create(name=name, spec=SURFACE),
        seed_tree=seed_tree,
        split_seed=7,
        split_ratios={"train": 0.5, "gate": 0.25, "sealed": 0.25},
        trials_per_task=1,
        run_settings={"model": "bench"},
    )


def child_candidate(experiment: Experiment, tree: Tree, *, label: str) -> Candidate:
    """A proposed child of the seed holding ``tree`` (frozen: it only has to
    be shown, not evaluated)."""
    return Candidate.objects.create(
        experiment=experiment,
        parent=experiment.seed_candidate,
        tree=tree,
        origin=Candidate.Origin.PROPOSED,
        state=Candidate.State.FROZEN,
        round=1,
        label=label,
    )


def client_for(role: str, *, username: str) -> Client:
    """A test client signed in as a new user in ``role`` (evolution.access roles)."""
    from django.contrib.auth.models import Group, User

    from evolution.access import roles_ensure

    roles_ensure()
    user = User.objects.create_user(username=username, password=None)
    user.groups.add(Group.objects.get(name=role))
    client = Client()
    client.force_login(user)
    return client


def served_hosts() -> Any:
    """Let the test client's host through ALLOWED_HOSTS outside the test runner."""
    hosts = list(settings.ALLOWED_HOSTS)
    return override_settings(ALLOWED_HOSTS=[*hosts, "testserver"])
