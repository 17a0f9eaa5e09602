"""A worker's database connections from task to task, on PostgreSQL.

Celery's Django fix-up closes every connection before and after each task,
so a prefork worker opened a new PostgreSQL connection (a new server
backend, with its caches cold) for every trial, whatever
RSI_DB_CONN_MAX_AGE said. Now a task's edges follow Django's rule for a
request's: a worker started with RSI_DB_CONN_MAX_AGE keeps its connection,
and a connection the server dropped in between costs a reconnect, not a
failed task. The server's own count of the sessions opened on the test
database says how many connections the worker made.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import connection

from evolution.models import Evaluation, Experiment, Trial
from evolution.services import evaluation as evaluation_services
from lab.processes import database_url_for_subprocess
from tests.conftest import wait_until
from tests.factories import make_tiny_experiment, seed_of

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _worker_env(max_age: str) -> tuple[str, dict[str, str]]:
    """A worker's environment whose connections carry a name of their own."""
    name = f"rsiweb-test-{uuid.uuid4().hex[:8]}"
    url = f"{database_url_for_subprocess()}?application_name={name}"
    return name, {"DATABASE_URL": url, "RSI_DB_CONN_MAX_AGE": max_age}


def _live(name: str) -> int:
    """The sessions on the test database open now under ``name``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [name],
        )
        return int(cursor.fetchone()[0])


def _sessions_opened() -> int:
    """Sessions ever opened on the test database (the server's statistics;
    a session's count is flushed by the time its backend has exited)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def _evaluate(experiment: Experiment, worker: Any) -> Evaluation:
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=["train"], purpose=Evaluation.Purpose.NOISE
    )

    def done() -> bool:
        evaluation.refresh_from_db()
        return evaluation.state in {Evaluation.State.CERTIFIED, Evaluation.State.FAILED}

    wait_until(done, timeout=180, what=f"certification (worker log: {worker.log_path})")
    assert evaluation.state == Evaluation.State.CERTIFIED, worker.log()[-3000:]
    trials = Trial.objects.filter(evaluation=evaluation)
    assert not trials.exclude(state=Trial.State.DONE).exists(), list(trials.values_list("error_kind", "error"))
    assert not trials.filter(attempt__gt=1).exists()
    return evaluation


@pytest.mark.parametrize("max_age", ["60", "0"])
def test_a_prefork_worker_keeps_its_connection_from_task_to_task_when_told_to(
    postgres: None, start_worker: Any, max_age: str
) -> None:
    experiment = make_tiny_experiment(tasks=4, k=2)
    name, env = _worker_env(max_age)
    before = _sessions_opened()
    worker = start_worker(concurrency=1, extra_env=env)
    evaluation = _evaluate(experiment, worker)
    tasks = Trial.objects.filter(evaluation=evaluation).count() + 1  # the trials and the certification
    assert tasks >= 5
    worker.stop()
    wait_until(lambda: _live(name) == 0, timeout=30, what="the worker's sessions ended")
    opened = _sessions_opened() - before
    if max_age == "0":
        # Django's default: closed at the end of each task, so one a task.
        assert opened >= tasks, (opened, tasks)
    else:
        # The pool process's one connection (and at most one more, should
        # the worker's main process have looked at the database).
        assert 1 <= opened <= 2, (opened, tasks)


def test_a_connection_the_server_dropped_between_tasks_costs_a_reconnect_not_a_task(
    postgres: None, start_worker: Any
) -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    name, env = _worker_env("60")
    worker = start_worker(concurrency=1, extra_env=env)
    _evaluate(experiment, worker)
    assert _live(name) == 1  # the worker kept its connection
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [name],
        )
        assert cursor.fetchone()[0] == 1
    wait_until(lambda: _live(name) == 0, timeout=30, what="the worker's session ended")
    # Every trial is claimed at its first attempt: the health check before
    # the first query of the next task found the connection gone and made a
    # new one, where without it the claim itself would have failed.
    _evaluate(experiment, worker)
    assert _live(name) == 1
