"""Pausing a run while it proposes, then resuming it, through a real worker.

The proposer of the first slot is held until the test has paused the run;
the worker's round_propose then stops between slots, leaving the run in
``proposing``. Resuming must send the proposals again at once: the worker
runs without beat and with the default 300 s lease, so nothing else would.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from evolution.loop import lifecycle
from evolution.models import Candidate, Run
from evolution.recipes import load_preset, parse_recipe, recipe_to_dict
from tests.conftest import wait_until
from tests.factories import make_tiny_experiment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def held_recipe(folder: Path) -> Any:
    import tests.operators  # noqa: F401  (registers the held proposer here too)

    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=1, candidates_per_round=2)
    data["proposal"] = {"operator": "tiny-held", "params": {"folder": str(folder)}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": 1}
    data["noise"] = {**data["noise"], "repeats": 2}
    data["edit_budget"] = {**data["edit_budget"], "T": 1}
    return parse_recipe(data)


def test_a_run_paused_while_proposing_proposes_again_as_soon_as_it_is_resumed(start_worker, tmp_path: Path) -> None:
    worker = start_worker(
        extra_env={"RSI_OPERATOR_MODULES": "tests.operators", "RSI_TRIAL_LEASE_SECONDS": "300"}, beat=False
    )
    run = lifecycle.run_create(experiment=make_tiny_experiment(tasks=12, k=1), recipe=held_recipe(tmp_path))
    wait_until((tmp_path / "entered").exists, timeout=180, what="the first proposal slot")

    assert lifecycle.run_pause(run=run)
    (tmp_path / "release").touch()
    # round_propose sees the pause after its slot and returns, leaving the round unfilled.
    wait_until(
        lambda: "evolution.round_propose[" in worker.log() and "succeeded" in worker.log().split("round_propose[")[-1],
        timeout=60,
        what="round_propose to stop at the pause",
    )
    run.refresh_from_db()
    assert (run.status, run.state["phase"]) == (Run.Status.PAUSED, "proposing")
    assert not Candidate.objects.filter(run=run, round=1).exists()  # the held slot's proposal was not kept

    resumed = time.monotonic()
    assert lifecycle.run_resume(run=run)

    def proposed() -> bool:
        run.refresh_from_db()
        return run.state.get("phase") != "proposing" or run.status != Run.Status.RUNNING

    wait_until(proposed, timeout=60, what="the resumed run to leave proposing (lease 300 s, no beat)")
    assert time.monotonic() - resumed < 60

    def ended() -> bool:
        run.refresh_from_db()
        return run.status != Run.Status.RUNNING

    def where() -> str:
        run.refresh_from_db()
        candidates = list(Candidate.objects.filter(run=run).values_list("label", "state"))
        state = f"run {run.status} {run.state.get('phase')} {run.error!r}; candidates {candidates}"
        return f"{state}\n{worker.log()[-6000:]}"

    wait_until(ended, timeout=180, what="the resumed run to end", diagnose=where)
    assert run.status == Run.Status.FINISHED, run.error
    assert sorted(Candidate.objects.filter(run=run, round=1).values_list("label", flat=True)) == ["r1s0", "r1s1"]
