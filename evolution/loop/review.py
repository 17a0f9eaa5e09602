"""A reviewer's decision as the loop sees it: decide (``services.review``), then evaluate what was approved.

The review service records the decision and starts nothing; here, in the same transaction, an approved candidate
(or a clean derived one) is evaluated at once: for its run's next gate, for the live run's when its own run has
ended, or for a late gate against its parent when no run is live (``late.candidate_evaluate_late``). When that
is impossible the decision still stands; the reaper's check (``late.stranded_reap``) ends the candidate with the
reason. The screens and the API decide through these two functions.

A decision made on the screens waits ``RSI_REVIEW_UNDO_SECONDS`` before it takes effect (``review_submit``: a
``ReviewPending``; ``review_undo`` takes it back; ``review_settle`` gives it effect through the two functions
above, sent as a task with that countdown and called by the next reader and the reaper, so a worker that is down
delays nothing a reader sees). A decision that took effect is corrected by ``review_correct``: a new certified
decision naming the one it corrects, with its consequences (docs/review.md#corrections).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from evolution import access, dispatch
from evolution.loop import load
from evolution.loop.late import LateError, candidate_evaluate_late
from evolution.loop.state import RunState
from evolution.models import (
    AtomicEdit,
    Candidate,
    Evaluation,
    ReviewCorrection,
    ReviewDecision,
    ReviewItem,
    ReviewPending,
    Run,
    Trial,
)
from evolution.services import review as review_services
from evolution.services.candidates import candidate_transition
from evolution.services.records import review_correction_certify, review_standing
from evolution.services.review import DECIDED, LIVE_RUNS, ReviewConflict, ReviewError

__all__ = [
    "corrections_of",
    "review_correct",
    "review_decide",
    "review_decide_partial",
    "review_settle",
    "review_settle_due",
    "review_submit",
    "review_undo",
    "undo_seconds",
]

logger = logging.getLogger(__name__)


def review_decide(*, item: ReviewItem, user: Any, approve: bool, reason: str) -> ReviewDecision:
    """``services.review.review_decide``; an approved candidate is then evaluated for its gate (one transaction).
    Raises what the service raises (``ReviewConflict``, ``ReviewError``), with nothing written."""
    with transaction.atomic():
        decision = review_services.review_decide(item=item, user=user, approve=approve, reason=reason)
        if approve:
            _evaluate(decision.item.candidate_id)
    return decision


def review_decide_partial(
    *, item: ReviewItem, user: Any, rejected_edits: Iterable[int | str], reason: str
) -> ReviewDecision:
    """``services.review.review_decide_partial`` with the edit budget of the flagged candidate's round; a derived
    candidate the critic approved is then evaluated for its gate (one transaction). Raises what the service
    raises, with nothing written."""
    with transaction.atomic():
        decision = review_services.review_decide_partial(
            item=item, user=user, rejected_edits=rejected_edits, reason=reason, edit_budget=_round_budget(item)
        )
        derived = decision.derived_candidate
        if derived is not None and derived.state == Candidate.State.APPROVED:
            _evaluate(derived.pk)
            derived.refresh_from_db()  # the caller sees it evaluating
    return decision


def _round_budget(item: ReviewItem) -> int | None:
    """The edit budget of the round that proposed the item's candidate (None: no budget, or no run)."""
    row = Candidate.objects.filter(pk=item.candidate_id).values_list("run_id", "round").first()
    run = Run.objects.filter(pk=row[0]).first() if row is not None and row[0] is not None else None
    if run is None or row is None:
        return None
    return RunState.of(run).round_budgets.get(row[1] or 0)


def _evaluate(candidate_id: int) -> None:
    try:
        candidate_evaluate_late(candidate_id=candidate_id, scope="gate")
    except LateError:
        logger.warning("approved candidate %s could not be evaluated", candidate_id, exc_info=True)


# --- The undo window --------------------------------------------------------------------


def undo_seconds() -> int:
    """How long a decision made on the screens waits before it takes effect (``RSI_REVIEW_UNDO_SECONDS``)."""
    return max(0, int(settings.RSI_REVIEW_UNDO_SECONDS))


def _decide(*, item: ReviewItem, user: Any, verdict: str, reason: str, rejected_edits: Sequence[int]) -> ReviewDecision:
    if verdict == ReviewDecision.Verdict.REJECT_EDITS:
        return review_decide_partial(item=item, user=user, rejected_edits=rejected_edits, reason=reason)
    return review_decide(item=item, user=user, approve=verdict == ReviewDecision.Verdict.APPROVE, reason=reason)


def review_submit(
    *, item: ReviewItem, user: Any, verdict: str, reason: str, rejected_edits: Iterable[int | str] = ()
) -> ReviewPending | ReviewDecision:
    """A reviewer's decision, held for ``undo_seconds()`` before it takes effect.

    ``verdict`` is a ``ReviewDecision.Verdict``; ``rejected_edits`` (AtomicEdit ids) go with REJECT_EDITS.
    The reason and the selection are checked now; the item (open, or claimed by ``user``) becomes PENDING,
    claimed by ``user``, and a ``review_settle`` task is sent with the window as its countdown after commit.
    Nothing else changes until then: ``review_undo`` takes it back. With a window of 0 the decision takes
    effect at once and the ``ReviewDecision`` is returned. Raises ReviewError / ReviewConflict as
    ``review_decide`` does; a decision that fails only when it takes effect (a derived candidate that cannot
    be made) is kept on the ``ReviewPending`` as ``error`` and the item is the reviewer's again.
    """
    reason = review_services.reason_required(reason)
    if verdict not in ReviewDecision.Verdict.values:
        raise ReviewError("choose approve, reject, or reject the selected edits")
    edits: list[int] = []
    if verdict == ReviewDecision.Verdict.REJECT_EDITS:
        try:
            edits = sorted({int(pk) for pk in rejected_edits})
        except (TypeError, ValueError) as exc:
            raise ReviewError("the selected edits are not edit ids") from exc
        if not edits:
            raise ReviewError("select at least one atomic edit to reject")
    window = undo_seconds()
    if window == 0:
        return _decide(item=item, user=user, verdict=verdict, reason=reason, rejected_edits=edits)
    with transaction.atomic():
        locked = review_services.item_lock_undecided(item=item, user=user)
        if edits:
            own = set(AtomicEdit.objects.filter(candidate_id=locked.candidate_id).values_list("pk", flat=True))
            if not set(edits) <= own:
                raise ReviewError(f"the selected edits are not atomic edits of candidate {locked.candidate_id}")
            if own <= set(edits):
                raise ReviewError("every atomic edit is selected: reject the whole candidate instead")
        now = timezone.now()
        ReviewPending.objects.filter(item=locked).delete()
        pending = ReviewPending.objects.create(
            item=locked,
            reviewer=user,
            verdict=verdict,
            reason=reason,
            rejected_edits=edits,
            effective_at=now + timedelta(seconds=window),
        )
        locked.state = ReviewItem.State.PENDING
        locked.claimed_by = user
        locked.claimed_at = locked.claimed_at or now
        locked.save(update_fields=["state", "claimed_by", "claimed_at"])
        dispatch.review_settle_after_commit(locked.pk, window)
        return pending


def review_undo(*, item: ReviewItem, user: Any) -> ReviewItem:
    """Take back one's own pending decision inside its window: the item is claimed by ``user`` again and
    nothing happened. After the window (or someone else's decision, or none pending): ReviewConflict."""
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update(no_key=True).get(pk=item.pk)
        pending = ReviewPending.objects.filter(item=locked).first()
        if locked.state in DECIDED:
            raise ReviewConflict("the decision has taken effect: correct it instead")
        if locked.state != ReviewItem.State.PENDING or pending is None:
            raise ReviewConflict("there is no pending decision to undo")
        if pending.reviewer_id != user.pk:
            raise ReviewConflict(f"only {pending.reviewer} can undo their decision")
        if pending.effective_at is None or pending.effective_at <= timezone.now():
            raise ReviewConflict("the undo window has closed and the decision takes effect: correct it instead")
        pending.delete()
        locked.state = ReviewItem.State.CLAIMED
        locked.save(update_fields=["state"])
        return locked


def review_settle(*, item_id: int) -> ReviewDecision | None:
    """Give effect to the item's pending decision once its window has passed (``review_decide`` or
    ``review_decide_partial`` as the reviewer who made it). Returns the decision, or None when there is
    nothing due (no pending decision, undone, not yet due, already settled). Safe to repeat and to race:
    the item's row lock serializes callers. When the decision cannot take effect, its error is kept on the
    ``ReviewPending`` and the item is claimed by its reviewer again."""
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update(no_key=True).filter(pk=item_id).first()
        if locked is None or locked.state != ReviewItem.State.PENDING:
            return None
        pending = ReviewPending.objects.select_related("reviewer").filter(item=locked).first()
        if pending is None or pending.effective_at is None or pending.effective_at > timezone.now():
            return None
        locked.state = ReviewItem.State.CLAIMED
        locked.claimed_by = pending.reviewer
        locked.save(update_fields=["state", "claimed_by"])
        try:
            with transaction.atomic():
                decision = _decide(
                    item=locked,
                    user=pending.reviewer,
                    verdict=pending.verdict,
                    reason=pending.reason,
                    rejected_edits=list(pending.rejected_edits),
                )
        except (ReviewError, ReviewConflict) as exc:
            ReviewPending.objects.filter(pk=pending.pk).update(error=str(exc), effective_at=None)
            return None
        pending.delete()
        return decision


def review_settle_due(*, item_ids: Iterable[int] | None = None, candidate_id: int | None = None) -> int:
    """Settle every pending decision whose window has passed (of ``item_ids``, or of the candidate's item,
    when given): what the readers (queue, item, candidate pages) and the reaper call, so decisions take
    effect with no worker. One query when nothing is due. Returns how many took effect."""
    due = ReviewItem.objects.filter(state=ReviewItem.State.PENDING, pending__effective_at__lte=timezone.now())
    if item_ids is not None:
        due = due.filter(pk__in=list(item_ids))
    if candidate_id is not None:
        due = due.filter(candidate_id=candidate_id)
    return sum(review_settle(item_id=pk) is not None for pk in due.order_by("pk").values_list("pk", flat=True))


# --- Corrections ---------------------------------------------------------------------------


def review_correct(*, item: ReviewItem, user: Any, approve: bool, reason: str) -> ReviewCorrection:
    """Correct the review verdict that stands on ``item`` (its decision, or the latest correction): a new
    certified decision naming the record it corrects, and what follows from it.

    Only a reviewer may correct, with a reason. Approve -> reject: every unfinished evaluation of the
    candidate is withdrawn (its trials not yet run never are), the candidate becomes REJECTED_REVIEW, so an
    accepted one leaves the experiment's best (``loop.load.best_candidate``) and the starts a new run is
    offered. Reject -> approve: the candidate becomes APPROVED and is evaluated for a gate as a late
    approval is (``evolution.loop.late``). A decision that rejected some edits is corrected to a whole
    verdict the same way (approve: the flagged candidate is approved and evaluated; reject: it stays
    rejected), and the candidate derived from it is withdrawn as a rejected one would be (its unfinished
    evaluations cancelled, rejected by review, out of the best), certified in the correction's record
    (``withdrawn``); when that derived candidate has a review of its own, that review decides it, and the
    correction is refused until then. A candidate that failed or was cancelled cannot be corrected:
    ReviewError / ReviewConflict, and nothing is written. ``followed`` on the correction lists what
    followed, in words.
    """
    reason = review_services.reason_required(reason)
    if not user.has_perm(access.REVIEW):
        raise ReviewError("only a reviewer can correct a review decision")
    verdict = ReviewCorrection.Verdict.APPROVE if approve else ReviewCorrection.Verdict.REJECT
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update(no_key=True).get(pk=item.pk)
        if locked.state not in DECIDED:
            raise ReviewError("this item has no decision that took effect (a pending one can be undone)")
        candidate = Candidate.objects.select_for_update(no_key=True).get(pk=locked.candidate_id)
        standing = review_standing(candidate_id=candidate.pk)
        if standing is None:
            raise ReviewError("this item's decision is not certified")
        if standing[0] == verdict:
            raise ReviewError(f"the decision that stands {'approved' if approve else 'rejected'} it already")
        partial = standing[0] == ReviewDecision.Verdict.REJECT_EDITS
        derived = _derived_to_withdraw(locked) if partial else None
        followed: list[str] = []
        words = f"review corrected by {user}: {reason}"
        was_accepted = candidate.state == Candidate.State.ACCEPTED
        if approve:
            if not candidate_transition(candidate=candidate, to=Candidate.State.APPROVED, reason=words):
                raise ReviewConflict(f"candidate {candidate.pk} is {candidate.state}: it cannot be approved again")
        elif partial:
            # Rejected already, with its edits kept in the derived candidate: now rejected whole.
            Candidate.objects.filter(pk=candidate.pk).update(state_reason=words)
            candidate.state_reason = words
        else:
            if (
                candidate.state not in Candidate.TRANSITIONS
                or Candidate.State.REJECTED_REVIEW not in (Candidate.TRANSITIONS[candidate.state])
            ):
                raise ReviewConflict(f"candidate {candidate.pk} is {candidate.state}: there is nothing to reject")
            followed += _withdraw_evaluations(candidate)
            candidate_transition(candidate=candidate, to=Candidate.State.REJECTED_REVIEW, reason=words)
            if was_accepted:
                followed.append(_best_words(candidate))
        withdrawn = None
        if derived is not None:
            withdrawn, said = _withdraw_derived(derived, f"derived from candidate {candidate.pk}, whose {words}")
            followed += said
        correction = ReviewCorrection.objects.create(
            item=locked, corrects_id=standing[1].pk, reviewer=user, verdict=verdict, reason=reason
        )
        review_correction_certify(correction=correction, withdrawn=withdrawn)
        locked.state = ReviewItem.State.APPROVED if approve else ReviewItem.State.REJECTED
        locked.save(update_fields=["state"])
        if approve:
            followed.append(_evaluate_words(candidate))
        correction.followed = followed
        correction.save(update_fields=["followed"])
        return correction


def _derived_to_withdraw(item: ReviewItem) -> Candidate | None:
    """The candidate a partial decision on ``item`` derived, locked; None when there is none. Refuses
    (ReviewError) when it has a review of its own: that review, or its correction, decides it."""
    derived_id = ReviewDecision.objects.filter(item=item).values_list("derived_candidate_id", flat=True).first()
    if derived_id is None:
        return None
    own = ReviewItem.objects.filter(candidate_id=derived_id).values_list("pk", flat=True).first()
    if own is not None:
        raise ReviewError(
            f"candidate {derived_id}, derived by this decision, has a review of its own (review {own}): "
            "decide or correct it there first"
        )
    return Candidate.objects.select_for_update(no_key=True).get(pk=derived_id)


def _withdraw_derived(derived: Candidate, words: str) -> tuple[Candidate | None, list[str]]:
    """Withdraw the candidate a corrected partial decision derived, as a correction to reject withdraws a
    candidate: its unfinished evaluations cancelled, rejected by review, out of the best. Returns it when it
    was withdrawn (the correction's record certifies its new state), with what followed in words."""
    name = f"the derived candidate {derived.pk}"
    if Candidate.State.REJECTED_REVIEW not in Candidate.TRANSITIONS.get(derived.state, frozenset()):
        return None, [f"{name} is {derived.get_state_display().lower()} already: nothing to withdraw"]
    was_accepted = derived.state == Candidate.State.ACCEPTED
    said = _withdraw_evaluations(derived)
    candidate_transition(candidate=derived, to=Candidate.State.REJECTED_REVIEW, reason=f"withdrawn: {words}")
    said.append(f"{name} withdrawn (rejected by review)")
    if was_accepted:
        said.append(f"{name} {_best_words(derived)}")
    return derived, said


def _withdraw_evaluations(candidate: Candidate) -> list[str]:
    """Cancel the candidate's unfinished evaluations and their trials not yet finished; in words."""
    said = []
    for evaluation in Evaluation.objects.select_for_update(no_key=True).filter(
        candidate=candidate, state=Evaluation.State.RUNNING
    ):
        trials = Trial.objects.filter(evaluation=evaluation)
        started = trials.exclude(state=Trial.State.PENDING).count()
        trials.filter(state__in=[Trial.State.PENDING, Trial.State.RUNNING]).update(state=Trial.State.CANCELLED)
        Evaluation.objects.filter(pk=evaluation.pk).update(state=Evaluation.State.CANCELLED)
        if started:
            said.append(
                f"evaluation {evaluation.pk} cancelled ({started} of {evaluation.trials_total} trials had started)"
            )
        else:
            said.append(f"evaluation {evaluation.pk} withdrawn before it started")
        if evaluation.run_id is not None:
            # The run's next step sees the candidate rejected and stops waiting for it.
            dispatch.run_advance_after_commit(evaluation.run_id)
    return said


def _best_words(candidate: Candidate) -> str:
    best = load.best_candidate(candidate.experiment)
    live = Run.objects.filter(current_candidate=candidate, status__in=LIVE_RUNS).values_list("pk", flat=True)
    now = f"the best is now candidate {best.pk}" if best is not None else "no accepted candidate is left"
    also = "".join(f"; run {pk} still builds on it until its next gate" for pk in live)
    return f"taken out of the experiment's best and the starts of a new run: {now}{also}"


def _evaluate_words(candidate: Candidate) -> str:
    try:
        return candidate_evaluate_late(candidate_id=candidate.pk, scope="gate").message
    except LateError as exc:
        logger.warning("corrected candidate %s could not be evaluated", candidate.pk, exc_info=True)
        return f"not evaluated: {exc}"


def corrections_of(*, item_ids: Iterable[int]) -> dict[int, list[ReviewCorrection]]:
    """The corrections of each item, oldest first, with who and the record each corrects. Read-only."""
    found: dict[int, list[ReviewCorrection]] = {}
    for correction in (
        ReviewCorrection.objects.filter(item_id__in=list(item_ids))
        .select_related("reviewer", "record", "corrects")
        .order_by("created_at", "pk")
    ):
        found.setdefault(correction.item_id, []).append(correction)
    return found
