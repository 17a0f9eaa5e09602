"""Inspect AI eval logs (``.eval`` read by ``evolution.inspect_logs``, or a
``.json`` log) holding one sample, as one ATIF trajectory: the sample's
messages the steps, each agent step's time, model and tokens from the model
event that produced it, the sample's scores, usage, times and error and the
log's task and model in ``extra["inspect"]``. A log of several samples is a
file of several trajectories (``inspect_logs.one_per_sample``)."""

from __future__ import annotations

from typing import Any

from evolution import inspect_logs
from evolution.formats.common import CONVERTED_VERSION, TrajectoryFormatError
from evolution.formats.openai import messages_to_steps


def from_inspect(document: Any, *, deviations: list[str] | None = None) -> dict[str, Any]:
    """An ATIF document (not yet validated) of an Inspect AI eval log holding one sample."""
    samples = document.get("samples") if inspect_logs.is_inspect_log(document) else None
    if not isinstance(samples, list) or len(samples) != 1 or not isinstance(samples[0], dict):
        raise TrajectoryFormatError(["document: must be an Inspect AI eval log holding one sample"])
    sample = samples[0]
    messages = inspect_logs.sample_messages(sample)
    steps, errors = messages_to_steps(messages, where="samples[0].messages", deviations=deviations)
    if errors:
        raise TrajectoryFormatError(errors)
    inspect_logs.sample_times(sample, steps, messages)
    spec = document["eval"]
    model = spec.get("model") if isinstance(spec.get("model"), str) else None
    for step in steps:
        if step["source"] == "agent" and "model_name" not in step:
            own = (step.get("extra") or {}).get("model")
            if isinstance(own, str) and own or model:
                step["model_name"] = own if isinstance(own, str) and own else model
    packages = spec.get("packages") if isinstance(spec.get("packages"), dict) else {}
    assert packages is not None
    agent: dict[str, Any] = {"name": "inspect-ai", "version": str(packages.get("inspect_ai") or "unknown")}
    if model:
        agent["model_name"] = model
    final: dict[str, Any] = {"total_steps": len(steps)}
    tokens = inspect_logs.usage_tokens(sample.get("model_usage"))
    if tokens is not None:
        final["total_prompt_tokens"], final["total_completion_tokens"] = tokens
    run = spec.get("eval_id") or spec.get("run_id") or spec.get("task")
    return {
        "schema_version": CONVERTED_VERSION,
        "session_id": f"{run}:{sample.get('id')}:epoch-{sample.get('epoch')}",
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": {
            "converted_from": "inspect-ai",
            "inspect": {**inspect_logs.log_extra(document), "sample": inspect_logs.sample_extra(sample)},
        },
    }
