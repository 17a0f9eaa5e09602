"""``manage.py compare_recipes`` with a real worker running: the comparison goes through the workers.

The command runs as a subprocess next to a worker process, both on the test database; it waits for the records
the worker makes and never reads an evaluation still running (which made it fail with "the transfer evaluation
N of #M failed: " and no reason while a worker took some of its trials).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from evolution.example.setup import example_experiment_create
from evolution.models import Evaluation, Run, Trial
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]


def test_compare_recipes_goes_through_a_running_worker(start_worker: Any) -> None:
    experiment = example_experiment_create(name="compare-worker", task_limit=9)
    worker = start_worker()
    argv = [sys.executable, "manage.py", "compare_recipes", "--experiment", str(experiment.pk)]
    argv += ["--recipes", "rrsi,unregularized", "--seeds", "2", "--seed-start", "5", "--rounds", "3", "--json"]
    argv += ["--candidates", "1", "--k", "1", "--proposer", "example", "--transfer-seeds", "1", "--timeout", "600"]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=worker.env, capture_output=True, text=True, timeout=900)

    assert done.returncode == 0, done.stderr[-3000:] + worker.log()[-3000:]
    data = json.loads(done.stdout)
    assert data["seed_start"] == 5 and data["rounds"] == 3
    for name in ("rrsi", "unregularized"):
        runs = data["recipes"][name]["runs"]
        assert [r["seed"] for r in runs] == [5, 6]
        assert {r["status"] for r in runs} == {"finished"}
        for r in runs:
            assert Run.objects.get(pk=r["run"]).recipe.spec["seed"] == r["seed"]
    # The worker ran every trial (the command drives none: an in-process trial's owner is "compare").
    transfers = Evaluation.objects.filter(purpose=Evaluation.Purpose.TRANSFER)
    assert transfers.exists() and not transfers.exclude(state=Evaluation.State.CERTIFIED).exists()
    twins = [r["experiment"] for v in data["recipes"].values() for r in v["runs"]]
    trials = Trial.objects.filter(evaluation__experiment__in=twins)
    assert trials.exists() and not trials.filter(lease_owner__in=["", "compare", "inline"]).exists()
    assert data["recipes"]["unregularized"]["paired"]["sealed"]["n"] == 2.0
