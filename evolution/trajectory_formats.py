"""Trajectory documents: ATIF v1.x validation and conversion into it.

The entry points: ``detect_format`` and ``parse``; the readers of each
producer are in ``evolution.formats``. Pure: no ORM, no I/O. Every input
format becomes one normalized ATIF document (a dict), the shape
``evolution.services.trajectories`` stores:

- ``atif``: an ATIF v1.x trajectory (``evolution.formats.atif``). A
  continuation (``continued_trajectory_ref``) is joined by
  ``join_continuations``; streaming ATIF JSONL (the document without its
  steps on the first line, then one step per line) by ``loads_text``.
- ``mini-swe-agent``: ``evolution.formats.mini_swe_agent``.
- ``openai``: an OpenAI chat message list or a tau-bench run
  (``evolution.formats.openai``).

A file holding several trajectories (a JSON list of ATIF documents or of
tau-bench runs) raises ``TrajectoryListError`` naming the count; what is
not a trajectory raises one short error naming what it looks like. With
``lenient`` an off-spec step keeps its text, and each deviation is listed
in the document's ``extra["deviations"]``.

Errors raise ``TrajectoryFormatError`` whose ``errors`` each name the path
of the offending field, e.g. ``steps[3].step_id: expected 4, got 5``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from evolution.formats.atif import join_continuations, subagent_refs, validate_atif
from evolution.formats.common import (
    AGENT_ONLY,
    CONVERTED_VERSION,
    MAX_ERRORS,
    ROOT_FIELDS,
    SOURCES,
    STEP_FIELDS,
    TrajectoryFormatError,
    TrajectoryListError,
    is_iso8601,
    type_name,
)
from evolution.formats.mini_swe_agent import from_mini_swe_agent, is_mini_messages
from evolution.formats.openai import from_openai

__all__ = [
    "AGENT_ONLY",
    "CONVERTED_VERSION",
    "FORMATS",
    "MAX_ERRORS",
    "ROOT_FIELDS",
    "SOURCES",
    "STEP_FIELDS",
    "SUPPORTED",
    "TrajectoryFormatError",
    "TrajectoryListError",
    "detect_format",
    "from_mini_swe_agent",
    "from_openai",
    "is_iso8601",
    "join_continuations",
    "loads_text",
    "parse",
    "subagent_refs",
    "validate_atif",
]

FORMATS = ("atif", "mini-swe-agent", "openai")
SUPPORTED = (
    "ATIF v1.0 to v1.7 (JSON, or streaming JSONL), a mini-swe-agent 1.x or 2.x .traj.json or message list, "
    "an OpenAI chat message list, a tau-bench run"
)


def _looks_like(document: Any) -> str:
    """What ``document`` looks like, in a few words, for a refusal."""
    if isinstance(document, list):
        items = [item for item in document[:20] if isinstance(item, dict)]
        if (
            items
            and all("action" in item or "observation" in item for item in items if "source" in item)
            and any("source" in item and ("action" in item or "observation" in item) for item in items)
        ):
            return f"an OpenHands event list ({len(document)} events)"
        if not items:
            kinds = sorted({type_name(item) for item in document[:20]}) or ["nothing"]
            return f"a JSON list of {len(document)} items ({', '.join(kinds)})"
        keys = sorted({key for item in items for key in item})[:6]
        return f"a JSON list of {len(document)} objects with keys {', '.join(keys)}"
    if isinstance(document, dict):
        messages = document.get("messages")
        if (
            "sessionId" in document
            and isinstance(messages, list)
            and any(isinstance(m, dict) and "type" in m for m in messages)
        ):
            return "a gemini-cli session"
        keys = sorted(document)[:8]
        return f"a JSON object with keys {', '.join(keys)}" if keys else "an empty JSON object"
    return type_name(document)


def _unsupported(document: Any) -> TrajectoryFormatError:
    return TrajectoryFormatError([f"document: looks like {_looks_like(document)}; supported: {SUPPORTED}"])


def _is_trajectory_item(item: Any) -> bool:
    return isinstance(item, dict) and (
        "schema_version" in item or "steps" in item or "traj" in item or "messages" in item
    )


def detect_format(document: Any) -> str:
    """Which of FORMATS ``document`` is; TrajectoryListError for a list of
    trajectories, TrajectoryFormatError naming what it looks like when none."""
    if isinstance(document, list):
        if document and all(_is_trajectory_item(item) for item in document):
            first = document[0]
            kind = "ATIF trajectories" if "schema_version" in first or "steps" in first else "trajectories"
            if "traj" in first:
                kind = "tau-bench runs"
            raise TrajectoryListError(len(document), kind)
        if not document or any(isinstance(item, dict) and "role" in item for item in document[:20]):
            return "mini-swe-agent" if is_mini_messages(document) else "openai"
        raise _unsupported(document)
    if isinstance(document, dict):
        if "schema_version" in document or ("steps" in document and "messages" not in document):
            return "atif"
        if isinstance(document.get("traj"), list):
            return "openai"
        if "messages" in document and _looks_like(document) != "a gemini-cli session":
            marker = str(document.get("trajectory_format") or "")
            if marker.startswith("mini-swe-agent") or "info" in document:
                return "mini-swe-agent"
            return "openai"
    raise _unsupported(document)


def parse(document: Any, fmt: str = "auto", *, lenient: bool = False) -> tuple[str, dict[str, Any]]:
    """(format, normalized ATIF document) of ``document``, validated.

    With ``lenient``, off-spec steps keep their text and each problem is
    listed in ``extra["deviations"]``; what leaves no trajectory at all (no
    steps, an unsupported shape) is still an error."""
    if fmt == "auto":
        fmt = detect_format(document)
    deviations: list[str] = []
    if fmt == "atif":
        normalized = validate_atif(document, deviations=deviations if lenient else None)
    elif fmt == "mini-swe-agent":
        converted = from_mini_swe_agent(document, deviations=deviations if lenient else None)
        normalized = validate_atif(converted, deviations=deviations if lenient else None)
    elif fmt == "openai":
        converted = from_openai(document, deviations=deviations if lenient else None)
        normalized = validate_atif(converted, deviations=deviations if lenient else None)
    else:
        raise TrajectoryFormatError([f"format: must be one of auto, {', '.join(FORMATS)}; got {fmt!r}"])
    if deviations:
        normalized["extra"] = {**normalized.get("extra", {}), "deviations": deviations}
    return fmt, normalized


def loads_text(
    text: str, *, loads: Callable[[str], Any] = json.loads, count_lines: Callable[[int], None] | None = None
) -> Any:
    """The JSON value of a trajectory file's ``text``: one JSON document, or
    streaming ATIF JSONL (a first line without ``steps``, then one step per
    line) joined into one document. A JSONL file whose every line is a
    whole trajectory is a list of them. ``json.JSONDecodeError`` for text
    that is neither, with the line of the fault. ``loads`` parses each
    piece; ``count_lines`` is given the number of JSONL lines before they are
    parsed (to refuse too many)."""
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise
        first_error = exc
    lines = [(number, line) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if count_lines is not None:
        count_lines(len(lines))
    values = []
    for number, line in lines:
        try:
            values.append(loads(line))
        except json.JSONDecodeError as exc:
            raise json.JSONDecodeError(f"line {number} of JSONL: {exc.msg}", exc.doc, exc.pos) from None
    if not values:
        raise first_error
    head = values[0]
    if isinstance(head, dict) and "schema_version" in head and "steps" not in head:
        return {**head, "steps": values[1:]}
    if all(_is_trajectory_item(value) for value in values):
        return values
    raise first_error
