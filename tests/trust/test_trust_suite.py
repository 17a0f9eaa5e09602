"""The trust suite, run as CI runs it: ``manage.py trust_suite`` in a
subprocess against PostgreSQL and Redis, and proof that it can fail."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.worker, pytest.mark.postgres, pytest.mark.redis]


def suite_env(redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of this test session: its PostgreSQL server (the
    suite makes a throwaway database there) and its Redis db as the broker."""
    db = connection.settings_dict
    env = dict(os.environ)
    env.pop("RSI_TEST_DB_SUFFIX", None)
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    # The session's own database is only the entry point; the suite never writes to it.
    env["DATABASE_URL"] = f"postgres://{auth}{db.get('HOST') or 'localhost'}{port}/{db['NAME']}"
    env["CELERY_BROKER_URL"] = redis_url
    env.update(extra)
    return env


def run_suite(env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "trust_suite", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.trust
def test_the_whole_suite_passes_once_on_both_benchmarks(postgres: None, redis_url: str) -> None:
    result = run_suite(suite_env(redis_url), "--trials", "1")
    output = result.stdout + result.stderr
    print(result.stdout)  # the suite's own lines, for CI's log (its stream runs with -s)
    assert result.returncode == 0, output[-6000:]
    closing = result.stdout.strip().splitlines()[-1]
    assert ", 0 failed" in closing, output[-6000:]
    assert int(closing.split(" passed")[0]) > 0, closing


def test_a_broken_platform_is_caught(postgres: None, redis_url: str) -> None:
    """With every worker started without its reaper (beat),
    a worker killed mid-evaluation leaves its trial for ever: the suite must
    say failed, not passed."""
    env = suite_env(redis_url, RSI_TRUST_BREAK="no-reaper", RSI_TRUST_TIMEOUT="25")
    result = run_suite(env, "--trials", "1", "--scenario", "2a-crash-eval-child", "--benchmark", "harbor")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-6000:]
    assert result.stdout.strip().splitlines()[-1].startswith("0 passed, 1 failed"), output[-6000:]
    # The failed trial's worker logs outlive the suite's throwaway folder.
    kept = re.search(r"the trial's worker logs are kept in (\S+)\)", result.stdout)
    assert kept is not None, output[-6000:]
    logs = sorted(Path(kept.group(1)).glob("*worker-*.log"))
    try:
        assert logs and any(" ready." in log.read_text() for log in logs), logs
    finally:
        shutil.rmtree(kept.group(1), ignore_errors=True)
