"""What the trial pages share (screen 6): the trial a user may see, its trajectory, pages of steps and the
parent's trial of the same task. Reads only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.shortcuts import get_object_or_404

from evolution import access, pricing
from evolution.measurements import COUNTED_PURPOSES
from evolution.models import Trajectory, TrajectoryStep, Trial
from evolution.trajectory_formats import STEP_FIELDS
from review import trajectories as tj

STEPS_PER_PAGE = 100
STEP_COLUMNS = ("pk", *STEP_FIELDS, "extra")


def visible_trial(*, user: Any, pk: int, related: tuple[str, ...] = ()) -> Trial:
    """The trial, or 404 when it does not exist or is sealed and ``user`` may
    not see sealed per-task data."""
    trials = access.hide_sealed(Trial.objects.select_related(*related), user)
    return get_object_or_404(trials, pk=pk)


def trajectory_of(trial: Trial) -> Trajectory | None:
    try:
        return trial.trajectory
    except Trajectory.DoesNotExist:
        return None


def page_count(total: int) -> int:
    """How many pages of ``STEPS_PER_PAGE`` steps ``total`` steps make (at least one)."""
    return max(1, math.ceil(total / STEPS_PER_PAGE))


def parent_trial(trial: Trial) -> Mapping[str, Any] | None:
    """The parent's trial of the same task and index (its first reported
    evaluation we ran, never an external one), as a few fields; None for the
    seed or when there is none."""
    parent_id = trial.candidate.parent_id
    if parent_id is None:
        return None
    return (
        Trial.objects.filter(
            candidate_id=parent_id,
            task_id=trial.task_id,
            index=trial.index,
            evaluation__purpose__in=COUNTED_PURPOSES,
            evaluation__external=False,
        )
        .order_by("evaluation_id", "pk")
        .values("pk", "outcome", "score", "state")
        .first()
    )


def steps_from(trajectory: Trajectory, offset: int) -> list[tj.StepView]:
    """A page of steps from 0-based ``offset``, each with its duration (the next step's timestamp is read with
    them, so the page's last step has one too)."""
    rows = list(
        TrajectoryStep.objects.filter(trajectory=trajectory)
        .order_by("step_id")
        .values(*STEP_COLUMNS)[offset : offset + STEPS_PER_PAGE + 1]
    )
    following = str(rows[STEPS_PER_PAGE].get("timestamp") or "") if len(rows) > STEPS_PER_PAGE else ""
    views = [tj.step_view(row, position=offset + k) for k, row in enumerate(rows[:STEPS_PER_PAGE], start=1)]
    return tj.with_durations(views, following=following)


def trajectory_price(trajectory: Trajectory | None) -> pricing.Cost | None:
    """The trajectory's tokens (its final metrics) at its model's list prices; None without a price or tokens."""
    if trajectory is None:
        return None
    agent = trajectory.agent if isinstance(trajectory.agent, dict) else {}
    final = trajectory.final_metrics if isinstance(trajectory.final_metrics, dict) else {}
    prompt, completion = final.get("total_prompt_tokens"), final.get("total_completion_tokens")
    return pricing.token_cost(
        model=str(agent.get("model_name") or ""),
        prompt_tokens=prompt if isinstance(prompt, int) else None,
        completion_tokens=completion if isinstance(completion, int) else None,
    )
