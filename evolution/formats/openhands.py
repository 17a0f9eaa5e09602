"""OpenHands event lists, and the instances of its evaluation ``output.jsonl``
(``{"instance_id", "instruction", "instance", "history": [events],
"metrics", "test_result", "error", "metadata"}``, one per line), as
``openhands/events/serialization/event.py`` writes events: ``id``,
``timestamp``, ``source`` (agent/user/environment), ``message`` and either
``action`` with its ``args`` or ``observation`` with its ``content``,
``extras`` and ``cause`` (the id of the action it answers).

An action of the agent is an agent step: its text is the model's
(``args.thought``, a message's ``args.content``), its tool call the one in
``tool_call_metadata`` (name, id and the arguments the model sent, from the
``model_response``; else the action's name and args), its tokens that
response's ``usage``, counted on the first step of each response. An
observation becomes the result of the call of the action it answers
(``cause``, else the same ``tool_call_id``). Other actions are steps of their
source (the environment's as system steps); an observation answering no
call is a system step. The totals come from the instance's
``metrics.accumulated_token_usage`` and ``accumulated_cost``.
"""

from __future__ import annotations

from typing import Any

from evolution.formats.common import (
    CONVERTED_VERSION,
    TrajectoryFormatError,
    call_arguments,
    content_text,
    is_int,
    is_number,
    iso_time,
    type_name,
    usage_metrics,
)

_KEPT = ("id", "message", "action", "observation", "cause", "source", "extras", "success")


def is_event(item: Any) -> bool:
    return isinstance(item, dict) and "source" in item and ("action" in item or "observation" in item)


def is_event_list(document: Any) -> bool:
    if not isinstance(document, list) or not document:
        return False
    items = [item for item in document[:20] if isinstance(item, dict)]
    return bool(items) and all(is_event(item) for item in items)


def is_instance(document: Any) -> bool:
    """An evaluation ``output.jsonl`` line: an instance with its event ``history``."""
    return (
        isinstance(document, dict)
        and "instance_id" in document
        and isinstance(document.get("history"), list)
        and all(is_event(item) for item in document["history"][:20])
    )


def _model_call(metadata: dict[str, Any], call_id: str) -> dict[str, Any]:
    """The tool call ``call_id`` of the model response a ``tool_call_metadata`` holds."""
    response = metadata.get("model_response") if isinstance(metadata.get("model_response"), dict) else {}
    assert response is not None
    for choice in response.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        for call in (message or {}).get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id") == call_id and isinstance(call.get("function"), dict):
                function: dict[str, Any] = call["function"]
                return function
    return {}


def events_to_steps(events: list[Any], where: str) -> tuple[list[dict[str, Any]], list[str]]:
    """ATIF steps of an OpenHands event list, and the errors found."""
    steps: list[dict[str, Any]] = []
    errors: list[str] = []
    by_event: dict[int | str, tuple[dict[str, Any], str]] = {}  # action id -> (its step, its call id)
    by_call: dict[str, dict[str, Any]] = {}
    responses: set[str] = set()
    for index, event in enumerate(events):
        path = f"{where}[{index}]"
        if not is_event(event):
            errors.append(f"{path}: must be an OpenHands event (source and action or observation)")
            continue
        extra = {key: event[key] for key in _KEPT if key in event and event[key] is not None}
        step: dict[str, Any] = {"step_id": len(steps) + 1}
        timestamp = iso_time(event.get("timestamp"))
        if timestamp:
            step["timestamp"] = timestamp
        args: dict[str, Any] = event["args"] if isinstance(event.get("args"), dict) else {}
        metadata: dict[str, Any] = (
            event["tool_call_metadata"] if isinstance(event.get("tool_call_metadata"), dict) else {}
        )
        if "observation" in event:
            call_id = metadata.get("tool_call_id")
            cause = event.get("cause")
            owner = by_event.get(cause) if isinstance(cause, int | str) else None
            if owner is None and isinstance(call_id, str) and call_id in by_call:
                owner = (by_call[call_id], call_id)
            content = content_text(event.get("content"))
            if owner is not None:
                result = {"source_call_id": owner[1], "content": content, "extra": extra}
                owner[0].setdefault("observation", {"results": []})["results"].append(result)
                continue
            steps.append(
                {**step, "source": "system", "message": content or str(event.get("message") or ""), "extra": extra}
            )
            continue
        action = event.get("action")
        source = event.get("source")
        if source != "agent" or action == "system":
            text = args.get("content") if isinstance(args.get("content"), str) else event.get("message")
            role = "user" if source == "user" and action == "message" else "system"
            steps.append({**step, "source": role, "message": str(text or ""), "extra": {**extra, "args": args}})
            continue
        step["source"] = "agent"
        text = args.get("content") if action == "message" else args.get("thought") or args.get("final_thought")
        step["message"] = text if isinstance(text, str) else ""
        response = metadata.get("model_response") if isinstance(metadata.get("model_response"), dict) else {}
        assert response is not None
        if isinstance(response.get("model"), str):
            step["model_name"] = response["model"]
        response_id = response.get("id")
        if isinstance(response_id, str) and response_id not in responses:
            responses.add(response_id)
            if metrics := usage_metrics(response.get("usage")):
                step["metrics"] = metrics
        if action != "message":
            call_id = metadata.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                call_id = f"event-{event.get('id', index)}"
            function = _model_call(metadata, call_id)
            if "arguments" in function:
                arguments = call_arguments(function["arguments"], f"{path}.tool_call_metadata", errors)
            else:
                arguments = {key: value for key, value in args.items() if key != "thought"}
            name = metadata.get("function_name") or function.get("name") or action
            step["tool_calls"] = [{"tool_call_id": call_id, "function_name": str(name), "arguments": arguments}]
            if isinstance(event.get("id"), int | str):
                by_event[event["id"]] = (step, call_id)
            by_call[call_id] = step
        step["extra"] = {**extra, "args": args}
        steps.append(step)
    if not steps and not errors:
        errors.append(f"{where}: must hold at least one event")
    return steps, errors


def from_openhands(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of an OpenHands event list or an
    evaluation instance (a line of ``output.jsonl``)."""
    instance: dict[str, Any] = document if isinstance(document, dict) else {"history": document}
    history = instance.get("history")
    if not isinstance(history, list):
        raise TrajectoryFormatError([f"history: must be a list of events, got {type_name(history)}"])
    steps, errors = events_to_steps(history, "history" if isinstance(document, dict) else "events")
    if errors:
        raise TrajectoryFormatError(errors)
    final: dict[str, Any] = {"total_steps": len(steps)}
    metrics: dict[str, Any] = instance["metrics"] if isinstance(instance.get("metrics"), dict) else {}
    usage = metrics.get("accumulated_token_usage")
    if isinstance(usage, dict):
        for ours, theirs in (
            ("total_prompt_tokens", "prompt_tokens"),
            ("total_completion_tokens", "completion_tokens"),
            ("total_cached_tokens", "cache_read_tokens"),
        ):
            if is_int(usage.get(theirs)) and usage[theirs] >= 0:
                final[ours] = usage[theirs]
    if is_number(metrics.get("accumulated_cost")) and metrics["accumulated_cost"] >= 0:
        final["total_cost_usd"] = metrics["accumulated_cost"]
    metadata: dict[str, Any] = instance["metadata"] if isinstance(instance.get("metadata"), dict) else {}
    version = next(
        (
            step["extra"]["args"].get("openhands_version")
            for step in steps
            if isinstance(step.get("extra", {}).get("args"), dict) and step["extra"]["args"].get("openhands_version")
        ),
        None,
    )
    agent: dict[str, Any] = {"name": "openhands", "version": str(version or "unknown")}
    llm = metadata.get("llm_config")
    if isinstance(llm, dict) and isinstance(llm.get("model"), str):
        agent["model_name"] = llm["model"]
    extra: dict[str, Any] = {"converted_from": "openhands"}
    for key in ("instruction", "instance", "test_result", "error", "metadata"):
        if instance.get(key) is not None:
            extra[key] = instance[key]
    rest = {k: v for k, v in metrics.items() if k not in ("accumulated_token_usage", "accumulated_cost")}
    if rest:
        extra["metrics"] = rest
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": str(instance.get("instance_id") or ""),
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": extra,
    }
