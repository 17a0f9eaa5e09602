"""The Celery application. Configuration comes from Django settings (CELERY_*)."""

from __future__ import annotations

import os

from celery import Celery
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings")

# filesystem:// is served by our safer subclass (see rsiweb/broker.py).
TRANSPORT_ALIASES["filesystem"] = "rsiweb.broker:Transport"

app = Celery("rsiweb")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


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
