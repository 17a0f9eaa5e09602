"""Trajectories of trials: the only writer of Trajectory and TrajectoryStep.

``trajectory_store`` stores an ATIF-shaped document (secrets redacted,
replacing the trial's previous trajectory); the worker calls it for the
trajectory an agent wrote, and ``trajectory_import`` calls it after
detecting the format, validating and converting (evolution.trajectory_formats);
``trajectories_import`` does the same for a batch, in one transaction.
Bad input raises ``TrajectoryFormatError`` (``TrajectoryBatchError`` for a
batch) before anything is written, so the previous trajectories stay.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import connection, models, transaction
from django.db.models.options import Options

from evolution.models import Annotation, Trajectory, TrajectoryStep, Trial
from evolution.prepared import concrete_field, statement_cursor
from evolution.redaction import redact
from evolution.trajectory_formats import (
    ROOT_FIELDS,
    STEP_FIELDS,
    TrajectoryFormatError,
    TrajectoryListError,
    join_continuations,
    parse,
    subagent_refs,
)

__all__ = [
    "TrajectoryBatchError",
    "TrajectoryFormatError",
    "TrajectoryListError",
    "trajectories_import",
    "trajectory_import",
    "trajectory_store",
]


def _message_text(message: Any) -> str:
    if isinstance(message, str):
        return message
    if isinstance(message, list):  # ATIF content parts
        texts = [part.get("text") for part in message if isinstance(part, dict)]
        return "\n".join(text for text in texts if isinstance(text, str))
    return ""


def trajectory_store(*, trial: Trial, document: dict[str, Any]) -> Trajectory:
    """Store ``document`` (ATIF-shaped) as ``trial``'s trajectory, replacing any.

    Secrets are redacted first; when any were found the trajectory is marked
    ``redacted`` and ``extra["redactions"]`` holds {kind: count}. Fields
    with no column are kept: a step's in its ``extra``, top-level ones in
    the trajectory's ``extra["document_fields"]``. Lenient about shapes (the
    worker stores whatever the agent wrote); validate with
    ``trajectory_formats.parse`` first for strictness.
    """
    return _store([_prepared(trial, document)])[0]


@dataclass
class _Prepared:
    """A trajectory ready to store: its row (unsaved) and its steps' rows
    (``_STEP_COLUMNS`` after the trajectory's id)."""

    trajectory: Trajectory
    steps: list[tuple[Any, ...]]


def _prepared(trial: Trial, document: dict[str, Any]) -> _Prepared:
    document, text = _without_nul(document)
    document, redactions = redact(document, ascii_json=text)
    steps = [step for step in document.get("steps") or [] if isinstance(step, dict)]
    extra = dict(document.get("extra") or {}) if isinstance(document.get("extra"), dict) else {}
    unknown = {key: value for key, value in document.items() if key not in ROOT_FIELDS}
    if unknown:
        extra["document_fields"] = {**extra.get("document_fields", {}), **unknown}
    if redactions:
        extra["redactions"] = redactions
    ids = [_step_id(step.get("step_id"), position) for position, step in enumerate(steps, start=1)]
    if len(set(ids)) != len(ids):  # an agent's own file with repeated ids: number the steps in order
        ids = list(range(1, len(steps) + 1))
    trajectory = Trajectory(
        trial=trial,
        schema_version=str(document.get("schema_version") or "")[:40],
        session_id=str(document.get("session_id") or "")[:200],
        agent=document.get("agent") if isinstance(document.get("agent"), dict) else {},
        final_metrics=document.get("final_metrics") if isinstance(document.get("final_metrics"), dict) else {},
        notes=str(document.get("notes") or ""),
        extra=extra,
        step_count=len(steps),
        redacted=bool(redactions),
    )
    rows = [
        (
            step_id,
            str(step.get("timestamp") or "")[:64],
            str(step.get("source") or "")[:20],
            str(step.get("model_name") or "")[:200],
            _message_text(step.get("message")),
            str(step.get("reasoning_content") or ""),
            _json_or(step.get("tool_calls"), "[]"),
            _json_or(step.get("observation"), "{}"),
            _json_or(step.get("metrics"), "{}"),
            _json_or(_step_extra(step), "{}"),
        )
        for step_id, step in zip(ids, steps, strict=True)
    ]
    return _Prepared(trajectory, rows)


def _store(prepared: list[_Prepared]) -> list[Trajectory]:
    """Replace the trials' trajectories with ``prepared`` in one transaction:
    one statement removes the old ones, one inserts the new, one COPY their
    steps, however many there are.

    Inside a caller's transaction (the worker's finish) no savepoint: an
    error here rolls the caller's whole transaction back, as it propagates
    through it anyway (no caller goes on after a database error), and the
    savepoint's two statements cost every trial."""
    with transaction.atomic(savepoint=False):
        _trajectories_remove([item.trajectory.trial_id for item in prepared])
        trajectories = [item.trajectory for item in prepared]
        _trajectories_insert(trajectories)
        _steps_insert(
            [
                (trajectory.pk, *row)
                for trajectory, item in zip(trajectories, prepared, strict=True)
                for row in item.steps
            ]
        )
    return trajectories


# A trajectory's columns, its trial's first (the steps' are in ``_STEP_COLUMNS``).
_TRAJECTORY_COLUMNS = ("trial", "schema_version", "session_id", "agent", "final_metrics", "notes", "extra")
_TRAJECTORY_COUNTS = ("step_count", "redacted")


def _trajectories_insert(trajectories: list[Trajectory]) -> None:
    """Insert the trajectories' rows and set their ids, as ``bulk_create``
    does (each value prepared by its field, the ids from ``RETURNING``),
    without its per-call planning: half of the worker's trajectory store
    in a profile of its CPU, every trial."""
    if not trajectories:
        return
    meta = Trajectory._meta
    fields = [concrete_field(Trajectory, name) for name in (*_TRAJECTORY_COLUMNS, *_TRAJECTORY_COUNTS)]
    quote = connection.ops.quote_name
    table, columns = quote(meta.db_table), ", ".join(quote(_column(meta, field.name)) for field in fields)
    returning = connection.features.can_return_rows_from_bulk_insert
    size = connection.ops.bulk_batch_size(fields, trajectories) or len(trajectories)
    for start in range(0, len(trajectories), size):
        batch = trajectories[start : start + size]
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        sql = f"INSERT INTO {table} ({columns}) VALUES {', '.join([row] * len(batch))}"
        params = [field.get_db_prep_save(getattr(t, field.attname), connection) for t in batch for field in fields]
        with statement_cursor(connection) as cursor:
            cursor.execute(sql + (f" RETURNING {quote(_column(meta, 'id'))}" if returning else ""), params)
            ids = [returned[0] for returned in cursor.fetchall()] if returning else []
        if not returning:  # SQLite before 3.35
            found = dict(
                Trajectory.objects.filter(trial_id__in=[t.trial_id for t in batch]).values_list("trial_id", "pk")
            )
            ids = [found[t.trial_id] for t in batch]
        for trajectory, pk in zip(batch, ids, strict=True):
            trajectory.pk = pk
            trajectory._state.adding, trajectory._state.db = False, connection.alias


def _trajectories_remove(trial_ids: list[int]) -> None:
    """Delete these trials' trajectories and their steps; annotations
    anchored to one of those steps keep their note and lose the anchor (the
    model's SET_NULL). Three statements, where ``QuerySet.delete`` loads every
    step as an instance to do the same: 7 ms of a 10 ms re-import of 200
    steps, and far more for a long trajectory."""
    if not trial_ids:
        return
    quote = connection.ops.quote_name
    trajectories = Trajectory._meta
    with statement_cursor(connection) as cursor:
        # Raw, as the deletes: the worker's finish asks this of every trial,
        # and the queryset's filter cost more than the query.
        trials = ", ".join(["%s"] * len(trial_ids))
        table, trial = quote(trajectories.db_table), quote(_column(trajectories, "trial"))
        cursor.execute(
            f"SELECT {quote(_column(trajectories, 'id'))} FROM {table} WHERE {trial} IN ({trials})", trial_ids
        )
        old = [row[0] for row in cursor.fetchall()]
    if not old:
        return
    Annotation.objects.filter(step__trajectory_id__in=old).update(step=None)
    marks = ", ".join(["%s"] * len(old))
    with connection.cursor() as cursor:
        for model, column in ((TrajectoryStep, "trajectory"), (Trajectory, "id")):
            meta = model._meta
            cursor.execute(f"DELETE FROM {quote(meta.db_table)} WHERE {quote(_column(meta, column))} IN ({marks})", old)


_STEP_COLUMNS = ("trajectory", *STEP_FIELDS, "extra")


def _column(meta: Options[Any], name: str) -> str:
    """The database column of a concrete field (never a reverse relation)."""
    field = meta.get_field(name)
    assert isinstance(field, models.Field) and field.column is not None, name
    return field.column


def _steps_insert(rows: list[tuple[Any, ...]]) -> None:
    """Insert step rows (values in ``_STEP_COLUMNS`` order, JSON columns as
    JSON text): one COPY on PostgreSQL, one prepared statement elsewhere.

    What ``bulk_create`` would write, without a model instance and a
    per-field preparation for each of thousands of steps, which cost several
    times the insert itself. COPY, because psycopg's executemany sends one
    INSERT per row (pipelined): 200 rows took four times as long as one
    COPY of them.
    """
    if not rows:
        return
    meta = TrajectoryStep._meta
    quote = connection.ops.quote_name
    columns = ", ".join(quote(_column(meta, name)) for name in _STEP_COLUMNS)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Text COPY takes JSON text for a jsonb column as it is.
            with cursor.cursor.copy(f"COPY {quote(meta.db_table)} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        values = ", ".join("%s" for _ in _STEP_COLUMNS)
        cursor.executemany(f"INSERT INTO {quote(meta.db_table)} ({columns}) VALUES ({values})", rows)


def _without_nul(value: Any) -> tuple[Any, str | None]:
    """What no database can store replaced: U+0000 (PostgreSQL text and
    jsonb cannot hold it) and lone surrogates (not Unicode, so they cannot
    be encoded as UTF-8 for any database) by U+FFFD; infinite and NaN
    numbers (not JSON: jsonb and SQLite's JSON check refuse them; Python's
    parser reads 1e999 in an agent's file as infinity) by null.

    (``value`` itself, its ASCII JSON text) when that text has none of them
    (JSON escapes the characters as \\u0000 and \\udXXX; a number that is
    not finite fails the dump); (a copy with the replacements, None)
    otherwise. The text serves redaction's look for secrets too: dumping
    70 KB twice was 1 ms.
    """
    try:
        text = json.dumps(value, check_circular=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return _nul_replaced(value), None
    if "\\u0000" not in text and ("\\ud" not in text or not _lone_surrogate_escaped(text)):
        return value, text
    return _nul_replaced(value), None


# Any surrogate escape; JSON writes a character beyond the BMP as a pair of
# them, high (d800-dbff) then low (dc00-dfff). A literal start, so the scan
# runs at the speed of a substring search.
_SURROGATE_ESCAPE = re.compile(r"\\ud[89a-f][0-9a-f]{2}")


def _lone_surrogate_escaped(text: str) -> bool:
    """Whether ``text`` (JSON) escapes a surrogate that is not half of a pair.

    An escaped backslash before "ud800" counts too, which only costs a walk
    that changes nothing. One regular expression with look-arounds for the
    unpaired ones took 1.3 ms over a 70 KB document holding one emoji.
    """
    high_end = -1  # where the low half of a pending high one must start
    for match in _SURROGATE_ESCAPE.finditer(text):
        if match.group()[3] in "89ab":
            if high_end != -1:
                return True
            high_end = match.end()
        elif match.start() != high_end:
            return True
        else:
            high_end = -1
    return high_end != -1


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _nul_replaced(value: Any) -> Any:
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {_nul_replaced(key): _nul_replaced(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [_nul_replaced(child) for child in value]
    return value


def _json_or(value: Any, empty: str) -> str:
    """The JSON text of ``value``, ``empty`` (the text of [] or {}) when it is
    falsy: most steps have no tool calls, observation or metrics, and one
    json.dumps call costs some microseconds however small its value."""
    return json.dumps(value) if value else empty


def _step_id(value: Any, position: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else position


def _step_extra(step: dict[str, Any]) -> dict[str, Any]:
    extra = {key: value for key, value in step.items() if key not in STEP_FIELDS}
    if isinstance(step.get("message"), list):
        extra["message_parts"] = step["message"]
    return extra


def trajectory_import(
    *,
    trial: Trial,
    document: Any,
    fmt: str = "auto",
    lenient: bool = False,
    files: Mapping[str, Any] | None = None,
) -> Trajectory:
    """Validate ``document`` (ATIF v1.x, mini-swe-agent or an OpenAI message
    list; ``fmt`` "auto" detects which), redact it and store it as
    ``trial``'s trajectory, replacing any. ``files`` maps the names of the
    trajectory's other files (parsed JSON) to them: an ATIF continuation
    chain is joined from them, and the subagent trajectories its steps name
    are validated and kept in ``extra["subagent_trajectories"]``. With
    ``lenient`` off-spec steps keep their text and the deviations are
    recorded in ``extra["deviations"]``. TrajectoryFormatError, with
    nothing written, when it is not valid (TrajectoryListError for a list
    of several trajectories). Safe to repeat: the result replaces."""
    return _store([_prepared(trial, _normalized(document, fmt, lenient=lenient, files=files))])[0]


class TrajectoryBatchError(Exception):
    """Documents of a batch that are not valid: ``errors`` maps each one's
    position in the batch to its problems (``TrajectoryFormatError.errors``)."""

    def __init__(self, errors: dict[int, list[str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"#{index}: {problems[0]}" for index, problems in sorted(errors.items())[:5]))


def trajectories_import(items: list[tuple[Trial, Any, str]], *, lenient: bool = False) -> list[Trajectory]:
    """``trajectory_import`` of several (trial, document, format), all or
    nothing: every document is validated first, and TrajectoryBatchError
    names each invalid one with nothing written; then one transaction
    replaces every trial's trajectory. Each trial at most once (ValueError).
    Returns the trajectories in the order given."""
    trial_ids = [trial.pk for trial, *_rest in items]
    if len(set(trial_ids)) != len(trial_ids):
        raise ValueError("a trial appears more than once in the batch")
    normalized: list[dict[str, Any]] = []
    errors: dict[int, list[str]] = {}
    for index, (_trial, document, fmt) in enumerate(items):
        try:
            normalized.append(_normalized(document, fmt, lenient=lenient))
        except TrajectoryFormatError as exc:
            errors[index] = exc.errors
    if errors:
        raise TrajectoryBatchError(errors)
    return _store([_prepared(trial, document) for (trial, _d, _f), document in zip(items, normalized, strict=True)])


def _normalized(
    document: Any, fmt: str, *, lenient: bool = False, files: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    files = {} if files is None else files  # a folder read on demand is empty until asked
    deviations: list[str] = []
    if fmt in ("auto", "atif") and isinstance(document, dict) and document.get("continued_trajectory_ref"):
        try:
            document, _names = join_continuations(document, files.__getitem__)
        except TrajectoryFormatError as exc:
            if not lenient:
                raise
            deviations.extend(exc.errors)
            deviations.append("only the files before that continuation were imported")
            document = {key: value for key, value in document.items() if key != "continued_trajectory_ref"}
    detected, normalized = parse(document, fmt, lenient=lenient)
    extra = dict(normalized.get("extra") or {})
    linked = []
    for path in subagent_refs(normalized):
        if path not in files:
            continue  # Harbor keeps them beside the trajectory; without the file the reference alone stays
        try:
            _kind, subagent = parse(files[path], "atif", lenient=lenient)
        except TrajectoryFormatError as exc:
            raise TrajectoryFormatError([f"{path}: {error}" for error in exc.errors]) from None
        linked.append({"trajectory_path": path, **subagent})
    if linked:
        extra["subagent_trajectories"] = [*extra.get("subagent_trajectories", []), *linked]
    if deviations:
        extra["deviations"] = [*deviations, *extra.get("deviations", [])]
    normalized["extra"] = {**extra, "imported_format": detected}
    return normalized
