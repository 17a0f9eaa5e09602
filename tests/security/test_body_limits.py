"""Request bodies over RSI_MAX_BODY_BYTES are refused before anything is
written: 413 on the API (api/errors.py), Django's 400 on a form POST.

tests/api/test_api.py covers an oversized run-start body; these cover the
trajectory upload, a multipart upload to it, a screen's form POST, and the
environment variable itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client, override_settings
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from evolution.models import ReviewDecision, ReviewItem, Trajectory, TrajectoryStep
from tests.api.conftest import World
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.django_db

LIMIT = 4096


def api_client(user: Any) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def atif(message: str, steps: int = 2) -> dict[str, Any]:
    return {
        "schema_version": "ATIF-v1.4",
        "session_id": "s1",
        "agent": {"name": "agent", "version": "1"},
        "steps": [{"step_id": n + 1, "source": "agent", "message": message} for n in range(steps)],
    }


def trajectory_state(trial_pk: int) -> list[tuple[Any, ...]]:
    return list(
        TrajectoryStep.objects.filter(trajectory__trial_id=trial_pk)
        .order_by("step_id")
        .values_list("step_id", "message")
    )


def test_the_environment_variable_sets_the_limit() -> None:
    env = {**os.environ, "RSI_MAX_BODY_BYTES": "12345", "DJANGO_SETTINGS_MODULE": "rsiweb.settings"}
    code = "import django; django.setup(); from django.conf import settings as s; print(s.DATA_UPLOAD_MAX_MEMORY_SIZE)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "12345"


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
def test_an_oversized_trajectory_upload_is_413_and_the_old_trajectory_stays(
    api_world: World, make_user: Callable[..., Any]
) -> None:
    operator = api_client(make_user("operator"))
    trial = api_world.train_trial
    before = trajectory_state(trial.pk)
    assert before
    url = f"/api/v1/trials/{trial.pk}/trajectory/"
    big = {"format": "atif", "document": atif("x" * (LIMIT + 1))}
    response = operator.post(url, big, format="json")
    assert response.status_code == 413
    assert "exceeded" in response.json()["detail"].lower()
    assert trajectory_state(trial.pk) == before
    # Just under the limit the same upload goes through: the limit is the only difference.
    small = {"format": "atif", "document": atif("y" * 100)}
    assert len(json.dumps(small)) < LIMIT
    response = operator.post(url, small, format="json")
    assert response.status_code == 201, response.content
    assert trajectory_state(trial.pk) == [(1, "y" * 100), (2, "y" * 100)]


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
def test_a_multipart_upload_with_a_large_file_part_writes_nothing(
    api_world: World, make_user: Callable[..., Any]
) -> None:
    # File parts are not counted by Django's limit; the endpoint reads JSON
    # fields only, so the file is never stored and the request is refused.
    operator = api_client(make_user("operator"))
    trial = api_world.train_trial
    before = trajectory_state(trial.pk)
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("t.json", json.dumps(atif("z" * (LIMIT * 4))).encode(), "application/json")
    response = operator.post(f"/api/v1/trials/{trial.pk}/trajectory/", {"document": upload}, format="multipart")
    assert response.status_code in (400, 413)
    assert trajectory_state(trial.pk) == before
    assert Trajectory.objects.filter(trial=trial).count() == 1


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=LIMIT)
def test_an_oversized_form_post_is_refused_and_records_no_decision(
    api_world: World, make_user: Callable[..., Any]
) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("reviewer", username="rita"))
    client.get(reverse("review:queue"))
    token = client.cookies["csrftoken"].value
    item = ReviewItem.objects.get(candidate=api_world.flagged)
    url = reverse("review:review_decide", args=[item.pk])
    response = client.post(url, {"verdict": "reject", "reason": "r" * (LIMIT + 1)}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 400  # Django's RequestDataTooBig
    assert not ReviewDecision.objects.exists()
    item.refresh_from_db()
    assert item.state == ReviewItem.State.OPEN
    response = client.post(url, {"verdict": "reject", "reason": "names a sealed task"}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 302
    assert ReviewDecision.objects.get(item=item).reason == "names a sealed task"
