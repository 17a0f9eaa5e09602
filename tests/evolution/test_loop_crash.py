"""A run survives a SIGKILL of its worker during proposal, evaluation and
certification, and ends with the same certified results as a run that was
never interrupted (the example and the tiny benchmark are deterministic
under their seeds, so the records' contents must match exactly)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evolution.loop import lifecycle
from evolution.models import Candidate, CertifiedResult, Run
from evolution.recipes import load_preset, parse_recipe, recipe_to_dict
from evolution.services.records import records_verify
from lab.records import record_contents, records_digest
from tests.conftest import wait_until
from tests.factories import make_tiny_experiment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

WORKER_ENV = {
    "RSI_OPERATOR_MODULES": "tests.operators",
    "RSI_TRIAL_LEASE_SECONDS": "4",
    "RSI_REAPER_INTERVAL": "1",
}


def recipe() -> Any:
    import tests.operators  # noqa: F401  (registers the tiny proposer here too)

    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=2, candidates_per_round=3)
    data["proposal"] = {"operator": "tiny-test", "params": {}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": 1}
    data["noise"] = {**data["noise"], "repeats": 2}
    data["edit_budget"] = {**data["edit_budget"], "T": 2}
    return parse_recipe(data)


def run_state(run: Run) -> str:
    run.refresh_from_db()
    return run.status


def finished(run: Run) -> bool:
    return run_state(run) in {Run.Status.FINISHED, Run.Status.FAILED, Run.Status.CANCELLED}


@pytest.fixture
def control(start_worker) -> Run:
    worker = start_worker(extra_env=WORKER_ENV, beat=True)
    run = lifecycle.run_create(experiment=make_tiny_experiment(tasks=12, k=1, name="control"), recipe=recipe())
    wait_until(lambda: finished(run), timeout=300, what="the control run")
    assert run.status == Run.Status.FINISHED, run.error
    worker.stop()
    return run


@pytest.mark.parametrize(
    ("point", "skip"),
    [
        ("propose:slot", 1),  # inside the second proposal slot's transaction
        ("trial:finished", 8),  # after a trial ran, before its result is stored
        ("certify:before_commit", 3),  # record written, transaction not committed
    ],
)
def test_a_killed_worker_resumes_to_the_same_certified_results(
    point: str, skip: int, control: Run, start_worker, tmp_path: Path
) -> None:
    marker = tmp_path / "fault"
    faulty = start_worker(
        extra_env={
            **WORKER_ENV,
            "RSI_FAULT_POINT": point,
            "RSI_FAULT_MARKER": str(marker),
            "RSI_FAULT_SKIP": str(skip),
        },
        beat=True,
    )
    twin = make_tiny_experiment(name="crashed", like=control.experiment)
    run = lifecycle.run_create(experiment=twin, recipe=recipe())
    wait_until(marker.exists, timeout=300, interval=0.1, what=f"the fault point {point}")
    faulty.kill()
    assert run_state(run) == Run.Status.RUNNING

    start_worker(extra_env=WORKER_ENV, beat=True)
    wait_until(lambda: finished(run), timeout=300, what="the resumed run")

    assert run.status == Run.Status.FINISHED, run.error
    assert len(record_contents(control.experiment)) > 5
    assert records_digest(run.experiment) == records_digest(control.experiment)
    report = records_verify(experiment=run.experiment)
    assert report.ok, report.problems
    # Nothing half-made is eligible as a parent.
    for candidate in Candidate.objects.filter(experiment=run.experiment, state=Candidate.State.ACCEPTED):
        assert candidate.certified_at is not None
        assert CertifiedResult.objects.filter(candidate=candidate).exists()
