"""A real model end to end: the example's slice with the local model as the trials' agent, the proposer and
the critic, two rounds of rrsi through real workers (the trial queue on eight thread slots, as ``dev.py run``
starts them)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.urls import reverse

from evolution import llm_local
from evolution.llm import LLMError
from evolution.llm_operators import analyse_failure
from evolution.loop.state import RunState
from evolution.models import Candidate, Experiment, Run, TrajectoryStep, Trial
from evolution.services.annotations import labels_available
from tests.conftest import wait_until
from tests.evolution.test_trial_slots import _max_overlap
from tests.review.test_browser import Journey

ROUNDS = 2
ENDED = {Run.Status.FINISHED, Run.Status.FAILED, Run.Status.CANCELLED, Run.Status.PAUSED}


@pytest.mark.slow
@pytest.mark.worker
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_two_rounds_with_the_local_model_through_workers(
    local_llm: str, start_worker: Any, monkeypatch: pytest.MonkeyPatch, browser: Any, live_server: Any, make_user: Any
) -> None:
    endpoint = {"RSI_LLM_BASE_URL": local_llm, "RSI_LLM_MODEL": llm_local.MODEL_ALIAS, "RSI_TRIAL_TIMEOUT": "600"}
    for key, value in endpoint.items():
        monkeypatch.setenv(key, value)
    out = io.StringIO()
    call_command("load_example", agent="llm", rounds=ROUNDS, through_workers=True, stdout=out)
    experiment = Experiment.objects.get(name="example-routing-llm")
    run = experiment.runs.get()
    assert "through the workers" in out.getvalue()

    start_worker(extra_env=endpoint, queues="celery", beat=True)
    start_worker(extra_env=endpoint, queues="trials", pool="threads", concurrency=8)

    def ended() -> bool:
        run.refresh_from_db()
        return run.status in ENDED

    wait_until(ended, timeout=2400, interval=2, what="the LLM run's end", diagnose=lambda: str(run.state)[-3000:])
    assert run.status == Run.Status.FINISHED, (run.status, run.stop_reason, run.error)

    # Every agent trial ran against the server and carries its usage, step by step.
    trials = Trial.objects.filter(evaluation__experiment=experiment)
    assert trials.count() > 0
    assert not trials.exclude(state=Trial.State.DONE).exists(), list(
        trials.exclude(state=Trial.State.DONE).values_list("error_kind", "error")[:3]
    )
    for trial in trials:
        steps = TrajectoryStep.objects.filter(trajectory__trial=trial, source="agent")
        assert steps.exists(), trial.pk
        for step in steps:
            assert step.model_name == llm_local.MODEL_ALIAS
            assert step.metrics["prompt_tokens"] > 0 and step.metrics["completion_tokens"] > 0, step.metrics
        assert trial.tokens == sum(s.metrics["prompt_tokens"] + s.metrics["completion_tokens"] for s in steps)

    # The endpoint's limit held against eight trial slots.
    spans = [(t.started_at, t.finished_at) for t in trials if t.started_at and t.finished_at]
    assert len(spans) == trials.count()
    assert experiment.endpoint is not None
    assert _max_overlap(spans) <= experiment.endpoint.max_in_flight

    # Every slot of every round is a candidate the model proposed or a refusal with its reason, and the model
    # answered at least once with tokens of its own.
    state = RunState.of(run)
    proposed = Candidate.objects.filter(run=run, origin=Candidate.Origin.PROPOSED)
    per_round = int(run.recipe.spec["candidates_per_round"])
    dropped = [item for round_number in range(1, ROUNDS + 1) for item in state.dropped_in(round_number)]
    assert proposed.count() + len(dropped) == ROUNDS * per_round, (proposed.count(), dropped)
    assert all(item["reason"] for item in dropped), dropped
    for candidate in proposed:
        assert candidate.state not in {Candidate.State.FROZEN, Candidate.State.EVALUATING}, candidate.state
        if candidate.state.startswith("rejected"):
            assert candidate.state_reason, candidate.pk
    usage = [slot for slots in state.proposer_usage.values() for slot in slots.values()]
    assert any(slot.get("completion_tokens", 0) > 0 for slot in usage), state.proposer_usage

    # The failure analyst answers about a failed train trial with a label of the catalogue, or says why not.
    failed = trials.filter(outcome="fail", split="train").first()
    if failed is not None:
        try:
            analysis = analyse_failure(failed, params={"timeout_seconds": 600, "max_tokens": 200})
        except LLMError as exc:
            assert str(exc)
        else:
            slugs = {label.slug for label in labels_available(experiment=experiment.pk)}
            assert analysis.label in slugs and analysis.usage["completion_tokens"] > 0, analysis

    # A person opens a trial of the run in Chromium and reads the model's own words and its tool call.
    make_user("viewer", username="vera")
    shown = trials.filter(split="train").order_by("pk").first()
    assert shown is not None
    said = TrajectoryStep.objects.filter(trajectory__trial=shown, source="agent").order_by("step_id").first()
    assert said is not None and said.message
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    journey = Journey(page, live_server.url)
    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "vera")
    page.fill("#id_password", "pw-vera")
    page.click("button[type=submit]")
    journey.go(reverse("review:trial", args=[shown.pk]))
    words = said.message.strip().splitlines()[0][:60]
    page.get_by_text(words, exact=False).first.wait_for()
    call = said.tool_calls[0]["function_name"] if said.tool_calls else llm_local.MODEL_ALIAS
    assert call in page.content()
    journey.shot("llm-trial")
    assert journey.errors == []

    checked = io.StringIO()
    call_command("verify_records", experiment=experiment.pk, stdout=checked)
    assert "no mismatch" in checked.getvalue()
