"""Human review of leakage-flagged candidates.

One decision per review item, whoever acts first: the item is claimed and
decided with conditional updates under a row lock, and the loser of a race
gets a ``ReviewConflict`` with a clear message. An approved candidate is
evaluated at once and joins the next gate of its run (or, when its run has
ended, of the experiment's live run, or a late gate against its parent):
that is the loop's part, so the screens and the API decide through
``evolution.loop.review``, which calls these functions and then evaluates
(``evolution.loop.late``); a rejected one is dropped. A reviewer may also reject some of a candidate's atomic edits and
keep the rest (``review_decide_partial``): the flagged candidate is
rejected and a *derived* candidate without the rejected edits goes through
the same checks as a proposal (surface, budget, duplicates, the critic)
and, when clean, is evaluated and gated like an approved one. These
functions decide and record, and start nothing (services sit below the loop).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from evolution import digests, operators
from evolution.models import RUN_LIVE, AtomicEdit, Candidate, ReviewDecision, ReviewItem, Run
from evolution.services.candidates import candidate_transition
from evolution.services.records import review_decision_certify
from evolution.services.snapshots import tree_entries
from evolution.trees import FileEntry

logger = logging.getLogger(__name__)

DECIDED = frozenset({ReviewItem.State.APPROVED, ReviewItem.State.REJECTED, ReviewItem.State.PARTIAL})
# Runs whose approved candidates are still evaluated and gated.
LIVE_RUNS = frozenset(RUN_LIVE)


class ReviewConflict(RuntimeError):
    """Someone else acted first (claimed or decided the item)."""


class ReviewError(ValueError):
    """The request itself cannot be carried out (missing reason, bad selection...)."""


def review_claim(*, item: ReviewItem, user: Any) -> ReviewItem:
    """Claim an open item (or re-claim one's own). Another reviewer's claim
    or a decided item raises ReviewConflict."""
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update(no_key=True).get(pk=item.pk)
        if locked.state == ReviewItem.State.CLAIMED and locked.claimed_by_id == user.pk:
            return locked
        if locked.state != ReviewItem.State.OPEN:
            who = f" by {locked.claimed_by}" if locked.claimed_by_id else ""
            raise ReviewConflict(f"this item is already {locked.state}{who}")
        locked.state = ReviewItem.State.CLAIMED
        locked.claimed_by = user
        locked.claimed_at = timezone.now()
        locked.save(update_fields=["state", "claimed_by", "claimed_at"])
        return locked


def review_release(*, item: ReviewItem, user: Any) -> ReviewItem:
    """Give back one's own claim so another reviewer can take the item.
    Safe to repeat; releasing someone else's claim raises ReviewConflict."""
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update(no_key=True).get(pk=item.pk)
        if locked.state == ReviewItem.State.OPEN:
            return locked
        if locked.state != ReviewItem.State.CLAIMED or locked.claimed_by_id != user.pk:
            who = f" by {locked.claimed_by}" if locked.claimed_by_id else ""
            raise ReviewConflict(f"this item is {locked.state}{who}; only the reviewer who claimed it can release it")
        locked.state = ReviewItem.State.OPEN
        locked.claimed_by = None
        locked.claimed_at = None
        locked.save(update_fields=["state", "claimed_by", "claimed_at"])
        return locked


def _lock_undecided(item: ReviewItem, user: Any) -> ReviewItem:
    """The item, locked, if ``user`` may decide it now (inside a transaction)."""
    locked = ReviewItem.objects.select_for_update(no_key=True).get(pk=item.pk)
    if locked.state in DECIDED:
        raise ReviewConflict(f"this item was already decided ({locked.state})")
    if locked.state == ReviewItem.State.PENDING:
        raise ReviewConflict(f"a decision by {locked.claimed_by} is pending (it can still be undone)")
    if locked.state == ReviewItem.State.CLAIMED and locked.claimed_by_id != user.pk:
        raise ReviewConflict(f"this item is claimed by {locked.claimed_by}")
    return locked


def _required_reason(reason: str) -> str:
    reason = reason.strip()
    if not reason:
        raise ReviewError("a reason is required")
    return reason


def review_decide(*, item: ReviewItem, user: Any, approve: bool, reason: str) -> ReviewDecision:
    """Approve (the edit is generic) or reject (it leaks) a flagged candidate.

    A reason is required. The item must be open or claimed by ``user``.
    Approving makes the candidate APPROVED (``evolution.loop.review.review_decide`` then evaluates it for its
    run, in the same transaction); rejecting drops it.
    """
    reason = _required_reason(reason)
    with transaction.atomic():
        locked = _lock_undecided(item, user)
        candidate = Candidate.objects.get(pk=locked.candidate_id)
        target = Candidate.State.APPROVED if approve else Candidate.State.REJECTED_REVIEW
        if candidate.state != Candidate.State.FLAGGED or not candidate_transition(
            candidate=candidate, to=target, reason=f"review by {user}: {reason}"
        ):
            raise ReviewConflict(f"the candidate is {candidate.state} and can no longer be reviewed")
        locked.state = ReviewItem.State.APPROVED if approve else ReviewItem.State.REJECTED
        locked.save(update_fields=["state"])
        decision = ReviewDecision.objects.create(
            item=locked,
            reviewer=user,
            verdict=ReviewDecision.Verdict.APPROVE if approve else ReviewDecision.Verdict.REJECT,
            reason=reason,
        )
        review_decision_certify(decision=decision)
        return decision


# --- Rejecting some edits and keeping the rest ---------------------------------


def derive_files(
    *,
    parent: Sequence[FileEntry],
    flagged: Sequence[FileEntry],
    rejected_paths: Iterable[str],
    kept_paths: Iterable[str],
) -> list[FileEntry]:
    """The flagged tree with every path of a rejected edit put back as the
    parent has it (or removed, when the parent has no such file).

    Pure. A path declared by both a rejected and a kept edit cannot be split
    between them: ReviewError.
    """
    rejected, kept = set(rejected_paths), set(kept_paths)
    shared = sorted(rejected & kept)
    if shared:
        raise ReviewError(
            f"{', '.join(shared)} {'is' if len(shared) == 1 else 'are'} changed by both a rejected and a kept edit: "
            "the edits cannot be separated; approve or reject the whole candidate"
        )
    before = {entry.path: entry for entry in parent}
    result = {entry.path: entry for entry in flagged if entry.path not in rejected}
    for path in rejected:
        if path in before:
            result[path] = before[path]
    return [result[path] for path in sorted(result)]


def _tree_digest(entries: Sequence[FileEntry]) -> str:
    return digests.tree_digest((e.path, e.mode, digests.blob_digest(e.data)) for e in entries)


def review_decide_partial(
    *, item: ReviewItem, user: Any, rejected_edits: Iterable[int | str], reason: str, edit_budget: int | None
) -> ReviewDecision:
    """Reject the selected atomic edits of a flagged candidate and keep the rest.

    The flagged candidate becomes REJECTED_REVIEW. A new candidate (origin
    DERIVED, same parent, run and round) is made of the flagged tree with the
    rejected edits' files restored from the parent, carrying copies of the
    kept edits, and is checked exactly like a proposal: surface and budget
    (``candidate_freeze``), duplicates (a tree already in the experiment is
    refused with "identical to candidate N"), then the critic with the run's
    recipe policy, so a derived candidate that still leaks is flagged (or
    rejected) again. ``edit_budget`` is the edit budget of the flagged
    candidate's round (the loop knows it). When the critic approves the
    derived candidate it is APPROVED, and the decision names it
    (``derived_candidate``): ``evolution.loop.review.review_decide_partial``
    then evaluates and gates it like an approved candidate.

    A reason is required; the item must be open or claimed by ``user``.
    Everything happens in one transaction: on ReviewError or ReviewConflict
    nothing is written. Not repeatable: a second call gets ReviewConflict.
    """
    from evolution.recipes import run_recipe
    from evolution.services import proposals

    reason = _required_reason(reason)
    try:
        wanted = {int(pk) for pk in rejected_edits}
    except (TypeError, ValueError) as exc:
        raise ReviewError("the selected edits are not edit ids") from exc
    if not wanted:
        raise ReviewError("select at least one atomic edit to reject")
    with transaction.atomic():
        locked = _lock_undecided(item, user)
        flagged = Candidate.objects.select_for_update(no_key=True).get(pk=locked.candidate_id)
        if flagged.state != Candidate.State.FLAGGED:
            raise ReviewConflict(f"the candidate is {flagged.state} and can no longer be reviewed")
        edits = list(AtomicEdit.objects.filter(candidate=flagged).order_by("index"))
        unknown = wanted - {edit.pk for edit in edits}
        if unknown:
            raise ReviewError(
                f"edit(s) {', '.join(str(pk) for pk in sorted(unknown))} are not atomic edits of candidate {flagged.pk}"
            )
        rejected = [edit for edit in edits if edit.pk in wanted]
        kept = [edit for edit in edits if edit.pk not in wanted]
        if not kept:
            raise ReviewError("every atomic edit is selected: reject the whole candidate instead")
        run = (
            Run.objects.select_related("experiment__surface", "recipe").filter(pk=flagged.run_id).first()
            if flagged.run_id
            else None
        )
        if run is None or flagged.parent is None:
            raise ReviewError("the candidate belongs to no run: a derived candidate could not be checked or gated")

        parent_files = tree_entries(tree=flagged.parent.tree)
        files = derive_files(
            parent=parent_files,
            flagged=tree_entries(tree=flagged.tree),
            rejected_paths=[path for edit in rejected for path in edit.paths],
            kept_paths=[path for edit in kept for path in edit.paths],
        )
        digest = _tree_digest(files)
        same = Candidate.objects.filter(experiment_id=flagged.experiment_id, tree_id=digest).first()
        if same is not None:
            raise ReviewError(
                f"without the rejected edits the candidate is identical to candidate {same.pk}: "
                "reject the whole candidate instead"
            )
        numbers = ", ".join(f"#{edit.index}" for edit in rejected)
        if not candidate_transition(
            candidate=flagged,
            to=Candidate.State.REJECTED_REVIEW,
            reason=f"review by {user}: edit(s) {numbers} rejected, the rest kept in a derived candidate: {reason}",
        ):
            raise ReviewConflict(f"the candidate is {flagged.state} and can no longer be reviewed")

        proposal = operators.Proposal(
            files={entry.path: entry.data for entry in files},
            edits=[operators.EditDeclaration(edit.component, edit.hypothesis, list(edit.paths)) for edit in kept],
        )
        try:
            outcome = proposals.candidate_freeze(
                run=run,
                parent=flagged.parent,
                proposal=proposal,
                round=flagged.round or 0,
                slot=0,
                edit_budget=edit_budget,
                origin=Candidate.Origin.DERIVED,
                label=f"{flagged.label or f'candidate {flagged.pk}'} without {numbers}"[:200],
            )
        except proposals.ProposalRejected as exc:
            raise ReviewError(f"the derived candidate cannot be made: {exc}") from exc
        if outcome.candidate is None:
            # Only reachable through a concurrent write of the same tree.
            raise ReviewError(f"the derived candidate cannot be made: {outcome.reason}")
        derived = outcome.candidate
        if derived.tree_id != digest:
            # Proposals carry no file modes; a kept edit that changed one cannot be carried over.
            raise ReviewError("a kept edit changes a file mode, which a derived candidate cannot carry")

        recipe = run_recipe(run)
        if derived.state == Candidate.State.FROZEN:
            policy = recipe.critique.leakage_policy if recipe.critique.enabled else "off"
            proposals.candidate_critique(run=run, candidate=derived, policy=policy)
            derived.refresh_from_db()

        locked.state = ReviewItem.State.PARTIAL
        locked.save(update_fields=["state"])
        decision = ReviewDecision.objects.create(
            item=locked,
            reviewer=user,
            verdict=ReviewDecision.Verdict.REJECT_EDITS,
            reason=reason,
            derived_candidate=derived,
        )
        decision.rejected_edits.set(rejected)
        review_decision_certify(decision=decision)
        return decision


def item_lock_undecided(*, item: ReviewItem, user: Any) -> ReviewItem:
    """The item, locked (inside the caller's transaction), if ``user`` may decide it now; else ReviewConflict."""
    return _lock_undecided(item, user)


def reason_required(reason: str) -> str:
    """The reason, stripped; ReviewError when it is empty."""
    return _required_reason(reason)
