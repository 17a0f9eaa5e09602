"""What every trajectory reader shares: the errors, the ATIF field names,
and small helpers for values (types, times, texts, arguments, usage)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from evolution import limits

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


class TrajectoryFormatError(ValueError):
    """The document is not a valid trajectory; ``errors`` name each field at
    fault; ``lenient_imports`` says the lenient import would take it."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        # Set by ``parse`` when the lenient import would take the document.
        self.lenient_imports = False
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


def type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
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


def content_text(content: Any) -> str:
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


def call_arguments(raw: Any, path: str, errors: list[str]) -> dict[str, Any]:
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
    errors.append(f"{path}: must be a JSON string or an object, got {type_name(raw)}")
    return {}


def usage_metrics(usage: Any) -> dict[str, Any]:
    """ATIF step metrics of an OpenAI ``usage`` object (cached tokens from
    ``prompt_tokens_details``)."""
    if not isinstance(usage, dict):
        return {}
    metrics = {}
    for key in ("prompt_tokens", "completion_tokens"):
        if is_int(usage.get(key)) and usage[key] >= 0:
            metrics[key] = usage[key]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and is_int(details.get("cached_tokens")) and details["cached_tokens"] >= 0:
        metrics["cached_tokens"] = details["cached_tokens"]
    return metrics


def iso_time(value: Any) -> str | None:
    """ISO 8601 (UTC) of a Unix time in seconds, or an ISO 8601 text as it is."""
    if isinstance(value, str) and is_iso8601(value):
        return value
    if is_number(value) and 0 <= value < 32503680000:  # before the year 3000
        return datetime.fromtimestamp(value, tz=UTC).isoformat().replace("+00:00", "Z")
    return None


def step_totals(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Final metrics summed from the steps' own: ``total_steps`` and each of
    the prompt, completion and cached token counts some step has."""
    final: dict[str, Any] = {"total_steps": len(steps)}
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        counted = [step["metrics"][name] for step in steps if name in step.get("metrics", {})]
        if counted:
            final[f"total_{name}"] = sum(counted)
    return final
