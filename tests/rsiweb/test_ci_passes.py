"""Which tests each CI pass keeps (markers: pyproject.toml, tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import reaches_database


@pytest.mark.parametrize(
    ("fixturenames", "markers"),
    [
        (["request", "db"], []),
        (["transactional_db"], []),
        (["live_server", "page"], ["browser"]),
        (["postgres"], []),
        (["django_db_setup", "django_db_blocker"], []),
        (["start_worker", "tmp_path"], []),
        (["tmp_path"], ["django_db"]),
    ],
)
def test_a_test_that_can_reach_the_database_is_kept(fixturenames: list[str], markers: list[str]) -> None:
    assert reaches_database(fixturenames, markers)


@pytest.mark.parametrize(
    ("fixturenames", "markers"),
    [
        ([], []),
        (["tmp_path", "monkeypatch", "django_db_blocker", "redis_url"], ["parametrize"]),
        (["settings"], ["slow"]),
    ],
)
def test_a_test_that_cannot_reach_the_database_is_not(fixturenames: list[str], markers: list[str]) -> None:
    assert not reaches_database(fixturenames, markers)


def _collected(marker_expression: str, *paths: str) -> set[str]:
    """The test ids a pytest run with ``-m marker_expression`` would run."""
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker_expression,
            *paths,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_markers_choose_each_ci_pass() -> None:
    """The `database` marker is added at collection, before ``-m`` selects:
    CI's PostgreSQL pass keeps a test that reaches the database and drops one
    that cannot; the SQLite pass drops the minutes-long tests."""
    paths = ("tests/evolution/test_run_start.py", "tests/rsiweb/test_ci_passes.py", "tests/rsiweb/test_dev_run.py")
    everything = _collected("", *paths)
    reaching = {test for test in everything if test.startswith(paths[0])}
    pure = {test for test in everything if test.startswith(paths[1])}
    slow = _collected("slow", *paths)
    postgres_pass = _collected("(database or slow) and not browser and not trust and not story", *paths)
    sqlite_pass = _collected("not slow", *paths)
    assert reaching and pure and slow, (reaching, pure, slow)
    assert reaching <= postgres_pass, "a test that reaches the database left the PostgreSQL pass"
    assert not pure & postgres_pass, "a test with no database ran on both passes"
    assert slow <= postgres_pass and not slow & sqlite_pass
    assert everything == sqlite_pass | postgres_pass, "a test ran on neither pass"


def test_no_pass_is_chosen_by_a_skip_variable() -> None:
    """Passes are chosen by markers; the old RSI_SKIP_* variables are gone
    from the code, the docs and CI (a leftover would skip nothing, silently)."""
    root = Path(__file__).resolve().parents[2]
    leftovers = []
    for path in [root / ".ci" / "run", root / "README.md", root / "pyproject.toml", *root.glob("docs/*.md")]:
        leftovers += [f"{path.name}: {line.strip()}" for line in path.read_text().splitlines() if "RSI_SKIP_" in line]
    for folder in ("tests", "rsiweb", "evolution", "review", "api", "lab"):
        for path in (root / folder).rglob("*.py"):
            if path.resolve() == Path(__file__).resolve():
                continue
            leftovers += [
                f"{path.name}: {line.strip()}"
                for line in path.read_text().splitlines()
                if "RSI_SKIP_" in line or "RSI_DATABASE_TESTS_ONLY" in line
            ]
    assert not leftovers, leftovers
