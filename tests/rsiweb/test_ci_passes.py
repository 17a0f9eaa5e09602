"""Which tests CI's PostgreSQL pass keeps (RSI_DATABASE_TESTS_ONLY=1)."""

from __future__ import annotations

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
