"""A reviewer's decision as the loop sees it: decide (``services.review``), then evaluate what was approved.

The review service records the decision and starts nothing; here, in the same transaction, an approved candidate
(or a clean derived one) is evaluated at once: for its run's next gate, for the live run's when its own run has
ended, or for a late gate against its parent when no run is live (``late.candidate_evaluate_late``). When that
is impossible the decision still stands; the reaper's check (``late.stranded_reap``) ends the candidate with the
reason. The screens and the API decide through these two functions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from evolution.loop.late import LateError, candidate_evaluate_late
from evolution.loop.state import RunState
from evolution.models import Candidate, ReviewDecision, ReviewItem, Run
from evolution.services import review as review_services

__all__ = ["review_decide", "review_decide_partial"]

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
