"""The app's error pages (templates/400.html ... 500.html, 403_csrf.html).

Django's own handlers are wrapped in ``requires_csrf_token``, which runs the
CSRF check again, and the check reads ``request.POST``. When reading the body
is what failed (a form posted in ``charset=iso-8859-1``, which Django refuses
to decode), it fails again inside the handler, then inside the 500 handler,
and the error escapes to the web server's bare "A server error occurred".
These handlers never read the request's body; the CSRF middleware has already
given the request its token, which the layout's ``{% csrf_token %}`` uses.
"""

from __future__ import annotations

from urllib.parse import quote

from django.http import HttpRequest, HttpResponse, HttpResponseServerError
from django.shortcuts import render
from django.template import loader


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    # No exception text: it may quote the request (a host name, a header).
    return render(request, "400.html", status=400)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    # Our own PermissionDenied messages say which permission is missing.
    return render(request, "403.html", {"exception": str(exception)}, status=403)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    return render(request, "404.html", {"request_path": quote(request.path)}, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    # Without the request: no user, session or context processor may touch the database that failed.
    return HttpResponseServerError(loader.render_to_string("500.html"))


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a refused form gets a 403 in the layout saying what
    to do. Django's ``reason`` is logged, not shown: it can quote the
    client's Origin header."""
    return render(request, "403_csrf.html", status=403)
