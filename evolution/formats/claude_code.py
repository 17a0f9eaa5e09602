"""Claude Code sessions (``~/.claude/projects/<project>/<session>.jsonl``),
read as Harbor's Claude Code converter reads them: each ``assistant`` line
is an agent step (its ``text`` blocks the message, ``thinking`` blocks the
reasoning, ``tool_use`` blocks the tool calls); a ``user`` line is a user
step, except its ``tool_result`` blocks, each the result of the call its
``tool_use_id`` names (the line's ``toolUseResult`` kept in the result's
``extra``). Claude Code writes one line per content block of a model
response, each repeating the response's ``usage``: the tokens count once,
on the first line of each ``message.id`` (prompt tokens are
``input_tokens`` plus ``cache_read_input_tokens``, as Harbor counts them).
Lines without a message (``summary``, ``file-history-snapshot``, ...) are
counted in ``extra["skipped"]``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from evolution.formats.common import (
    CONVERTED_VERSION,
    TrajectoryFormatError,
    content_text,
    is_int,
    iso_time,
    step_totals,
)

TYPES = frozenset({"user", "assistant", "summary", "system", "file-history-snapshot", "queue-operation"})
_KEPT = ("uuid", "parentUuid", "isSidechain", "userType", "cwd", "gitBranch", "requestId", "agentId")


def is_session(document: Any) -> bool:
    items = document[:50] if isinstance(document, list) else []
    return (
        bool(items)
        and all(
            isinstance(item, dict) and isinstance(item.get("type"), str) and item["type"] in TYPES for item in items
        )
        and any(isinstance(item.get("message"), dict) and "sessionId" in item for item in items)
    )


def _usage(usage: Any) -> dict[str, Any]:
    if not isinstance(usage, dict) or not is_int(usage.get("input_tokens")):
        return {}
    cached = usage.get("cache_read_input_tokens") if is_int(usage.get("cache_read_input_tokens")) else 0
    metrics = {"prompt_tokens": usage["input_tokens"] + cached, "cached_tokens": cached}
    if is_int(usage.get("output_tokens")):
        metrics["completion_tokens"] = usage["output_tokens"]
    return metrics


def _result_text(content: Any) -> str:
    return content if isinstance(content, str) else content_text(content) if isinstance(content, list) else ""


def from_claude_code(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of a Claude Code session's lines."""
    steps: list[dict[str, Any]] = []
    errors: list[str] = []
    owner: dict[str, dict[str, Any]] = {}
    responses: set[str] = set()
    skipped: Counter[str] = Counter()
    meta: dict[str, Any] = {}
    for index, line in enumerate(document if isinstance(document, list) else []):
        message = line.get("message") if isinstance(line, dict) else None
        kind = line.get("type") if isinstance(line, dict) else None
        if kind not in ("user", "assistant") or not isinstance(message, dict):
            skipped[str(kind)] += 1
            continue
        for key in ("sessionId", "version"):
            if isinstance(line.get(key), str):
                meta.setdefault(key, line[key])
        step: dict[str, Any] = {"step_id": len(steps) + 1, "message": ""}
        if time := iso_time(line.get("timestamp")):
            step["timestamp"] = time
        if extra := {key: line[key] for key in _KEPT if line.get(key) is not None}:
            step["extra"] = extra
        content = message.get("content")
        blocks = content if isinstance(content, list) else []
        if kind == "assistant":
            step["source"] = "agent"
            step["message"] = "\n\n".join(
                b["text"]
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            )
            thinking = [
                b.get("thinking") or b.get("text")
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "thinking"
            ]
            if reasoning := "\n\n".join(t for t in thinking if isinstance(t, str)):
                step["reasoning_content"] = reasoning
            if isinstance(message.get("model"), str):
                step["model_name"] = message["model"]
            response_id = message.get("id")
            if isinstance(response_id, str) and response_id not in responses:
                responses.add(response_id)
                if metrics := _usage(message.get("usage")):
                    step["metrics"] = metrics
            calls = []
            for block in blocks:
                if isinstance(block, dict) and block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                    arguments = block.get("input")
                    calls.append(
                        {
                            "tool_call_id": block["id"],
                            "function_name": str(block.get("name") or ""),
                            "arguments": arguments if isinstance(arguments, dict) else {"input": arguments},
                        }
                    )
                    owner[block["id"]] = step
            if calls:
                step["tool_calls"] = calls
            steps.append(step)
            continue
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        for block in results:
            call_id = block.get("tool_use_id")
            result: dict[str, Any] = {"content": _result_text(block.get("content"))}
            result_extra = {key: block[key] for key in ("is_error",) if key in block}
            if line.get("toolUseResult") is not None:
                result_extra["tool_use_result"] = line["toolUseResult"]
            if result_extra:
                result["extra"] = result_extra
            if isinstance(call_id, str) and call_id in owner:
                result["source_call_id"] = call_id
                owner[call_id].setdefault("observation", {"results": []})["results"].append(result)
            else:
                problem = f"line {index + 1}: tool_result {call_id!r} answers no tool_use of an earlier line"
                if deviations is None:
                    errors.append(problem)
                    continue
                deviations.append(problem)  # lenient: the answer is kept as a system step
                steps.append({**step, "step_id": len(steps) + 1, "source": "system", "message": result["content"]})
                step["step_id"] = len(steps) + 1
        others = [b for b in blocks if b not in results]
        if isinstance(content, str) or others:
            step["source"] = "user"
            step["message"] = content if isinstance(content, str) else content_text(others) or json.dumps(others)
            steps.append(step)
    if not steps and not errors:
        errors.append("document: holds no user or assistant message")
    if errors:
        raise TrajectoryFormatError(errors)
    final = step_totals(steps)
    document_extra: dict[str, Any] = {"converted_from": "claude-code"}
    if skipped:
        document_extra["skipped"] = dict(skipped)
    models = [step["model_name"] for step in steps if "model_name" in step]
    agent: dict[str, Any] = {"name": "claude-code", "version": meta.get("version", "unknown")}
    if models:
        agent["model_name"] = models[0]
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": meta.get("sessionId", ""),
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": document_extra,
    }
