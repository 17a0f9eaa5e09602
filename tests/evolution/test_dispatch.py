"""Every Celery message goes through ``evolution.dispatch``: by a registered task's name, after commit, never on
a rollback; read back from a real Redis broker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from kombu import Connection

from evolution import dispatch
from tests.conftest import _use_broker


@pytest.fixture
def broker(redis_url: str) -> Iterator[str]:
    """This process's Celery app publishing to the test's Redis database."""
    _use_broker(redis_url)
    try:
        yield redis_url
    finally:
        _use_broker(None)


def received(url: str, queue: str) -> list[tuple[str, list[Any], bool]]:
    """The messages waiting on ``queue``, oldest first: (task name, arguments, has an ETA); taken off the queue."""
    found = []
    with Connection(url) as conn:
        simple = conn.SimpleQueue(queue)
        while True:
            try:
                message = simple.get(timeout=0.5)
            except simple.Empty:
                break
            args, _kwargs, _embed = message.decode()
            found.append((message.headers["task"], args, message.headers.get("eta") is not None))
            message.ack()
        simple.close()
    return found


def test_every_name_dispatch_sends_is_a_registered_task() -> None:
    import evolution.tasks  # noqa: F401  (registers the tasks, as a worker does)
    from rsiweb.celery import app

    assert sorted(dispatch.TASK_NAMES) == sorted(name for name in app.tasks if name.startswith("evolution."))


@pytest.mark.django_db(transaction=True)
def test_messages_leave_after_commit_and_never_on_a_rollback(broker: str) -> None:
    waiting = redis.Redis.from_url(broker)
    default, trials = settings.CELERY_TASK_DEFAULT_QUEUE, settings.RSI_TRIAL_QUEUE

    with transaction.atomic():
        dispatch.run_advance_after_commit(41)
        dispatch.certify_after_commit(7)
        dispatch.propose_after_commit(41, 3)
        # Still inside the transaction: nothing has left.
        assert (waiting.llen(default), waiting.llen(trials)) == (0, 0)
    assert received(broker, default) == [
        ("evolution.run_advance", [41], False),
        ("evolution.result_certify", [7], False),
        ("evolution.round_propose", [41, 3], False),
    ]

    with pytest.raises(RuntimeError), transaction.atomic():
        dispatch.trials_run_after_commit([5, 6])
        raise RuntimeError("rolled back")
    assert (waiting.llen(default), waiting.llen(trials)) == (0, 0)

    # Outside a transaction a message leaves at once; trials go to the trial queue (routed by name).
    dispatch.trials_run_after_commit([5, 6])
    dispatch.trial_run_later(5, 2, countdown=30.0)
    assert received(broker, trials) == [
        ("evolution.trial_run", [5], False),
        ("evolution.trial_run", [6], False),
        ("evolution.trial_run", [5, 2], True),
    ]
    assert waiting.llen(default) == 0
