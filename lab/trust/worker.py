"""``python -m lab.trust.worker <celery worker options>``: the Celery
worker of rsiweb, on the queue named by ``RSI_TRUST_QUEUE``.

The trust suite runs its workers on a queue of its own, so that neither its
messages nor its leftovers mix with those of a deployment sharing the broker:
every task the worker (and its embedded beat) sends goes to that queue too.
Without the variable this is the ordinary ``celery -A rsiweb worker``.

With ``RSI_FAULT_DUPLICATE_PUBLISH=1`` (the suite's duplicate-delivery
scenario, never elsewhere) every task message it publishes goes to the
broker twice, the same message with the same task id: what a broker that
delivers at least once may do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any


def duplicate_publish(app: Any) -> Callable[[], None]:
    """Make ``app`` send every task message twice; returns the undo."""
    original = app.amqp.send_task_message

    def send_twice(producer: Any, name: str, message: Any, **kwargs: Any) -> Any:
        original(producer, name, message, **kwargs)
        return original(producer, name, message, **kwargs)

    app.amqp.send_task_message = send_twice

    def undo() -> None:
        app.amqp.send_task_message = original

    return undo


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings")
    from rsiweb.celery import app, queue_everything_to

    hold = os.environ.get("RSI_TRUST_HOLD")
    if hold:
        # A standby worker: load everything now, start consuming only when
        # the file appears (the suite's replacement worker, ready in a moment).
        import django

        django.setup()
        import evolution.proposers  # noqa: F401
        import evolution.tasks  # noqa: F401

        while not os.path.exists(hold):
            time.sleep(0.02)
        # Variables read at run time (fault points) may be handed over on release.
        with open(hold) as handle:
            text = handle.read().strip()
        if text:
            os.environ.update(json.loads(text))

    queue = os.environ.get("RSI_TRUST_QUEUE")
    if queue:
        queue_everything_to(queue)
        argv = [*argv, "-Q", queue]
    if os.environ.get("RSI_FAULT_DUPLICATE_PUBLISH") == "1":
        duplicate_publish(app)
    app.worker_main(argv=["worker", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
