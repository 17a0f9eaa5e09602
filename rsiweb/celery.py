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
