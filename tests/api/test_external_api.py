"""POST /api/v1/candidates/<pk>/external-results/: operators only, 400 per field, never certified."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import override_settings
from django.urls import include, path
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

import api.external
from evolution.access import roles_ensure
from evolution.models import CertifiedResult, Evaluation, Experiment, SplitMembership, Trial
from tests.factories import make_tiny_experiment, seed_id

pytestmark = pytest.mark.django_db

# This module is its own URLconf, so the test does not depend on api/v1.py wiring the route.
urlpatterns = [path("api/v1/", include(api.external.urlpatterns))]
URLCONF = override_settings(ROOT_URLCONF=__name__)


def client_for(role: str | None) -> APIClient:
    client = APIClient()
    if role is None:
        return client
    roles_ensure()
    user = User.objects.create_user(username=role, password="pw")
    user.groups.add(Group.objects.get(name=role))
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def body(experiment: Experiment) -> dict[str, Any]:
    tasks = SplitMembership.objects.filter(experiment=experiment).values_list("task__external_id", flat=True)
    return {
        "results": [{"task": task, "index": 0, "passed": True, "score": 1.0, "tokens": 42} for task in sorted(tasks)],
        "source": {"tool": "harbor", "job": "job-7"},
    }


def url(pk: int) -> str:
    return f"/api/v1/candidates/{pk}/external-results/"


@URLCONF
def test_operator_ingests_external_results() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    response = client_for("operator").post(url(seed_id(experiment)), body(experiment), format="json")
    assert response.status_code == 201, response.content
    evaluation = Evaluation.objects.get()
    assert response.json() == {
        "evaluation": evaluation.pk,
        "candidate": experiment.seed_candidate_id,
        "external": True,
        "certified": False,
        "state": "external",
        "trials": 4,
        "splits": evaluation.splits,
        "source": {"tool": "harbor", "job": "job-7"},
    }
    assert Trial.objects.filter(evaluation=evaluation, state=Trial.State.DONE).count() == 4
    assert not CertifiedResult.objects.exists()


@URLCONF
def test_a_result_with_an_error_is_an_error_trial_without_a_score() -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    data = body(experiment)
    data["results"][1] = {**data["results"][1], "passed": False, "error": "infrastructure_failed (docker)"}
    del data["results"][1]["score"]
    response = client_for("operator").post(url(seed_id(experiment)), data, format="json")
    assert response.status_code == 201, response.content
    rows = Trial.objects.order_by("task__external_id").values_list("state", "outcome", "score", "error")
    assert list(rows) == [
        (Trial.State.DONE, Trial.Outcome.PASS, 1.0, ""),
        (Trial.State.ERROR, Trial.Outcome.ERROR, None, "infrastructure_failed (docker)"),
    ]


@URLCONF
def test_an_error_on_a_passed_result_is_a_400_and_writes_nothing() -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    data = body(experiment)
    data["results"][0]["error"] = "boom"
    response = client_for("operator").post(url(seed_id(experiment)), data, format="json")
    assert (response.status_code, response.json()) == (
        400,
        {"results[0].error": ["a trial that errored cannot pass"]},
    )
    assert not Evaluation.objects.exists()


@URLCONF
@pytest.mark.parametrize(("role", "status"), [("viewer", 403), ("annotator", 403), (None, 401)])
def test_without_the_operate_permission_the_post_is_refused(role: str | None, status: int) -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    response = client_for(role).post(url(seed_id(experiment)), body(experiment), format="json")
    assert response.status_code == status
    assert not Evaluation.objects.exists()


@URLCONF
def test_unknown_task_is_a_400_naming_the_field_and_writes_nothing() -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    data = body(experiment)
    data["results"][1]["task"] = "t99"
    response = client_for("operator").post(url(seed_id(experiment)), data, format="json")
    assert response.status_code == 400
    assert response.json() == {"results[1].task": ["unknown task 't99' in this experiment"]}
    assert not Evaluation.objects.exists()


@URLCONF
def test_wrong_types_are_a_400_per_item_field_and_ranges_are_checked_too() -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    client = client_for("operator")
    data = body(experiment)
    data["results"][0]["passed"] = "perhaps"
    response = client.post(url(seed_id(experiment)), data, format="json")
    assert response.status_code == 400
    assert response.json() == {"results": {"0": {"passed": ["Must be a valid boolean."]}}}

    data["results"][0]["passed"] = True
    data["results"][1]["score"] = 2
    response = client.post(url(seed_id(experiment)), data, format="json")
    assert response.status_code == 400
    assert response.json() == {"results[1].score": ["must be a number in [0, 1], got 2.0"]}
    assert not Evaluation.objects.exists()


@URLCONF
@pytest.mark.parametrize("pk", ["999999", "-5", "123456789012345678901234"])
def test_unknown_candidate_is_a_json_404(pk: str) -> None:
    response = client_for("operator").post(
        f"/api/v1/candidates/{pk}/external-results/",
        {"results": [{"task": "t", "index": 0, "passed": True}]},
        format="json",
    )
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
