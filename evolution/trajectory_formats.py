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
- ``mini-swe-agent``: a mini-swe-agent ``.traj.json`` (``info``,
  ``messages``, ``trajectory_format``). Text-mode actions (one fenced bash
  block per assistant message, the output in the next user message) become
  a ``bash`` tool call and its observation; tool-call mode messages are
  converted as OpenAI messages.
- ``openai``: a plain OpenAI chat message list (system/user/assistant/tool
  messages, assistant ``tool_calls``), or ``{"messages": [...]}``.

Errors raise ``TrajectoryFormatError`` whose ``errors`` each name the path
of the offending field, e.g. ``steps[3].step_id: expected 4, got 5``.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

FORMATS = ("atif", "mini-swe-agent", "openai")
SOURCES = ("system", "user", "agent")
AGENT_ONLY = ("model_name", "reasoning_content", "tool_calls", "metrics")
ROOT_FIELDS = ("schema_version", "session_id", "agent", "steps", "notes", "final_metrics", "extra")
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
_BASH_BLOCK_RE = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)


class TrajectoryFormatError(ValueError):
    """The document is not a valid trajectory; ``errors`` name each field at fault."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        shown = errors[:MAX_ERRORS]
        more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
        super().__init__("; ".join(shown) + more)


def detect_format(document: Any) -> str:
    """Which of FORMATS ``document`` is; TrajectoryFormatError when none."""
    if isinstance(document, list):
        return "openai"
    if isinstance(document, dict):
        if "schema_version" in document or ("steps" in document and "messages" not in document):
            return "atif"
        if "messages" in document:
            marker = str(document.get("trajectory_format") or "")
            if marker.startswith("mini-swe-agent") or "info" in document:
                return "mini-swe-agent"
            return "openai"
    raise TrajectoryFormatError(
        [
            "document: not a recognized trajectory (expected an ATIF object with 'steps', "
            "a mini-swe-agent object with 'info' and 'messages', or a list of chat messages)"
        ]
    )


def parse(document: Any, fmt: str = "auto") -> tuple[str, dict[str, Any]]:
    """(format, normalized ATIF document) of ``document``, validated."""
    if fmt == "auto":
        fmt = detect_format(document)
    if fmt == "atif":
        return fmt, validate_atif(document)
    if fmt == "mini-swe-agent":
        return fmt, validate_atif(from_mini_swe_agent(document))
    if fmt == "openai":
        return fmt, validate_atif(from_openai(document))
    raise TrajectoryFormatError([f"format: must be one of auto, {', '.join(FORMATS)}; got {fmt!r}"])


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


def validate_atif(document: Any) -> dict[str, Any]:
    """The normalized copy of an ATIF v1.x document; TrajectoryFormatError listing every problem."""
    check = _Checker()
    if not isinstance(document, dict):
        raise TrajectoryFormatError([f"document: must be a JSON object, got {_type_name(document)}"])
    if check.expect(document, "schema_version", "", "str", required=True) and not _VERSION_RE.match(
        document["schema_version"]
    ):
        check.fail("schema_version", f"must be ATIF-v1.x, got {document['schema_version']!r}")
    check.expect(document, "session_id", "", "str", required=True)
    if check.expect(document, "agent", "", "dict", required=True):
        agent = document["agent"]
        check.expect(agent, "name", "agent", "str", required=True)
        check.expect(agent, "version", "agent", "str", required=True)
        check.expect(agent, "model_name", "agent", "str")
        check.expect(agent, "tool_definitions", "agent", "list")
        check.expect(agent, "extra", "agent", "dict")
    check.expect(document, "notes", "", "str")
    check.expect(document, "extra", "", "dict")
    if check.expect(document, "final_metrics", "", "dict"):
        check.counts(document["final_metrics"], "final_metrics", _FINAL_INT_METRICS, "total_cost_usd")
    steps: list[Any] = []
    if check.expect(document, "steps", "", "list", required=True):
        steps = document["steps"]
        if not steps:
            check.fail("steps", "must hold at least one step")
    for index, step in enumerate(steps):
        _validate_step(check, step, index)
    if check.errors:
        raise TrajectoryFormatError(check.errors)

    normalized = {key: document[key] for key in ROOT_FIELDS if document.get(key) is not None}
    unknown = {key: value for key, value in document.items() if key not in ROOT_FIELDS}
    if unknown:
        normalized["extra"] = {**normalized.get("extra", {}), "document_fields": unknown}
    normalized["steps"] = [dict(step) for step in steps]
    return normalized


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
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return {"input": raw}  # Models do emit invalid JSON arguments; keep them verbatim.
        return parsed if isinstance(parsed, dict) else {"input": parsed}
    errors.append(f"{path}: must be a JSON string or an object, got {_type_name(raw)}")
    return {}


def _usage_metrics(usage: Any) -> dict[str, Any]:
    if not isinstance(usage, dict):
        return {}
    metrics = {}
    for ours, theirs in (("prompt_tokens", "prompt_tokens"), ("completion_tokens", "completion_tokens")):
        if _is_int(usage.get(theirs)):
            metrics[ours] = usage[theirs]
    return metrics


def _messages_to_steps(
    messages: Any, *, where: str, text_actions: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """ATIF steps of an OpenAI-style message list, and the errors found.

    Assistant messages become agent steps whose tool calls are the
    message's; each ``tool`` message becomes a result of the observation of
    the agent step that made the call. With ``text_actions`` (mini-swe-agent
    text mode) an assistant message holding a fenced bash block gets a
    ``bash`` tool call and the next user message becomes its observation.
    """
    errors: list[str] = []
    if not isinstance(messages, list):
        return [], [f"{where}: must be a list of messages, got {_type_name(messages)}"]
    if not messages:
        return [], [f"{where}: must hold at least one message"]
    steps: list[dict[str, Any]] = []
    owner: dict[str, dict[str, Any]] = {}  # tool_call_id -> the agent step that made the call
    pending_text_action: dict[str, Any] | None = None
    for index, message in enumerate(messages):
        path = f"{where}[{index}]"
        if not isinstance(message, dict):
            errors.append(f"{path}: must be an object, got {_type_name(message)}")
            continue
        role = message.get("role")
        known = {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content", "usage", "timestamp"}
        extra: dict[str, Any] = {key: value for key, value in message.items() if key not in known}
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in owner:
                message_text = "does not name a tool call of an earlier assistant message"
                errors.append(f"{path}.tool_call_id: {call_id!r} {message_text}")
                continue
            result: dict[str, Any] = {"source_call_id": call_id, "content": _text(message.get("content"))}
            if extra:
                result["extra"] = extra
            owner[call_id].setdefault("observation", {"results": []})["results"].append(result)
            continue
        if role == "user" and pending_text_action is not None:
            call_id = pending_text_action["tool_calls"][0]["tool_call_id"]
            result = {"source_call_id": call_id, "content": _text(message.get("content"))}
            if extra:
                result["extra"] = extra
            pending_text_action["observation"] = {"results": [result]}
            pending_text_action = None
            continue
        if role not in ("system", "user", "assistant", "developer"):
            errors.append(f"{path}.role: must be system, user, assistant or tool, got {role!r}")
            continue
        pending_text_action = None
        step: dict[str, Any] = {
            "step_id": len(steps) + 1,
            "source": {"assistant": "agent", "developer": "system"}.get(role, role),
            "message": _text(message.get("content")),
        }
        if isinstance(message.get("timestamp"), str):
            step["timestamp"] = message["timestamp"]
        if role == "assistant":
            if isinstance(message.get("reasoning_content"), str):
                step["reasoning_content"] = message["reasoning_content"]
            metrics = _usage_metrics(message.get("usage"))
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
                found = _BASH_BLOCK_RE.findall(step["message"])
                if len(found) == 1:
                    converted.append(
                        {
                            "tool_call_id": f"action-{step['step_id']}",
                            "function_name": "bash",
                            "arguments": {"command": found[0].strip()},
                        }
                    )
                    pending_text_action = step
            if converted:
                step["tool_calls"] = converted
        if extra:
            step["extra"] = extra
        steps.append(step)
    return steps, errors


def from_openai(document: Any) -> dict[str, Any]:
    """An ATIF document (not yet validated) of an OpenAI message list or ``{"messages": [...]}``."""
    messages, root = document, {}
    if isinstance(document, dict):
        messages = document.get("messages")
        root = document
    steps, errors = _messages_to_steps(messages, where="messages")
    if errors:
        raise TrajectoryFormatError(errors)
    model = root.get("model") if isinstance(root.get("model"), str) else None
    agent: dict[str, Any] = {"name": "openai-messages", "version": "unknown"}
    if model:
        agent["model_name"] = model
        for step in steps:
            if step["source"] == "agent":
                step["model_name"] = model
    converted: dict[str, Any] = {
        "schema_version": CONVERTED_VERSION,
        "session_id": str(root.get("id") or root.get("session_id") or ""),
        "agent": agent,
        "steps": steps,
        "extra": {"converted_from": "openai"},
    }
    rest = {k: v for k, v in root.items() if k not in ("messages", "model", "id", "session_id")}
    if rest:
        converted["extra"]["source_fields"] = rest
    return converted


def from_mini_swe_agent(document: Any) -> dict[str, Any]:
    """An ATIF document (not yet validated) of a mini-swe-agent trajectory file."""
    if not isinstance(document, dict):
        raise TrajectoryFormatError([f"document: must be a JSON object, got {_type_name(document)}"])
    info = document.get("info", {})
    if not isinstance(info, dict):
        raise TrajectoryFormatError([f"info: must be an object, got {_type_name(info)}"])
    steps, errors = _messages_to_steps(document.get("messages"), where="messages", text_actions=True)
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
    stats: dict[str, Any] = info["model_stats"] if isinstance(info.get("model_stats"), dict) else {}
    if _is_number(stats.get("instance_cost")):
        final["total_cost_usd"] = stats["instance_cost"]
    extra: dict[str, Any] = {"converted_from": "mini-swe-agent", "info": info}
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
