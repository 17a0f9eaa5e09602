"""Split assignment: each task in exactly one of train, gate, sealed.

Pure functions. The assignment is a deterministic function of the task ids,
the seed and the ratios, so re-running it anywhere gives the same splits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

SPLITS = ("train", "gate", "sealed")


class SplitError(ValueError):
    pass


def validate_ratios(ratios: Mapping[str, float]) -> dict[str, float]:
    unknown = set(ratios) - set(SPLITS)
    if unknown:
        raise SplitError(f"unknown split name(s) in ratios: {', '.join(sorted(unknown))}")
    values = {name: float(ratios.get(name, 0.0)) for name in SPLITS}
    if any(value < 0 for value in values.values()):
        raise SplitError("split ratios must not be negative")
    total = sum(values.values())
    if not math.isclose(total, 1.0, abs_tol=1e-9):
        raise SplitError(f"split ratios must add up to 1 (they add up to {total:g})")
    return values


def assign_by_ratio(
    task_ids: Sequence[str],
    *,
    seed: int,
    ratios: Mapping[str, float],
    strata: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Shuffle the sorted ids with ``seed`` and cut them by ``ratios``.

    Counts use largest-remainder rounding so they add up to the number of
    tasks; ties in the remainders go to train, then gate, then sealed.

    ``strata`` (``stratify_by``: task id -> the value of a task attribute)
    cuts each value's tasks by ``ratios`` on its own, so every value with
    enough tasks has some in every split with a nonzero ratio and no
    capability lives in one split only. A task missing from ``strata`` is in
    a stratum of its own name "".
    """
    values = validate_ratios(ratios)
    ids = sorted(set(task_ids))
    if len(ids) != len(task_ids):
        raise SplitError("task ids must be unique")
    if strata is not None:
        groups: dict[str, list[str]] = {}
        for task_id in ids:
            groups.setdefault(str(strata.get(task_id, "")), []).append(task_id)
        assignment: dict[str, str] = {}
        for _, members in sorted(groups.items()):
            assignment.update(assign_by_ratio(members, seed=seed, ratios=values))
        return assignment
    rng = random.Random(seed)
    rng.shuffle(ids)
    exact = {name: values[name] * len(ids) for name in SPLITS}
    counts = {name: math.floor(exact[name]) for name in SPLITS}
    leftover = len(ids) - sum(counts.values())
    by_remainder = sorted(SPLITS, key=lambda name: (-(exact[name] - counts[name]), SPLITS.index(name)))
    for name in by_remainder[:leftover]:
        counts[name] += 1
    assignment = {}
    start = 0
    for name in SPLITS:
        for task_id in ids[start : start + counts[name]]:
            assignment[task_id] = name
        start += counts[name]
    return assignment


def strata_of(metadata: Mapping[str, Mapping[str, object]], attribute: str) -> dict[str, str]:
    """``assign_by_ratio``'s strata for ``stratify_by: attribute``: task id -> the value of the attribute in
    the task's metadata, as text ("" when the task has none)."""
    values = {task_id: meta.get(attribute) for task_id, meta in metadata.items()}
    return {task_id: "" if value is None else str(value) for task_id, value in values.items()}


def assign_explicit(task_ids: Sequence[str], lists: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Use explicit per-split id lists; every task must appear exactly once."""
    unknown_splits = set(lists) - set(SPLITS)
    if unknown_splits:
        raise SplitError(f"unknown split name(s): {', '.join(sorted(unknown_splits))}")
    known = set(task_ids)
    assignment: dict[str, str] = {}
    for name in SPLITS:
        for task_id in lists.get(name, ()):
            if task_id not in known:
                raise SplitError(f"task {task_id!r} in split {name!r} is not in the benchmark")
            if task_id in assignment:
                raise SplitError(f"task {task_id!r} is in both {assignment[task_id]!r} and {name!r}")
            assignment[task_id] = name
    missing = sorted(known - set(assignment))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise SplitError(f"{len(missing)} task(s) are in no split: {shown}")
    return assignment


def concentration_warnings(
    assignment: Mapping[str, str], attribute_of: Mapping[str, object], *, attribute: str
) -> list[str]:
    """One line for every value of a task attribute held by one split only ("sealed holds all 3 tasks of
    category ticket-context"): a capability no other split can measure. ``assignment`` maps task ids to
    splits, ``attribute_of`` task ids to the attribute's value (tasks without one are left out). Values of a
    single task are left out too: one task is always in one split."""
    where: dict[str, dict[str, int]] = {}
    for task_id, value in attribute_of.items():
        split = assignment.get(task_id)
        if split is not None and value is not None:
            counts = where.setdefault(str(value), {})
            counts[split] = counts.get(split, 0) + 1
    return [
        f"{split} holds all {count} tasks of {attribute} {value}"
        for value, counts in sorted(where.items())
        for split, count in counts.items()
        if len(counts) == 1 and count > 1
    ]


def categorical_attributes(metadata: Mapping[str, Mapping[str, object]]) -> list[str]:
    """The task attributes worth a concentration check: metadata keys whose values are strings and repeat
    (fewer distinct values than half the tasks that have the key)."""
    values: dict[str, list[str]] = {}
    for attributes in metadata.values():
        for key, value in attributes.items():
            if isinstance(value, str):
                values.setdefault(key, []).append(value)
    return sorted(key for key, seen in values.items() if 1 < len(set(seen)) <= len(seen) // 2)
