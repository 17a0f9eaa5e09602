"""OpenAI chat messages (system/developer/user/assistant/tool messages,
assistant ``tool_calls``, a tool message's ``name`` kept), ``{"messages":
[...]}``, or a tau-bench run (``{"task_id", "traj": [...], "reward", ...}``),
as ATIF steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evolution.formats.common import (
    CONVERTED_VERSION,
    TrajectoryFormatError,
    call_arguments,
    content_text,
    is_number,
    iso_time,
    type_name,
    usage_metrics,
)

_ROLES = "system, developer, user, assistant or tool"


def message_time(message: dict[str, Any]) -> str | None:
    """A message's time: mini-swe-agent 2.x's ``extra.timestamp``, 1.x's ``timestamp``."""
    extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
    assert extra is not None
    return iso_time(extra.get("timestamp")) or iso_time(message.get("timestamp"))


def message_metrics(message: dict[str, Any]) -> dict[str, Any]:
    """Token counts and cost of an assistant message: its own ``usage``, or
    mini-swe-agent's ``extra.response.usage`` and ``extra.cost``."""
    extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
    assert extra is not None
    response = extra.get("response") if isinstance(extra.get("response"), dict) else {}
    assert response is not None
    metrics = usage_metrics(message.get("usage")) or usage_metrics(response.get("usage"))
    if is_number(extra.get("cost")) and extra["cost"] >= 0:
        metrics["cost_usd"] = extra["cost"]
    return metrics


def _result_extra(message: dict[str, Any]) -> dict[str, Any]:
    """What an observation's message holds beside its text (a tool's
    ``name``, mini-swe-agent's ``extra`` and 1.x's ``timestamp``)."""
    return {key: value for key, value in message.items() if key not in ("role", "content", "tool_call_id")}


def messages_to_steps(
    messages: Any,
    *,
    where: str,
    text_action: Callable[[dict[str, Any], str], str | None] | None = None,
    deviations: list[str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """ATIF steps of an OpenAI-style message list, and the errors found.

    Assistant messages become agent steps whose tool calls are the
    message's; each ``tool`` message becomes a result of the observation of
    the agent step that made the call (its ``name`` in the result's
    ``extra``). With ``text_action`` (mini-swe-agent text mode: the command of a
    message, or None) an assistant message holding one action gets a ``bash`` tool call and the
    next user message becomes its observation. mini-swe-agent's ``exit``
    message becomes a system step holding the run's end. With
    ``deviations`` (lenient) a message of an unknown role, or a tool
    message answering no call, becomes a system step with its text and the
    problem goes to ``deviations`` instead of the errors.
    """
    errors: list[str] = []
    if not isinstance(messages, list):
        return [], [f"{where}: must be a list of messages, got {type_name(messages)}"]
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
                "message": content_text(message.get("content")),
                "extra": {"off_spec": message},
            }
        )

    for index, message in enumerate(messages):
        path = f"{where}[{index}]"
        if not isinstance(message, dict):
            errors.append(f"{path}: must be an object, got {type_name(message)}")
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
            result: dict[str, Any] = {"source_call_id": call_id, "content": content_text(message.get("content"))}
            if result_extra := _result_extra(message):
                result["extra"] = result_extra
            owner[call_id].setdefault("observation", {"results": []})["results"].append(result)
            continue
        if role == "user" and pending_text_action is not None:
            call_id = pending_text_action["tool_calls"][0]["tool_call_id"]
            result = {"source_call_id": call_id, "content": content_text(message.get("content"))}
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
                "message": content_text(message.get("content")),
            }
            timestamp = message_time(message)
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
            "message": content_text(message.get("content")),
        }
        timestamp = message_time(message)
        if timestamp:
            step["timestamp"] = timestamp
        if role == "assistant":
            if isinstance(message.get("reasoning_content"), str):
                step["reasoning_content"] = message["reasoning_content"]
            metrics = message_metrics(message)
            if metrics:
                step["metrics"] = metrics
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                errors.append(f"{path}.tool_calls: must be a list, got {type_name(calls)}")
                calls = []
            converted = []
            for number, call in enumerate(calls):
                at = f"{path}.tool_calls[{number}]"
                if not isinstance(call, dict):
                    errors.append(f"{at}: must be an object, got {type_name(call)}")
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
                        "arguments": call_arguments(function.get("arguments"), f"{at}.function.arguments", errors),
                    }
                )
                owner[call_id] = step
            if not converted and text_action is not None:
                command = text_action(message, step["message"])
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
    steps, errors = messages_to_steps(messages, where="messages", deviations=deviations)
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
