"""Every Celery message the platform sends goes from here, once the transaction that made its work commits.

A message for a row not yet committed would find nothing (or the row as it was before), so each function
registers its send with ``transaction.on_commit``: inside a transaction the message leaves after the commit (and
never, on a rollback); outside one, at once. Tasks are named, not imported: ``evolution.tasks`` imports the loop
and the services, so a service that starts work (trials, certification) sends by name without an import circle.
``tests/rsiweb/test_architecture.py`` checks that no other module calls ``delay``, ``apply_async`` or
``send_task``, and that every name here is a registered task.

Every task is safe to receive twice, so a message sent again (the reaper's, a retry's) costs nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import current_app
from django.db import transaction

from evolution import faults

logger = logging.getLogger(__name__)

__all__ = [
    "CANDIDATE_EVALUATE_LATE",
    "LEASE_REAP",
    "RESULT_CERTIFY",
    "REVIEW_SETTLE",
    "ROUND_PROPOSE",
    "RUN_ADVANCE",
    "TASK_NAMES",
    "TRIAL_RUN",
    "certify_after_commit",
    "propose_after_commit",
    "review_settle_after_commit",
    "run_advance_after_commit",
    "trial_run_later",
    "trials_run_after_commit",
]

# The tasks' registered names (``evolution.tasks`` declares each with the same constant).
TRIAL_RUN = "evolution.trial_run"
RESULT_CERTIFY = "evolution.result_certify"
LEASE_REAP = "evolution.lease_reap"
CANDIDATE_EVALUATE_LATE = "evolution.candidate_evaluate_late"
RUN_ADVANCE = "evolution.run_advance"
ROUND_PROPOSE = "evolution.round_propose"
REVIEW_SETTLE = "evolution.review_settle"
TASK_NAMES = (
    TRIAL_RUN,
    RESULT_CERTIFY,
    LEASE_REAP,
    CANDIDATE_EVALUATE_LATE,
    RUN_ADVANCE,
    ROUND_PROPOSE,
    REVIEW_SETTLE,
)


def _send(name: str, *args: int, countdown: float | None = None, producer: Any = None) -> None:
    # The routes (the trial queue) and the defaults (no result kept) come from settings, by name.
    current_app.send_task(name, args=args, countdown=countdown, producer=producer)


def trials_run_after_commit(trial_ids: Sequence[int]) -> None:
    """One ``trial_run`` message for each trial, after commit, all through one producer (taken from
    the app's pool once, not once a message: about 0.46 against 0.52 ms of CPU a message, 640 sent)."""
    ids = list(trial_ids)

    def send() -> None:
        faults.checkpoint("publish:trials")
        with current_app.producer_or_acquire() as producer:
            for trial_id in ids:
                _send(TRIAL_RUN, trial_id, producer=producer)

    transaction.on_commit(send)


def trial_run_later(trial_id: int, held_back: int, countdown: float) -> None:
    """``trial_run`` again for a held-back trial, ``countdown`` seconds from now (after commit, when in one)."""
    transaction.on_commit(lambda: _send(TRIAL_RUN, trial_id, held_back, countdown=countdown))


def certify_after_commit(evaluation_id: int) -> None:
    """``result_certify`` for a complete evaluation, after commit."""
    transaction.on_commit(lambda: _send(RESULT_CERTIFY, evaluation_id))


def run_advance_after_commit(run_id: int) -> None:
    """``run_advance`` for the run, after commit."""

    def send() -> None:
        faults.checkpoint("publish:run_advance")
        _send(RUN_ADVANCE, run_id)

    transaction.on_commit(send)


def propose_after_commit(run_id: int, round_number: int) -> None:
    """``round_propose`` for the run's round, after commit."""
    transaction.on_commit(lambda: _send(ROUND_PROPOSE, run_id, round_number))


def review_settle_after_commit(item_id: int, countdown: float) -> None:
    """``review_settle`` for a review item, after commit, to arrive once its undo window has passed. A broker
    that is down loses nothing: the next reader of the item, the queue or the candidate settles it."""

    def send() -> None:
        try:
            _send(REVIEW_SETTLE, item_id, countdown=countdown)
        except Exception:  # noqa: BLE001  (the readers and the reaper settle it; the decision is committed)
            logger.warning("review_settle for item %s not sent", item_id, exc_info=True)

    transaction.on_commit(send)
