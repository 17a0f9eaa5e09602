"""A decided candidate shows the numbers of its decision (issue 39, items 1 and 2).

The gate keeps dS, its paired bootstrap interval and dC with its decision (and so in its certified record);
the candidate page and the API show those, labelled "at decision", and the current estimate beside them once
later measurements moved it. Any other comparison is cached by the two sets of trials it depends on.

The agent here lapses on one trial in three, chosen by the trial's seed (as a model's luck would), so a later
run that measures the same harness with another seed measures it differently.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.urls import reverse
from django.utils.html import escape
from rest_framework.test import APIClient

from evolution.loop import lifecycle, load, measure
from evolution.models import Candidate, Evaluation, Experiment, GateDecision, Run, Trial
from review.pages.candidate import interval_text
from tests.evolution.test_loop import tiny_recipe
from tests.factories import TINY_AGENT, make_tiny_experiment, run_evaluation_inline, seed_of
from tests.loop_driver import drive

pytestmark = pytest.mark.django_db

LAPSING_AGENT = TINY_AGENT.replace(
    '(out / "answer.txt").write_text(answer)',
    # One trial in three (by its seed) answers the other way and spends more tokens.
    "import os\n"
    "lapse = int(os.environ['RSI_SEED']) % 3 == 0\n"
    "answer = ({'yes': 'no', 'no': 'yes'}.get(answer, 'yes')) if lapse else answer\n"
    '(out / "answer.txt").write_text(answer)',
).replace('"tokens": 10 + words', '"tokens": 10 + words + 7 * lapse')


def lapsing_experiment() -> Experiment:
    experiment = make_tiny_experiment(tasks=12, k=1, agent=LAPSING_AGENT)
    assert "lapse" in LAPSING_AGENT and "7 * lapse" in LAPSING_AGENT  # both replacements took
    return experiment


def gated(run: Run) -> GateDecision:
    """The run's first gate decision of a round (a candidate compared with the harness it started from)."""
    decision = GateDecision.objects.filter(run=run, round__gt=0).order_by("pk").first()
    assert decision is not None, "the run gated no candidate"
    return decision


def api_delta(candidate: Candidate) -> dict[str, Any]:
    api = APIClient()
    api.force_authenticate(get_user_model().objects.get(username="viewer"))
    response = api.get(reverse("api:candidate-detail", args=[candidate.pk]))
    assert response.status_code == 200, response.content
    delta = response.json()["delta"]
    assert delta is not None
    return dict(delta)


def visible(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def decided_then_remeasured(*, check: bool = True) -> tuple[GateDecision, dict[str, Any]]:
    """A run gates a candidate against the seed; a later run (another seed) measures the seed again. Returns the
    decision and the numbers it kept. ``check``: assert the API before the later run too (needs a "viewer")."""
    experiment = lapsing_experiment()
    first = drive(lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("unregularized"), rounds=1))
    assert first.status == Run.Status.FINISHED, first.error
    decision = gated(first)
    candidate, base = decision.candidate, decision.current
    assert base is not None and base.pk == seed_of(experiment).pk
    kept = dict(decision.numbers)
    # The interval was computed when the decision was made, and certified with it.
    assert kept["paired_tasks"] >= 5 and kept["dS_low"] <= kept["dS"] <= kept["dS_high"]
    assert decision.record is not None and decision.record.payload["gate"]["numbers"] == kept
    if check:
        before = api_delta(candidate)
        assert (before["dS"], before["low"], before["high"], before["dC"]) == (
            kept["dS"],
            kept["dS_low"],
            kept["dS_high"],
            kept["dC"],
        )
        assert (before["at_decision"], before["decision"], before["current"]) == (True, decision.pk, None)

    # A later run from the same start (another seed) measures the base again: S and C of the base move.
    later = lifecycle.run_create(
        experiment=experiment, recipe=tiny_recipe("unregularized", seed=99), rounds=1, start=base
    )
    later = drive(later)
    assert later.status == Run.Status.FINISHED, later.error
    assert Evaluation.objects.filter(candidate=base, run=later, state=Evaluation.State.CERTIFIED).exists()
    return decision, kept


def test_a_decided_candidate_keeps_its_decisions_numbers_after_a_later_run_remeasures_its_base(
    client_as: Any,
) -> None:
    viewer = client_as("viewer")
    decision, kept = decided_then_remeasured()
    candidate = decision.candidate
    now = load.candidate_delta(candidate)
    assert now is not None and now.at_decision is not None and now.moved
    assert now.estimate.delta != pytest.approx(kept["dS"], abs=1e-9)  # the base's S moved

    # The API gives the decision's numbers, and the current estimate beside them.
    after = api_delta(candidate)
    assert (after["dS"], after["low"], after["high"], after["paired_tasks"], after["dC"]) == (
        kept["dS"],
        kept["dS_low"],
        kept["dS_high"],
        kept["paired_tasks"],
        kept["dC"],
    )
    assert after["at_decision"] is True and after["decision"] == decision.pk
    assert after["current"] == {
        "dS": now.estimate.delta,
        "low": now.estimate.low,
        "high": now.estimate.high,
        "confidence": now.estimate.confidence,
        "paired_tasks": now.estimate.pairs,
        "dC": now.delta_cost,
    }

    # The page labels both.
    html = viewer.get(reverse("review:candidate", args=[candidate.pk])).content.decode()
    text = visible(html)
    at_decision = interval_text(kept["dS"], kept["dS_low"], kept["dS_high"], kept["paired_tasks"], 0.95)
    current = interval_text(now.estimate.delta, now.estimate.low, now.estimate.high, now.estimate.pairs, 0.95)
    assert f"At decision: {escape(at_decision)}" in text
    assert f"dC = {kept['dC'] * 100:+.1f}%" in text
    assert f"Current estimate (the trials as measured now): {escape(current)}" in text


def test_a_comparison_is_cached_by_its_two_sets_of_trials() -> None:
    experiment = lapsing_experiment()
    run = drive(lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("unregularized"), rounds=1))
    assert run.status == Run.Status.FINISHED, run.error
    decision = gated(run)
    candidate, base = decision.candidate, decision.current
    assert base is not None
    splits, metric = ["train", "gate"], "pass_at_1"
    key = load.comparison_key(base.pk, candidate.pk, splits, metric)
    # The decision kept the digest of the trials its interval was computed on: while they are the same, its
    # numbers are the answer, and nothing is computed (or cached).
    assert decision.numbers["trials_digest"] == key.rsplit(":", 1)[1]
    cache.clear()
    shown = load.candidate_delta(candidate)
    assert shown is not None and shown.at_decision is not None and not shown.moved
    assert (shown.estimate.delta, shown.estimate.low, shown.estimate.high) == (
        decision.numbers["dS"],
        decision.numbers["dS_low"],
        decision.numbers["dS_high"],
    )
    assert cache.get(key) is None

    first = load.comparison(base.pk, candidate.pk, splits, metric)
    assert first is not None
    assert cache.get(key) == first
    assert (first.estimate.low, first.estimate.high) == (decision.numbers["dS_low"], decision.numbers["dS_high"])
    # A repeat reads the cache and computes nothing: what the key holds is the answer.
    held = load.Comparison(dataclasses.replace(first.estimate, low=-1.0), first.delta_cost)
    cache.set(key, held)
    assert load.comparison(base.pk, candidate.pk, splits, metric) == held

    # One more certified trial of the candidate: another key, and an answer computed on the new trials.
    more = lifecycle_evaluation(candidate, seed=5)
    assert Trial.objects.filter(evaluation=more).count() == 9
    assert load.comparison_key(base.pk, candidate.pk, splits, metric) != key
    second = load.comparison(base.pk, candidate.pk, splits, metric)
    assert second is not None and second != held
    rows = load.candidate_task_rows(candidate.pk, splits)
    assert sum(len(task) for task in rows.values()) == 18
    assert second.estimate == measure.paired_delta(
        load.candidate_task_rows(base.pk, splits), rows, metric, seed=candidate.pk
    )


def lifecycle_evaluation(candidate: Candidate, *, seed: int) -> Evaluation:
    """Measure ``candidate`` once more on the evolve splits, in this process, and certify it."""
    from evolution.services import evaluation as evaluation_services  # noqa: PLC0415

    evaluation = evaluation_services.evaluation_start(
        candidate=candidate, splits=["train", "gate"], k=1, purpose=Evaluation.Purpose.CANDIDATE, seed=seed
    )
    run_evaluation_inline(evaluation)
    assert evaluation.state == Evaluation.State.CERTIFIED
    return evaluation
