"""The messages the loop sends, each after its transaction commits (a message for a row not yet committed
would find nothing), through ``evolution.dispatch``."""

from __future__ import annotations

from django.utils import timezone

from evolution import dispatch
from evolution.loop.state import RunState
from evolution.models import Run


def advance_after_commit(run_id: int) -> None:
    """Send ``run_advance`` for the run once the current transaction commits."""
    dispatch.run_advance_after_commit(run_id)


def propose_send(run: Run, state: RunState) -> None:
    """Stamp when the round's proposals were asked for, save the state, and send ``round_propose`` after
    commit. Filling slots is idempotent, so sending it again is safe."""
    state.proposing_since = timezone.now()
    state.save(run)
    run.save(update_fields=["state"])
    dispatch.propose_after_commit(run.pk, run.current_round)
