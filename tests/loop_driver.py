"""Drive a run to its end in this process (see evolution.loop.inline)."""

from __future__ import annotations

from collections.abc import Callable

from evolution.loop.inline import run_drive
from evolution.models import Run


def drive(run: Run, *, max_steps: int = 2000, until: Callable[[Run], bool] | None = None) -> Run:
    """Run to the end, or until ``until(run)`` holds after a step."""
    try:
        return run_drive(run, max_steps=max_steps, until=until)
    except RuntimeError as exc:
        raise AssertionError(str(exc)) from exc
