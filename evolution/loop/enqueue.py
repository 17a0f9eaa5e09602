"""The messages the loop sends, each after its transaction commits (a message for a row not yet committed
would find nothing)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from evolution import faults
from evolution.loop.state import RunState
from evolution.models import Run


def enqueue_advance(run_id: int) -> None:
    from evolution.tasks import run_advance

    faults.checkpoint("publish:run_advance")
    run_advance.delay(run_id)


def enqueue_propose(run_id: int, round_number: int) -> None:
    from evolution.tasks import round_propose

    round_propose.delay(run_id, round_number)


def advance_after_commit(run_id: int) -> None:
    """Send ``run_advance`` for the run once the current transaction commits."""
    transaction.on_commit(lambda: enqueue_advance(run_id))


def propose_send(run: Run, state: RunState) -> None:
    """Stamp when the round's proposals were asked for, save the state, and send ``round_propose`` after
    commit. Filling slots is idempotent, so sending it again is safe."""
    state.proposing_since = timezone.now()
    state.save(run)
    run.save(update_fields=["state"])
    round_number = run.current_round
    transaction.on_commit(lambda: enqueue_propose(run.pk, round_number))
