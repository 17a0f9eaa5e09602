"""Celery tasks: thin wrappers that load by id and call a service.

All tasks are safe to run twice (the services claim their work with
conditional updates), acknowledge late and are re-queued when the worker
process dies, so a SIGKILL at any point loses nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from celery import Task, shared_task
from django.conf import settings
from django.db import close_old_connections, connection

from evolution import dispatch
from evolution.loop import certify as loop_certify
from evolution.loop import compare as loop_compare
from evolution.loop import late as loop_late
from evolution.loop import propose as loop_propose
from evolution.loop import review as loop_review
from evolution.loop import steps as loop_steps
from evolution.services import evaluation as evaluation_services

_P = ParamSpec("_P")
_R = TypeVar("_R")


def task(name: str) -> Callable[[Callable[_P, _R]], Task[_P, _R]]:
    """Every task's options: acknowledged late, re-queued when its worker dies, no result kept."""
    return shared_task(name=name, acks_late=True, reject_on_worker_lost=True, ignore_result=True)


# The longest wait before a held-back trial's message is sent again.
HELD_BACK_MAX_SECONDS = 30.0


@task(dispatch.TRIAL_RUN)
def trial_run(trial_id: int, held_back: int = 0) -> bool:
    """Run one trial, on the trial queue (a thread-pool worker's slots).

    A trial held back by a limit on trials in flight is sent again after a
    wait that grows with each hold (jittered, so waiting trials do not all
    ask at once). The thread's database connections are closed at the end,
    as they are after every task, so a slot holds none between trials.
    """
    try:
        return evaluation_services.trial_execute(trial_id=trial_id)
    except evaluation_services.TrialHeldBack:
        wait = min(HELD_BACK_MAX_SECONDS, settings.RSI_TRIAL_DEFER_SECONDS * 1.5 ** min(held_back, 20))
        dispatch.trial_run_later(trial_id, held_back + 1, countdown=wait * random.uniform(1.0, 1.5))
        return False
    finally:
        if not connection.in_atomic_block:
            close_old_connections()


@task(dispatch.RESULT_CERTIFY)
def result_certify(evaluation_id: int) -> bool:
    return loop_certify.result_certify(evaluation_id=evaluation_id) is not None


@task(dispatch.LEASE_REAP)
def lease_reap() -> dict[str, int]:
    counts = evaluation_services.lease_reap()
    # A lost run_advance message would stall a run; every step is idempotent,
    # so nudging every active run costs nothing when nothing was lost.
    runs = loop_steps.runs_to_nudge()
    for run_id in runs:
        dispatch.run_advance_after_commit(run_id)
    # No candidate may wait with nothing scheduled for it (approved after its run ended, say).
    stranded = loop_late.stranded_reap()
    # A review decision whose undo window passed while its review_settle message was lost.
    settled = loop_review.review_settle_due()
    # A recipe comparison whose command was killed would otherwise show as running for ever.
    interrupted = loop_compare.comparisons_reap()
    return {
        **counts,
        "runs": len(runs),
        **{f"stranded_{key}": value for key, value in stranded.items()},
        "reviews_settled": settled,
        "comparisons_interrupted": interrupted,
    }


@task(dispatch.REVIEW_SETTLE)
def review_settle(item_id: int) -> bool:
    """Give effect to a review decision whose undo window has passed (sent with the window as countdown)."""
    return loop_review.review_settle(item_id=item_id) is not None


@task(dispatch.CANDIDATE_EVALUATE_LATE)
def candidate_evaluate_late(candidate_id: int, scope: str) -> str:
    try:
        return loop_late.candidate_evaluate_late(candidate_id=candidate_id, scope=scope).message
    except loop_late.LateError as exc:
        return str(exc)


@task(dispatch.RUN_ADVANCE)
def run_advance(run_id: int) -> str:
    return loop_steps.run_advance(run_id=run_id)


@task(dispatch.ROUND_PROPOSE)
def round_propose(run_id: int, round_number: int) -> int:
    return loop_propose.round_propose(run_id=run_id, round_number=round_number)
