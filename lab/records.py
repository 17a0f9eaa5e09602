"""What two experiments certified, compared: the same results whatever their ids, chain positions and times?

The trust suite compares an interrupted run with an uninterrupted control this way; the crash tests do too.
"""

from __future__ import annotations

from typing import Any

from evolution import digests
from evolution.models import CertifiedResult, Experiment, Trial


def record_contents(experiment: Experiment) -> list[str]:
    """Sorted digests of what each certified record of ``experiment``
    certifies, without what legitimately differs between two experiments
    (their id, chain position and link) and without any timestamp."""
    contents = []
    for payload in CertifiedResult.objects.filter(experiment=experiment).values_list("payload", flat=True):
        body = {k: v for k, v in payload.items() if k not in {"experiment", "seq", "prev"} and not k.endswith("_at")}
        contents.append(digests.json_digest(body))
    return sorted(contents)


def records_difference(control: Experiment, experiment: Experiment, *, limit: int = 6) -> str:
    """What differs between the certified records of two experiments, in
    words: records on one side only, paired by candidate tree, purpose and
    repeat, with the payload fields and trial rows that differ."""

    def bodies(of: Experiment) -> dict[tuple[str, str, int], dict[str, Any]]:
        found = {}
        for payload in CertifiedResult.objects.filter(experiment=of).values_list("payload", flat=True):
            body = {
                k: v for k, v in payload.items() if k not in {"experiment", "seq", "prev"} and not k.endswith("_at")
            }
            evaluation = body.get("evaluation", {})
            key = (str(body["candidate"]["tree"]), str(evaluation.get("purpose")), int(evaluation.get("repeat", 0)))
            found[key] = body
        return found

    want, got = bodies(control), bodies(experiment)
    notes = [f"{len(want)} records in the control, {len(got)} here"]
    for key in sorted(set(want) ^ set(got)):
        notes.append(f"only {'in the control' if key in want else 'here'}: tree {key[0][:12]} {key[1]} repeat {key[2]}")
    for key in sorted(set(want) & set(got)):
        a, b = want[key], got[key]
        fields = sorted(k for k in set(a) | set(b) if k != "trials" and a.get(k) != b.get(k))
        rows_a = {(r.get("task"), r.get("index")): r for r in a.get("trials", [])}
        rows_b = {(r.get("task"), r.get("index")): r for r in b.get("trials", [])}
        trials = [
            f"{task}#{index}: "
            + ", ".join(
                f"{k} {rows_a.get((task, index), {}).get(k)!r} -> {rows_b.get((task, index), {}).get(k)!r}"
                for k in sorted(set(rows_a.get((task, index), {})) | set(rows_b.get((task, index), {})))
                if rows_a.get((task, index), {}).get(k) != rows_b.get((task, index), {}).get(k)
            )
            for task, index in sorted(set(rows_a) | set(rows_b), key=str)
            if rows_a.get((task, index)) != rows_b.get((task, index))
        ]
        if fields or trials:
            notes.append(f"tree {key[0][:12]} {key[1]} repeat {key[2]}: fields {fields}; trials {trials[:limit]}")
    notes = notes[: limit + 1]
    # What the differing side's errors said, and how often its trials were
    # taken over (an attempt above 1), which a record does not keep.
    errors = (
        Trial.objects.filter(evaluation__experiment=experiment)
        .exclude(error_kind="")
        .values_list("task__external_id", "index", "attempt", "error_kind", "error")
        .order_by("pk")[:limit]
    )
    notes += [
        f"error here: {task}#{index} attempt {attempt} {kind}: {error[:300]!r}"
        for task, index, attempt, kind, error in errors
    ]
    retried = Trial.objects.filter(evaluation__experiment=experiment, attempt__gt=1).count()
    if retried:
        notes.append(f"{retried} trial(s) here ran more than once (attempt > 1)")
    return "; ".join(notes)


def records_digest(experiment: Experiment) -> str:
    """One digest of ``record_contents``: equal for two experiments exactly
    when they certified the same results."""
    return digests.json_digest(record_contents(experiment))
