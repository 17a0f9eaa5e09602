"""Error pages: the app's own 400, 403, 404 and 500 pages, never Django's
debug pages (every URL pattern on a 404, the settings on a 500) unless
RSI_DEBUG=1 asks for them.

The first tests start the web server ``python3.11 dev.py run`` starts (the
same command line, ``dev.web_server_command``) with the default
environment, as one person's laptop runs it, and talk HTTP to it."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import django
import pytest
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path, reverse

import dev
from review.models import LoginFailure
from rsiweb import urls as site_urls
from tests.conftest import DEPLOYMENT_PASSWORD_HASHERS, REPO_ROOT, database_url_for_subprocess
from tests.factories import make_tiny_experiment

# The broker's password: Django's debug page would show it (CELERY_BROKER_URL is not a name it hides).
CANARY = "canary-pw-7f3c1e"
# What Django's debug pages say; none of it may reach a client.
DEBUG_PAGE_WORDS = ("URLconf", "Django tried these URL patterns", "Traceback", "DATABASE_URL", "INSTALLED_APPS")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def default_env(tmp_path: Path, database_url: str) -> dict[str, str]:
    """The laptop's environment: nothing of rsiweb's set but where its files,
    its database and its broker are (no DEBUG, no RSI_DEBUG). The broker (with
    a password) is never reached by these requests."""
    env = {key: value for key, value in os.environ.items() if key in {"PATH", "HOME", "LANG", "TMPDIR"}}
    env.update(
        RSI_VAR_DIR=str(tmp_path / "var"),
        DATABASE_URL=database_url,
        CELERY_BROKER_URL=f"redis://:{CANARY}@127.0.0.1:{free_port()}/0",
    )
    return env


def unmigrated_database(tmp_path: Path) -> str:
    """A database without tables: the server starts, and any request that
    reads a session fails inside a view (a 500)."""
    return f"sqlite:///{tmp_path / 'unmigrated.sqlite3'}"


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[Callable[[str], int]]:
    """``start(database_url)`` runs dev.py's web server and returns its port; stopped afterwards."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(database_url: str) -> int:
        port = free_port()
        log = (tmp_path / f"web-{port}.log").open("wb")
        process = subprocess.Popen(
            dev.web_server_command("127.0.0.1", str(port)),
            cwd=REPO_ROOT,
            env=default_env(tmp_path, database_url),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        processes.append(process)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / f"web-{port}.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return port
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"the web server did not listen within 90 s: {(tmp_path / f'web-{port}.log').read_text()}")

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=30)


def fetch(
    port: int, target: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: str = ""
) -> tuple[int, str, http.client.HTTPMessage]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, target, body=body.encode() or None, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace"), response.headers
    finally:
        connection.close()


def assert_no_debug_page(body: str) -> None:
    assert CANARY not in body
    for word in DEBUG_PAGE_WORDS:
        assert word not in body, word


def test_the_default_web_server_shows_the_app_s_error_pages_and_nothing_of_its_settings(
    web_server, tmp_path: Path
) -> None:
    """A 404, a 500 (the database has no tables, so reading the session
    fails) and a 400 (a host the server does not answer for) get the app's
    pages in its layout; nothing lists URL patterns or shows the settings,
    the broker URL's password least of all."""
    port = web_server(unmigrated_database(tmp_path))

    status, body, _headers = fetch(port, "/no-such-page/")
    assert_no_debug_page(body)
    assert "api/v1/" not in body and "admin/login/" not in body
    assert status == 404
    assert "<h1>Page not found (404)</h1>" in body
    assert "There is no page at <code>/no-such-page/</code>, or none you may see." in body
    assert '<link rel="stylesheet" href="/static/review/app.css">' in body

    status, body, _headers = fetch(port, "/login/", headers={"Cookie": "sessionid=abcdefghijklmnopqrstuvwxyz012345"})
    assert_no_debug_page(body)
    assert status == 500
    assert "<h1>Server error (500)</h1>" in body
    assert "the error has been logged" in body
    assert '<link rel="stylesheet" href="/static/review/app.css">' in body

    status, body, _headers = fetch(port, "/login/", headers={"Host": "rsi.attacker.example"})
    assert_no_debug_page(body)
    assert "rsi.attacker.example" not in body
    assert status == 400
    assert "<h1>Bad request (400)</h1>" in body


def test_a_form_posted_in_latin_1_gets_the_app_s_400_and_404_pages(web_server, tmp_path: Path) -> None:
    """Django refuses to decode a form body that is not UTF-8 (400). Its own
    error handlers run the CSRF check again, which reads the body again: the
    error escaped every handler, and the server answered its bare "A server
    error occurred". The app's handlers never read the body."""
    port = web_server(unmigrated_database(tmp_path))
    status, page, headers = fetch(port, "/login/")
    assert status == 200
    found = re.search(r"csrftoken=([^;]+)", " ".join(headers.get_all("Set-Cookie") or []))
    assert found is not None
    cookie = {"Cookie": f"csrftoken={found.group(1)}"}
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None
    body = f"username=v%E9ra&password=x&csrfmiddlewaretoken={found.group(1)}"
    latin_1 = {**cookie, "Content-Type": "application/x-www-form-urlencoded; charset=iso-8859-1"}
    for target, expected, heading in (
        ("/login/", 400, "<h1>Bad request (400)</h1>"),
        ("/no-such-page/", 404, "<h1>Page not found (404)</h1>"),
    ):
        status, page, _headers = fetch(port, target, method="POST", headers=latin_1, body=body)
        assert status == expected, page
        assert heading in page
        assert '<link rel="stylesheet" href="/static/review/app.css">' in page
        assert_no_debug_page(page)


def test_the_default_web_server_serves_static_files_with_debug_off(web_server, tmp_path: Path) -> None:
    port = web_server(unmigrated_database(tmp_path))
    status, body, headers = fetch(port, "/static/review/app.css")
    assert status == 200
    assert body == (REPO_ROOT / "static" / "review" / "app.css").read_text()
    assert headers["Content-Type"].startswith("text/css")
    status, body, _headers = fetch(port, "/static/admin/css/base.css")
    admin_css = Path(django.__file__).parent / "contrib" / "admin" / "static" / "admin" / "css" / "base.css"
    assert status == 200 and body == admin_css.read_text()
    status, _body, _headers = fetch(port, "/static/review/no-such-file.css")
    assert status == 404


@pytest.mark.django_db(transaction=True)
def test_the_default_web_server_serves_the_screens_with_debug_off(web_server, make_user, settings) -> None:
    """Log in through the form, then the home page, a dashboard and a
    candidate page open (with their static files) and the admin for staff."""
    # The server checks the password with the deployment's hasher, not the tests' MD5.
    settings.PASSWORD_HASHERS = DEPLOYMENT_PASSWORD_HASHERS
    experiment = make_tiny_experiment()
    user = make_user("operator", username="olga")
    User.objects.filter(pk=user.pk).update(is_staff=True)
    port = web_server(database_url_for_subprocess())

    status, page, headers = fetch(port, "/login/")
    assert status == 200
    found = re.search(r"csrftoken=([^;]+)", " ".join(headers.get_all("Set-Cookie") or []))
    assert found is not None
    csrf = found.group(1)
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None
    form_token = found.group(1)
    status, _body, headers = fetch(
        port,
        "/login/",
        method="POST",
        headers={"Cookie": f"csrftoken={csrf}", "Content-Type": "application/x-www-form-urlencoded"},
        body=f"username=olga&password=pw-olga&csrfmiddlewaretoken={form_token}",
    )
    assert status == 302 and headers["Location"] == "/"
    found = re.search(r"sessionid=([^;]+)", " ".join(headers.get_all("Set-Cookie") or []))
    assert found is not None
    session = found.group(1)
    cookies = {"Cookie": f"csrftoken={csrf}; sessionid={session}"}

    assets: set[str] = set()
    for target, expected in (
        ("/", experiment.name),
        (f"/experiments/{experiment.pk}/", experiment.name),
        (f"/candidates/{experiment.seed_candidate_id}/", "seed"),
        ("/admin/", "Site administration"),
        ("/admin/evolution/run/", "Select run to view"),
    ):
        status, body, _headers = fetch(port, target, headers=cookies)
        assert status == 200, target
        assert expected in body, target
        assets.update(re.findall(r'(?:href|src)="(/static/[^"]+)"', body))
    assert {"/static/review/app.css", "/static/review/app.js", "/static/admin/css/base.css"} <= assets
    for asset in sorted(assets):
        assert fetch(port, asset)[0] == 200, asset


# --- The pages themselves, in the test process ------------------------------------------


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError(f"the database password is {CANARY}")


def forbidden(request: HttpRequest) -> HttpResponse:
    raise PermissionDenied("you need the evolution.operate_runs permission for this")


urlpatterns = [path("test-boom/", boom), path("test-forbidden/", forbidden), *site_urls.urlpatterns]


@pytest.mark.urls(__name__)
def test_a_crashing_view_gets_the_500_page_in_the_layout(db) -> None:
    client = Client(raise_request_exception=False)
    response = client.get("/test-boom/")
    assert response.status_code == 500
    body = response.content.decode()
    assert "<h1>Server error (500)</h1>" in body
    assert 'href="/"' in body and "Back to the experiments" in body
    assert_no_debug_page(body)
    assert "RuntimeError" not in body


@pytest.mark.urls(__name__)
def test_a_403_says_why_in_the_layout_with_the_user_s_menu(make_user) -> None:
    client = Client()
    client.force_login(make_user("viewer", username="vera"))
    response = client.get("/test-forbidden/")
    assert response.status_code == 403
    body = response.content.decode()
    assert "<h1>Forbidden (403)</h1>" in body
    assert "You need the evolution.operate_runs permission for this." in body
    assert "vera" in body and 'href="/review/"' in body  # the signed-in layout: user and menu


def test_a_404_for_a_signed_in_user_is_in_the_layout(make_user) -> None:
    client = Client()
    client.force_login(make_user("viewer", username="vera"))
    response = client.get(reverse("review:experiment", args=[999999]))
    assert response.status_code == 404
    body = response.content.decode()
    assert "<h1>Page not found (404)</h1>" in body
    assert "There is no page at <code>/experiments/999999/</code>, or none you may see." in body
    assert "vera" in body
    assert_no_debug_page(body)
    assert "No Experiment matches" not in body


def test_a_refused_csrf_token_gets_the_app_s_403_page_and_no_login_is_tried(db) -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post("/login/", {"username": "vera", "password": "pw-vera"})
    assert response.status_code == 403
    body = response.content.decode()
    assert "<h1>Forbidden (403)</h1>" in body
    assert "This form was refused: its security token (CSRF) was missing or did not match." in body
    assert '<link rel="stylesheet" href="/static/review/app.css">' in body
    assert "CSRF verification failed" not in body  # Django's own page
    assert not LoginFailure.objects.exists()
    assert "_auth_user_id" not in client.session
