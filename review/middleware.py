"""Content Security Policy for every response.

Only this origin's scripts, styles, images and forms; no inline script, no
eval, no plugins, no framing. Diffs, trajectories and task text are
untrusted: escaping keeps them text, and this policy stops whatever slipped
through from running. Pages therefore carry no inline ``<script>`` or
``style=`` attributes; charts use SVG presentation attributes.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

DEFAULT_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy = getattr(settings, "RSI_CSP", "") or DEFAULT_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # The admin ships inline scripts and styles of its own; it keeps
        # Django's defaults, everything else gets the strict policy.
        if not request.path.startswith("/admin/"):
            response.headers.setdefault("Content-Security-Policy", self.policy)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response
