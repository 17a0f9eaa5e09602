"""Failed logins are throttled per username and per client address, in the
database so that every web process shares the count."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client, override_settings

from review.models import LoginFailure
from tests.conftest import REPO_ROOT, database_url_for_subprocess

if TYPE_CHECKING:  # the test client's response, as django-stubs names it
    from django.test.client import _MonkeyPatchedWSGIResponse as TestResponse

pytestmark = pytest.mark.django_db

LIMIT = 3
WINDOW = 60
THROTTLE = {"RSI_LOGIN_FAILURES": LIMIT, "RSI_LOGIN_ADDRESS_FAILURES": 6, "RSI_LOGIN_WINDOW_SECONDS": WINDOW}


def attempt(username: str, password: str, *, address: str = "203.0.113.7", path: str = "/login/") -> TestResponse:
    # A fresh client each time: a web farm does not share a session between attempts.
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


def age_failures(seconds: int) -> None:
    """Move every recorded failure ``seconds`` into the past (as if time passed)."""
    for failure in LoginFailure.objects.all():
        LoginFailure.objects.filter(pk=failure.pk).update(failed_at=failure.failed_at - timedelta(seconds=seconds))


@override_settings(**THROTTLE)
def test_repeated_failures_lock_the_account_with_429_and_a_message(make_user: Callable[..., User]) -> None:
    make_user("viewer", username="vera")
    for _ in range(LIMIT):
        response = attempt("vera", "wrong")
        assert response.status_code == 200
        assert b"did not match" in response.content
    response = attempt("vera", "wrong")
    assert response.status_code == 429
    body = response.content.decode()
    assert "Too many failed logins for this account or from this address" in body
    assert "try again later" in body
    assert 0 < int(response["Retry-After"]) <= WINDOW
    # Refused failures are not counted again: the lock does not extend itself.
    assert LoginFailure.objects.filter(scope="username", key="vera").count() == LIMIT


@override_settings(**THROTTLE)
def test_the_right_password_is_refused_while_locked_then_works_after_the_window(
    make_user: Callable[..., User],
) -> None:
    make_user("viewer", username="vera")
    for _ in range(LIMIT):
        attempt("vera", "wrong", address="198.51.100.1")
    client = Client(REMOTE_ADDR="198.51.100.2")  # another address: the username alone locks
    response = client.post("/login/", {"username": "vera", "password": "pw-vera"})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    # Case does not dodge the lock.
    assert attempt("VERA", "pw-vera", address="198.51.100.3").status_code == 429

    age_failures(WINDOW + 1)
    response = client.post("/login/", {"username": "vera", "password": "pw-vera"})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.session["_auth_user_id"] == str(User.objects.get(username="vera").pk)
    assert not LoginFailure.objects.filter(scope="username", key="vera").exists()  # expired rows are gone too


@override_settings(**THROTTLE)
def test_a_success_resets_the_count(make_user: Callable[..., User]) -> None:
    make_user("viewer", username="vera")
    for _ in range(LIMIT - 1):
        attempt("vera", "wrong")
    assert attempt("vera", "pw-vera").status_code == 302
    for _ in range(LIMIT - 1):
        assert attempt("vera", "wrong").status_code == 200
    assert attempt("vera", "pw-vera").status_code == 302


@override_settings(**THROTTLE)
def test_other_users_are_unaffected_by_one_locked_account(make_user: Callable[..., User]) -> None:
    make_user("viewer", username="vera")
    make_user("viewer", username="otto")
    for _ in range(LIMIT):
        attempt("vera", "wrong", address="192.0.2.10")
    assert attempt("vera", "pw-vera", address="192.0.2.11").status_code == 429
    assert attempt("otto", "pw-otto", address="192.0.2.11").status_code == 302
    assert attempt("otto", "pw-otto", address="192.0.2.10").status_code == 302


@override_settings(**THROTTLE)
def test_one_address_guessing_many_accounts_is_locked_out(make_user: Callable[..., User]) -> None:
    make_user("viewer", username="vera")
    for number in range(6):
        assert attempt(f"guess{number}", "wrong", address="192.0.2.66").status_code == 200
    assert attempt("vera", "pw-vera", address="192.0.2.66").status_code == 429
    assert attempt("vera", "pw-vera", address="192.0.2.67").status_code == 302


@override_settings(**THROTTLE, RSI_BEHIND_PROXY=True)
def test_behind_the_proxy_the_address_is_the_one_the_proxy_appended(make_user: Callable[..., User]) -> None:
    make_user("viewer", username="vera")
    for number in range(6):
        # The client forges the first X-Forwarded-For entry; the proxy appends the real one.
        Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR=f"1.2.3.{number}, 192.0.2.99").post(
            "/login/", {"username": f"guess{number}", "password": "wrong"}
        )
    client = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="9.9.9.9, 192.0.2.99")
    assert client.post("/login/", {"username": "vera", "password": "pw-vera"}).status_code == 429
    other = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="192.0.2.100")
    assert other.post("/login/", {"username": "vera", "password": "pw-vera"}).status_code == 302


@override_settings(**THROTTLE)
def test_the_admin_login_shares_the_throttle(make_user: Callable[..., User]) -> None:
    user = make_user("admin", username="root")
    User.objects.filter(pk=user.pk).update(is_staff=True)
    for _ in range(LIMIT):
        assert attempt("root", "wrong", path="/admin/login/").status_code == 200
    assert attempt("root", "pw-root", path="/admin/login/").status_code == 429
    assert attempt("root", "pw-root", path="/login/").status_code == 429
    age_failures(WINDOW + 1)
    assert attempt("root", "pw-root", path="/admin/login/").status_code == 302


SUBPROCESS_ATTEMPTS = """
import sys
import django
django.setup()
from django.conf import settings
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()
settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
for _ in range(int(sys.argv[1])):
    print(Client(REMOTE_ADDR=sys.argv[2]).post("/login/", {"username": "vera", "password": "wrong"}).status_code)
"""


@pytest.mark.django_db(transaction=True)
def test_failures_in_two_other_web_processes_add_up(make_user: Callable[..., User]) -> None:
    """Two separate processes (as two web servers) fail in turn; the second is
    refused once both together reach the limit, and so is this process."""
    make_user("viewer", username="vera")
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess(), "DJANGO_SETTINGS_MODULE": "rsiweb.settings"}
    env.pop("RSI_LOGIN_FAILURES", None)
    assert settings.RSI_LOGIN_FAILURES == 5  # the production default, as in the subprocesses
    statuses = []
    for address in ("192.0.2.1", "192.0.2.2"):
        result = subprocess.run(
            [sys.executable, "-c", SUBPROCESS_ATTEMPTS, "3", address],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        statuses.append(result.stdout.split())
    assert statuses == [["200", "200", "200"], ["200", "200", "429"]]
    assert LoginFailure.objects.filter(scope="username", key="vera").count() == 5
    assert attempt("vera", "pw-vera", address="192.0.2.3").status_code == 429


# Spellings the login form and backend turn into "throttleuser": padded, and with a fullwidth t (NFKC).
SPELLINGS = ("throttleuser", "throttleuser ", " throttleuser", "\uff54hrottleuser", "\u3000throttleuser\t")


@override_settings(**THROTTLE)
def test_every_spelling_of_a_name_logs_in_to_the_same_account(make_user: Callable[..., User]) -> None:
    """The premise of the lock tests below: Django strips and NFKC-normalizes
    the name, so each spelling, with the right password, is the same user."""
    user = make_user("viewer", username="throttleuser")
    for number, spelling in enumerate(SPELLINGS):
        client = Client(REMOTE_ADDR=f"192.0.2.{number + 1}")
        response = client.post("/login/", {"username": spelling, "password": "pw-throttleuser"})
        assert response.status_code == 302, spelling
        assert client.session["_auth_user_id"] == str(user.pk)
    assert not LoginFailure.objects.exists()


@override_settings(**THROTTLE)
@pytest.mark.parametrize("spelling", SPELLINGS[1:])
def test_no_spelling_of_a_locked_name_logs_in(spelling: str, make_user: Callable[..., User]) -> None:
    make_user("viewer", username="throttleuser")
    for _ in range(LIMIT):
        assert attempt("throttleuser", "wrong", address="198.51.100.1").status_code == 200
    client = Client(REMOTE_ADDR="198.51.100.2")
    response = client.post("/login/", {"username": spelling, "password": "pw-throttleuser"})
    assert response.status_code == 429
    assert "_auth_user_id" not in client.session
    assert attempt(spelling, "pw-throttleuser", address="198.51.100.3", path="/admin/login/").status_code == 429
    assert LoginFailure.objects.filter(scope="username").count() == LIMIT  # refusals are not counted


@override_settings(**THROTTLE)
def test_each_spelling_spends_the_same_budget(make_user: Callable[..., User]) -> None:
    """Failures with different spellings, each from its own address, add up
    to one account's count: no spelling gets a fresh budget of guesses."""
    make_user("viewer", username="throttleuser")
    for number, spelling in enumerate(SPELLINGS[1 : LIMIT + 1]):
        assert attempt(spelling, "wrong", address=f"203.0.113.{number + 1}").status_code == 200
    assert list(LoginFailure.objects.filter(scope="username").values_list("key", flat=True)) == ["throttleuser"] * LIMIT
    for number, spelling in enumerate(SPELLINGS):
        assert attempt(spelling, "pw-throttleuser", address=f"203.0.113.{number + 10}").status_code == 429, spelling
    assert attempt("THROTTLEUSER", "pw-throttleuser", address="203.0.113.20").status_code == 429


@override_settings(**THROTTLE)
def test_a_success_with_another_spelling_clears_the_account_s_count(make_user: Callable[..., User]) -> None:
    make_user("viewer", username="throttleuser")
    for _ in range(LIMIT - 1):
        attempt("throttleuser", "wrong")
    assert attempt("\uff54hrottleuser ", "pw-throttleuser").status_code == 302
    assert not LoginFailure.objects.filter(scope="username").exists()
    assert LoginFailure.objects.filter(scope="address").count() == LIMIT - 1


# --- Concurrent attempts ------------------------------------------------------------

CONCURRENT = 40


def attempt_together(posts: list[tuple[str, str]]) -> list[int]:
    """POST every ``(username, address)`` with a wrong password, each from its
    own thread (its own database connection, as in a threaded web server),
    all released at once; the statuses in the order given."""
    barrier = threading.Barrier(len(posts))

    def post(username: str, address: str) -> int:
        try:
            client = Client(REMOTE_ADDR=address)
            barrier.wait(timeout=60)
            return client.post("/login/", {"username": username, "password": "wrong"}).status_code
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(posts)) as pool:
        return list(pool.map(lambda args: post(*args), posts))


@pytest.mark.django_db(transaction=True)
@override_settings(RSI_LOGIN_FAILURES=5, RSI_LOGIN_ADDRESS_FAILURES=100, RSI_LOGIN_WINDOW_SECONDS=WINDOW)
def test_concurrent_wrong_passwords_for_one_account_check_at_most_the_limit(make_user: Callable[..., User]) -> None:
    """40 wrong passwords for one account at once, from 40 addresses: five
    are checked (the form again), 35 are refused unchecked. Counting first
    and recording after the check let all 40 through."""
    make_user("viewer", username="vera")
    statuses = attempt_together([("vera", f"198.51.100.{number}") for number in range(CONCURRENT)])
    assert (statuses.count(200), statuses.count(429)) == (5, CONCURRENT - 5)
    assert LoginFailure.objects.filter(scope="username", key="vera").count() == 5
    assert LoginFailure.objects.filter(scope="address").count() == 5


@pytest.mark.django_db(transaction=True)
@override_settings(RSI_LOGIN_FAILURES=100, RSI_LOGIN_ADDRESS_FAILURES=8, RSI_LOGIN_WINDOW_SECONDS=WINDOW)
def test_concurrent_wrong_passwords_from_one_address_check_at_most_the_limit(make_user: Callable[..., User]) -> None:
    """40 guesses at once from one address, each at another account: eight
    are checked, 32 refused unchecked."""
    for number in range(CONCURRENT):
        make_user("viewer", username=f"user{number}")
    statuses = attempt_together([(f"user{number}", "203.0.113.66") for number in range(CONCURRENT)])
    assert (statuses.count(200), statuses.count(429)) == (8, CONCURRENT - 8)
    assert LoginFailure.objects.filter(scope="address", key="203.0.113.66").count() == 8
    assert LoginFailure.objects.filter(scope="username").count() == 8


# --- Names and addresses the database could not store ------------------------------


@override_settings(**THROTTLE)
@pytest.mark.parametrize(
    ("path", "message"),
    [("/login/", "Your username and password did not match."), ("/admin/login/", "Null characters are not allowed.")],
)
def test_a_nul_in_the_name_gets_the_form_s_message_and_counts_for_the_address_only(
    path: str, message: str, make_user: Callable[..., User]
) -> None:
    """PostgreSQL cannot look a name with a NUL up (nor store it): the form
    refuses such a name before any password is checked, and so does the
    throttle, counting the attempt against the address alone."""
    make_user("viewer", username="vera")
    response = attempt("ve\x00ra", "pw-vera", path=path)
    assert response.status_code == 200
    assert message in response.content.decode()
    assert list(LoginFailure.objects.values_list("scope", "key")) == [("address", "203.0.113.7")]


@override_settings(**THROTTLE, RSI_BEHIND_PROXY=True)
def test_a_nul_in_the_proxy_s_address_is_dropped_from_the_key(make_user: Callable[..., User]) -> None:
    make_user("viewer", username="vera")
    client = Client(REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="192.0.2.\x0099")
    response = client.post("/login/", {"username": "vera", "password": "wrong"})
    assert response.status_code == 200
    assert b"did not match" in response.content
    assert sorted(LoginFailure.objects.values_list("scope", "key")) == [("address", "192.0.2.99"), ("username", "vera")]
