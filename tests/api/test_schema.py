"""Schemathesis against /api/schema/, in process (WSGI).

As a viewer every operation answers without a 5xx, conforms to the schema
and never shows the sealed canary; without credentials, or with another
role's, every operation is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, given, settings
from rest_framework.authtoken.models import Token

from evolution.models import Candidate, CertifiedResult, LeakageFlag, Trial
from rsiweb.wsgi import application
from tests.api.conftest import CANARY, World

pytestmark = pytest.mark.django_db

EXAMPLES = 10
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.content_type_conformance,
]
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@pytest.fixture
def schema(db: Any) -> Iterator[Any]:
    """The schema as served, its operations called through the WSGI handler.

    Like Django's test client, requests keep the test's database connection
    (and its transaction) open: close_old_connections is off meanwhile."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


def _operations(schema: Any) -> Iterator[Any]:
    for result in schema.get_all_operations():
        yield result.ok()


def _fuzz(operation: Any, examples: int, check: Callable[[Any], None]) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=examples,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        check(case)

    run()


def _token(user: Any) -> dict[str, str]:
    return {"Authorization": f"Token {Token.objects.create(user=user).key}"}


def test_viewer_gets_no_server_errors_conforming_responses_and_no_canary(
    schema: Any, api_world: World, make_user: Any
) -> None:
    headers = _token(make_user("viewer"))
    calls: list[str] = []

    def check(case: Any) -> None:
        calls.append(case.operation.label)
        response = case.call(headers=headers)
        case.validate_response(response, checks=CHECKS)
        assert CANARY not in response.text, case.as_curl_command()
        if case.method in WRITES:
            assert response.status_code == 403, case.as_curl_command()

    operations = list(_operations(schema))
    for operation in operations:
        _fuzz(operation, EXAMPLES, check)
    assert len(set(calls)) == len(operations)
    assert Trial.objects.filter(pk=api_world.sealed_trial.pk, error__contains=CANARY).exists()  # canary in place


def test_viewer_never_sees_the_canary_on_real_ids(schema: Any, api_world: World, make_user: Any) -> None:
    """Random ids mostly miss; this sweep asks every GET operation about every real row."""
    headers = _token(make_user("viewer"))
    ids = {
        *Trial.objects.values_list("pk", flat=True),
        *Candidate.objects.values_list("pk", flat=True),
        *CertifiedResult.objects.values_list("pk", flat=True),
        *LeakageFlag.objects.values_list("pk", flat=True),
    }
    seen = 0
    for operation in _operations(schema):
        if operation.method.upper() != "GET":
            continue
        params = [p.name for p in operation.path_parameters]
        for pk in sorted(ids) if params else [None]:
            path_parameters = {"id": str(pk)} if params else {}
            if "path" in params:
                path_parameters["path"] = "default.txt"
            case = operation.Case(path_parameters=path_parameters)
            response = case.call(headers=headers)
            case.validate_response(response, checks=CHECKS)
            assert CANARY not in response.text, case.as_curl_command()
            seen += response.status_code == 200
    assert seen >= 25  # most real rows answered, not only 404s
    # The same sweep finds the canary for someone with the sealed permission: the sweep can fail.
    admin = _token(make_user("admin"))
    trajectory = schema["/api/v1/trials/{id}/trajectory/"]["GET"]
    response = trajectory.Case(path_parameters={"id": str(api_world.sealed_trial.pk)}).call(headers=admin)
    assert CANARY in response.text


@pytest.mark.parametrize("credentials", ["none", "bad-token", "no-role"])
def test_every_operation_is_refused_without_valid_credentials(
    schema: Any, api_world: World, make_user: Any, credentials: str
) -> None:
    if credentials == "none":
        headers: dict[str, str] = {}
    elif credentials == "bad-token":
        headers = {"Authorization": "Token 0123456789abcdef0123456789abcdef01234567"}
    else:
        headers = _token(make_user(username="no-role"))

    def check(case: Any) -> None:
        response = case.call(headers=headers)
        assert response.status_code in (401, 403), case.as_curl_command()

    for operation in _operations(schema):
        _fuzz(operation, 3, check)


def test_schema_generates_without_warnings() -> None:
    generator = SchemaGenerator()
    document = generator.get_schema(request=None, public=True)
    assert document["openapi"].startswith("3.")
    assert "/api/v1/candidates/{id}/files/{path}" in document["paths"]
