"""Decisions after a run ends: an approved or derived candidate is evaluated and gated (issue 19).

In-process tests do what the workers do (trials, certification, ``run_advance``) with the same services; the
last test runs it through a real worker.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from evolution.loop import late, lifecycle, load
from evolution.loop import steps as loop_steps
from evolution.loop.certify import result_certify
from evolution.loop.review import review_decide, review_decide_partial
from evolution.models import (
    Candidate,
    CertifiedDecision,
    Evaluation,
    GateDecision,
    LedgerEntry,
    ReviewItem,
    Run,
    Trial,
)
from evolution.services import evaluation as evaluation_services
from evolution.services import review as review_services
from evolution.services.records import records_verify
from tests.conftest import wait_until
from tests.evolution.test_loop import start, tiny_recipe
from tests.factories import make_tiny_experiment
from tests.loop_driver import drive
from tests.operators import GENERIC_NOTE

pytestmark = pytest.mark.django_db


def settle(run: Run, *, rounds: int = 20) -> None:
    """What the workers do for an ended run, in this process: run its pending trials, certify, advance."""
    for _ in range(rounds):
        trials = Trial.objects.filter(evaluation__run=run, state=Trial.State.PENDING)
        pending = list(trials.values_list("pk", flat=True))
        for trial_id in pending:
            evaluation_services.trial_execute(trial_id=trial_id, owner="inline")
        complete = list(
            Evaluation.objects.filter(run=run, state=Evaluation.State.COMPLETE).values_list("pk", flat=True)
        )
        for evaluation_id in complete:
            result_certify(evaluation_id=evaluation_id)
        loop_steps.run_advance(run_id=run.pk)
        if not pending and not complete:
            return


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice")


def ended_with_two_open_reviews() -> tuple[Run, list[ReviewItem]]:
    """Drive an rrsi run with mixed candidates to its end; its two review items are still open."""
    run = drive(start("rrsi", proposal={"operator": "review-test-mixed"}))
    assert run.status == Run.Status.FINISHED, run.error
    items = list(ReviewItem.objects.filter(candidate__run=run, state=ReviewItem.State.OPEN).order_by("pk"))
    assert len(items) == 2
    return run, items


@pytest.fixture
def ended() -> tuple[Run, list[ReviewItem]]:
    """A finished rrsi run whose two mixed candidates (two leaky edits, one generic) still wait for review."""
    return ended_with_two_open_reviews()


def assert_gated_late(run: Run, candidate: Candidate) -> GateDecision:
    """Evaluated, certified, gated against its parent by the loop's gate, with ledger rows and a record."""
    candidate.refresh_from_db()
    assert Evaluation.objects.filter(candidate=candidate, run=run, state=Evaluation.State.CERTIFIED).exists()
    decision = GateDecision.objects.get(candidate=candidate)
    assert decision.run_id == run.pk and decision.current_id == candidate.parent_id
    assert candidate.state == (Candidate.State.ACCEPTED if decision.accepted else Candidate.State.REJECTED_GATE)
    assert decision.record is not None and decision.record.kind == CertifiedDecision.Kind.GATE
    assert LedgerEntry.objects.filter(candidate=candidate).count() == candidate.edits.count()
    # The gate's dS is the one dS every screen shows (load.candidate_delta), against the same parent.
    delta = load.candidate_delta(candidate)
    assert delta is not None and delta.gated and delta.base_id == candidate.parent_id
    assert decision.numbers["dS"] == pytest.approx(delta.estimate.delta)
    assert any("late decision" in e.get("text", "") for e in run.state["events"] if e.get("kind") == "gate")
    return decision


def test_approved_and_derived_after_the_run_ended_are_evaluated_and_gated_against_their_parents(
    ended: tuple[Run, list[ReviewItem]], alice: User
) -> None:
    run, (first, second) = ended
    final_before = run.state["final"]
    review_decide(item=first, user=alice, approve=True, reason="generic enough")
    leaky = second.candidate.edits.filter(paths__0__startswith="answers/")
    partial = review_decide_partial(item=second, user=alice, rejected_edits=[e.pk for e in leaky], reason="leaks")
    derived = partial.derived_candidate
    assert derived is not None
    approved = Candidate.objects.get(pk=first.candidate_id)
    assert approved.state == derived.state == Candidate.State.EVALUATING

    settle(run)
    run.refresh_from_db()
    assert run.status == Run.Status.FINISHED
    assert_gated_late(run, approved)
    assert_gated_late(run, derived)
    assert [e.hypothesis for e in LedgerEntry.objects.filter(candidate=derived)] == [
        "Reading the whole question first helps."
    ]
    assert GENERIC_NOTE  # the derived candidate keeps the generic note (test_review_decisions checks its files)
    # The run's own report is as it ended; the chain verifies with the late decisions in it.
    assert run.state["final"] == final_before
    assert records_verify(experiment=run.experiment).ok


def test_approved_after_the_run_ended_joins_the_live_run_next_gate(
    ended: tuple[Run, list[ReviewItem]], alice: User
) -> None:
    run, (first, _) = ended
    second_run = lifecycle.run_create(experiment=run.experiment, recipe=tiny_recipe("rrsi"))
    review_decide(item=first, user=alice, approve=True, reason="generic")
    evaluation = Evaluation.objects.get(candidate_id=first.candidate_id)
    assert evaluation.run_id == second_run.pk
    drive(second_run)
    decision = GateDecision.objects.get(candidate_id=first.candidate_id)
    assert decision.run_id == second_run.pk and decision.round >= 1
    assert not GateDecision.objects.filter(run=run, candidate_id=first.candidate_id).exists()


def test_the_operator_evaluates_a_decided_candidate_on_the_splits_it_lacks_only() -> None:
    experiment = make_tiny_experiment(tasks=12, k=1)
    recipe = tiny_recipe("rrsi", evaluation={"sealed": "final"})
    run = drive(lifecycle.run_create(experiment=experiment, recipe=recipe))
    # A candidate the gate rejected: the final report measured only the final harness and the start on sealed tasks.
    decided = Candidate.objects.filter(run=run, state=Candidate.State.REJECTED_GATE).order_by("pk").first()
    assert decided is not None
    assert not Trial.objects.filter(candidate=decided, split="sealed").exists()
    with pytest.raises(late.LateError, match="measured on the gate's splits already"):
        late.candidate_evaluate_late(candidate_id=decided.pk, scope="gate")
    outcome = late.candidate_evaluate_late(candidate_id=decided.pk, scope="all")
    evaluation = Evaluation.objects.get(pk__in=outcome.evaluations)
    assert (evaluation.splits, evaluation.purpose) == (["sealed"], Evaluation.Purpose.TRANSFER)
    settle(run)
    decided.refresh_from_db()
    assert decided.state == Candidate.State.REJECTED_GATE
    assert Trial.objects.filter(candidate=decided, split="sealed", evaluation__state="certified").exists()
    with pytest.raises(late.LateError, match="every split already"):
        late.candidate_evaluate_late(candidate_id=decided.pk, scope="all")


def test_a_flagged_candidate_is_not_evaluated_before_review(ended: tuple[Run, list[ReviewItem]]) -> None:
    _, (first, _) = ended
    with pytest.raises(late.LateError, match="waits for a reviewer"):
        late.candidate_evaluate_late(candidate_id=first.candidate_id, scope="gate")
    assert not Evaluation.objects.filter(candidate_id=first.candidate_id).exists()


def approve_only(item: ReviewItem, user: User) -> None:
    """A certified review approval that starts nothing (the review service alone, without the loop's
    evaluation): what the code before issue 19 left behind."""
    review_services.review_decide(item=item, user=user, approve=True, reason="generic enough")


def test_the_reaper_check_schedules_or_ends_candidates_left_waiting(
    ended: tuple[Run, list[ReviewItem]], alice: User
) -> None:
    run, (first, second) = ended
    # As the code before this change left them: approved after the run, never evaluated.
    approve_only(first, alice)
    # Evaluating, but its only evaluation was cancelled.
    approve_only(second, alice)
    cancelled = late.candidate_evaluate_late(candidate_id=second.candidate_id).evaluations
    Evaluation.objects.filter(pk__in=cancelled).update(state=Evaluation.State.CANCELLED)

    counts = late.stranded_reap()

    assert counts == {"scheduled": 1, "ended": 1, "gates": 0}
    assert Candidate.objects.get(pk=first.candidate_id).state == Candidate.State.EVALUATING
    ended_one = Candidate.objects.get(pk=second.candidate_id)
    assert ended_one.state == Candidate.State.CANCELLED
    assert ended_one.state_reason == f"its evaluation {cancelled[0]} was cancelled"
    # Once certified, the candidate waits for its ended run's gate: the check sends run_advance for that run.
    for trial_id in Trial.objects.filter(candidate_id=first.candidate_id).values_list("pk", flat=True):
        evaluation_services.trial_execute(trial_id=trial_id, owner="inline")
    for evaluation in Evaluation.objects.filter(candidate_id=first.candidate_id):
        result_certify(evaluation_id=evaluation.pk)
    assert Candidate.objects.get(pk=first.candidate_id).state == Candidate.State.CERTIFIED
    assert late.stranded_reap() == {"scheduled": 0, "ended": 0, "gates": 1}
    loop_steps.run_advance(run_id=run.pk)
    assert GateDecision.objects.filter(candidate_id=first.candidate_id, run=run).exists()
    assert late.stranded_reap() == {"scheduled": 0, "ended": 0, "gates": 0}


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_evaluates_and_gates_what_was_approved_and_derived_after_the_run(
    start_worker: Any, alice: User
) -> None:
    run = drive(start("rrsi", proposal={"operator": "review-test-mixed"}))
    assert run.status == Run.Status.FINISHED, run.error
    first, second = ReviewItem.objects.filter(candidate__run=run).order_by("pk")
    start_worker(extra_env={"RSI_OPERATOR_MODULES": "tests.operators"})
    review_decide(item=first, user=alice, approve=True, reason="generic enough")
    leaky = second.candidate.edits.filter(paths__0__startswith="answers/")
    derived = review_decide_partial(
        item=second, user=alice, rejected_edits=[e.pk for e in leaky], reason="leaks"
    ).derived_candidate
    assert derived is not None
    waiting = [first.candidate_id, derived.pk]

    def decided() -> bool:
        return GateDecision.objects.filter(candidate_id__in=waiting).count() == 2

    wait_until(
        decided,
        timeout=180,
        what="the worker's late gate of both candidates",
        diagnose=lambda: str(list(Candidate.objects.filter(pk__in=waiting).values("pk", "state", "state_reason"))),
    )
    run.refresh_from_db()
    for candidate in Candidate.objects.filter(pk__in=waiting):
        assert_gated_late(run, candidate)
    assert records_verify(experiment=run.experiment).ok


def user_in(role: str) -> User:
    from django.contrib.auth.models import Group

    from evolution.access import roles_ensure

    roles_ensure()
    user = User.objects.create_user(role)
    user.groups.add(Group.objects.get(name=role))
    return user


def test_the_candidate_page_and_the_api_evaluate_on_the_operator_s_request(
    ended: tuple[Run, list[ReviewItem]], alice: User
) -> None:
    from django.test import Client
    from django.urls import reverse
    from rest_framework.test import APIClient

    run, (first, second) = ended
    operator, viewer = user_in("operator"), user_in("viewer")
    page, api = Client(), APIClient()
    page.force_login(operator)
    url = reverse("review:candidate_evaluate", args=[first.candidate_id])
    # Flagged: refused with the reason, nothing started.
    response = page.post(url, {"scope": "gate"}, follow=True)
    assert (
        "Not evaluated: candidate" in response.content.decode() and "waits for a reviewer" in response.content.decode()
    )
    assert not Evaluation.objects.filter(candidate_id=first.candidate_id).exists()
    # Left approved with nothing scheduled (as before this change): the API evaluates it on every split.
    approve_only(first, alice)
    api.force_authenticate(viewer)
    endpoint = f"/api/v1/candidates/{first.candidate_id}/evaluate/"
    assert api.post(endpoint, {"scope": "all"}, format="json").status_code == 403
    assert not Evaluation.objects.filter(candidate_id=first.candidate_id).exists()
    api.force_authenticate(operator)
    answer = api.post(endpoint, {"scope": "all"}, format="json")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert (body["run"], body["joined"], len(body["evaluations"])) == (run.pk, False, 2)
    purposes = dict(Evaluation.objects.filter(candidate_id=first.candidate_id).values_list("purpose", "splits"))
    assert purposes == {"candidate": ["gate", "train"], "transfer": ["sealed"]}
    assert api.post(endpoint, {"scope": "all"}, format="json").status_code == 409
    # The page of a derived candidate links the candidate it was derived from; an operator sees the actions.
    leaky = second.candidate.edits.filter(paths__0__startswith="answers/")
    derived = review_decide_partial(item=second, user=alice, rejected_edits=[e.pk for e in leaky], reason="leaks")
    assert derived.derived_candidate is not None
    settle(run)
    html = page.get(reverse("review:candidate", args=[derived.derived_candidate.pk])).content.decode()
    assert f'Derived from <a href="{reverse("review:candidate", args=[second.candidate_id])}">' in html
    assert 'value="gate"' in html and "Evaluate on all splits" in html
    # The lineage draws the derived-from link (dashed, not a parent edge).
    lineage = page.get(reverse("review:lineage", args=[run.experiment_id])).content.decode()
    assert f'data-from="{second.candidate_id}" data-to="{derived.derived_candidate.pk}"' in lineage
