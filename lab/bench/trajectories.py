"""Trajectory import: ATIF files posted to the API versus parsing them with
``json`` alone.

The files are built from the real ATIF fixtures (the OpenHands hello-world
trajectory, whose steps are repeated and renumbered up to the size wanted)
and posted to ``POST /api/v1/trials/<id>/trajectory/`` with an operator's
token through the whole Django stack: authentication, permissions,
validation, conversion, redaction, storage. The verdict is on that, one file
a request; the same files are then posted to other trials in batches
(``POST /api/v1/trajectories/``), whose figure is printed beside it.
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from evolution import selectors
from evolution.models import Evaluation, Experiment, SplitMembership, Trajectory, TrajectoryStep, Trial
from lab.bench import BenchResult, benchmark, stopwatch
from lab.bench.orchestration import SPLITS, with_bench_experiment

FIXTURE = "hello-world.trajectory.json"


def fixture_path() -> Path:
    """The real ATIF fixture kept with the tests (tests/fixtures/atif)."""
    return Path(settings.BASE_DIR) / "tests" / "fixtures" / "atif" / FIXTURE


def atif_document(*, steps: int, number: int) -> dict[str, Any]:
    """The fixture with its steps after the system prompt repeated until
    there are ``steps``, renumbered; ``number`` makes each file distinct."""
    base = json.loads(fixture_path().read_text())
    head, cycle = base["steps"][:1], base["steps"][1:]
    out = copy.deepcopy(head)
    while len(out) < steps:
        step = copy.deepcopy(cycle[(len(out) - 1) % len(cycle)])
        if isinstance(step.get("message"), str):
            step["message"] = f"{step['message']} [file {number}, step {len(out) + 1}]"
        out.append(step)
    for position, step in enumerate(out, start=1):
        step["step_id"] = position
    document = dict(base)
    document["session_id"] = f"bench-{number}"
    document["steps"] = out[:steps]
    return document


def finished_trials(experiment: Experiment, *, count: int) -> list[int]:
    """``count`` finished trials of the seed (one evaluation), ids in order."""
    memberships = list(SplitMembership.objects.filter(experiment=experiment).select_related("task"))
    evaluation = Evaluation.objects.create(
        experiment=experiment,
        candidate=selectors.experiment_seed(experiment),
        purpose=Evaluation.Purpose.BASELINE,
        splits=SPLITS,
        k=max(1, -(-count // len(memberships))),
        seed=11,
        state=Evaluation.State.COMPLETE,
        trials_total=count,
        trials_finished=count,
    )
    Trial.objects.bulk_create(
        Trial(
            evaluation=evaluation,
            candidate=experiment.seed_candidate,
            task=memberships[number % len(memberships)].task,
            split=memberships[number % len(memberships)].split,
            index=number // len(memberships),
            seed=number,
            state=Trial.State.DONE,
            outcome=Trial.Outcome.FAIL,
            score=0.0,
            tokens=300,
            steps=1,
            valid_output=True,
            submitted=True,
        )
        for number in range(count)
    )
    return list(Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True))


@benchmark(
    "trajectory-import",
    "1,000 ATIF files of 200 steps imported through the API vs parsed with json alone",
    quick={"files": 20, "steps": 50, "batch": 8},
)
def trajectory_import_benchmark(*, files: int = 1000, steps: int = 200, batch: int = 50) -> BenchResult:
    def body(experiment: Experiment, _scratch: Path) -> BenchResult:
        warm_up, *trial_ids = finished_trials(experiment, count=2 * files + 1)
        trial_ids, batch_ids = trial_ids[:files], trial_ids[files:]
        texts = [json.dumps(atif_document(steps=steps, number=number)).encode() for number in range(files)]
        bodies = [b'{"format": "atif", "document": ' + text + b"}" for text in texts]
        user = get_user_model().objects.create_user(
            username=f"bench-{uuid.uuid4().hex[:10]}", is_staff=True, is_superuser=True
        )
        try:
            client = APIClient(HTTP_HOST="localhost")
            client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
            # One untimed request first: the URLconf and the views are imported lazily.
            client.post(f"/api/v1/trials/{warm_up}/trajectory/", data=bodies[0], content_type="application/json")
            with stopwatch() as parsed:
                for text in texts:
                    json.loads(text)
            statuses: dict[int, int] = {}
            with stopwatch() as imported:
                for trial_id, request_body in zip(trial_ids, bodies, strict=True):
                    response = client.post(
                        f"/api/v1/trials/{trial_id}/trajectory/", data=request_body, content_type="application/json"
                    )
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            # The same files again, into other trials, ``batch`` to a request.
            batch_bodies = [
                b'{"trajectories": ['
                + b", ".join(
                    b'{"trial": %d, "format": "atif", "document": %s}' % (trial_id, text)
                    for trial_id, text in zip(
                        batch_ids[start : start + batch], texts[start : start + batch], strict=True
                    )
                )
                + b"]}"
                for start in range(0, files, batch)
            ]
            batch_statuses: dict[int, int] = {}
            with stopwatch() as batched:
                for request_body in batch_bodies:
                    response = client.post("/api/v1/trajectories/", data=request_body, content_type="application/json")
                    batch_statuses[response.status_code] = batch_statuses.get(response.status_code, 0) + 1
        finally:
            Token.objects.filter(user=user).delete()
            user.delete()
        stored = Trajectory.objects.filter(trial_id__in=trial_ids, step_count=steps).count()
        stored_steps = TrajectoryStep.objects.filter(trajectory__trial_id__in=trial_ids).count()
        batch_stored = Trajectory.objects.filter(trial_id__in=batch_ids, step_count=steps).count()
        batch_stored_steps = TrajectoryStep.objects.filter(trajectory__trial_id__in=batch_ids).count()
        size = sum(len(text) for text in texts)
        return BenchResult(
            ratio=imported[0] / parsed[0],
            target=5.0,
            label="trajectory-import: API import / json.loads",
            lines=[
                f"files: {files} ATIF documents of {steps} steps, {size / 1e6:.1f} MB",
                f"json.loads:  {parsed[0]:8.3f} s",
                f"API import:  {imported[0]:8.3f} s  ({1000 * imported[0] / files:.1f} ms per file); "
                f"responses {dict(sorted(statuses.items()))}",
                f"stored: {stored} trajectories, {stored_steps} steps",
                f"API import in batches of {batch} (POST /api/v1/trajectories/): {batched[0]:8.3f} s  "
                f"({1000 * batched[0] / files:.1f} ms per file, ratio {batched[0] / parsed[0]:.3f}); "
                f"responses {dict(sorted(batch_statuses.items()))}; "
                f"stored {batch_stored} trajectories, {batch_stored_steps} steps",
            ],
            checks={
                "all imported": statuses == {201: files} and stored == files and stored_steps == files * steps,
                "all imported in batches": batch_statuses == {201: len(batch_bodies)}
                and batch_stored == files
                and batch_stored_steps == files * steps,
            },
        )

    tasks = max(1, min(files, 100))
    return with_bench_experiment("trajectories", tasks, 1, body)
