"""A worker keeps its claim on a trial for as long as it holds it, and a
trial has one owner at a time.

The lease is renewed from the claim to the finish, including the slow parts
around the agent's run (writing the inputs out, storing the result), and a
renewal that fails once (a database restarting) does not end the renewals:
otherwise, on a loaded machine, a duplicate message for the same trial takes
a live worker's trial over, its result is thrown away, and after three such
rounds the trial ends as an infrastructure error.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from django.db import OperationalError, connection, transaction

from evolution.models import Trial
from evolution.services import evaluation as evaluation_services
from evolution.trials import run_trial
from tests.conftest import wait_until
from tests.factories import make_tiny_experiment, seed_of

pytestmark = pytest.mark.django_db(transaction=True)

LEASE_SECONDS = 1
# Long enough for the lease to lapse twice over when nobody renews it.
SLOW_INPUTS_SECONDS = 2.5 * LEASE_SECONDS


def _run_with_slow_inputs(monkeypatch: pytest.MonkeyPatch) -> tuple[Trial, list[object]]:
    """Execute one trial whose inputs take longer to write than its lease;
    meanwhile a duplicate message for it tries to claim it from another owner."""
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    trial_id = evaluation.trials.order_by("pk").values_list("pk", flat=True)[0]
    duplicate_claims: list[object] = []
    write_inputs = evaluation_services.trial_spec

    def slow_trial_spec(trial: Trial, root: Path) -> object:
        time.sleep(SLOW_INPUTS_SECONDS)
        duplicate_claims.append(evaluation_services.trial_claim(trial_id=trial.pk, owner="duplicate"))
        return write_inputs(trial, root)

    monkeypatch.setattr(evaluation_services, "trial_spec", slow_trial_spec)
    finished = evaluation_services.trial_execute(trial_id=trial_id, owner="first")
    assert finished, "the first owner's result was discarded"
    return Trial.objects.get(pk=trial_id), duplicate_claims


def test_a_trial_whose_inputs_are_slow_to_write_is_not_taken_over(monkeypatch, settings) -> None:
    settings.RSI_TRIAL_LEASE_SECONDS = LEASE_SECONDS
    trial, duplicate_claims = _run_with_slow_inputs(monkeypatch)
    assert duplicate_claims == [None], "a duplicate message took over a trial its worker still held"
    assert (trial.lease_owner, trial.attempt, trial.state) == ("first", 1, Trial.State.DONE), trial.error


def test_a_failed_lease_renewal_does_not_end_the_renewals(monkeypatch, settings) -> None:
    settings.RSI_TRIAL_LEASE_SECONDS = LEASE_SECONDS
    renew = evaluation_services.lease_renew
    calls: list[str] = []

    def renew_failing_once(*, trial: Trial, owner: str) -> bool:
        if not calls:
            calls.append("failed")
            raise OperationalError("server closed the connection unexpectedly")
        calls.append("renewed")
        return renew(trial=trial, owner=owner)

    monkeypatch.setattr(evaluation_services, "lease_renew", renew_failing_once)
    trial, duplicate_claims = _run_with_slow_inputs(monkeypatch)
    assert calls[0] == "failed" and "renewed" in calls, calls
    assert duplicate_claims == [None], "after one failed renewal the lease lapsed and the trial was taken over"
    assert (trial.lease_owner, trial.attempt) == ("first", 1)


def _waiting_on_a_lock() -> int:
    """Sessions of this database waiting for a lock (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def test_two_workers_claiming_one_pending_trial_at_once_give_it_to_one(postgres: None) -> None:
    """A duplicate message's claim that waits on the first claim's row lock
    must see the committed claim and give up: one owner, one attempt."""
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    trial_id = evaluation.trials.order_by("pk").values_list("pk", flat=True)[0]
    claims: dict[str, object] = {}
    first_holds_the_row, commit_first = threading.Event(), threading.Event()

    def claim(owner: str, *, hold: bool) -> None:
        try:
            with transaction.atomic():
                claims[owner] = evaluation_services.trial_claim(trial_id=trial_id, owner=owner)
                if hold:
                    first_holds_the_row.set()
                    commit_first.wait(60)
        finally:
            connection.close()

    first = threading.Thread(target=claim, args=("first",), kwargs={"hold": True})
    first.start()
    assert first_holds_the_row.wait(60)
    second = threading.Thread(target=claim, args=("second",), kwargs={"hold": False})
    second.start()
    try:
        wait_until(lambda: _waiting_on_a_lock() >= 1, timeout=60, what="the second claim to wait for the row")
    finally:
        commit_first.set()
        first.join(60)
        second.join(60)
    assert claims["first"] is not None
    assert claims["second"] is None, "a second worker claimed a trial the first had just claimed"
    trial = Trial.objects.get(pk=trial_id)
    assert (trial.lease_owner, trial.attempt, trial.state) == ("first", 1, Trial.State.RUNNING)


def _trials_running_slowly(
    monkeypatch: pytest.MonkeyPatch, count: int, seconds: float
) -> tuple[list[threading.Thread], list[float], threading.Event]:
    """Start ``count`` trials in threads of their own (as a thread-pool
    worker's slots run them), each agent taking ``seconds``; returns the
    threads, the times at which a lease renewal returned, and an event set
    while the (first) agent runs."""
    experiment = make_tiny_experiment(tasks=count, k=1)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    trial_ids = list(evaluation.trials.order_by("pk").values_list("pk", flat=True))
    renew = evaluation_services.lease_renew
    renewed: list[float] = []
    agent_running = threading.Event()

    def slow_run(spec: object, *, work_root: Path) -> object:
        agent_running.set()
        time.sleep(seconds)
        agent_running.clear()
        return run_trial(spec, work_root=work_root)  # type: ignore[arg-type]

    def counted_renew(*, trial: Trial, owner: str) -> bool:
        try:
            return renew(trial=trial, owner=owner)
        finally:
            renewed.append(time.monotonic())

    monkeypatch.setattr(evaluation_services, "run_trial", slow_run)
    monkeypatch.setattr(evaluation_services, "lease_renew", counted_renew)

    def slot(trial_id: int) -> None:
        try:
            assert evaluation_services.trial_execute(trial_id=trial_id, owner=f"slot-{trial_id}")
        finally:
            connection.close()

    threads = [threading.Thread(target=slot, args=(trial_id,)) for trial_id in trial_ids]
    for thread in threads:
        thread.start()
    return threads, renewed, agent_running


def _other_sessions() -> int:
    """Sessions of this database other than this thread's (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def test_renewing_a_lease_keeps_no_database_connection_while_the_agent_runs(
    postgres: None, monkeypatch, settings
) -> None:
    """A slot gives its connection back while its agent runs (minutes, for a
    real agent), and so must the renewals: one connection a trial held from
    its first renewal to its end would exhaust a worker's pool."""
    settings.RSI_TRIAL_LEASE_SECONDS = LEASE_SECONDS
    interval = LEASE_SECONDS / 3
    threads, renewed, agent_running = _trials_running_slowly(monkeypatch, count=1, seconds=6 * interval)
    between_renewals: list[int] = []
    while threads[0].is_alive():
        # While the agent runs, between a renewal and the next (one a third of
        # the lease), once the backend of a closed connection has had time to end.
        if agent_running.is_set() and renewed and 0.35 * interval < time.monotonic() - renewed[-1] < 0.8 * interval:
            sessions = _other_sessions()
            if agent_running.is_set():  # the slot has not begun its finish meanwhile
                between_renewals.append(sessions)
        time.sleep(0.02)
    threads[0].join()
    assert len(renewed) >= 3, renewed
    assert between_renewals, "no moment between two renewals was observed"
    assert max(between_renewals) == 0, f"database sessions open between renewals: {between_renewals}"
    trial = Trial.objects.get(evaluation__candidate__experiment__name__startswith="tiny")
    assert trial.state == Trial.State.DONE


def test_a_worker_renews_the_leases_of_all_its_trials_in_one_thread(monkeypatch, settings) -> None:
    settings.RSI_TRIAL_LEASE_SECONDS = LEASE_SECONDS
    threads, renewed, _agent_running = _trials_running_slowly(monkeypatch, count=4, seconds=1.5)
    wait_until(lambda: len(renewed) >= 4, timeout=30, what="the leases to be renewed")
    renewing = [thread for thread in threading.enumerate() if thread.name.startswith("lease")]
    for thread in threads:
        thread.join(60)
    assert len(renewing) == 1, [thread.name for thread in renewing]
    assert not any(thread.is_alive() for thread in threads)
    assert set(Trial.objects.values_list("state", flat=True)) == {Trial.State.DONE}
