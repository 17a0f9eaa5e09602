"""Trajectory documents: ATIF v1.x validation and conversion into it.

Pure: no ORM, no I/O. Three input formats become one normalized ATIF
document (a dict), the shape ``evolution.services.trajectories`` stores:

- ``atif``: an ATIF v1.x trajectory, validated like Harbor's reference
  validator: required fields and their types, ``step_id`` sequential from 1,
  ``source`` one of system/user/agent, agent-only fields only on agent steps,
  ISO 8601 timestamps, and each observation's ``source_call_id`` naming a
  tool call of the same step. Unknown fields are kept (step-level ones end
  up in the stored step's ``extra``, top-level ones in the trajectory's
  ``extra["document_fields"]``).
  ATIF v1.0 to v1.7 are read (v1.7's ``trajectory_id`` may stand for
  ``session_id``; its embedded ``subagent_trajectories`` are validated too).
  A continuation (``continued_trajectory_ref``) is joined by
  ``join_continuations``; streaming ATIF JSONL (the document without its
  steps on the first line, then one step per line) by ``loads_text``.
- ``mini-swe-agent``: a mini-swe-agent ``.traj.json`` (``info``,
  ``messages``, ``trajectory_format``) of 1.x or 2.x, or its plain message
  list. Text-mode actions (2.x: ``extra.actions``, else one fenced
  ``mswea_bash_command``/``bash`` block per assistant message; the output in
  the next user message) become a ``bash`` tool call and its observation;
  tool-call mode messages are converted as OpenAI messages. Tokens and cost
  come from each message's ``extra.response.usage`` and ``extra.cost``, its
  time from ``extra.timestamp`` (2.x) or ``timestamp`` (1.x, Unix seconds);
  2.x's closing ``{"role": "exit"}`` message becomes the last step (a system
  step) and its ``exit_status`` the trajectory's.
- ``openai``: a plain OpenAI chat message list (system/developer/user/
  assistant/tool messages, assistant ``tool_calls``, a tool message's
  ``name`` kept), ``{"messages": [...]}``, or a tau-bench run
  (``{"task_id", "traj": [...], "reward", ...}``).

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
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from evolution import limits

FORMATS = ("atif", "mini-swe-agent", "openai")
SOURCES = ("system", "user", "agent")
AGENT_ONLY = ("model_name", "reasoning_content", "tool_calls", "metrics")
ROOT_FIELDS = ("schema_version", "session_id", "agent", "steps", "notes", "final_metrics", "extra")
SUPPORTED = (
    "ATIF v1.0 to v1.7 (JSON, or streaming JSONL), a mini-swe-agent 1.x or 2.x .traj.json or message list, "
    "an OpenAI chat message list, a tau-bench run"
)
# The step fields a stored step (TrajectoryStep) has a column of the same name
# for; any other, the step's own ``extra`` included, is kept in its ``extra``.
STEP_FIELDS = (
    "step_id",
    "timestamp",
    "source",
    "model_name",
    "message",
    "reasoning_content",
    "tool_calls",
    "observation",
    "metrics",
)
CONVERTED_VERSION = "ATIF-v1.5"
MAX_ERRORS = 50
_VERSION_RE = re.compile(r"^ATIF-v1\.\d+$")
_STEP_INT_METRICS = ("prompt_tokens", "completion_tokens", "cached_tokens")
_FINAL_INT_METRICS = ("total_prompt_tokens", "total_completion_tokens", "total_cached_tokens", "total_steps")
_BASH_BLOCK_RE = re.compile(r"```(?:mswea_bash_command|bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)
_ROLES = "system, developer, user, assistant or tool"


class TrajectoryFormatError(ValueError):
    """The document is not a valid trajectory; ``errors`` name each field at fault."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        shown = errors[:MAX_ERRORS]
        more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
        super().__init__("; ".join(shown) + more)


class TrajectoryListError(TrajectoryFormatError):
    """The document is a list of ``count`` trajectories (``kind`` says of what), not one."""

    def __init__(self, count: int, kind: str) -> None:
        self.count = count
        self.kind = kind
        super().__init__(
            [f"document: this is a list of {count} {kind}, not one trajectory; import each into its own trial"]
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
            kinds = sorted({_type_name(item) for item in document[:20]}) or ["nothing"]
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
    return _type_name(document)


def _unsupported(document: Any) -> TrajectoryFormatError:
    return TrajectoryFormatError([f"document: looks like {_looks_like(document)}; supported: {SUPPORTED}"])


def _is_mini_messages(messages: list[Any]) -> bool:
    """Whether a plain message list was written by mini-swe-agent (its exit
    message, its actions, or its text-mode fence)."""
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "exit" or isinstance((message.get("extra") or {}).get("actions"), list):
            return True
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, str) and "```mswea_bash_command" in content:
            return True
    return False


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
            return "mini-swe-agent" if _is_mini_messages(document) else "openai"
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


def join_continuations(
    head: dict[str, Any], fetch: Callable[[str], Any], *, name: str = "the trajectory"
) -> tuple[dict[str, Any], list[str]]:
    """One ATIF document of ``head`` and the files its
    ``continued_trajectory_ref`` chain names, each got by ``fetch(ref)``
    (which raises KeyError when there is no such file), and the names read.

    A continuation restarts its step ids at 1 (Harbor's terminus-2 does):
    the joined steps are numbered on, each continuation step keeping its
    file and own id in ``extra["continuation"]``. The final metrics are the
    last file's (Harbor writes running totals). TrajectoryFormatError when a
    reference is not a plain file name, is missing, loops, or its file is
    not an ATIF object."""
    files: list[str] = []
    document = dict(head)
    steps = list(head.get("steps") or []) if isinstance(head.get("steps"), list) else []
    current, where = head, name
    while current.get("continued_trajectory_ref"):
        ref = current["continued_trajectory_ref"]
        if not isinstance(ref, str) or not ref or "/" in ref or "\\" in ref or ref in (".", ".."):
            raise TrajectoryFormatError(
                [f"{where}: continued_trajectory_ref must name a file in the same folder, got {ref!r}"]
            )
        if ref in files or len(files) >= 1000:
            raise TrajectoryFormatError([f"{where}: continued_trajectory_ref {ref!r} makes a loop"])
        try:
            following = fetch(ref)
        except KeyError:
            raise TrajectoryFormatError(
                [f"{where}: its continuation {ref!r} is missing (give the files of the trajectory together)"]
            ) from None
        if not isinstance(following, dict) or not isinstance(following.get("steps"), list):
            raise TrajectoryFormatError([f"{ref}: must be an ATIF object with steps, got {_type_name(following)}"])
        files.append(ref)
        for step in following["steps"]:
            if isinstance(step, dict):
                marked = {**step, "step_id": len(steps) + 1}
                own_extra = step.get("extra")
                marked["extra"] = {
                    **(own_extra if isinstance(own_extra, dict) else {}),
                    "continuation": {"file": ref, "step_id": step.get("step_id")},
                }
                steps.append(marked)
            else:
                steps.append(step)
        if following.get("final_metrics") is not None:
            document["final_metrics"] = following["final_metrics"]
        current, where = following, ref
    if files:
        document.pop("continued_trajectory_ref", None)
        document["steps"] = steps
        document_extra = document.get("extra")
        extra = document_extra if isinstance(document_extra, dict) else {}
        document["extra"] = {**extra, "continuation_files": files}
    return document, files


def subagent_refs(document: Any) -> list[str]:
    """The ``trajectory_path`` of each subagent trajectory a document's
    observations name, in order, once each."""
    paths: list[str] = []
    steps = document.get("steps") if isinstance(document, dict) else None
    for step in steps if isinstance(steps, list) else []:
        observation = step.get("observation") if isinstance(step, dict) else None
        results = observation.get("results") if isinstance(observation, dict) else None
        for result in results if isinstance(results, list) else []:
            refs = result.get("subagent_trajectory_ref") if isinstance(result, dict) else None
            for ref in refs if isinstance(refs, list) else []:
                path = ref.get("trajectory_path") if isinstance(ref, dict) else None
                if isinstance(path, str) and path and path not in paths:
                    paths.append(path)
    return paths


# --- ATIF validation ----------------------------------------------------------


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_iso8601(text: str) -> bool:
    """A date-time in ISO 8601 (``2025-01-02T03:04:05Z``, with or without fraction or offset)."""
    if not isinstance(text, str) or "T" not in text.upper() and " " not in text:
        return False
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


_KIND_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "number": (int, float),
    "dict": dict,
    "list": list,
    "bool": bool,
}
_KIND_WANTED = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "dict": "an object",
    "list": "a list",
    "bool": "true or false",
}


class _Checker:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}")

    def expect(self, container: dict[str, Any], key: str, path: str, kind: str, *, required: bool = False) -> bool:
        """True when ``container[key]`` is present (not null) and of ``kind``."""
        value = container.get(key)
        if value is None:
            if required:
                where = f"{path}.{key}" if path else key
                self.fail(where, "is required" if key not in container else "must not be null")
            return False
        # A boolean is an int to Python, not to JSON. Called some ten times a
        # step, so the path is only spelled out for an error.
        if isinstance(value, _KIND_TYPES[kind]) and (value.__class__ is not bool or kind == "bool"):
            return True
        where = f"{path}.{key}" if path else key
        self.fail(where, f"must be {_KIND_WANTED[kind]}, got {_type_name(value)}")
        return False

    def counts(self, container: dict[str, Any], path: str, int_keys: tuple[str, ...], cost_key: str) -> None:
        for key in int_keys:
            if self.expect(container, key, path, "int") and container[key] < 0:
                self.fail(f"{path}.{key}", "must not be negative")
        if self.expect(container, cost_key, path, "number") and container[cost_key] < 0:
            self.fail(f"{path}.{cost_key}", "must not be negative")


def validate_atif(document: Any, *, deviations: list[str] | None = None, where: str = "") -> dict[str, Any]:
    """The normalized copy of an ATIF v1.x document; TrajectoryFormatError listing every problem.

    With ``deviations`` (a list, the lenient import) a step at fault is kept
    as a step with its text, the original in its ``extra["off_spec"]``, and
    each problem is appended to ``deviations`` instead of raised; problems
    outside the steps are still raised. ``where`` prefixes the paths (an
    embedded subagent trajectory's)."""
    check = _Checker()
    if not isinstance(document, dict):
        raise TrajectoryFormatError([f"{where or 'document'}: must be a JSON object, got {_type_name(document)}"])
    if check.expect(document, "schema_version", "", "str", required=True) and not _VERSION_RE.match(
        document["schema_version"]
    ):
        check.fail("schema_version", f"must be ATIF-v1.x, got {document['schema_version']!r}")
    # ATIF v1.7 lets trajectory_id stand for session_id.
    if document.get("trajectory_id") is None or document.get("session_id") is not None:
        check.expect(document, "session_id", "", "str", required=True)
    else:
        check.expect(document, "trajectory_id", "", "str", required=True)
    if check.expect(document, "agent", "", "dict", required=True):
        agent = document["agent"]
        check.expect(agent, "name", "agent", "str", required=True)
        check.expect(agent, "version", "agent", "str", required=True)
        check.expect(agent, "model_name", "agent", "str")
        check.expect(agent, "tool_definitions", "agent", "list")
        check.expect(agent, "extra", "agent", "dict")
    check.expect(document, "notes", "", "str")
    check.expect(document, "extra", "", "dict")
    check.expect(document, "continued_trajectory_ref", "", "str")
    if check.expect(document, "final_metrics", "", "dict"):
        check.counts(document["final_metrics"], "final_metrics", _FINAL_INT_METRICS, "total_cost_usd")
    steps: list[Any] = []
    if check.expect(document, "steps", "", "list", required=True):
        steps = list(document["steps"])
        if not steps:
            check.fail("steps", "must hold at least one step")
    for index, step in enumerate(steps):
        before = len(check.errors)
        _validate_step(check, step, index)
        if deviations is not None and len(check.errors) > before:
            deviations.extend(f"{where}{error}" for error in check.errors[before:])
            del check.errors[before:]
            steps[index] = _salvaged(step, index)
    subagents: list[dict[str, Any]] = []
    if check.expect(document, "subagent_trajectories", "", "list"):
        for number, embedded in enumerate(document["subagent_trajectories"]):
            try:
                subagents.append(
                    validate_atif(embedded, deviations=deviations, where=f"{where}subagent_trajectories[{number}].")
                )
            except TrajectoryFormatError as exc:
                check.errors.extend(exc.errors)
    if check.errors:
        raise TrajectoryFormatError([f"{where}{error}" for error in check.errors] if where else check.errors)

    normalized = {key: document[key] for key in ROOT_FIELDS if document.get(key) is not None}
    unknown = {
        key: value for key, value in document.items() if key not in ROOT_FIELDS and key != "subagent_trajectories"
    }
    if document.get("session_id") is None and isinstance(document.get("trajectory_id"), str):
        normalized["session_id"] = document["trajectory_id"]
    if unknown:
        normalized["extra"] = {**normalized.get("extra", {}), "document_fields": unknown}
    if subagents:
        normalized["extra"] = {**normalized.get("extra", {}), "subagent_trajectories": subagents}
    normalized["steps"] = [dict(step) for step in steps]
    return normalized


def _salvaged(step: Any, index: int) -> dict[str, Any]:
    """A valid step keeping what can be read of an off-spec ``step``: its
    source when it is one of SOURCES (else system), its message's text (else
    the step as JSON), and the whole original in ``extra["off_spec"]``."""
    if not isinstance(step, dict):
        return {"step_id": index + 1, "source": "system", "message": json.dumps(step), "extra": {"off_spec": step}}
    source = step.get("source") if step.get("source") in SOURCES else "system"
    message = step.get("message")
    text = message if isinstance(message, str) else _text(message) if isinstance(message, list) else ""
    salvaged: dict[str, Any] = {
        "step_id": index + 1,
        "source": source,
        "message": text or json.dumps(step, default=str)[:100_000],
        "extra": {"off_spec": step},
    }
    if isinstance(step.get("timestamp"), str) and is_iso8601(step["timestamp"]):
        salvaged["timestamp"] = step["timestamp"]
    return salvaged


def _validate_step(check: _Checker, step: Any, index: int) -> None:
    path = f"steps[{index}]"
    if not isinstance(step, dict):
        check.fail(path, f"must be an object, got {_type_name(step)}")
        return
    if check.expect(step, "step_id", path, "int", required=True) and step["step_id"] != index + 1:
        check.fail(f"{path}.step_id", f"expected {index + 1} (step ids are sequential from 1), got {step['step_id']}")
    if check.expect(step, "source", path, "str", required=True) and step["source"] not in SOURCES:
        check.fail(f"{path}.source", f"must be one of {', '.join(SOURCES)}, got {step['source']!r}")
    if check.expect(step, "timestamp", path, "str") and not is_iso8601(step["timestamp"]):
        check.fail(f"{path}.timestamp", f"is not an ISO 8601 date-time: {step['timestamp']!r}")
    message = step.get("message")
    if "message" not in step:
        check.fail(f"{path}.message", "is required")
    elif not isinstance(message, str | list):
        check.fail(f"{path}.message", f"must be a string or a list of content parts, got {_type_name(message)}")
    check.expect(step, "model_name", path, "str")
    check.expect(step, "reasoning_content", path, "str")
    check.expect(step, "extra", path, "dict")
    if step.get("source") in SOURCES and step.get("source") != "agent":
        for key in AGENT_ONLY:
            if step.get(key) is not None:
                source = step["source"]
                check.fail(f"{path}.{key}", f"is only allowed on agent steps (this step's source is {source!r})")
    if check.expect(step, "metrics", path, "dict"):
        check.counts(step["metrics"], f"{path}.metrics", _STEP_INT_METRICS, "cost_usd")
    call_ids: set[str] = set()
    if check.expect(step, "tool_calls", path, "list"):
        for number, call in enumerate(step["tool_calls"]):
            where = f"{path}.tool_calls[{number}]"
            if not isinstance(call, dict):
                check.fail(where, f"must be an object, got {_type_name(call)}")
                continue
            if check.expect(call, "tool_call_id", where, "str", required=True):
                if call["tool_call_id"] in call_ids:
                    check.fail(f"{where}.tool_call_id", f"{call['tool_call_id']!r} is used twice in this step")
                call_ids.add(call["tool_call_id"])
            check.expect(call, "function_name", where, "str", required=True)
            check.expect(call, "arguments", where, "dict", required=True)
    if check.expect(step, "observation", path, "dict"):
        observation = step["observation"]
        where = f"{path}.observation"
        if check.expect(observation, "results", where, "list", required=True):
            for number, result in enumerate(observation["results"]):
                at = f"{where}.results[{number}]"
                if not isinstance(result, dict):
                    check.fail(at, f"must be an object, got {_type_name(result)}")
                    continue
                if check.expect(result, "source_call_id", at, "str") and result["source_call_id"] not in call_ids:
                    check.fail(
                        f"{at}.source_call_id",
                        f"{result['source_call_id']!r} does not name a tool call of step {step.get('step_id')}",
                    )
                content = result.get("content")
                if content is not None and not isinstance(content, str | list):
                    wanted = "a string or a list of content parts"
                    check.fail(f"{at}.content", f"must be {wanted}, got {_type_name(content)}")
                check.expect(result, "subagent_trajectory_ref", at, "list")


# --- Conversions --------------------------------------------------------------


def _text(content: Any) -> str:
    """Plain text of an OpenAI message content (string, or list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return json.dumps(content)


def _arguments(raw: Any, path: str, errors: list[str]) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        # The string is a JSON document of its own, so it gets the input limits the file it came in got.
        try:
            parsed = limits.json_loads(raw, what="its JSON text")
        except limits.InputLimitError as exc:
            errors.append(f"{path}: {exc}")
            return {}
        except json.JSONDecodeError:
            return {"input": raw}  # Models do emit invalid JSON arguments; keep them verbatim.
        return parsed if isinstance(parsed, dict) else {"input": parsed}
    errors.append(f"{path}: must be a JSON string or an object, got {_type_name(raw)}")
    return {}


def _usage_metrics(usage: Any) -> dict[str, Any]:
    """ATIF step metrics of an OpenAI ``usage`` object (cached tokens from
    ``prompt_tokens_details``)."""
    if not isinstance(usage, dict):
        return {}
    metrics = {}
    for key in ("prompt_tokens", "completion_tokens"):
        if _is_int(usage.get(key)) and usage[key] >= 0:
            metrics[key] = usage[key]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and _is_int(details.get("cached_tokens")) and details["cached_tokens"] >= 0:
        metrics["cached_tokens"] = details["cached_tokens"]
    return metrics


def _iso_time(value: Any) -> str | None:
    """ISO 8601 (UTC) of a Unix time in seconds, or an ISO 8601 text as it is."""
    if isinstance(value, str) and is_iso8601(value):
        return value
    if _is_number(value) and 0 <= value < 32503680000:  # before the year 3000
        return datetime.fromtimestamp(value, tz=UTC).isoformat().replace("+00:00", "Z")
    return None


def _message_time(message: dict[str, Any]) -> str | None:
    """A message's time: mini-swe-agent 2.x's ``extra.timestamp``, 1.x's ``timestamp``."""
    extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
    assert extra is not None
    return _iso_time(extra.get("timestamp")) or _iso_time(message.get("timestamp"))


def _message_metrics(message: dict[str, Any]) -> dict[str, Any]:
    """Token counts and cost of an assistant message: its own ``usage``, or
    mini-swe-agent's ``extra.response.usage`` and ``extra.cost``."""
    extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
    assert extra is not None
    response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
    assert response is not None
    metrics = _usage_metrics(message.get("usage")) or _usage_metrics(response.get("usage"))
    if _is_number(extra.get("cost")) and extra["cost"] >= 0:
        metrics["cost_usd"] = extra["cost"]
    return metrics


def _text_action(message: dict[str, Any], text: str) -> str | None:
    """The bash command of a text-mode assistant message: 2.x's one
    ``extra.actions`` entry, else the one fenced block of its text."""
    extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
    assert extra is not None
    actions = extra.get("actions")
    if isinstance(actions, list) and len(actions) == 1 and isinstance(actions[0], dict):
        command = actions[0].get("command")
        if isinstance(command, str):
            return command
    found = _BASH_BLOCK_RE.findall(text)
    return found[0].strip() if len(found) == 1 else None


def _result_extra(message: dict[str, Any]) -> dict[str, Any]:
    """What an observation's message holds beside its text (a tool's
    ``name``, mini-swe-agent's ``extra`` and 1.x's ``timestamp``)."""
    return {key: value for key, value in message.items() if key not in ("role", "content", "tool_call_id")}


def _messages_to_steps(
    messages: Any, *, where: str, text_actions: bool = False, deviations: list[str] | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """ATIF steps of an OpenAI-style message list, and the errors found.

    Assistant messages become agent steps whose tool calls are the
    message's; each ``tool`` message becomes a result of the observation of
    the agent step that made the call (its ``name`` in the result's
    ``extra``). With ``text_actions`` (mini-swe-agent text mode) an
    assistant message holding one action gets a ``bash`` tool call and the
    next user message becomes its observation. mini-swe-agent's ``exit``
    message becomes a system step holding the run's end. With
    ``deviations`` (lenient) a message of an unknown role, or a tool
    message answering no call, becomes a system step with its text and the
    problem goes to ``deviations`` instead of the errors.
    """
    errors: list[str] = []
    if not isinstance(messages, list):
        return [], [f"{where}: must be a list of messages, got {_type_name(messages)}"]
    if not messages:
        return [], [f"{where}: must hold at least one message"]
    steps: list[dict[str, Any]] = []
    owner: dict[str, dict[str, Any]] = {}  # tool_call_id -> the agent step that made the call
    pending_text_action: dict[str, Any] | None = None
    known = {"role", "content", "tool_calls", "tool_call_id", "reasoning_content", "usage", "timestamp"}

    def off_spec(message: dict[str, Any], problem: str) -> None:
        if deviations is None:
            errors.append(problem)
            return
        deviations.append(problem)
        steps.append(
            {
                "step_id": len(steps) + 1,
                "source": "system",
                "message": _text(message.get("content")),
                "extra": {"off_spec": message},
            }
        )

    for index, message in enumerate(messages):
        path = f"{where}[{index}]"
        if not isinstance(message, dict):
            errors.append(f"{path}: must be an object, got {_type_name(message)}")
            continue
        role = message.get("role")
        extra: dict[str, Any] = {key: value for key, value in message.items() if key not in known}
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in owner:
                off_spec(
                    message,
                    f"{path}.tool_call_id: {call_id!r} does not name a tool call of an earlier assistant message",
                )
                continue
            result: dict[str, Any] = {"source_call_id": call_id, "content": _text(message.get("content"))}
            if result_extra := _result_extra(message):
                result["extra"] = result_extra
            owner[call_id].setdefault("observation", {"results": []})["results"].append(result)
            continue
        if role == "user" and pending_text_action is not None:
            call_id = pending_text_action["tool_calls"][0]["tool_call_id"]
            result = {"source_call_id": call_id, "content": _text(message.get("content"))}
            if result_extra := _result_extra(message):
                result["extra"] = result_extra
            pending_text_action["observation"] = {"results": [result]}
            pending_text_action = None
            continue
        pending_text_action = None
        if role == "exit":  # mini-swe-agent 2.x: the run's end, its exit status in extra
            step: dict[str, Any] = {
                "step_id": len(steps) + 1,
                "source": "system",
                "message": _text(message.get("content")),
            }
            timestamp = _message_time(message)
            if timestamp:
                step["timestamp"] = timestamp
            step["extra"] = {"role": "exit", **extra}
            steps.append(step)
            continue
        if role not in ("system", "user", "assistant", "developer"):
            off_spec(message, f"{path}.role: must be {_ROLES}, got {role!r}")
            continue
        step = {
            "step_id": len(steps) + 1,
            "source": {"assistant": "agent", "developer": "system"}.get(role, role),
            "message": _text(message.get("content")),
        }
        timestamp = _message_time(message)
        if timestamp:
            step["timestamp"] = timestamp
        if role == "assistant":
            if isinstance(message.get("reasoning_content"), str):
                step["reasoning_content"] = message["reasoning_content"]
            metrics = _message_metrics(message)
            if metrics:
                step["metrics"] = metrics
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                errors.append(f"{path}.tool_calls: must be a list, got {_type_name(calls)}")
                calls = []
            converted = []
            for number, call in enumerate(calls):
                at = f"{path}.tool_calls[{number}]"
                if not isinstance(call, dict):
                    errors.append(f"{at}: must be an object, got {_type_name(call)}")
                    continue
                function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
                call_id = call.get("id")
                name = function.get("name")
                if not isinstance(call_id, str) or not call_id:
                    errors.append(f"{at}.id: must be a non-empty string")
                    continue
                if not isinstance(name, str):
                    errors.append(f"{at}.function.name: must be a string")
                    continue
                converted.append(
                    {
                        "tool_call_id": call_id,
                        "function_name": name,
                        "arguments": _arguments(function.get("arguments"), f"{at}.function.arguments", errors),
                    }
                )
                owner[call_id] = step
            if not converted and text_actions:
                command = _text_action(message, step["message"])
                if command is not None:
                    converted.append(
                        {
                            "tool_call_id": f"action-{step['step_id']}",
                            "function_name": "bash",
                            "arguments": {"command": command},
                        }
                    )
                    pending_text_action = step
            if converted:
                step["tool_calls"] = converted
        if extra:
            step["extra"] = extra
        steps.append(step)
    return steps, errors


def from_openai(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of an OpenAI message list,
    ``{"messages": [...]}`` or a tau-bench run (``{"traj": [...], ...}``)."""
    messages, root = document, {}
    if isinstance(document, dict):
        key = "traj" if "traj" in document and "messages" not in document else "messages"
        messages = document.get(key)
        root = {k: v for k, v in document.items() if k != key}
    steps, errors = _messages_to_steps(messages, where="messages", deviations=deviations)
    if errors:
        raise TrajectoryFormatError(errors)
    model = root.get("model") if isinstance(root.get("model"), str) else None
    agent: dict[str, Any] = {"name": "openai-messages", "version": "unknown"}
    if model:
        agent["model_name"] = model
        for step in steps:
            if step["source"] == "agent":
                step["model_name"] = model
    session = root.get("id") or root.get("session_id")
    if session is None and "task_id" in root:  # tau-bench: one run of a task
        session = f"task-{root['task_id']}-trial-{root.get('trial', 0)}"
    converted: dict[str, Any] = {
        "schema_version": CONVERTED_VERSION,
        "session_id": str(session or ""),
        "agent": agent,
        "steps": steps,
        "extra": {
            "converted_from": "tau-bench" if "traj" in (document if isinstance(document, dict) else {}) else "openai"
        },
    }
    rest = {k: v for k, v in root.items() if k not in ("model", "id", "session_id")}
    if rest:
        converted["extra"]["source_fields"] = rest
    return converted


def from_mini_swe_agent(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of a mini-swe-agent trajectory
    file (1.x or 2.x) or its plain message list."""
    if isinstance(document, list):
        document = {"messages": document}
    if not isinstance(document, dict):
        raise TrajectoryFormatError([f"document: must be a JSON object, got {_type_name(document)}"])
    info = document.get("info", {})
    if not isinstance(info, dict):
        raise TrajectoryFormatError([f"info: must be an object, got {_type_name(info)}"])
    steps, errors = _messages_to_steps(
        document.get("messages"), where="messages", text_actions=True, deviations=deviations
    )
    if errors:
        raise TrajectoryFormatError(errors)
    config: dict[str, Any] = info["config"] if isinstance(info.get("config"), dict) else {}
    model_config: dict[str, Any] = config["model"] if isinstance(config.get("model"), dict) else {}
    model = model_config.get("model_name") if isinstance(model_config.get("model_name"), str) else None
    agent: dict[str, Any] = {"name": "mini-swe-agent", "version": str(info.get("mini_version") or "unknown")}
    if model:
        agent["model_name"] = model
        for step in steps:
            if step["source"] == "agent":
                step["model_name"] = model
    final: dict[str, Any] = {"total_steps": len(steps)}
    for ours, theirs in (("total_prompt_tokens", "prompt_tokens"), ("total_completion_tokens", "completion_tokens")):
        counted = [step["metrics"][theirs] for step in steps if theirs in step.get("metrics", {})]
        if counted:
            final[ours] = sum(counted)
    model_stats = info.get("model_stats")
    stats: dict[str, Any] = model_stats if isinstance(model_stats, dict) else {}
    if _is_number(stats.get("instance_cost")):
        final["total_cost_usd"] = stats["instance_cost"]
    extra: dict[str, Any] = {"converted_from": "mini-swe-agent", "info": info}
    exit_steps = [step for step in steps if step.get("extra", {}).get("role") == "exit"]
    exit_status = info.get("exit_status")
    if exit_steps and isinstance(exit_steps[-1]["extra"].get("extra"), dict):
        exit_status = exit_steps[-1]["extra"]["extra"].get("exit_status", exit_status)
    if isinstance(exit_status, str) and exit_status:
        extra["exit_status"] = exit_status
    if isinstance(document.get("trajectory_format"), str):
        extra["trajectory_format"] = document["trajectory_format"]
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": str(document.get("instance_id") or info.get("instance_id") or ""),
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": extra,
    }
