"""Deeply nested JSON on every API write endpoint (issue 16, item 2): a 400
with one line naming the limit, never a 500, and nothing written.

On the old code each body below raised RecursionError inside DRF's parser
(it catches ValueError only): 500 with a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import override_settings
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from evolution.models import Annotation, Evaluation, ReviewDecision, Run, Trajectory, TrajectoryStep
from tests.api.conftest import World

pytestmark = pytest.mark.django_db

V1 = "/api/v1"
REFUSED = "JSON parse error - the JSON body is nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)"


@pytest.fixture
def api_as(make_user: Callable[..., Any]) -> Callable[[str], APIClient]:
    def client(role: str) -> APIClient:
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=make_user(role)).key}")
        return api

    return client


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def body(field: str, depth: int) -> str:
    """A JSON object whose ``field`` holds arrays nested ``depth`` deep (the object adds one level)."""
    return '{"' + field + '": ' + nested(depth) + "}"


def state() -> dict[str, Any]:
    """Everything the write endpoints could create or change."""
    return {
        "runs": list(Run.objects.values_list("pk", "status")),
        "evaluations": list(Evaluation.objects.values_list("pk", flat=True)),
        "trajectories": list(Trajectory.objects.values_list("pk", "trial_id", "step_count")),
        "steps": TrajectoryStep.objects.count(),
        "decisions": list(ReviewDecision.objects.values_list("pk", flat=True)),
        "annotations": list(Annotation.objects.values_list("pk", flat=True)),
    }


def endpoints(world: World) -> list[tuple[str, str, str]]:
    """(role, url, the field the nesting goes in) for every JSON write endpoint."""
    return [
        ("operator", f"{V1}/trials/{world.train_trial.pk}/trajectory/", "document"),
        ("operator", f"{V1}/trajectories/", "trajectories"),
        ("operator", f"{V1}/runs/", "experiment"),
        ("operator", f"{V1}/candidates/{world.experiment.seed_candidate_id}/external-results/", "results"),
        ("reviewer", f"{V1}/review-decisions/", "rejected_edits"),
        ("annotator", f"{V1}/annotations/", "label"),
    ]


@pytest.mark.parametrize("depth", [950, 100_000])
def test_a_deeply_nested_body_is_a_400_on_every_write_endpoint_and_nothing_is_written(
    api_world: World, api_as: Callable[[str], APIClient], depth: int
) -> None:
    clients = {role: api_as(role) for role in ("operator", "reviewer", "annotator")}
    before = state()
    for role, url, field in endpoints(api_world):
        response = clients[role].post(url, body(field, depth), content_type="application/json")
        assert (url, response.status_code) == (url, 400), response.content[:300]
        assert response.json() == {"detail": REFUSED}, url
    assert state() == before


def test_the_depth_limit_is_exact_and_follows_the_setting(api_world: World, api_as: Callable[[str], APIClient]) -> None:
    operator = api_as("operator")
    url = f"{V1}/trials/{api_world.train_trial.pk}/trajectory/"
    before = state()
    with override_settings(RSI_MAX_INPUT_DEPTH=6):
        # The object plus five arrays: six levels, parsed (then refused by validation: not a trajectory).
        response = operator.post(url, body("document", 5), content_type="application/json")
        assert response.status_code == 400
        assert "document" in response.json()
        response = operator.post(url, body("document", 6), content_type="application/json")
        assert response.json() == {"detail": REFUSED.replace("100", "6")}
    assert state() == before


def test_deep_json_text_in_a_form_field_is_a_400_naming_the_limit(
    api_world: World, api_as: Callable[[str], APIClient]
) -> None:
    """A multipart form's ``document`` is JSON text, parsed by the field: the same limit."""
    operator = api_as("operator")
    url = f"{V1}/trials/{api_world.train_trial.pk}/trajectory/"
    before = state()
    response = operator.post(url, {"format": "atif", "document": nested(100_000)}, format="multipart")
    assert response.status_code == 400
    assert response.json() == {"document": ["the document is nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)"]}
    assert state() == before
