"""Login throttling: too many failed logins lock an account and an address.

After ``RSI_LOGIN_FAILURES`` failed logins for one account, or
``RSI_LOGIN_ADDRESS_FAILURES`` from one client address, within
``RSI_LOGIN_WINDOW_SECONDS``, every further attempt (even with the right
password) gets HTTP 429 with a message saying how long to wait, and the
password is not even checked. A successful login clears the account's count
(not the address's: an attacker holding one valid account must not be able
to reset the counter of the address they guess other accounts from).

Failures are counted against the account the posted name resolves to, not
the name as typed: Django's login form strips the name and NFKC-normalizes
it before its backend looks the user up, so ``"vera "``, ``" vera"`` and a
fullwidth ``"ｖera"`` all log in as ``vera``, and each must spend the same
budget (``account_key``).

An attempt is counted as a failure before its password is checked, and the
count is taken back if the login succeeds (``login_attempt_reserve``):
concurrent guesses cannot all be checked before any of them is counted.

The failures are rows in the database (``review.models.LoginFailure``), not a
local-memory cache: several web processes on several machines share one
count. Wrap a login view with ``throttled``; the site login and the admin
login both are (rsiweb/urls.py).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.http import HttpRequest, HttpResponseBase
from django.shortcuts import render
from django.utils import timezone

from review.models import LoginFailure

View = Callable[..., HttpResponseBase]


def client_address(request: HttpRequest) -> str:
    """The client's address. Behind our TLS proxy (RSI_BEHIND_PROXY=1) that is
    the last X-Forwarded-For entry, the one the proxy itself appended; earlier
    entries come from the client and could be forged."""
    address = str(request.META.get("REMOTE_ADDR", ""))
    if settings.RSI_BEHIND_PROXY:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if part.strip()]
        if forwarded:
            address = forwarded[-1]
    # PostgreSQL refuses a NUL in a text column: the key would fail the request with a 500.
    return address.replace("\x00", "")[:255]


def account_key(username: str) -> str:
    """The key a login attempt with the posted ``username`` is counted under:
    the account it logs in to, whatever its spelling; "" for none.

    The name goes through exactly what the login form and the backend do with
    it: the form's username field (strip, then NFKC, as
    ``AbstractBaseUser.normalize_username``), then the user model's own
    lookup (``get_by_natural_key``, whose case handling is the database's).
    A name that resolves to an account is counted under that account's
    stored name; one that resolves to none under the normalized name. Both
    are case-folded, so ``VERA`` and ``vera`` share one count even where the
    lookup tells them apart (an over-count, never a fresh budget). A name the
    form refuses (empty, or with a NUL) gets "".
    """
    try:
        name = AuthenticationForm().fields["username"].clean(username)
    except ValidationError:
        # The form refuses the name itself (empty, or with a NUL, which
        # PostgreSQL could not even look up): no password is checked and no
        # account is at stake, so only the address counts the attempt.
        return ""
    user_model = get_user_model()
    with contextlib.suppress(user_model.DoesNotExist, user_model.MultipleObjectsReturned):
        name = user_model._default_manager.get_by_natural_key(name).get_username()
    return name.casefold()[:255]


def _keys(username: str, address: str) -> list[tuple[LoginFailure.Scope, str, int]]:
    keys = [(LoginFailure.Scope.ADDRESS, address, settings.RSI_LOGIN_ADDRESS_FAILURES)]
    account = account_key(username)
    if account:
        keys.insert(0, (LoginFailure.Scope.USERNAME, account, settings.RSI_LOGIN_FAILURES))
    return keys


def _lock(keys: list[tuple[LoginFailure.Scope, str, int]]) -> None:
    """Serialize the attempts on these keys until the transaction ends.

    PostgreSQL: one advisory lock per key, taken in a fixed order so that two
    attempts sharing one key (an account, an address) cannot deadlock. SQLite
    needs none: its transactions begin IMMEDIATE (rsiweb/settings.py), so the
    database's one write lock already lets a single attempt in at a time."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for scope, key in sorted((scope, key) for scope, key, _limit in keys):
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"review.login:{scope}:{key}"])


@dataclass(frozen=True)
class Attempt:
    """A login attempt let through (``wait`` 0, counted as a failure in the
    rows ``reserved`` until it succeeds) or refused (``wait`` seconds)."""

    wait: int
    reserved: tuple[int, ...] = ()


def login_attempt_reserve(*, username: str, address: str) -> Attempt:
    """Let one login for ``username`` from ``address`` through, or refuse it.

    Let through, the attempt is recorded as a failure *before* its password
    is checked (``login_succeeded`` takes that back): checking first and
    recording afterwards let every one of 40 concurrent wrong passwords be
    checked, since each counted the failures before any was recorded. The
    count and the record are one transaction under a lock per key
    (``_lock``), so concurrent attempts are let through one at a time and at
    most the limit of them per window. Refused, nothing is recorded (a lock
    does not extend itself). Deletes failures older than the window. Each
    call is one attempt: not safe to repeat."""
    keys = _keys(username, address)
    now = timezone.now()
    since = now - timedelta(seconds=settings.RSI_LOGIN_WINDOW_SECONDS)
    wait = 0.0
    with transaction.atomic():
        _lock(keys)
        for scope, key, limit in keys:
            LoginFailure.objects.filter(scope=scope, key=key, failed_at__lt=since).delete()
            times = list(
                LoginFailure.objects.filter(scope=scope, key=key, failed_at__gte=since)
                .order_by("-failed_at")
                .values_list("failed_at", flat=True)[:limit]
            )
            if len(times) >= limit:
                # Locked until the oldest of the last ``limit`` failures leaves the window.
                wait = max(wait, (times[-1] - since).total_seconds())
        if wait > 0:
            return Attempt(wait=math.ceil(wait))
        rows = [LoginFailure.objects.create(scope=scope, key=key, failed_at=now) for scope, key, _limit in keys]
    return Attempt(wait=0, reserved=tuple(row.pk for row in rows))


def login_succeeded(*, username: str, attempt: Attempt) -> None:
    """Take back ``attempt``'s reserved failure and clear the account's count
    (not the address's: see the module's docstring). Safe to repeat."""
    LoginFailure.objects.filter(pk__in=attempt.reserved).delete()
    LoginFailure.objects.filter(scope=LoginFailure.Scope.USERNAME, key=account_key(username)).delete()


def lockout_message(wait: int) -> str:
    minutes = max(1, math.ceil(wait / 60))
    return (
        "Too many failed logins for this account or from this address. "
        f"Logins are refused for about {minutes} minute{'s' if minutes != 1 else ''}; try again later."
    )


def throttled(view: View) -> View:
    """``view`` (a login view: redirects on success, shows the form again on
    failure) with the throttle in front of its POST."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if request.method != "POST":
            return view(request, *args, **kwargs)
        username = str(request.POST.get("username", ""))
        address = client_address(request)
        attempt = login_attempt_reserve(username=username, address=address)
        if attempt.wait:
            context = {"locked": lockout_message(attempt.wait), "next": request.POST.get("next", "")}
            refused = render(request, "registration/login.html", context, status=429)
            refused["Retry-After"] = str(attempt.wait)
            return refused
        response = view(request, *args, **kwargs)
        # A failure (the form again, or an error) keeps the reserved failure.
        if response.status_code in (301, 302, 303):
            login_succeeded(username=username, attempt=attempt)
        return response

    return wrapped
