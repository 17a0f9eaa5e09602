"""The noise band is measured, never assumed (issue 18, item 2).

The seed is evaluated ``noise.repeats`` times with ``noise.trials_per_task`` trials per task (rrsi: 3 and
2), delta is the bootstrap's expected range of S, and a band that cannot be estimated blocks acceptance
inside it and says so on the dashboard and in the API.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from evolution import operators
from evolution.example.setup import example_experiment_create, example_recipe
from evolution.loop import lifecycle
from evolution.loop.state import RunState
from evolution.models import Evaluation, GateDecision, Run
from evolution.recipes import load_preset, parse_recipe, recipe_to_dict
from tests.factories import make_tiny_experiment, seed_of
from tests.loop_driver import drive

pytestmark = pytest.mark.django_db


def tiny_recipe(**noise: Any) -> Any:
    import tests.operators  # noqa: F401  (registers the tiny proposer)

    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=2, candidates_per_round=3)
    data["proposal"] = {"operator": "tiny-test", "params": {}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": 1}
    data["noise"] = {**data["noise"], **noise}
    data["edit_budget"] = {**data["edit_budget"], "T": 2}
    return parse_recipe(data, known_operators=operators.known_operators())


def api_run(client: Client, run: Run) -> dict[str, Any]:
    response = client.get(f"/api/v1/runs/{run.pk}/")
    assert response.status_code == 200
    return dict(json.loads(response.content))


def test_the_default_recipe_evaluates_the_seed_three_times_with_two_trials_per_task_in_the_repeats(
    client_as: Callable[..., Client],
) -> None:
    recipe = tiny_recipe()
    assert (recipe.noise.rule, recipe.noise.repeats, recipe.noise.trials_per_task) == ("bootstrap", 3, 2)
    run = drive(lifecycle.run_create(experiment=make_tiny_experiment(tasks=12, k=1), recipe=recipe))
    assert run.status == Run.Status.FINISHED, run.error

    seed = seed_of(run.experiment)
    repeats = Evaluation.objects.filter(run=run, candidate=seed, purpose__in=["baseline", "noise"])
    # The first is an evaluation like a candidate's (k = 1); the repeats run noise.trials_per_task = 2.
    assert sorted(repeats.values_list("repeat", "k")) == [(0, 1), (1, 2), (2, 2)]
    noise = RunState.of(run).noise
    assert noise is not None
    # The tiny agent is deterministic: every trial of a task agrees, so the measured band is 0, and says so.
    assert (noise["rule"], noise["evaluations"], noise["trials_per_task"], noise["delta"]) == ("bootstrap", 3, 5, 0.0)
    assert run.noise_delta == 0.0
    viewer = client_as("viewer")
    page = viewer.get(reverse("review:experiment", args=[run.experiment_id])).content.decode()
    assert '0.000 <span class="muted">(bootstrap: expected range of S over 3 evaluations of k=1' in page
    assert api_run(viewer, run)["noise"]["delta"] == 0.0


def test_a_band_that_cannot_be_estimated_blocks_acceptance_inside_it_and_is_shown(
    client_as: Callable[..., Client],
) -> None:
    # Two evaluations of a deterministic seed under the range rule: their S agree, which says nothing.
    run = drive(
        lifecycle.run_create(
            experiment=make_tiny_experiment(tasks=12, k=1), recipe=tiny_recipe(rule="range", repeats=2)
        )
    )
    assert run.status == Run.Status.FINISHED, run.error
    state = RunState.of(run)
    assert state.noise_unknown and run.noise_delta is None
    assert state.noise is not None and "says nothing about the spread" in state.noise.get("note", "")
    decisions = GateDecision.objects.filter(run=run, round__gte=1)
    assert decisions.exists()
    assert not decisions.filter(rule="inside_noise_gain").exists()
    for decision in decisions:
        assert decision.numbers["delta"] == 0.0 and decision.numbers["delta_estimated"] is None
    assert any(e.get("kind") == "error" and "could not be estimated" in e.get("text", "") for e in state.events)

    viewer = client_as("viewer")
    page = viewer.get(reverse("review:experiment", args=[run.experiment_id])).content.decode()
    assert "could not be estimated</span>" in page
    assert "The gate accepts nothing inside the band" in page
    assert api_run(viewer, run)["noise"]["delta"] is None


@pytest.mark.slow
def test_the_bundled_example_is_noisy_enough_for_a_band_above_zero() -> None:
    import evolution.proposers  # noqa: F401  (registers the example proposer)

    experiment = example_experiment_create(name="noise example")
    recipe = example_recipe(rounds=1, candidates=1, k=1)
    assert (recipe.noise.repeats, recipe.noise_k, recipe.noise.rule) == (3, 2, "bootstrap")
    run = lifecycle.run_create(experiment=experiment, recipe=recipe)
    run = drive(run, until=lambda r: RunState.of(r).phase != "baseline")
    noise = RunState.of(run).noise
    assert noise is not None and noise["delta"] is not None
    assert noise["delta"] > 0.0, noise
    assert run.noise_delta == noise["delta"]
