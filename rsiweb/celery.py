"""The Celery application. Configuration comes from Django settings (CELERY_*)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task
from celery.signals import task_postrun, task_prerun, worker_init
from django.db import close_old_connections
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings")

# filesystem:// is served by our safer subclass, redis:// by one that
# shares its client (see rsiweb/broker.py).
TRANSPORT_ALIASES["filesystem"] = "rsiweb.broker:Transport"
TRANSPORT_ALIASES["redis"] = TRANSPORT_ALIASES["rediss"] = "rsiweb.broker:RedisTransport"

app = Celery("rsiweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def close_obsolete_connections(sender: Task | None = None, **_: Any) -> None:
    """At each edge of a task, what Django does at each edge of a request:
    close this thread's connections that are broken or older than
    ``CONN_MAX_AGE`` (all of them when it is 0, the default), so a worker
    started with ``RSI_DB_CONN_MAX_AGE`` keeps its connection from task to
    task, and a pooled one goes back to its pool.

    Celery's own fix-up would close them all, always (settings.py turns that
    off with CELERY_DB_REUSE_MAX): every task of a prefork worker then paid a
    new PostgreSQL connection, the server's start of a backend and its cold
    caches included, and a pool of a prefork process was torn down after
    every task. A task run eagerly, inside its caller, leaves the caller's
    connections alone, as the fix-up did.
    """
    request = getattr(sender, "request", None)
    if not getattr(request, "is_eager", False):
        close_old_connections()


@worker_init.connect
def trial_ramp_configure(sender: Any = None, **_: Any) -> None:
    """Give this worker's trial slots their ramp (evolution/ramp.py): its
    slots (``--concurrency``) and ``RSI_TRIAL_RAMP_SECONDS``."""
    from django.conf import settings

    from evolution import ramp

    slots = getattr(sender, "concurrency", None)
    # "auto" is resolved after this signal, and only for a prefork pool, whose processes run one trial at a time.
    ramp.configure(seconds=settings.RSI_TRIAL_RAMP_SECONDS, slots=slots if isinstance(slots, int) and slots > 0 else 1)


def queue_everything_to(queue: str | None) -> None:
    """Send every task this process publishes to ``queue`` (trials too), or
    back to the settings' routing (trials to their own queue) with None.

    The trust suite runs each scenario on a queue of its own that one
    worker serves, so nothing of it mixes with a deployment's messages.
    """
    from django.conf import settings

    app.conf.task_default_queue = queue or settings.CELERY_TASK_DEFAULT_QUEUE
    app.conf.task_routes = {} if queue else settings.CELERY_TASK_ROUTES
    app.amqp.flush_routes()
    # The router is cached with the routes it was built with: drop it.
    vars(app.amqp).pop("router", None)
