"""mini-swe-agent: a ``.traj.json`` (``info``, ``messages``,
``trajectory_format``) of 1.x or 2.x, or its plain message list. Text-mode
actions (2.x: ``extra.actions``, else one fenced ``mswea_bash_command``/``bash``
block per assistant message; the output in the next user message) become a
``bash`` tool call and its observation; tool-call mode messages are converted
as OpenAI messages. Tokens and cost come from each message's
``extra.response.usage`` and ``extra.cost``, its time from
``extra.timestamp`` (2.x) or ``timestamp`` (1.x, Unix seconds); 2.x's closing
``{"role": "exit"}`` message becomes the last step (a system step) and its
``exit_status`` the trajectory's."""

from __future__ import annotations

import re
from typing import Any

from evolution.formats.common import CONVERTED_VERSION, TrajectoryFormatError, is_number, step_totals, type_name
from evolution.formats.openai import messages_to_steps

BASH_BLOCK_RE = re.compile(r"```(?:mswea_bash_command|bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)


# What mini-swe-agent 1.x's prompts and observations hold: its closing
# command (MINI_SWE_AGENT_FINAL_OUTPUT before 2.0, COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
# since) and each observation's <returncode>.
_MINI_1_MARKERS = ("MINI_SWE_AGENT_FINAL_OUTPUT", "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


def is_mini_messages(messages: list[Any]) -> bool:
    """Whether a plain message list was written by mini-swe-agent: its exit
    message, its actions, its 2.x text-mode fence, or (1.x) a fenced bash
    action answered by a ``<returncode>`` observation or its closing
    command named in the prompt."""
    fenced = marked = False
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "exit" or isinstance((message.get("extra") or {}).get("actions"), list):
            return True
        content = message.get("content")
        if not isinstance(content, str):
            continue
        if message.get("role") == "assistant":
            if "```mswea_bash_command" in content:
                return True
            fenced = fenced or len(BASH_BLOCK_RE.findall(content)) == 1
        elif message.get("role") == "user" and content.lstrip().startswith("<returncode>"):
            marked = True
        marked = marked or (message.get("role") == "system" and any(m in content for m in _MINI_1_MARKERS))
    return fenced and marked


def text_action(message: dict[str, Any], text: str) -> str | None:
    """The bash command of a text-mode assistant message: 2.x's one
    ``extra.actions`` entry, else the one fenced block of its text."""
    extra = message.get("extra") if isinstance(message.get("extra"), dict) else {}
    assert extra is not None
    actions = extra.get("actions")
    if isinstance(actions, list) and len(actions) == 1 and isinstance(actions[0], dict):
        command = actions[0].get("command")
        if isinstance(command, str):
            return command
    found = BASH_BLOCK_RE.findall(text)
    return found[0].strip() if len(found) == 1 else None


def from_mini_swe_agent(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of a mini-swe-agent trajectory
    file (1.x or 2.x) or its plain message list."""
    if isinstance(document, list):
        document = {"messages": document}
    if not isinstance(document, dict):
        raise TrajectoryFormatError([f"document: must be a JSON object, got {type_name(document)}"])
    info = document.get("info", {})
    if not isinstance(info, dict):
        raise TrajectoryFormatError([f"info: must be an object, got {type_name(info)}"])
    steps, errors = messages_to_steps(
        document.get("messages"), where="messages", text_action=text_action, deviations=deviations
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
    final = step_totals(steps)
    model_stats = info.get("model_stats")
    stats: dict[str, Any] = model_stats if isinstance(model_stats, dict) else {}
    if is_number(stats.get("instance_cost")):
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
