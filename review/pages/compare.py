"""Two trajectories side by side (screen 6's comparison): this trial against the parent's trial of the same task
and index, or another trial of that task, aligned by content or by step position, a page of rows at a time.
Reads only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import F
from django.db.models.functions import MD5
from django.http import Http404
from django.urls import reverse

from evolution import access, pricing
from evolution.models import Experiment, Task, Trajectory, TrajectoryStep, Trial
from review import trajectories as tj
from review.pages import BadInput, Page, query_url
from review.pages.trials import (
    STEP_COLUMNS,
    STEPS_PER_PAGE,
    page_count,
    parent_trial,
    steps_from,
    trajectory_of,
    trajectory_price,
    visible_trial,
)

# The "compare with" select lists at most this many trials of the task.
CHOICES_SHOWN = 200
RELATED = ("task", "candidate", "candidate__experiment", "evaluation", "trajectory")


def _step_keys(trajectory: Trajectory | None) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """The signature of every step of a trajectory, in one query: the message
    is hashed by the database so a long trajectory's text is not loaded."""
    if trajectory is None:
        return []
    rows = (
        TrajectoryStep.objects.filter(trajectory=trajectory)
        .order_by("step_id")
        .values_list("source", MD5("message"), "tool_calls")
    )
    return [(source, digest or "", tj.call_signature(calls)) for source, digest, calls in rows]


def _steps_between(trajectory: Trajectory | None, indexes: list[int]) -> dict[int, tj.StepView]:
    """The steps at these 0-based indexes (one query over their range), by index."""
    if trajectory is None or not indexes:
        return {}
    low, high = min(indexes), max(indexes)
    rows = TrajectoryStep.objects.filter(trajectory=trajectory).order_by("step_id").values(*STEP_COLUMNS)
    return {low + k: tj.step_view(row, position=low + k + 1) for k, row in enumerate(rows[low : high + 1])}


def _aligned_window(
    pairs: list[tj.ContentPair], start: int, first: int | None, left: Trajectory | None, right: Trajectory | None
) -> list[tj.AlignedRow[tj.StepView]]:
    """Rows ``start`` to ``start + STEPS_PER_PAGE - 1`` of a content alignment,
    with their steps and, for a changed step, its word diff."""
    window = pairs[start - 1 : start - 1 + STEPS_PER_PAGE]
    left_steps = _steps_between(left, [p.left for p in window if p.left is not None])
    right_steps = _steps_between(right, [p.right for p in window if p.right is not None])
    rows = []
    for number, pair in enumerate(window, start=start):
        left_step = left_steps.get(pair.left) if pair.left is not None else None
        right_step = right_steps.get(pair.right) if pair.right is not None else None
        words = None
        if pair.kind == "changed" and left_step is not None and right_step is not None:
            words = tj.word_diff(tj.step_text(left_step), tj.step_text(right_step))
        rows.append(
            tj.AlignedRow(
                number, left_step, right_step, pair.differs, first=number == first, kind=pair.kind, words=words
            )
        )
    return rows


def _window(trajectory: Trajectory | None, start: int) -> list[tj.StepView]:
    return steps_from(trajectory, start - 1) if trajectory is not None else []


@dataclass(frozen=True)
class Alignment(Page):
    """One page of the aligned rows of two trajectories, with its links."""

    left_trajectory: Trajectory | None
    right_trajectory: Trajectory | None
    left_priced: pricing.Cost | None  # each trajectory's tokens at its model's list prices
    right_priced: pricing.Cost | None
    summary: tj.DivergenceSummary
    rows: list[tj.AlignedRow[tj.StepView]]
    first_url: str | None  # the page and row of the first difference
    # The nearest difference on a later (earlier) page, so the next-difference key goes on past this page.
    next_difference_url: str | None
    previous_difference_url: str | None
    page_number: int
    page_count: int
    page_start: int
    page_end: int
    previous_url: str | None
    next_url: str | None
    is_parent: bool
    by_position: bool
    position_url: str
    content_url: str


@dataclass(frozen=True)
class ComparePage(Page):
    trial: Trial  # on the right
    other: Trial | None  # on the left; None: the seed's trial, or the parent has no trial of this task and index
    task: Task
    experiment: Experiment
    choices: list[dict[str, Any]]  # the other trials of the task (``CHOICES_SHOWN`` at most)
    with_pk: int | None
    alignment: Alignment | None  # None when there is nothing to compare with


def _other_trial(trial: Trial, user: Any, with_pk: int | None) -> Trial | None:
    visible = access.hide_sealed(Trial.objects.select_related(*RELATED), user)
    if with_pk is None:
        parent = parent_trial(trial)
        return visible.filter(pk=parent["pk"]).first() if parent else None
    other = visible.filter(pk=with_pk).first()
    if other is None:
        raise Http404(f"trial {with_pk} does not exist or you may not see it")
    if other.task_id != trial.task_id:
        raise BadInput(
            f"trial {other.pk} is of another task; compare trials of the same task ({trial.task.external_id})"
        )
    return other


def _alignment(trial: Trial, other: Trial, *, with_pk: int | None, page: int, by_position: bool) -> Alignment:
    left_trajectory, right_trajectory = trajectory_of(other), trajectory_of(trial)
    left_keys, right_keys = _step_keys(left_trajectory), _step_keys(right_trajectory)
    if by_position:
        summary = tj.divergence_summary(left_keys, right_keys)
        differing = tj.differing_positions(left_keys, right_keys)
    else:
        pairs = tj.align_by_content(left_keys, right_keys)
        summary = tj.content_summary(pairs, left_steps=len(left_keys), right_steps=len(right_keys))
        differing = [row for row, pair in enumerate(pairs, start=1) if pair.differs]
    count = page_count(summary.positions)
    number = min(page, count)
    start = (number - 1) * STEPS_PER_PAGE + 1
    if by_position:
        rows = tj.align_window(
            _window(left_trajectory, start),
            _window(right_trajectory, start),
            start=start,
            left_keys=left_keys,
            right_keys=right_keys,
        )
    else:
        rows = _aligned_window(pairs, start, summary.first, left_trajectory, right_trajectory)
    base = reverse("review:trial_compare", args=[trial.pk])
    align = "position" if by_position else None

    def row_url(position: int | None) -> str | None:
        if position is None:
            return None
        on_page = (position - 1) // STEPS_PER_PAGE + 1
        return (
            query_url(base, **{"with": with_pk, "align": align, "page": on_page if on_page > 1 else None})
            + f"#pos-{position}"
        )

    end = start + len(rows) - 1
    return Alignment(
        left_trajectory=left_trajectory,
        right_trajectory=right_trajectory,
        left_priced=trajectory_price(left_trajectory),
        right_priced=trajectory_price(right_trajectory),
        summary=summary,
        rows=rows,
        first_url=row_url(summary.first),
        next_difference_url=row_url(next((p for p in differing if p > end), None)),
        previous_difference_url=row_url(next((p for p in reversed(differing) if p < start), None)),
        page_number=number,
        page_count=count,
        page_start=start,
        page_end=end,
        previous_url=query_url(base, **{"with": with_pk, "align": align, "page": number - 1}) if number > 1 else None,
        next_url=query_url(base, **{"with": with_pk, "align": align, "page": number + 1}) if number < count else None,
        is_parent=with_pk is None,
        by_position=by_position,
        position_url=query_url(base, **{"with": with_pk, "align": "position"}),
        content_url=query_url(base, **{"with": with_pk}),
    )


def compare_page(*, user: Any, pk: int, with_pk: int | None, page: int, by_position: bool) -> ComparePage:
    """Trial ``pk`` (right) against trial ``with_pk`` of the same task, or the parent's trial of the same task
    and index when None (left), page ``page`` of the rows (clamped to the last), aligned by content or, with
    ``by_position``, step by step. 404 for a trial ``user`` may not see; ``BadInput`` for a trial of another
    task. The number of queries does not depend on the trajectories' lengths."""
    trial = visible_trial(user=user, pk=pk, related=RELATED)
    other = _other_trial(trial, user, with_pk)
    choices = list(
        access.hide_sealed(Trial.objects.filter(task_id=trial.task_id).exclude(pk=trial.pk), user)
        .order_by(F("candidate__round").asc(nulls_first=True), "candidate_id", "evaluation_id", "index")
        .values("pk", "index", "outcome", "candidate_id", "candidate__label", "evaluation__purpose")[:CHOICES_SHOWN]
    )
    return ComparePage(
        trial=trial,
        other=other,
        task=trial.task,
        experiment=trial.candidate.experiment,
        choices=choices,
        with_pk=with_pk,
        alignment=None
        if other is None
        else _alignment(trial, other, with_pk=with_pk, page=page, by_position=by_position),
    )
