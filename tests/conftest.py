"""Shared fixtures.

Service fixtures (PostgreSQL, Redis, a Celery worker) skip when the service
is missing on a developer's machine, and fail instead when
RSI_REQUIRE_SERVICES=1 (CI sets it), so CI can never go green by skipping.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import override_settings
from kombu import pools as kombu_pools

# The same workers the trust suite and the benchmarks start; re-exported for the tests.
from lab.processes import WorkerProcess, database_url_for_subprocess

REPO_ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("RSI_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


# Fixtures through which a test reaches the database of the pass (pytest-django
# blocks every other test's queries; django_db_setup's users build worlds in
# it; a worker subprocess is given the test database's URL).
DATABASE_FIXTURES = frozenset(
    {
        "db",
        "transactional_db",
        "django_db_setup",
        "django_db_reset_sequences",
        "django_db_serialized_rollback",
        "live_server",
        "postgres",
        "start_worker",
    }
)


def reaches_database(fixturenames: Iterable[str], markers: Iterable[str]) -> bool:
    """Whether a test with these fixtures (the whole closure, as pytest lists
    them) and markers can see which database the pass runs on."""
    return "django_db" in set(markers) or not DATABASE_FIXTURES.isdisjoint(fixturenames)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that can reach the database of the pass ``database``.

    Runs before pytest's own ``-m`` selection, so a pass chooses its tests by
    markers alone: CI's PostgreSQL pass keeps ``-m "database or slow"`` (a
    test that never reaches the database runs the same on both passes, so it
    runs on the SQLite pass alone), and the SQLite pass ``-m "not slow"``."""
    for item in items:
        markers = [marker.name for marker in item.iter_markers()]
        if reaches_database(getattr(item, "fixturenames", ()), markers):
            item.add_marker(pytest.mark.database)


# The deployment's password hashers, read before the tests' own (below): a test
# whose user logs in to a server in another process hashes the password with them.
DEPLOYMENT_PASSWORD_HASHERS: list[str] = list(settings.PASSWORD_HASHERS)


@pytest.fixture(scope="session", autouse=True)
def fast_password_hashing() -> Iterator[None]:
    """Passwords hashed with MD5 in the tests of this process, as Django's
    documentation advises for test runs: the deployment's PBKDF2 (1,000,000
    iterations in Django 5.2) took 0.24 s a hash on a 2-core CI machine, and
    tests/review alone hashed 231 passwords, 55.5 s of its 282. What the
    tests check of logging in, roles and throttling does not depend on the
    hasher. Subprocesses (workers, servers, the trust suite) keep the
    deployment's: a user who logs in to one is given a password hashed with
    ``DEPLOYMENT_PASSWORD_HASHERS``."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


def require_service(name: str, available: bool, why: str = "") -> None:
    """Skip (laptop) or fail (CI, RSI_REQUIRE_SERVICES=1) when a service is missing."""
    if available:
        return
    message = f"{name} is not available{': ' + why if why else ''}"
    if settings.RSI_REQUIRE_SERVICES:
        pytest.fail(f"{message} (RSI_REQUIRE_SERVICES=1: required here)")
    pytest.skip(message)


@pytest.fixture
def reasoning_gym_installed() -> None:
    """The reasoning-gym package (requirements-rgym.txt, which ``dev.py test`` installs where it can)."""
    from evolution.rgym.tasks import INSTALL_HINT

    require_service("the reasoning-gym package", importlib.util.find_spec("reasoning_gym") is not None, INSTALL_HINT)


def _port_open(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture
def redis_url() -> Iterator[str]:
    require_service("Redis", _port_open(REDIS_URL), REDIS_URL)
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()


@pytest.fixture
def postgres() -> None:
    """For tests whose point is PostgreSQL behaviour (triggers, locking).

    They do not apply to a pass on SQLite; CI runs the suite a second time on
    PostgreSQL with RSI_REQUIRE_POSTGRES=1, where they must run, not skip."""
    if connection.vendor == "postgresql":
        return
    if os.environ.get("RSI_REQUIRE_POSTGRES") == "1":
        pytest.fail("RSI_REQUIRE_POSTGRES=1 but the suite runs on SQLite: set DATABASE_URL=postgres://...")
    pytest.skip("needs PostgreSQL (this pass runs on SQLite; set DATABASE_URL=postgres://... to run it)")


def _use_broker(url: str | None) -> None:
    """Point this process's Celery app at ``url`` (None: back to settings)."""
    from rsiweb.celery import app

    app.conf.update(broker_url=url or settings.CELERY_BROKER_URL)
    app.conf.broker_transport_options = (
        {"visibility_timeout": 3600} if url else settings.CELERY_BROKER_TRANSPORT_OPTIONS
    )
    # Drop every cached broker connection and producer pool (kombu keeps a
    # global registry), so the next publish connects to the new broker.
    kombu_pools.reset()
    app._pool = None  # type: ignore[attr-defined]  # a private cache celery-types leaves out
    app.amqp._producer_pool = None  # type: ignore[attr-defined]  # a private cache celery-types leaves out


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real Celery worker processes against the test database.

    The test must use ``@pytest.mark.django_db(transaction=True)`` so the
    worker sees committed rows. ``broker_url`` None uses the embedded
    file-system broker of this test session. By default a worker consumes
    every declared queue (the default one and the trial queue) with a
    prefork pool; ``queues`` (``-Q``, e.g. "trials") and ``pool`` ("threads")
    start the workers of a deployment that keeps trials apart.
    """
    workers: list[WorkerProcess] = []
    brokers: list[str | None] = []

    def start(
        *,
        broker_url: str | None = None,
        concurrency: int = 2,
        extra_env: dict[str, str] | None = None,
        hostname: str | None = None,
        beat: bool = False,
        pool: str = "prefork",
        queues: str | None = None,
    ) -> WorkerProcess:
        env = dict(os.environ)
        env["DATABASE_URL"] = database_url_for_subprocess()
        if broker_url:
            env["CELERY_BROKER_URL"] = broker_url
        env.update(extra_env or {})
        name = hostname or f"test-{uuid.uuid4().hex[:8]}"
        log_path = tmp_path / f"worker-{name}.log"
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "rsiweb",
            "worker",
            "--loglevel=INFO",
            f"--concurrency={concurrency}",
            f"--hostname={name}@%h",
            "--without-mingle",
            "--without-gossip",
            f"--pool={pool}",
        ]
        if queues:
            argv += ["-Q", queues]
        if beat:
            argv += ["--beat", f"--schedule={tmp_path / ('beat-' + name)}"]
        log = log_path.open("wb")
        process = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        worker = WorkerProcess(process=process, log_path=log_path, hostname=name, env=env)
        workers.append(worker)
        deadline = time.monotonic() + 60
        while " ready." not in worker.log():
            if process.poll() is not None:
                pytest.fail(f"worker exited with {process.returncode}:\n{worker.log()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker not ready after 60 s:\n{worker.log()[-4000:]}")
            time.sleep(0.2)
        if broker_url:
            brokers.append(broker_url)
            _use_broker(broker_url)
        return worker

    yield start
    for worker in workers:
        worker.stop()
    if any(brokers):
        _use_broker(None)


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout: float,
    interval: float = 0.25,
    what: str = "",
    diagnose: Callable[[], str] | None = None,
) -> None:
    """Poll ``predicate``; on timeout fail with ``what`` and, when given, what
    ``diagnose()`` says about the state reached (trial states, worker logs)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            details = f"\n{diagnose()}" if diagnose is not None else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what or predicate}{details}")
        time.sleep(interval)
