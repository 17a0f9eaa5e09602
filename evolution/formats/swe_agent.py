"""SWE-agent ``.traj`` files (0.x and 1.x), as its agent writes them
(``sweagent/agent/agents.py``: ``get_trajectory_data``): ``history`` (the
model's messages), ``trajectory`` (one entry per action with its raw
observation and ``execution_time``), ``info`` (``exit_status``,
``submission``, ``model_stats``) and ``environment``.

The steps are the ``history``: assistant messages are agent steps. In 1.x's
function-calling mode an assistant message carries OpenAI ``tool_calls`` and
each answer is a ``tool`` message naming its call in ``tool_call_ids``; in
text mode (0.x, and 1.x's thought-action parsers) the message's ``action``
becomes a ``bash`` tool call (SWE-agent runs every command in its shell) and
the next user message, the templated observation, its result. Demonstration
messages (``is_demo``) stay user steps marked so in their ``extra``. The
totals come from ``info.model_stats`` (``tokens_sent``, ``tokens_received``,
``instance_cost``); SWE-agent records no times.
"""

from __future__ import annotations

from typing import Any

from evolution.formats.common import CONVERTED_VERSION, TrajectoryFormatError, is_int, is_number, type_name
from evolution.formats.openai import messages_to_steps


def is_swe_agent(document: Any) -> bool:
    """Whether ``document`` is a SWE-agent ``.traj``: a ``history`` of
    role messages, with its ``trajectory``, ``info`` or the ``agent`` each
    message names."""
    if not isinstance(document, dict) or not isinstance(document.get("history"), list) or "messages" in document:
        return False
    history = [item for item in document["history"][:20] if isinstance(item, dict)]
    if not history or not all("role" in item for item in history):
        return False
    return "trajectory" in document or "info" in document or all("agent" in item for item in history)


def _action(message: dict[str, Any], _text: str) -> str | None:
    action = message.get("action")
    return action.strip() if isinstance(action, str) and action.strip() else None


def _messages(history: list[Any]) -> list[Any]:
    """``history`` with each 1.x tool message's one ``tool_call_ids`` entry
    as the ``tool_call_id`` an OpenAI tool message has."""
    messages = []
    for message in history:
        ids = message.get("tool_call_ids") if isinstance(message, dict) else None
        if isinstance(ids, list) and len(ids) == 1 and message.get("role") == "tool" and "tool_call_id" not in message:
            message = {**message, "tool_call_id": ids[0]}
        messages.append(message)
    return messages


def from_swe_agent(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of a SWE-agent ``.traj``."""
    if not isinstance(document, dict) or not isinstance(document.get("history"), list):
        raise TrajectoryFormatError([f"history: must be a list of messages, got {type_name(document)}"])
    steps, errors = messages_to_steps(
        _messages(document["history"]), where="history", text_action=_action, deviations=deviations
    )
    if errors:
        raise TrajectoryFormatError(errors)
    info: dict[str, Any] = document["info"] if isinstance(document.get("info"), dict) else {}
    stats: dict[str, Any] = info["model_stats"] if isinstance(info.get("model_stats"), dict) else {}
    final: dict[str, Any] = {"total_steps": len(steps)}
    for ours, theirs in (("total_prompt_tokens", "tokens_sent"), ("total_completion_tokens", "tokens_received")):
        if is_int(stats.get(theirs)) and stats[theirs] >= 0:
            final[ours] = stats[theirs]
    if is_number(stats.get("instance_cost")) and stats["instance_cost"] >= 0:
        final["total_cost_usd"] = stats["instance_cost"]
    version = info.get("swe_agent_version")
    extra: dict[str, Any] = {"converted_from": "swe-agent", "info": info}
    for key in ("environment", "trajectory", "replay_config"):
        if document.get(key) is not None:
            extra[key] = document[key]
    if isinstance(info.get("exit_status"), str) and info["exit_status"]:
        extra["exit_status"] = info["exit_status"]
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": str(document.get("instance_id") or info.get("instance_id") or ""),
        "agent": {"name": "swe-agent", "version": str(version or "unknown")},
        "steps": steps,
        "final_metrics": final,
        "extra": extra,
    }
