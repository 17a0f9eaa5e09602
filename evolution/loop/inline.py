"""Drive a run to its end in this process, with the services the Celery tasks call.

Deterministic and worker-free: ``load_example --rounds`` uses it so a new
installation opens with a finished example run, and tests of the loop's
logic use it; the worker tests show the same through the broker. Messages
the services enqueue on the way stay in the broker for a worker to find
(every task they name is idempotent, so a worker that picks them up later
finds nothing left to do).
"""

from __future__ import annotations

from collections.abc import Callable

from evolution.loop import propose as loop_propose
from evolution.loop import steps as loop_steps
from evolution.loop.certify import result_certify
from evolution.loop.state import RunState
from evolution.models import Evaluation, Run, Trial
from evolution.services import evaluation as evaluation_services


def run_drive(
    run: Run,
    *,
    max_steps: int = 2000,
    until: Callable[[Run], bool] | None = None,
    on_step: Callable[[Run], None] | None = None,
) -> Run:
    """Run to the end, or until ``until(run)`` holds after a step."""
    for _ in range(max_steps):
        run.refresh_from_db()
        if run.status != Run.Status.RUNNING or (until is not None and until(run)):
            return run
        pending = list(
            Trial.objects.filter(evaluation__run=run, state=Trial.State.PENDING)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        for trial_id in pending:
            evaluation_services.trial_execute_in_process(trial_id=trial_id, owner="inline")
        for evaluation_id in Evaluation.objects.filter(run=run, state=Evaluation.State.COMPLETE).values_list(
            "pk", flat=True
        ):
            result_certify(evaluation_id=evaluation_id)
        if RunState.of(run).phase == "proposing":
            loop_propose.round_propose(run_id=run.pk, round_number=run.current_round)
        loop_steps.run_advance(run_id=run.pk)
        if on_step is not None:
            on_step(run)
    raise RuntimeError(f"run {run.pk} did not finish in {max_steps} steps (phase {RunState.of(run).phase})")
