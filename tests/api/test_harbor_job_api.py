"""POST /api/v1/harbor-jobs/: a Harbor job's documents (tests/fixtures/harbor) as external results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from evolution.access import roles_ensure
from evolution.models import Candidate, Evaluation, Experiment, Task, Trajectory, Trial
from tests.factories import evaluate_seed_inline, make_tiny_experiment

pytestmark = pytest.mark.django_db

JOB = Path(__file__).resolve().parents[1] / "fixtures" / "harbor" / "adder-careless"
URL = "/api/v1/harbor-jobs/"


def operator() -> APIClient:
    roles_ensure()
    user = User.objects.create_user(username="operator", password="pw")
    user.groups.add(Group.objects.get(name="operator"))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def job_body() -> dict[str, Any]:
    trials = []
    for folder in sorted(p for p in JOB.iterdir() if (p / "result.json").is_file()):
        trajectory = folder / "agent" / "trajectory.json"
        trials.append(
            {
                "result": json.loads((folder / "result.json").read_text()),
                "trajectory": json.loads(trajectory.read_text()) if trajectory.is_file() else None,
            }
        )
    return {
        "experiment": "adders",
        "config": json.loads((JOB / "config.json").read_text()),
        "result": json.loads((JOB / "result.json").read_text()),
        "trials": trials,
    }


def test_harbor_job_api_imports_the_job_as_the_command_does() -> None:
    client = operator()
    response = client.post(URL, job_body(), format="json")
    assert response.status_code == 201, response.content
    experiment = Experiment.objects.get(name="adders")
    assert response.json() == {
        "experiment": experiment.pk,
        "candidate": Candidate.objects.get(experiment=experiment).pk,
        "evaluation": experiment.evaluations.get().pk,
        "created": True,
        "trials": 5,
        "notes": [],
    }
    scores = dict(Trial.objects.filter(candidate__experiment=experiment).values_list("task__external_id", "score"))
    assert scores == {"task-0": 1.0, "task-1": 1.0, "task-2": None, "task-3": 0.0, "task-4": 0.0}
    assert Trajectory.objects.filter(trial__candidate__experiment=experiment).count() == 4
    again = client.post(URL, job_body(), format="json")
    assert (again.status_code, again.json()["evaluation"], Trial.objects.count()) == (200, None, 5)


def test_harbor_job_api_refuses_a_contradiction_in_one_line_and_writes_nothing() -> None:
    body = job_body()
    body["trials"][3]["result"]["verifier_result"]["rewards"]["reward"] = 1.0
    response = operator().post(URL, body, format="json")
    assert response.status_code == 400
    name = body["trials"][3]["result"]["trial_name"]
    assert response.json() == {"detail": f"{name}/result.json: reward 1.0, but the job's result.json lists 0.0"}
    assert (Experiment.objects.count(), Trial.objects.count()) == (0, 0)


def test_harbor_job_api_needs_an_operator() -> None:
    assert APIClient().post(URL, job_body(), format="json").status_code == 401
    assert Experiment.objects.count() == 0


def test_harbor_job_api_refuses_an_experiment_the_loop_made_with_409_and_writes_nothing() -> None:
    experiment = make_tiny_experiment(tasks=6, k=1)
    evaluate_seed_inline(experiment)
    body = job_body()
    body["experiment"] = experiment.name
    for trial in body["trials"]:  # tasks the experiment has, so none is missing
        trial["result"]["task_name"] = trial["result"]["task_name"].replace("task-", "t0")
    counts = (Task.objects.count(), Candidate.objects.count(), Evaluation.objects.count(), Trial.objects.count())
    response = operator().post(URL, body, format="json")
    assert response.status_code == 409
    assert response.json() == {
        "detail": f"experiment {experiment.name!r} was not made by Harbor job imports: a job may only create an "
        "experiment or add to one that Harbor imports made; import into another experiment name"
    }
    assert (
        Task.objects.count(),
        Candidate.objects.count(),
        Evaluation.objects.count(),
        Trial.objects.count(),
    ) == counts
    after = Experiment.objects.get(pk=experiment.pk)
    assert (after.split_digests, after.run_settings) == (experiment.split_digests, experiment.run_settings)
