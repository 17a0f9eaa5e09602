"""Ingest results produced outside the platform (for example by a Harbor job).

External results are stored as an Evaluation with ``external=True`` and the
state EXTERNAL, and Trials in the DONE state. They are never certified: no
CertifiedResult is written, the certifier only takes COMPLETE evaluations
and the reaper only re-sends COMPLETE ones, a database constraint keeps an
external evaluation in the EXTERNAL state, and every certified view filters
on ``state=CERTIFIED``. We did not run them, so we cannot vouch for them:
they are shown marked "external", with the source the submitter gave.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from django.db import transaction
from django.utils import timezone

from evolution.models import Candidate, Evaluation, SplitMembership, SplitName, Trial

MAX_RESULTS = 10_000
MAX_INDEX = 32_767  # PositiveSmallIntegerField
MAX_SOURCE_BYTES = 16_384
MAX_COUNTS = {"tokens": 2**63 - 1, "steps": 2**31 - 1}  # the columns' ranges
RESULT_FIELDS = frozenset({"task", "split", "index", "passed", "score", "tokens", "steps", "error"})
MAX_ERROR_CHARS = 2_000


class ExternalResultsError(ValueError):
    """Bad input; ``errors`` maps a field path (``results[2].score``) to what is wrong."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        self.errors = dict(errors)
        super().__init__("; ".join(f"{path}: {message}" for path, message in self.errors.items()))


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _memberships(candidate: Candidate) -> dict[str, SplitMembership]:
    """The experiment's tasks by the names a submitter may use: ``id`` for the
    experiment's own benchmark, ``benchmark/id`` for any benchmark (held-out too)."""
    rows = SplitMembership.objects.filter(experiment_id=candidate.experiment_id).select_related("task__benchmark")
    by_name: dict[str, SplitMembership] = {}
    for membership in rows:
        task = membership.task
        by_name[f"{task.benchmark.name}/{task.external_id}"] = membership
        if membership.split != SplitName.HELDOUT:
            by_name[task.external_id] = membership
    return by_name


def _check_result(
    position: int, item: Any, tasks: Mapping[str, SplitMembership], errors: dict[str, str]
) -> tuple[SplitMembership, int, dict[str, Any]] | None:
    where = f"results[{position}]"
    if not isinstance(item, Mapping):
        errors[where] = "must be an object"
        return None
    unknown = sorted(set(item) - RESULT_FIELDS)
    if unknown:
        errors[where] = f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(RESULT_FIELDS))}"
    membership = None
    name = item.get("task")
    if not isinstance(name, str) or not name:
        errors[f"{where}.task"] = "required: the task id"
    elif name not in tasks:
        errors[f"{where}.task"] = f"unknown task {name!r} in this experiment"
    else:
        membership = tasks[name]
    split = item.get("split")
    if split is not None and membership is not None and split != membership.split:
        errors[f"{where}.split"] = f"task {name!r} is in split {membership.split!r}, not {split!r}"
    index = item.get("index")
    if not _count(index) or index > MAX_INDEX:
        errors[f"{where}.index"] = f"must be an integer from 0 to {MAX_INDEX}, got {index!r}"
    passed = item.get("passed")
    if not isinstance(passed, bool):
        errors[f"{where}.passed"] = f"must be true or false, got {passed!r}"
    score = item.get("score", 1.0 if passed is True else 0.0)
    if not isinstance(score, int | float) or isinstance(score, bool) or not math.isfinite(score) or not 0 <= score <= 1:
        errors[f"{where}.score"] = f"must be a number in [0, 1], got {score!r}"
    for key, limit in MAX_COUNTS.items():
        value = item.get(key)
        if value is not None and (not _count(value) or value > limit):
            errors[f"{where}.{key}"] = f"must be a non-negative integer or null, got {value!r}"
    error = item.get("error")
    if error is not None and (not isinstance(error, str) or not error or len(error) > MAX_ERROR_CHARS):
        errors[f"{where}.error"] = f"must be a message of 1 to {MAX_ERROR_CHARS} characters or null"
    elif error is not None and passed is True:
        errors[f"{where}.error"] = "a trial that errored cannot pass"
    if membership is None or any(key == where or key.startswith(where + ".") for key in errors):
        return None
    assert isinstance(index, int)  # else an error for it was recorded above
    values: dict[str, Any] = {
        "state": Trial.State.DONE,
        "outcome": Trial.Outcome.PASS if passed else Trial.Outcome.FAIL,
        "score": float(score),
        "tokens": item.get("tokens"),
        "steps": item.get("steps"),
    }
    if error is not None:
        # An error (the infrastructure failed, the agent crashed) is neither a
        # pass nor a fail: no score, so it never lowers or raises a rate.
        values.update(
            state=Trial.State.ERROR, outcome=Trial.Outcome.ERROR, score=None, error_kind=Trial.ErrorKind.INFRA
        )
        values["error"] = error
    return membership, index, values


def external_results_ingest(
    *, candidate: Candidate, results: Sequence[Mapping[str, Any]], source: Mapping[str, Any]
) -> Evaluation:
    """Store externally produced trial results of ``candidate`` as one external evaluation.

    ``results``: ``{"task", "split"?, "index", "passed", "score"?, "tokens"?, "steps"?,
    "error"?}`` each (a trial with an ``error`` message is stored as an error,
    with no score); ``task`` is a task id of the experiment's benchmark (``benchmark/id``
    for held-out tasks); ``split`` when given must be the task's split; a
    missing score is 1 for a pass and 0 for a fail. ``source`` describes where
    the results came from and is stored as given.

    Validates everything first and raises ExternalResultsError listing every
    problem, writing nothing. Not idempotent: ingesting twice stores two
    external evaluations (each submission is its own record).
    """
    errors: dict[str, str] = {}
    if not isinstance(source, Mapping):
        errors["source"] = "must be an object"
    else:
        try:
            text = json.dumps(source, allow_nan=False)
            size = len(text.encode())
        except (TypeError, ValueError) as exc:
            errors["source"] = f"must be plain JSON: {exc}"
        else:
            if "\\u0000" in text:
                # PostgreSQL's jsonb cannot store NUL characters.
                errors["source"] = "must not contain NUL characters"
            elif size > MAX_SOURCE_BYTES:
                errors["source"] = f"holds {size} bytes of JSON, over the limit of {MAX_SOURCE_BYTES}"
    if isinstance(results, str | bytes) or not isinstance(results, Sequence) or not results:
        raise ExternalResultsError({**errors, "results": "must be a non-empty list"})
    if len(results) > MAX_RESULTS:
        raise ExternalResultsError({**errors, "results": f"at most {MAX_RESULTS} results per submission"})

    tasks = _memberships(candidate)
    checked: list[tuple[SplitMembership, int, dict[str, Any]]] = []
    seen: dict[tuple[int, int], int] = {}
    for position, item in enumerate(results):
        row = _check_result(position, item, tasks, errors)
        if row is None:
            continue
        key = (row[0].task_id, row[1])
        if key in seen:
            errors[f"results[{position}]"] = (
                f"duplicate trial: task {item['task']!r} index {row[1]} is also results[{seen[key]}]"
            )
            continue
        seen[key] = position
        checked.append(row)
    if errors:
        raise ExternalResultsError(errors)

    now = timezone.now()
    with transaction.atomic():
        evaluation = Evaluation.objects.create(
            experiment_id=candidate.experiment_id,
            candidate=candidate,
            purpose=Evaluation.Purpose.CANDIDATE,
            splits=sorted({membership.split for membership, _, _ in checked}),
            k=max(index for _, index, _ in checked) + 1,
            state=Evaluation.State.EXTERNAL,
            external=True,
            source=dict(source),
            trials_total=len(checked),
            trials_finished=len(checked),
            sandbox_profile="external",
            finished_at=now,
        )
        Trial.objects.bulk_create(
            Trial(
                evaluation=evaluation,
                candidate=candidate,
                task_id=membership.task_id,
                split=membership.split,
                index=index,
                sandbox_profile="external",
                finished_at=now,
                **values,
            )
            for membership, index, values in checked
        )
    return evaluation
