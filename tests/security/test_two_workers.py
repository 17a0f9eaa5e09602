"""Two workers on two machine roles (two worker processes with different
hostnames, the same PostgreSQL and Redis) finish a run with the same
certified records as one worker does."""

from __future__ import annotations

import re

import pytest

from evolution.loop import lifecycle
from evolution.models import Run
from evolution.services.records import records_verify
from lab.records import record_contents
from tests.conftest import wait_until
from tests.evolution.test_loop_crash import WORKER_ENV, finished, recipe
from tests.factories import make_tiny_experiment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.redis]

TRIAL_RECEIVED = re.compile(r"Task evolution\.trial_run\[[0-9a-f-]+\] received")


def test_two_workers_on_two_hosts_certify_the_same_records_as_one(postgres: None, redis_url: str, start_worker) -> None:
    env = {**WORKER_ENV, "RSI_TRIAL_LEASE_SECONDS": "60"}
    alone = start_worker(broker_url=redis_url, extra_env=env, hostname="solo", concurrency=1, beat=True)
    control = lifecycle.run_create(experiment=make_tiny_experiment(tasks=12, k=1, name="one-worker"), recipe=recipe())
    wait_until(lambda: finished(control), timeout=300, what="the one-worker run")
    assert control.status == Run.Status.FINISHED, control.error
    alone.stop()

    # Two "machines": only the hostname differs, as it would between hosts; one runs beat.
    first = start_worker(broker_url=redis_url, extra_env=env, hostname="worker-a", concurrency=1, beat=True)
    second = start_worker(broker_url=redis_url, extra_env=env, hostname="worker-b", concurrency=1)
    twin = make_tiny_experiment(name="two-workers", like=control.experiment)
    run = lifecycle.run_create(experiment=twin, recipe=recipe())
    wait_until(lambda: finished(run), timeout=300, what="the two-worker run")
    assert run.status == Run.Status.FINISHED, run.error

    assert len(record_contents(control.experiment)) > 5
    assert record_contents(run.experiment) == record_contents(control.experiment)
    report = records_verify(experiment=run.experiment)
    assert report.ok, report.problems
    counts = {w.hostname: len(TRIAL_RECEIVED.findall(w.log())) for w in (first, second)}
    assert all(count > 0 for count in counts.values()), f"trial_run tasks per worker: {counts}"
    assert "worker-a@" in first.log() and "worker-b@" in second.log()
