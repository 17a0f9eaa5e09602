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
