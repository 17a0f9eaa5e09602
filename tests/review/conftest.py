"""Fixtures of the review screens: users in each role, and a real example run.

``example_world`` is the bundled example after three rounds of the rrsi
recipe, run for real once per test session (trials in subprocesses, the
critic, the gate, certification), dumped, and loaded into each test's
database: accepted, gate-rejected and flagged candidates, certified
records, ledger entries and trajectories, in about a second a test.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client

from evolution.access import roles_ensure
from evolution.models import Experiment
from tests.worlds import WorldRows, world_dump, world_load, world_rows

WORLD_NAME = "example-routing"
WORLD_ROUNDS = 3


# Read by the screens, not by the run that makes the world.
WORLD_INDEPENDENT = frozenset(
    {
        "evolution/admin.py",
        "evolution/selectors.py",
        "evolution/tasks.py",
        "evolution/agreement.py",
        "evolution/services/review.py",
        "evolution/services/annotations.py",
    }
)


def _world_key() -> str:
    """Digest of everything the world's content depends on: the domain code,
    the example, the recipes, migrations, this file and tests/worlds.py."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for path in sorted((root / "evolution").rglob("*")):
        name = str(path.relative_to(root))
        if name in WORLD_INDEPENDENT or ("/management/commands/" in name and not name.endswith("load_example.py")):
            continue
        if path.is_file() and path.suffix in {".py", ".yaml", ".jsonl", ".toml", ".md", ".json", ".txt"}:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    digest.update((root / "tests" / "worlds.py").read_bytes())  # how the world is dumped
    # The world's records are signed with this installation's records key.
    key = settings.RSI_RECORDS_KEY
    digest.update(b"records key\0" + (key.encode() if isinstance(key, str) else bytes(key)))
    return digest.hexdigest()[:24]


def _build_world() -> None:
    call_command("load_example", name=WORLD_NAME, rounds=WORLD_ROUNDS, candidates=3, k=1, verbosity=0)


@pytest.fixture(scope="session")
def example_world_dump(django_db_setup: Any, django_db_blocker: Any) -> Path:
    """Built once, then kept in a per-user cache keyed by the code it depends
    on (RSI_TEST_WORLD_CACHE, default under the temp dir), so repeated test
    sessions of unchanged code load it without running the example again."""
    cache = Path(os.environ.get("RSI_TEST_WORLD_CACHE") or Path(tempfile.gettempdir()) / f"rsiweb-world-{os.getuid()}")
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = cache / f"example-world-{_world_key()}.json"
    if path.exists():
        return path
    # Sessions that start together (CI's SQLite and PostgreSQL passes) build it
    # once: the others wait for the lock, then find the dump (the rows are the
    # same on both databases). Minutes of two busy cores each build saves.
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            world_dump(_build_world, path=partial, django_db_blocker=django_db_blocker)
            partial.replace(path)
    return path


@pytest.fixture(scope="session")
def example_world_rows(example_world_dump: Path) -> WorldRows:
    """The dump deserialized once: runs of rows of one model, in dump order."""
    return world_rows(example_world_dump)


@pytest.fixture
def example_world(db: Any, example_world_rows: WorldRows) -> Experiment:
    """The example experiment after a finished three-round rrsi run, inserted
    in bulk into the test's database (``tests.worlds.world_load``)."""
    world_load(example_world_rows)
    return Experiment.objects.get(name=WORLD_NAME)


@pytest.fixture
def make_user(db: Any) -> Callable[..., User]:
    """``make_user("reviewer")`` gives a user in that role group;
    ``extra_perms`` adds single permissions (e.g. view_sealed_details)."""

    def make(*roles: str, username: str | None = None, extra_perms: tuple[str, ...] = ()) -> User:
        from django.contrib.auth.models import Permission

        roles_ensure()
        name = username or "-".join(roles) or "nobody"
        user = User.objects.create_user(username=name, password="pw-" + name)
        for role in roles:
            user.groups.add(Group.objects.get(name=role))
        for perm in extra_perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
        return User.objects.get(pk=user.pk)  # fresh permission cache

    return make


@pytest.fixture
def client_as(make_user: Callable[..., User]) -> Callable[..., Client]:
    """``client_as("viewer")``: a logged-in test client with CSRF checks on."""

    def login(*roles: str, **kwargs: Any) -> Client:
        client = Client(enforce_csrf_checks=True)
        client.force_login(make_user(*roles, **kwargs))
        return client

    return login
