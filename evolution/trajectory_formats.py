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

from evolution import inspect_logs
from evolution.formats.atif import join_continuations, subagent_refs, validate_atif
from evolution.formats.claude_code import from_claude_code
from evolution.formats.claude_code import is_session as is_claude_session
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
from evolution.formats.inspect import from_inspect
from evolution.formats.mini_swe_agent import from_mini_swe_agent, is_mini_messages
from evolution.formats.openai import from_openai
from evolution.formats.openhands import from_openhands
from evolution.formats.openhands import is_event_list as is_openhands_events
from evolution.formats.openhands import is_instance as is_openhands_instance
from evolution.formats.responses import from_codex, from_responses, is_codex_session, is_rollout
from evolution.formats.responses import is_items as is_responses_items
from evolution.formats.swe_agent import from_swe_agent, is_swe_agent
from evolution.formats.tau2_bench import from_simulation
from evolution.formats.tau2_bench import is_results as is_tau2_results
from evolution.formats.tau2_bench import is_simulation as is_tau2_simulation

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
    "JsonLines",
    "TrajectoryListError",
    "detect_format",
    "from_mini_swe_agent",
    "from_openai",
    "is_iso8601",
    "join_continuations",
    "loads_text",
    "parse",
    "subagent_refs",
    "trajectory_items",
    "validate_atif",
]

FORMATS = (
    "atif",
    "mini-swe-agent",
    "openai",
    "swe-agent",
    "openhands",
    "tau2-bench",
    "claude-code",
    "codex",
    "openai-responses",
    "inspect",
)
SUPPORTED = (
    "ATIF v1.0 to v1.7 (JSON, or streaming JSONL), a mini-swe-agent 1.x or 2.x .traj.json or message list, "
    "a SWE-agent 0.x or 1.x .traj, an OpenHands event list or evaluation output.jsonl, tau2-bench results, "
    "a Claude Code or Codex CLI session (JSONL), OpenAI Responses API items or NeMo Gym rollouts, "
    "an OpenAI chat message list, a tau-bench run, an Inspect AI eval log (.eval or .json)"
)
_LENIENT_HINT = (
    'document: off-spec as ATIF, but importable with --lenient (the API\'s "lenient": true), which keeps each '
    "off-spec step's text and records each deviation"
)
# Event streams no reader takes, by the types their lines have: (kinds, name).
_EVENT_STREAMS = (
    ({"user", "assistant", "summary", "system", "file-history-snapshot", "queue-operation"}, "a Claude Code session"),
    ({"session_meta", "response_item", "event_msg", "turn_context"}, "a Codex CLI session"),
    (
        {"message", "function_call", "function_call_output", "reasoning", "web_search_call"},
        "OpenAI Responses API items",
    ),
)


class JsonLines(list[Any]):
    """The values of a JSONL file's lines (so a refusal can say it was JSONL)."""


def _event_stream(items: list[dict[str, Any]]) -> str | None:
    kinds = {item.get("type") for item in items if isinstance(item.get("type"), str)}
    if not items or len(kinds) == 0 or any(not isinstance(item.get("type"), str) for item in items):
        return None
    for known, name in _EVENT_STREAMS:
        if kinds <= known:
            return name
    return None


def _looks_like(document: Any) -> str:
    """What ``document`` looks like, in a few words, for a refusal."""
    if isinstance(document, list):
        items = [item for item in document[:50] if isinstance(item, dict)]
        jsonl = isinstance(document, JsonLines)
        count = f"{'JSONL, ' if jsonl else ''}{len(document)} {'line' if jsonl else 'item'}{'s' * (len(document) != 1)}"
        if (stream := _event_stream(items)) is not None:
            return f"{stream} ({'JSONL, ' if jsonl else ''}{len(document)} events)"
        if not items:
            kinds = sorted({type_name(item) for item in document[:20]}) or ["nothing"]
            return f"a {'JSONL file' if jsonl else 'JSON list'} of {count.split(', ')[-1]} ({', '.join(kinds)})"
        keys = sorted({key for item in items for key in item})[:6]
        return f"a {'JSONL file' if jsonl else 'JSON list'} of {len(document)} objects with keys {', '.join(keys)}"
    if isinstance(document, dict):
        messages = document.get("messages")
        if (
            "sessionId" in document
            and isinstance(messages, list)
            and any(isinstance(m, dict) and "type" in m for m in messages)
        ):
            return "a gemini-cli session"
        if "task_id" in document and "termination_reason" in document and isinstance(document.get("ticks"), list):
            return f"a tau2-bench full-duplex (voice) simulation ({len(document['ticks'])} ticks, no messages)"
        keys = sorted(document)[:8]
        return f"a JSON object with keys {', '.join(keys)}" if keys else "an empty JSON object"
    return type_name(document)


def _unsupported(document: Any) -> TrajectoryFormatError:
    return TrajectoryFormatError([f"document: looks like {_looks_like(document)}; supported: {SUPPORTED}"])


def _is_trajectory_item(item: Any) -> bool:
    return isinstance(item, dict) and (
        "schema_version" in item
        or "steps" in item
        or "traj" in item
        or "messages" in item
        or is_openhands_instance(item)
        or is_swe_agent(item)
        or is_rollout(item)
    )


def _list_kind(items: list[Any]) -> str:
    first = items[0]
    if inspect_logs.is_inspect_log(first):
        return "samples (an Inspect AI eval log)"
    if "traj" in first:
        return "tau-bench runs"
    if is_openhands_instance(first):
        return "OpenHands instances"
    if is_tau2_simulation(first):
        return "tau2-bench simulations"
    if is_swe_agent(first):
        return "SWE-agent trajectories"
    if is_rollout(first):
        return "NeMo Gym rollouts"
    return "ATIF trajectories" if "schema_version" in first or "steps" in first else "trajectories"


def trajectory_items(document: Any) -> list[Any] | None:
    """The trajectories of a file that holds several (a list of them, an
    OpenHands output.jsonl, tau2-bench results), one per trial, in order;
    None for a file of one trajectory or none."""
    if is_tau2_results(document):
        return list(document["simulations"])
    if inspect_logs.is_inspect_log(document) and len(document.get("samples") or []) > 1:
        return inspect_logs.one_per_sample(document)
    if isinstance(document, list) and document and all(_is_trajectory_item(item) for item in document):
        return list(document)
    return None


def detect_format(document: Any) -> str:
    """Which of FORMATS ``document`` is; TrajectoryListError for a file of
    several trajectories, TrajectoryFormatError naming what it looks like
    when none."""
    items = trajectory_items(document)
    if items is not None:
        raise TrajectoryListError(len(items), _list_kind(items))
    if isinstance(document, list):
        if is_openhands_events(document):
            return "openhands"
        if is_codex_session(document):
            return "codex"
        if is_claude_session(document):
            return "claude-code"
        if is_responses_items(document):
            return "openai-responses"
        if not document or any(isinstance(item, dict) and "role" in item for item in document[:20]):
            return "mini-swe-agent" if is_mini_messages(document) else "openai"
        raise _unsupported(document)
    if inspect_logs.is_inspect_log(document):
        if len(document.get("samples") or []) == 1:
            return "inspect"
        raise TrajectoryFormatError([f"document: looks like {inspect_logs.describe(document)}; nothing to import"])
    if isinstance(document, dict):
        if "schema_version" in document or ("steps" in document and "messages" not in document):
            return "atif"
        if isinstance(document.get("traj"), list):
            return "openai"
        if is_swe_agent(document):
            return "swe-agent"
        if is_openhands_instance(document):
            return "openhands"
        if is_tau2_simulation(document):
            return "tau2-bench"
        if is_rollout(document):
            return "openai-responses"
        if "messages" in document and _looks_like(document) != "a gemini-cli session":
            marker = str(document.get("trajectory_format") or "")
            if marker.startswith("mini-swe-agent") or "info" in document:
                return "mini-swe-agent"
            return "openai"
    raise _unsupported(document)


_CONVERTERS: dict[str, Callable[..., dict[str, Any]]] = {
    "mini-swe-agent": from_mini_swe_agent,
    "openai": from_openai,
    "swe-agent": from_swe_agent,
    "openhands": from_openhands,
    "tau2-bench": from_simulation,
    "claude-code": from_claude_code,
    "codex": from_codex,
    "openai-responses": from_responses,
    "inspect": from_inspect,
}


def parse(document: Any, fmt: str = "auto", *, lenient: bool = False) -> tuple[str, dict[str, Any]]:
    """(format, normalized ATIF document) of ``document``, validated.

    With ``lenient``, off-spec steps keep their text and each problem is
    listed in ``extra["deviations"]``; what leaves no trajectory at all (no
    steps, an unsupported shape) is still an error. A strict refusal of a
    document the lenient import takes has ``lenient_imports`` set."""
    if fmt == "auto":
        fmt = detect_format(document)
    if fmt != "atif" and fmt not in _CONVERTERS:
        raise TrajectoryFormatError([f"format: must be one of auto, {', '.join(FORMATS)}; got {fmt!r}"])
    deviations: list[str] = []
    try:
        if fmt == "atif":
            normalized = validate_atif(document, deviations=deviations if lenient else None)
        else:
            converted = _CONVERTERS[fmt](document, deviations=deviations if lenient else None)
            normalized = validate_atif(converted, deviations=deviations if lenient else None)
    except TrajectoryFormatError as exc:
        if lenient or isinstance(exc, TrajectoryListError):
            raise
        try:
            parse(document, fmt, lenient=True)
        except TrajectoryFormatError:
            raise exc from None
        exc.lenient_imports = True
        raise
    if deviations:
        normalized["extra"] = {**normalized.get("extra", {}), "deviations": deviations}
    return fmt, normalized


def loads_text(
    text: str, *, loads: Callable[[str], Any] = json.loads, count_lines: Callable[[int], None] | None = None
) -> Any:
    """The JSON value of a trajectory file's ``text``: one JSON document, or
    streaming ATIF JSONL (a first line without ``steps``, then one step per
    line) joined into one document. Any other JSONL is the list of its
    lines' values (a ``JsonLines``): trajectories, instances or events,
    for ``detect_format`` to tell. ``json.JSONDecodeError`` for text that
    is neither JSON nor JSONL, with the line of the fault. ``loads`` parses each
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
    return JsonLines(values)
