"""tau2-bench results, as ``tau2/data_model/simulation.py`` writes them:
``Results`` (``{"timestamp", "info", "tasks", "simulations": [...]}``), one
trial per ``SimulationRun`` (``id``, ``task_id``, ``trial``, ``start_time``,
``end_time``, ``termination_reason``, ``agent_cost``, ``user_cost``,
``reward_info``, ``messages``), or one simulation on its own (the directory
format's ``simulations/<id>.json``).

Messages: ``assistant`` ones are agent steps, their tool calls
``{"id", "name", "arguments"}``; ``user`` ones (the user simulator) user
steps; a ``tool`` message (``id`` naming the call, ``requestor``, ``error``)
the result of the call it names. A tool call the user simulator makes
(telecom domains) has no place on a user step in ATIF: it is kept in the
step's ``extra`` and its result becomes a system step. Each message's
``timestamp``, ``usage`` and ``cost`` are kept; the reward and the
termination reason are the trajectory's.
"""

from __future__ import annotations

from typing import Any

from evolution.formats.common import (
    CONVERTED_VERSION,
    TrajectoryFormatError,
    content_text,
    is_number,
    iso_time,
    step_totals,
    type_name,
    usage_metrics,
)

_MESSAGE_FIELDS = ("role", "content", "tool_calls", "timestamp", "usage", "cost", "id")


def is_results(document: Any) -> bool:
    return isinstance(document, dict) and isinstance(document.get("simulations"), list) and "info" in document


def is_simulation(document: Any) -> bool:
    return (
        isinstance(document, dict)
        and isinstance(document.get("messages"), list)
        and "task_id" in document
        and ("termination_reason" in document or "reward_info" in document)
    )


def from_simulation(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of one tau2-bench simulation."""
    if not is_simulation(document):
        raise TrajectoryFormatError([f"document: must be a tau2-bench simulation, got {type_name(document)}"])
    steps: list[dict[str, Any]] = []
    errors: list[str] = []
    owner: dict[str, dict[str, Any]] = {}
    for index, message in enumerate(document["messages"]):
        path = f"messages[{index}]"
        if not isinstance(message, dict):
            errors.append(f"{path}: must be an object, got {type_name(message)}")
            continue
        role = message.get("role")
        extra = {key: value for key, value in message.items() if key not in _MESSAGE_FIELDS and value is not None}
        step: dict[str, Any] = {"step_id": len(steps) + 1}
        timestamp = iso_time(message.get("timestamp"))
        if timestamp:
            step["timestamp"] = timestamp
        if role == "tool":
            call_id = message.get("id")
            result = {"content": content_text(message.get("content")), "extra": extra}
            if isinstance(call_id, str) and call_id in owner:
                owner[call_id].setdefault("observation", {"results": []})["results"].append(
                    {"source_call_id": call_id, **result}
                )
                continue
            steps.append({**step, "source": "system", "message": result["content"], "extra": {"tool": message}})
            continue
        if role not in ("assistant", "user", "system"):
            errors.append(f"{path}.role: must be assistant, user, system or tool, got {role!r}")
            continue
        step["source"] = "agent" if role == "assistant" else role
        step["message"] = content_text(message.get("content"))
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            errors.append(f"{path}.tool_calls: must be a list, got {type_name(calls)}")
            calls = []
        usage = usage_metrics(message.get("usage"))
        if role == "assistant":
            metrics = dict(usage)
            if is_number(message.get("cost")) and message["cost"] >= 0:
                metrics["cost_usd"] = message["cost"]
            if metrics:
                step["metrics"] = metrics
            converted = []
            for number, call in enumerate(calls):
                at = f"{path}.tool_calls[{number}]"
                if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not call["id"]:
                    errors.append(f"{at}: must be an object with an id")
                    continue
                arguments = call.get("arguments")
                converted.append(
                    {
                        "tool_call_id": call["id"],
                        "function_name": str(call.get("name") or ""),
                        "arguments": arguments if isinstance(arguments, dict) else {"input": arguments},
                    }
                )
                owner[call["id"]] = step
            if converted:
                step["tool_calls"] = converted
        else:
            if calls:
                extra["tool_calls"] = calls
            for key in ("usage", "cost"):
                if message.get(key) is not None:
                    extra[key] = message[key]
        if extra:
            step["extra"] = extra
        steps.append(step)
    if not steps and not errors:
        errors.append("messages: must hold at least one message")
    if errors:
        raise TrajectoryFormatError(errors)
    final = step_totals(steps)
    if is_number(document.get("agent_cost")) and document["agent_cost"] >= 0:
        final["total_cost_usd"] = document["agent_cost"]
    reward_info = document.get("reward_info")
    document_extra: dict[str, Any] = {
        "converted_from": "tau2-bench",
        "source_fields": {key: value for key, value in document.items() if key not in ("messages", "id")},
    }
    if isinstance(reward_info, dict) and is_number(reward_info.get("reward")):
        document_extra["reward"] = reward_info["reward"]
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": str(document.get("id") or f"task-{document['task_id']}-trial-{document.get('trial', 0)}"),
        "agent": {"name": "tau2-bench", "version": "unknown"},
        "steps": steps,
        "final_metrics": final,
        "extra": document_extra,
    }
