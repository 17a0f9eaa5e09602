"""Undoing a review decision inside its window, and correcting one that took effect (issue 40, item 3)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from evolution import access, records
from evolution.loop import load
from evolution.loop.review import (
    review_correct,
    review_decide,
    review_decide_partial,
    review_settle,
    review_settle_due,
    review_submit,
    review_undo,
)
from evolution.models import (
    Candidate,
    CertifiedDecision,
    Evaluation,
    GateDecision,
    ReviewCorrection,
    ReviewDecision,
    ReviewItem,
    ReviewPending,
    Run,
    Trial,
)
from evolution.services.records import records_verify
from evolution.services.review import ReviewConflict, ReviewError
from tests.evolution.test_review_decisions import held_at_first_flag, held_by
from tests.loop_driver import drive

pytestmark = pytest.mark.django_db


@pytest.fixture
def held() -> tuple[Run, ReviewItem]:
    return held_at_first_flag()


def reviewer(name: str) -> User:
    access.roles_ensure()
    user = User.objects.create_user(name, password=f"pw-{name}")
    user.groups.add(Group.objects.get(name="reviewer"))
    return User.objects.get(pk=user.pk)  # a fresh object: no cached permissions


def verified(run: Run) -> None:
    report = records_verify(experiment=run.experiment)
    assert report.problems == [], report.problems


def wait_out(pending: ReviewPending) -> None:
    """Sleep until the pending decision's window has passed (real time: the windows in these tests are 1 s)."""
    assert pending.effective_at is not None
    from django.utils import timezone

    left = (pending.effective_at - timezone.now()).total_seconds()
    time.sleep(max(0.0, left) + 0.05)


def test_a_decision_waits_out_its_window_and_is_undone_inside_it(held: tuple[Run, ReviewItem], settings: Any) -> None:
    settings.RSI_REVIEW_UNDO_SECONDS = 30
    _, item = held
    alice = reviewer("alice")
    pending = review_submit(item=item, user=alice, verdict="reject", reason="copies a task id")
    assert isinstance(pending, ReviewPending)
    item.refresh_from_db()
    assert (item.state, item.claimed_by_id) == (ReviewItem.State.PENDING, alice.pk)
    # Nothing has happened yet: no decision, no record, the candidate still waits.
    assert not ReviewDecision.objects.exists()
    assert not CertifiedDecision.objects.filter(kind=CertifiedDecision.Kind.REVIEW).exists()
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.FLAGGED
    assert review_settle(item_id=item.pk) is None  # not yet due
    assert review_settle_due() == 0
    bob = reviewer("bob")
    with pytest.raises(ReviewConflict, match="only alice can undo"):
        review_undo(item=item, user=bob)
    with pytest.raises(ReviewConflict, match="pending"):
        review_submit(item=item, user=bob, verdict="approve", reason="generic")

    review_undo(item=item, user=alice)
    item.refresh_from_db()
    assert (item.state, item.claimed_by_id) == (ReviewItem.State.CLAIMED, alice.pk)
    assert not ReviewPending.objects.exists()
    assert not ReviewDecision.objects.exists()
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.FLAGGED
    with pytest.raises(ReviewConflict, match="no pending decision"):
        review_undo(item=item, user=alice)


def test_after_its_window_the_decision_takes_effect_once_and_cannot_be_undone(
    held: tuple[Run, ReviewItem], settings: Any
) -> None:
    settings.RSI_REVIEW_UNDO_SECONDS = 1
    run, item = held
    alice = reviewer("alice")
    pending = review_submit(item=item, user=alice, verdict="approve", reason="generic enough")
    assert isinstance(pending, ReviewPending)
    wait_out(pending)
    with pytest.raises(ReviewConflict, match="window has closed"):
        review_undo(item=item, user=alice)
    assert review_settle_due() == 1
    assert review_settle_due() == 0  # settling twice does nothing more
    assert review_settle(item_id=item.pk) is None
    decision = ReviewDecision.objects.get(item=item)
    assert (decision.verdict, decision.reason, decision.reviewer_id) == ("approve", "generic enough", alice.pk)
    assert decision.record is not None
    item.refresh_from_db()
    assert item.state == ReviewItem.State.APPROVED
    assert not ReviewPending.objects.exists()
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.EVALUATING
    with pytest.raises(ReviewConflict, match="taken effect: correct it"):
        review_undo(item=item, user=alice)
    verified(run)


def test_the_next_reader_of_the_item_gives_a_due_decision_effect(held: tuple[Run, ReviewItem], settings: Any) -> None:
    # No worker runs here: the task sent after commit finds nothing due, and the page read after the window does it.
    settings.RSI_REVIEW_UNDO_SECONDS = 5
    _, item = held
    alice = reviewer("alice")
    pending = review_submit(item=item, user=alice, verdict="reject", reason="copies a task id")
    assert isinstance(pending, ReviewPending)
    client = Client()
    client.force_login(alice)
    started = time.monotonic()
    page = client.get(reverse("review:review_item", args=[item.pk]))
    assert page.status_code == 200
    assert time.monotonic() - started < 5, "the page took longer than the window"
    assert 'id="undo"' in page.content.decode() and not ReviewDecision.objects.exists()
    wait_out(pending)
    page = client.get(reverse("review:review_item", args=[item.pk]))
    assert page.status_code == 200
    decision = ReviewDecision.objects.get(item=item)
    assert decision.verdict == "reject"
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.REJECTED_REVIEW


def test_correcting_an_approval_withdraws_the_evaluation_not_yet_started(held: tuple[Run, ReviewItem]) -> None:
    run, item = held
    alice, bob = reviewer("alice"), reviewer("bob")
    decision = review_decide(item=item, user=alice, approve=True, reason="generic enough")
    candidate = Candidate.objects.get(pk=item.candidate_id)
    evaluation = Evaluation.objects.get(candidate=candidate, state=Evaluation.State.RUNNING)
    assert not Trial.objects.filter(evaluation=evaluation).exclude(state=Trial.State.PENDING).exists()

    with pytest.raises(ReviewError, match="reason is required"):
        review_correct(item=item, user=bob, approve=False, reason=" ")
    with pytest.raises(ReviewError, match="approved it already"):
        review_correct(item=item, user=bob, approve=True, reason="still fine")
    assert not ReviewCorrection.objects.exists()

    correction = review_correct(item=item, user=bob, approve=False, reason="it names the task's answer file")
    evaluation.refresh_from_db()
    assert evaluation.state == Evaluation.State.CANCELLED
    assert set(Trial.objects.filter(evaluation=evaluation).values_list("state", flat=True)) == {Trial.State.CANCELLED}
    assert correction.followed == [f"evaluation {evaluation.pk} withdrawn before it started"]
    candidate.refresh_from_db()
    assert candidate.state == Candidate.State.REJECTED_REVIEW
    assert candidate.state_reason == "review corrected by bob: it names the task's answer file"
    item.refresh_from_db()
    assert item.state == ReviewItem.State.REJECTED

    # A certified record in the chain that names the decision it corrects.
    assert decision.record is not None and correction.record is not None
    payload = correction.record.payload
    assert correction.record.kind == CertifiedDecision.Kind.CORRECTION
    assert payload["schema"] == records.CORRECTION_SCHEMA and payload["correction"] is True
    assert payload["corrects"] == {
        "seq": decision.record.seq,
        "record": decision.record.record_digest,
        "verdict": "approve",
    }
    assert payload["withdrawn"] is None
    assert payload["review"]["verdict"] == "reject" and payload["review"]["reviewer"] == "bob"
    assert payload["state"] == {"name": "rejected_review", "reason": candidate.state_reason}
    assert correction.record.seq > decision.record.seq
    verified(run)

    finished = drive(run)
    assert finished.status == Run.Status.FINISHED, finished.error
    assert not GateDecision.objects.filter(candidate=candidate).exists()
    assert Candidate.objects.get(pk=candidate.pk).state == Candidate.State.REJECTED_REVIEW
    verified(run)


def test_an_accepted_candidate_rejected_on_correction_leaves_the_best_and_the_starts(
    held: tuple[Run, ReviewItem],
) -> None:
    run, item = held
    alice, bob = reviewer("alice"), reviewer("bob")
    review_decide(item=item, user=alice, approve=True, reason="generic enough")
    finished = drive(run)
    assert finished.status == Run.Status.FINISHED, finished.error
    candidate = Candidate.objects.get(pk=item.candidate_id)
    assert candidate.state == Candidate.State.ACCEPTED  # it hard-codes a failing task's answer: the gate takes it
    experiment = run.experiment
    assert load.best_candidate(experiment) == candidate

    correction = review_correct(item=item, user=bob, approve=False, reason="it hard-codes a task's answer")
    candidate.refresh_from_db()
    assert candidate.state == Candidate.State.REJECTED_REVIEW
    best = load.best_candidate(experiment)
    assert best is not None and best.pk != candidate.pk
    assert correction.followed == [
        f"taken out of the experiment's best and the starts of a new run: the best is now candidate {best.pk}"
    ]
    verified(run)

    # The next run starts from the best that remains, never from the corrected candidate.
    from evolution.loop import lifecycle
    from tests.evolution.test_loop import tiny_recipe

    second = lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("rrsi"))
    assert second.start_candidate_id == best.pk


def test_a_rejection_corrected_to_an_approval_is_evaluated_and_gated(held: tuple[Run, ReviewItem]) -> None:
    run, item = held
    alice, bob = reviewer("alice"), reviewer("bob")
    first = review_decide(item=item, user=alice, approve=False, reason="looks like a leak")
    correction = review_correct(item=item, user=bob, approve=True, reason="the file is a generic note")
    candidate = Candidate.objects.get(pk=item.candidate_id)
    assert candidate.state == Candidate.State.EVALUATING
    assert correction.followed and "is evaluated" in correction.followed[0]
    assert first.record is not None and correction.record is not None
    assert correction.record.payload["corrects"]["seq"] == first.record.seq
    drive(run)
    gate = GateDecision.objects.get(candidate=candidate)
    # The gate rests on the correction's approval, and the chain verifies.
    assert gate.record is not None
    assert gate.record.payload["review"] == {"seq": correction.record.seq, "record": correction.record.record_digest}
    verified(run)

    # A correction of the correction names the correction, not the first decision.
    again = review_correct(item=item, user=alice, approve=False, reason="on second thought it leaks")
    assert again.record is not None
    assert again.record.payload["corrects"] == {
        "seq": correction.record.seq,
        "record": correction.record.record_digest,
        "verdict": "approve",
    }
    verified(run)


def test_only_a_reviewer_corrects_and_a_pending_decision_is_undone_not_corrected(
    held: tuple[Run, ReviewItem], settings: Any
) -> None:
    settings.RSI_REVIEW_UNDO_SECONDS = 30
    _, item = held
    alice = reviewer("alice")
    viewer = User.objects.create_user("victor")
    review_submit(item=item, user=alice, verdict="approve", reason="generic enough")
    with pytest.raises(ReviewError, match="can be undone"):
        review_correct(item=item, user=alice, approve=False, reason="oops")
    settings.RSI_REVIEW_UNDO_SECONDS = 0
    review_undo(item=item, user=alice)
    review_submit(item=item, user=alice, verdict="approve", reason="generic enough")
    with pytest.raises(ReviewError, match="only a reviewer"):
        review_correct(item=item, user=viewer, approve=False, reason="it leaks")
    assert not ReviewCorrection.objects.exists()
    client = Client()
    client.force_login(viewer)
    response = client.post(reverse("review:review_correct", args=[item.pk]), {"verdict": "reject", "reason": "x"})
    assert response.status_code == 403
    assert not ReviewCorrection.objects.exists()


def test_a_forged_correction_record_fails_verification(held: tuple[Run, ReviewItem]) -> None:
    run, item = held
    alice, bob = reviewer("alice"), reviewer("bob")
    review_decide(item=item, user=alice, approve=True, reason="generic enough")
    correction = review_correct(item=item, user=bob, approve=False, reason="it leaks")
    # A correction row pointed at another record than the one its certified record names.
    other = CertifiedDecision.objects.exclude(pk__in=[correction.corrects_id, correction.record_id]).order_by("seq")
    ReviewCorrection.objects.filter(pk=correction.pk).update(corrects=other.first())
    problems = records_verify(experiment=run.experiment).problems
    assert any("the correction names another record than the stored one" in p for p in problems), problems


def test_a_partial_decision_is_corrected_to_a_whole_verdict_and_its_derived_candidate_withdrawn() -> None:
    run, item = held_by("review-test-mixed")
    alice, bob = reviewer("alice"), reviewer("bob")
    flagged = item.candidate
    leaky = list(flagged.edits.filter(paths__0__startswith="answers/"))
    decision = review_decide_partial(item=item, user=alice, rejected_edits=[e.pk for e in leaky], reason="leaks")
    derived = decision.derived_candidate
    assert derived is not None and derived.state == Candidate.State.EVALUATING
    evaluation = Evaluation.objects.get(candidate=derived, state=Evaluation.State.RUNNING)
    with pytest.raises(ReviewError, match="reason is required"):
        review_correct(item=item, user=bob, approve=False, reason="")
    assert not ReviewCorrection.objects.exists()

    # The item's panel offers either whole verdict and says the derived candidate is withdrawn.
    client = Client()
    client.force_login(bob)
    url = reverse("review:review_item", args=[item.pk])
    html = client.get(url).content.decode()
    assert 'value="reject" class="danger">Correct to reject the whole candidate</button>' in html
    assert 'value="approve" class="primary">Correct to approve the whole candidate</button>' in html
    assert f"the candidate derived from this decision (#{derived.pk}) is withdrawn like a rejected one" in html

    # Rejected whole: the flagged candidate stays rejected, the derived one is withdrawn as a rejected one is.
    response = client.post(
        reverse("review:review_correct", args=[item.pk]), {"verdict": "reject", "reason": "the note leaks too"}
    )
    assert response.status_code == 302
    correction = ReviewCorrection.objects.get(item=item)
    flagged.refresh_from_db()
    derived.refresh_from_db()
    evaluation.refresh_from_db()
    words = "review corrected by bob: the note leaks too"
    assert (flagged.state, flagged.state_reason) == (Candidate.State.REJECTED_REVIEW, words)
    assert derived.state == Candidate.State.REJECTED_REVIEW
    assert derived.state_reason == f"withdrawn: derived from candidate {flagged.pk}, whose {words}"
    assert evaluation.state == Evaluation.State.CANCELLED
    assert correction.followed == [
        f"evaluation {evaluation.pk} withdrawn before it started",
        f"the derived candidate {derived.pk} withdrawn (rejected by review)",
    ]
    item.refresh_from_db()
    assert item.state == ReviewItem.State.REJECTED
    # Its record says it is a correction, names the partial decision's record, and certifies the withdrawal.
    assert decision.record is not None and correction.record is not None
    assert correction.record.kind == CertifiedDecision.Kind.CORRECTION
    payload = correction.record.payload
    assert payload["correction"] is True
    assert payload["corrects"] == {
        "seq": decision.record.seq,
        "record": decision.record.record_digest,
        "verdict": "reject_edits",
    }
    assert payload["withdrawn"] == {"tree": derived.tree_id, "state": "rejected_review", "reason": derived.state_reason}
    verified(run)

    # Corrected back to an approval of the whole candidate: evaluated for its gate (as a rejection corrected to
    # an approval is, gated in the test above); the derived one stays withdrawn.
    again = review_correct(item=item, user=alice, approve=True, reason="the answers are generic after all")
    assert again.record is not None and again.record.payload["corrects"]["seq"] == correction.record.seq
    assert again.record.payload["withdrawn"] is None
    assert Candidate.objects.get(pk=flagged.pk).state == Candidate.State.EVALUATING
    assert Candidate.objects.get(pk=derived.pk).state == Candidate.State.REJECTED_REVIEW
    verified(run)


def test_a_partial_decision_whose_derived_candidate_has_its_own_review_is_corrected_after_it() -> None:
    run, item = held_by("review-test-mixed")
    alice, bob = reviewer("alice"), reviewer("bob")
    first_leak = item.candidate.edits.get(index=0)
    decision = review_decide_partial(item=item, user=alice, rejected_edits=[first_leak.pk], reason="one leak")
    derived = decision.derived_candidate
    assert derived is not None and derived.state == Candidate.State.FLAGGED
    own = ReviewItem.objects.get(candidate=derived)
    with pytest.raises(ReviewError, match=f"candidate {derived.pk}, derived by this decision, has a review of its own"):
        review_correct(item=item, user=bob, approve=True, reason="generic")
    assert not ReviewCorrection.objects.exists()
    assert Candidate.objects.get(pk=item.candidate_id).state == Candidate.State.REJECTED_REVIEW
    # Its own review rejects it; then the partial decision is corrected, and nothing more is withdrawn.
    review_decide(item=own, user=bob, approve=False, reason="still leaks")
    with pytest.raises(ReviewError, match="has a review of its own"):
        review_correct(item=item, user=bob, approve=True, reason="generic")
    verified(run)


def test_a_correction_record_is_checked_for_what_it_says_it_corrects_and_withdraws() -> None:
    def review(seq: int, tree: str, verdict: str, derived: str | None = None) -> tuple[int, str, dict[str, Any]]:
        payload = {
            "schema": records.REVIEW_SCHEMA,
            "candidate": {"tree": tree},
            "review": {"verdict": verdict, "derived": derived},
        }
        return seq, f"d{seq}", payload

    def correction(seq: int, tree: str, corrects: int, verdict: str, withdrawn: str | None) -> tuple[int, str, Any]:
        payload = {
            "schema": records.CORRECTION_SCHEMA,
            "candidate": {"tree": tree},
            "correction": True,
            "corrects": {"seq": corrects, "record": f"d{corrects}", "verdict": verdict},
            "withdrawn": {"tree": withdrawn, "state": "rejected_review", "reason": "r"} if withdrawn else None,
            "review": {"verdict": "approve", "derived": None},
        }
        return seq, f"d{seq}", payload

    partial = review(1, "F", "reject_edits", derived="D")
    assert records.correction_problems([partial, correction(2, "F", 1, "reject_edits", "D")]) == []
    assert records.correction_problems([partial, correction(2, "F", 1, "reject_edits", "X")]) == [
        "record #2: correction of candidate F: it withdraws a candidate the corrected record did not derive"
    ]
    assert records.correction_problems([partial, correction(2, "F", 1, "approve", None)]) == [
        "record #2: correction of candidate F: it does not say it is a correction of the reject_edits verdict of "
        "record #1"
    ]
    whole = review(1, "F", "reject")
    assert records.correction_problems([whole, correction(2, "F", 1, "reject", "D")]) == [
        "record #2: correction of candidate F: it withdraws a candidate the corrected record did not derive"
    ]
    # A withdrawn candidate's state is held to the correction's record like a decided one's.
    state = {"name": "rejected_review", "reason": "r"}
    _, _, certified = correction(2, "F", 1, "reject_edits", "D")
    problems = records.candidate_state_problems(
        [records.CandidateState("D", "accepted", "", "derived")],
        [(2, {**certified, "state": state})],
        known_states=Candidate.State.values,
    )
    assert problems == [
        "candidate D: state 'accepted', but the certified correction decision (record #2) made it 'rejected_review'"
    ]
    # The record's kind: a correction is a correction record (or, written before that kind, a review record).
    assert records.kind_problem(certified, "correction") == records.kind_problem(certified, "review") == ""
    assert records.kind_problem(certified, "gate") == "payload is not a gate decision"
    assert records.kind_problem(partial[2], "correction") == "payload is not a correction decision"
