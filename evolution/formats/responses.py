"""OpenAI Responses API items (a list, or the lines of a JSONL file), NeMo
Gym rollouts (``{"responses_create_params": {"input"}, "response":
{"output", "usage"}, "reward"}``: the input items then the output items,
the response's usage as the totals, the reward kept; a JSONL of them is
one trial per line), and Codex CLI sessions, whose ``response_item`` lines
hold the same items.

Items: a ``message`` of the user, system or developer is a step of its
role; the model's output between two inputs (its ``reasoning`` summaries,
``assistant`` messages and ``function_call`` / ``custom_tool_call`` /
``web_search_call`` items) is one agent step; a ``function_call_output`` /
``custom_tool_call_output`` is the result of the call its ``call_id``
names. Items of other types are counted in ``extra["skipped"]``.

A Codex session (``~/.codex/sessions/.../rollout-*.jsonl``, read as
Harbor's Codex converter reads it): ``session_meta`` (id, ``cli_version``),
``turn_context`` (the model), ``response_item`` lines (the items above,
each with the line's time) and ``event_msg`` lines, of which a
``token_count`` closes a model call: its ``last_token_usage`` are the
tokens of the agent step it closes, the last ``total_token_usage`` the
totals. A tool's output that is Codex's ``{"output", "metadata"}`` JSON
is split into the text and the result's ``extra``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from evolution.formats.common import (
    CONVERTED_VERSION,
    TrajectoryFormatError,
    call_arguments,
    content_text,
    is_int,
    iso_time,
)

MODEL_ITEMS = ("reasoning", "function_call", "custom_tool_call", "web_search_call")
OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
ITEM_TYPES = frozenset({"message", *MODEL_ITEMS, *OUTPUT_ITEMS})
CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context"})


def is_items(document: Any) -> bool:
    """A list of Responses API items: every one typed, all of the item types."""
    items = document[:50] if isinstance(document, list) else []
    return bool(items) and all(
        isinstance(item, dict) and isinstance(item.get("type"), str) and item["type"] in ITEM_TYPES for item in items
    )


def is_rollout(document: Any) -> bool:
    """A NeMo Gym rollout: the request's ``responses_create_params`` and the ``response`` with its ``output``."""
    return (
        isinstance(document, dict)
        and isinstance(document.get("responses_create_params"), dict)
        and isinstance(document.get("response"), dict)
        and isinstance(document["response"].get("output"), list)
    )


def is_codex_session(document: Any) -> bool:
    items = document[:50] if isinstance(document, list) else []
    return (
        bool(items)
        and all(
            isinstance(item, dict) and isinstance(item.get("type"), str) and item["type"] in CODEX_TYPES
            for item in items
        )
        and any(item.get("type") in ("session_meta", "response_item") for item in items)
    )


def _output(raw: Any) -> tuple[str, dict[str, Any]]:
    """The text and the extra of a tool's output: Codex's ``{"output",
    "metadata"}`` JSON split, content parts joined, text as it is."""
    if isinstance(raw, str):
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            return raw, {}
        if isinstance(parsed, dict) and isinstance(parsed.get("output"), str):
            return parsed["output"], {key: value for key, value in parsed.items() if key != "output"}
        return raw, {}
    return content_text(raw), {}


class _Steps:
    """ATIF steps built item by item (the model's turn kept open until an input)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.turn: dict[str, Any] | None = None
        self.owner: dict[str, dict[str, Any]] = {}
        self.skipped: Counter[str] = Counter()

    def _step(self, source: str, timestamp: Any) -> dict[str, Any]:
        step: dict[str, Any] = {"step_id": len(self.steps) + 1, "source": source, "message": ""}
        if time := iso_time(timestamp):
            step["timestamp"] = time
        self.steps.append(step)
        return step

    def close(self, metrics: dict[str, Any] | None = None) -> None:
        if self.turn is not None and metrics and "metrics" not in self.turn:
            self.turn["metrics"] = metrics
        self.turn = None

    def add(self, item: Any, path: str, timestamp: Any = None, model: str | None = None) -> None:
        if not isinstance(item, dict):
            self.errors.append(f"{path}: must be an object")
            return
        kind = item.get("type") or ("message" if "role" in item else None)  # an easy input message has no type
        timestamp = timestamp if timestamp is not None else item.get("timestamp")
        if kind == "message" and item.get("role") != "assistant":
            self.close()
            role = item.get("role")
            step = self._step("user" if role == "user" else "system", timestamp)
            step["message"] = content_text(item.get("content"))
            if role not in ("user", "system"):
                step["extra"] = {"role": role}
            return
        if kind in OUTPUT_ITEMS:
            self.close()
            call_id = item.get("call_id")
            text, extra = _output(item.get("output"))
            result: dict[str, Any] = {"content": text}
            if extra:
                result["extra"] = extra
            if isinstance(call_id, str) and call_id in self.owner:
                result["source_call_id"] = call_id
                self.owner[call_id].setdefault("observation", {"results": []})["results"].append(result)
            else:  # an answer to no call of this file: kept as a system step
                self._step("system", timestamp).update(message=text, extra={"item": item})
            return
        if kind != "message" and kind not in MODEL_ITEMS:
            self.skipped[str(kind)] += 1
            return
        if self.turn is None:
            self.turn = self._step("agent", timestamp)
            if model:
                self.turn["model_name"] = model
        turn = self.turn
        if kind == "message":
            text = content_text(item.get("content"))
            turn["message"] = "\n\n".join(part for part in (turn["message"], text) if part)
        elif kind == "reasoning":
            summary = content_text(item.get("summary")) or content_text(item.get("content"))
            if summary:
                turn["reasoning_content"] = "\n\n".join(p for p in (turn.get("reasoning_content", ""), summary) if p)
        else:
            number = len(turn.get("tool_calls", []))
            call_id = item.get("call_id") or item.get("id") or f"{kind}-{turn['step_id']}-{number}"
            raw = item.get("arguments") if kind == "function_call" else item.get("input", item.get("action"))
            if isinstance(raw, dict):
                arguments = raw
            elif isinstance(raw, str):
                arguments = call_arguments(raw, f"{path}.arguments", self.errors)
            else:
                arguments = {} if raw is None else {"input": raw}
            name = item.get("name") or kind
            call = {"tool_call_id": str(call_id), "function_name": str(name), "arguments": arguments}
            turn.setdefault("tool_calls", []).append(call)
            self.owner[str(call_id)] = turn

    def result(self) -> list[dict[str, Any]]:
        if self.errors:
            raise TrajectoryFormatError(self.errors)
        if not self.steps:
            raise TrajectoryFormatError(["document: holds no message or tool call"])
        return self.steps


def from_responses(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of a list of Responses API items
    or of a NeMo Gym rollout."""
    items: Any = document
    final: dict[str, Any] = {}
    extra: dict[str, Any] = {"converted_from": "openai-responses"}
    agent: dict[str, Any] = {"name": "openai-responses", "version": "unknown"}
    session = ""
    if is_rollout(document):
        request, response = document["responses_create_params"], document["response"]
        given = request.get("input")
        inputs = (
            [{"role": "user", "content": given}] if isinstance(given, str) else given if isinstance(given, list) else []
        )
        items = [*inputs, *response["output"]]
        final = _token_metrics(response.get("usage"), totals=True)
        if isinstance(response.get("model"), str):
            agent["model_name"] = response["model"]
        session = str(response.get("id") or "")
        extra["source_fields"] = {key: value for key, value in document.items() if key != "response"}
        extra["response"] = {key: value for key, value in response.items() if key != "output"}
        if isinstance(document.get("reward"), int | float):
            extra["reward"] = document["reward"]
    built = _Steps()
    for index, item in enumerate(items if isinstance(items, list) else []):
        built.add(item, f"items[{index}]", model=agent.get("model_name"))
    steps = built.result()
    if built.skipped:
        extra["skipped"] = dict(built.skipped)
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": session,
        "agent": agent,
        "steps": steps,
        "final_metrics": {"total_steps": len(steps), **final},
        "extra": extra,
    }


def _token_metrics(usage: Any, *, totals: bool = False) -> dict[str, Any]:
    """ATIF metrics of a Codex or Responses usage (``input_tokens``,
    ``output_tokens``, cached from ``cached_input_tokens`` or
    ``input_tokens_details.cached_tokens``); with ``totals`` as final metrics."""
    if not isinstance(usage, dict):
        return {}
    details = usage.get("input_tokens_details")
    cached = usage.get("cached_input_tokens", details.get("cached_tokens") if isinstance(details, dict) else None)
    metrics = {}
    for ours, value in (
        ("prompt_tokens", usage.get("input_tokens")),
        ("completion_tokens", usage.get("output_tokens")),
        ("cached_tokens", cached),
    ):
        if isinstance(value, int) and is_int(value) and value >= 0:
            metrics[f"total_{ours}" if totals else ours] = value
    return metrics


def from_codex(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of a Codex CLI session's lines."""
    built = _Steps()
    meta: dict[str, Any] = {}
    model: str | None = None
    totals: dict[str, Any] = {}
    for index, line in enumerate(document if isinstance(document, list) else []):
        payload = line.get("payload") if isinstance(line, dict) else None
        if not isinstance(payload, dict):
            built.errors.append(f"line {index + 1}: must be a Codex event with a payload")
            continue
        kind = line.get("type")
        if kind == "session_meta":
            meta = payload
        elif kind == "turn_context":
            model = payload["model"] if isinstance(payload.get("model"), str) else model
        elif kind == "response_item":
            built.add(payload, f"line {index + 1}.payload", line.get("timestamp"), model)
        elif kind == "event_msg" and payload.get("type") == "token_count" and isinstance(payload.get("info"), dict):
            info = payload["info"]
            built.close(_token_metrics(info.get("last_token_usage")))
            totals = _token_metrics(info.get("total_token_usage")) or totals
    steps = built.result()
    final: dict[str, Any] = {"total_steps": len(steps)}
    for ours, theirs in (
        ("total_prompt_tokens", "prompt_tokens"),
        ("total_completion_tokens", "completion_tokens"),
        ("total_cached_tokens", "cached_tokens"),
    ):
        if theirs in totals:
            final[ours] = totals[theirs]
    agent: dict[str, Any] = {"name": "codex", "version": str(meta.get("cli_version") or "unknown")}
    if model:
        agent["model_name"] = model
    extra: dict[str, Any] = {"converted_from": "codex", "session_meta": meta}
    if built.skipped:
        extra["skipped"] = dict(built.skipped)
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": str(meta.get("id") or ""),
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": extra,
    }
