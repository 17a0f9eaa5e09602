"""Eight reviewers act on the same leakage review queue at once while a run
evaluates (a real worker): one decision per item, no lost or doubled
decision, no deadlock, and every loser of a race told why (409 and a message
on the page). PostgreSQL only: SQLite serializes writers, so it cannot race."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from evolution.loop import lifecycle
from evolution.models import Candidate, ReviewDecision, ReviewItem, Run
from evolution.services.records import records_verify
from tests.conftest import wait_until
from tests.evolution.test_loop_crash import WORKER_ENV, finished, recipe
from tests.factories import make_tiny_experiment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.redis]

REVIEWERS = 8
LOSER_MESSAGE = r"already (decided|claimed|approved|rejected)|claimed by|no longer be reviewed"


def csrf_client(user: User) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.get("/review/")
    return client


def message_of(body: str) -> str:
    found = re.search(r"(Nothing changed: [^<]*|Not claimed: [^<]*)", body)
    return found.group(1) if found else ""


def test_eight_reviewers_racing_on_one_queue_make_one_decision_per_item(
    postgres: None, redis_url: str, start_worker, make_user: Any
) -> None:
    start_worker(broker_url=redis_url, extra_env={**WORKER_ENV, "RSI_TRIAL_LEASE_SECONDS": "60"}, beat=True)
    run = lifecycle.run_create(experiment=make_tiny_experiment(tasks=12, k=1, name="raced"), recipe=recipe())
    wait_until(
        lambda: ReviewItem.objects.filter(candidate__run=run).exists() or finished(run),
        timeout=240,
        what="a candidate held for review",
    )
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING  # the race happens while the run goes on
    items = list(ReviewItem.objects.filter(candidate__run=run, state=ReviewItem.State.OPEN).order_by("pk"))
    assert items
    clients = [csrf_client(make_user("reviewer", username=f"reviewer{n}")) for n in range(REVIEWERS)]
    start_together = threading.Barrier(REVIEWERS)
    results: list[tuple[int, int, str, int, str]] = []  # (reviewer, item, action, status, message)
    failures: list[str] = []

    def act(number: int, client: Client) -> None:
        token = client.cookies["csrftoken"].value
        try:
            start_together.wait(timeout=30)
            for item in items:
                # Half claim first, half decide straight away: both paths race.
                steps = ["claim", "decide"] if number % 2 == 0 else ["decide"]
                for action in steps:
                    data = {"verdict": "approve" if number % 4 < 2 else "reject", "reason": f"reviewer {number}"}
                    response = client.post(
                        f"/review/{item.pk}/{action}/", data if action == "decide" else {}, HTTP_X_CSRFTOKEN=token
                    )
                    results.append(
                        (number, item.pk, action, response.status_code, message_of(response.content.decode()))
                    )
        except Exception as exc:  # reported below: a thread must not die silently
            failures.append(f"reviewer {number}: {exc!r}")
        finally:
            connection.close()

    threads = [threading.Thread(target=act, args=(n, c)) for n, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a reviewer is stuck (deadlock?)"
    assert not failures, failures

    for item in items:
        rows = [r for r in results if r[1] == item.pk]
        decided = [r for r in rows if r[2] == "decide" and r[3] == 302]
        assert len(decided) == 1, rows  # exactly one decision got through
        decision = ReviewDecision.objects.get(item=item)  # and exactly one is stored
        assert decision.reason == f"reviewer {decided[0][0]}"
        assert decision.reviewer.username == f"reviewer{decided[0][0]}"
        for reviewer, _pk, action, status, message in rows:
            if status == 302:
                continue
            assert status == 409, (reviewer, action, status)
            assert message, f"reviewer {reviewer} got 409 on {action} without a message"
            assert re.search(
                r"already (decided|claimed|approved|rejected)|claimed by|no longer be reviewed", message
            ), message
        item.refresh_from_db()
        expected = ReviewItem.State.APPROVED if decision.verdict == ReviewDecision.Verdict.APPROVE else "rejected"
        assert item.state == expected
    assert ReviewDecision.objects.filter(item__in=items).count() == len(items)

    wait_until(lambda: finished(run), timeout=300, what="the run to finish after the reviews")
    assert run.status == Run.Status.FINISHED, run.error
    report = records_verify(experiment=run.experiment)
    assert report.ok, report.problems
    for item in items:
        candidate = Candidate.objects.get(pk=item.candidate_id)
        decision = ReviewDecision.objects.get(item=item)
        if decision.verdict == ReviewDecision.Verdict.REJECT:
            assert candidate.state == Candidate.State.REJECTED_REVIEW
        else:
            assert candidate.state not in {Candidate.State.FLAGGED, Candidate.State.REJECTED_REVIEW}
