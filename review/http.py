"""Request types of the review screens, for the type checker.

Every screen needs a login (``access.permission_required``), so its request
carries a ``User`` (django-stubs' recommended ``AuthenticatedHttpRequest``);
django-htmx's middleware (in ``MIDDLEWARE``) sets ``request.htmx`` on every
request (``HtmxHttpRequest``, as django-htmx's documentation gives it).
"""

from __future__ import annotations

from django.contrib.auth.models import User
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class AuthenticatedHttpRequest(HttpRequest):
    user: User


class HtmxHttpRequest(AuthenticatedHttpRequest):
    htmx: HtmxDetails
