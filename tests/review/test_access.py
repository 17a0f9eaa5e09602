"""Login, roles and the security headers every screen carries."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from evolution.access import ROLES, SEALED, can_see_sealed, roles_ensure

pytestmark = pytest.mark.django_db


def test_every_role_group_exists_with_exactly_its_permissions() -> None:
    roles_ensure()
    for name, perms in ROLES.items():
        group = Group.objects.get(name=name)
        got = {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}
        assert got == set(perms), name
    assert SEALED in ROLES["admin"]
    assert all(SEALED not in ROLES[role] for role in ("viewer", "annotator", "reviewer", "operator"))


def test_roles_are_made_again_by_migrate_after_a_flush() -> None:
    Group.objects.all().delete()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    assert set(Group.objects.values_list("name", flat=True)) >= set(ROLES)


def test_anonymous_users_are_sent_to_the_login_page() -> None:
    response = Client().get(reverse("review:home"))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/")


def test_login_with_the_form_then_the_home_page_opens(make_user) -> None:
    make_user("viewer", username="vera")
    client = Client(enforce_csrf_checks=True)
    page = client.get("/login/")
    assert page.status_code == 200
    token = client.cookies["csrftoken"].value
    response = client.post("/login/", {"username": "vera", "password": "pw-vera", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/").status_code == 200


def test_a_wrong_password_is_refused_with_a_message(make_user) -> None:
    make_user("viewer", username="vera")
    client = Client()
    response = client.post("/login/", {"username": "vera", "password": "nope"})
    assert response.status_code == 200
    assert b"did not match" in response.content


def test_a_user_without_a_role_is_forbidden(db) -> None:
    user = User.objects.create_user(username="nobody", password="x")
    client = Client()
    client.force_login(user)
    assert client.get(reverse("review:home")).status_code == 403


def test_pages_carry_a_strict_content_security_policy(client_as) -> None:
    response = client_as("viewer").get(reverse("review:home"))
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy
    assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
    assert response["X-Content-Type-Options"] == "nosniff"
    body = response.content.decode()
    assert "<script>" not in body and " style=" not in body and " onclick=" not in body


def test_htmx_requests_carry_the_csrf_token_and_htmx_may_not_eval(client_as) -> None:
    body = client_as("viewer").get(reverse("review:home")).content.decode()
    assert 'hx-headers=\'{"X-CSRFToken": "' in body
    assert '"allowEval": false' in body and '"includeIndicatorStyles": false' in body
    assert "/static/django_htmx/htmx" in body  # vendored, no CDN
    assert "https://" not in body.split("<body", 1)[0]


def test_only_the_sealed_permission_opens_sealed_details(make_user) -> None:
    assert not can_see_sealed(make_user("viewer", "reviewer", "annotator", "operator", username="all-but"))
    assert can_see_sealed(make_user("admin", username="boss"))
    assert can_see_sealed(make_user("viewer", username="trusted", extra_perms=(SEALED,)))


def _group_perms(name: str) -> set[str]:
    group = Group.objects.get(name=name)
    return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}


@pytest.mark.django_db(transaction=True)
def test_the_upgrade_gives_the_existing_operator_and_admin_groups_the_run_list() -> None:
    """review 0003 grants evolution.view_run to the groups a database already
    has (the admin's run list and its actions need it), and takes it back
    when migrated back; the other roles do not get it."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    roles_ensure()
    MigrationExecutor(connection).migrate([("review", "0002_login_failure")])
    # As the previous release left them: no role may see the run list.
    assert all("evolution.view_run" not in _group_perms(name) for name in ROLES)
    assert _group_perms("operator") == {"evolution.view_experiment", "evolution.operate_runs"}

    MigrationExecutor(connection).migrate([("review", "0003_operators_view_runs")])
    assert _group_perms("operator") == {"evolution.view_experiment", "evolution.operate_runs", "evolution.view_run"}
    assert "evolution.view_run" in _group_perms("admin")
    for name in ("viewer", "annotator", "reviewer"):
        assert "evolution.view_run" not in _group_perms(name)
    assert {name: _group_perms(name) for name in ROLES} == {name: set(perms) for name, perms in ROLES.items()}
    # The later migrations again, for the tests after this one.
    executor = MigrationExecutor(connection)
    executor.migrate([key for key in executor.loader.graph.leaf_nodes() if key[0] == "review"])
