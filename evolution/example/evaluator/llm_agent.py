"""Support-routing agent driven by a real model behind an OpenAI-compatible endpoint.

    llm_agent.py --harness DIR --task DIR --output DIR --seed N

The same harness files steer it as steer ``agent.py``, but here a model reads them. The system message is
the harness's whole context (prompts, tool files, skills, memory: what the proposer edits); each tool file
becomes a function definition; the user message is the customer's request (cut and joined with the public
files as ``context/window.toml`` says). The model answers with one tool and its arguments, as JSON held to a
schema where the server supports one. That answer is the tool call: it is checked against the tool's
argument patterns when the control flow has a ``verify`` step, and a problem goes back to the model as the
tool's result for another try (``control/flow.toml``'s ``max_retries``, within ``config.toml``'s
``max_steps``). Then ``answer.json`` is written as ``output/format.toml`` says, with ``trajectory.json``
(ATIF v1.5): every model message, tool call and result, and per step the tokens the server reported in its
``usage``.

The endpoint comes from the environment: ``RSI_LLM_BASE_URL`` (up to ``/v1``), ``RSI_LLM_MODEL``, optionally
``RSI_LLM_API_KEY`` and ``RSI_LLM_TIMEOUT`` (seconds a request may take, default 300). The harness's own
``model`` setting names the offline policy and is not sent. Standard library only. Exit status: 0 when the
run finished (whether or not it submitted), 2 when the harness, the task or the endpoint could not be used
(the trajectory then says why).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agent import (
    Harness,
    HarnessError,
    ToolSpec,
    _tool_definition,
    _write_json,
    cli,
    is_valid,
    load_harness,
    read_task,
)

AGENT_NAME = "llm-support-router"
AGENT_VERSION = "1.0.0"
# Room for the tool's name, its arguments and a sentence of reasoning; the schema keeps the answer short.
MAX_ANSWER_TOKENS = 160


class EndpointError(Exception):
    """The endpoint could not be reached or gave no usable completion."""


def answer_schema(tools: list[ToolSpec]) -> dict[str, Any]:
    """The JSON an answer must be: a sentence of reasoning, then one of the harness's tools with every one of
    its arguments as a string (a server that holds output to a schema then cannot leave them out)."""
    return {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "reason": {"type": "string"},
                    "tool": {"const": tool.name},
                    "args": {
                        "type": "object",
                        "properties": {arg.name: {"type": "string"} for arg in tool.args},
                        "required": [arg.name for arg in tool.args],
                    },
                },
                "required": ["reason", "tool", "args"],
            }
            for tool in tools
        ]
    }


def system_message(harness: Harness) -> str:
    tools = "\n".join(
        f"- {tool.name}({', '.join(arg.name for arg in tool.args)}): {tool.description}" for tool in harness.tools
    )
    return (
        f"{harness.context_text}\n\n"
        "Answer every customer message by choosing exactly one tool and filling its arguments. Reply with JSON "
        'only: {"reason": "<one sentence>", "tool": "<tool name>", "args": {"<argument>": "<value>"}}.\n'
        f"Tools:\n{tools}"
    )


def chat(messages: list[dict[str, str]], *, schema: dict[str, Any], temperature: float, seed: int) -> dict[str, Any]:
    """One chat completion; the parsed response. EndpointError when none came back."""
    base_url = os.environ.get("RSI_LLM_BASE_URL", "").rstrip("/")
    model = os.environ.get("RSI_LLM_MODEL", "")
    if not base_url or not model:
        raise EndpointError("RSI_LLM_BASE_URL and RSI_LLM_MODEL must name the endpoint and its model")
    body = {
        "model": model,
        "messages": messages,
        "temperature": temperature,
        "seed": seed,
        "max_tokens": MAX_ANSWER_TOKENS,
        "response_format": {"type": "json_object", "schema": schema},
    }
    headers = {"Content-Type": "application/json"}
    if key := os.environ.get("RSI_LLM_API_KEY", ""):
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(
        f"{base_url}/chat/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    timeout = float(os.environ.get("RSI_LLM_TIMEOUT", "") or 300)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise EndpointError(f"{base_url}: HTTP {exc.code}: {detail}") from exc
    except (OSError, ValueError) as exc:
        raise EndpointError(f"{base_url}: {exc}") from exc
    if not isinstance(data, dict) or not data.get("choices"):
        raise EndpointError(f"{base_url}: not a chat completion: {str(data)[:300]}")
    return data


def parse_answer(text: str, tools: list[ToolSpec]) -> tuple[ToolSpec | None, dict[str, str], str]:
    """(tool, arguments, problem): the problem is "" when the answer names a tool with string arguments."""
    cleaned = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        answer = json.loads(cleaned)
    except ValueError as exc:
        return None, {}, f"the answer is not JSON ({exc.msg})"
    if not isinstance(answer, dict):
        return None, {}, "the answer is not a JSON object"
    tool = next((t for t in tools if t.name == answer.get("tool")), None)
    if tool is None:
        return None, {}, f"unknown tool {answer.get('tool')!r}; the tools are {', '.join(t.name for t in tools)}"
    raw = answer.get("args")
    args = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    return tool, {arg.name: args[arg.name] for arg in tool.args if args.get(arg.name)}, ""


def problems_of(tool: ToolSpec, args: dict[str, str]) -> list[str]:
    """What the tool's argument patterns refuse, one line each."""
    problems = []
    for arg in tool.args:
        value = args.get(arg.name)
        if value is None:
            problems.append(f"{arg.name}: missing")
        elif not is_valid(arg, value):
            problems.append(f"{arg.name}: {value!r} does not match {arg.validate.pattern if arg.validate else ''}")
    return problems


class Transcript:
    """The ATIF steps of one run, stamped with the wall clock (a real model's time is part of the record)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.calls = 0

    def add(self, source: str, message: str, **fields: Any) -> dict[str, Any]:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        step = {"step_id": len(self.steps) + 1, "timestamp": stamp, "source": source, "message": message}
        self.steps.append({**step, **fields})
        return self.steps[-1]

    def model_step(
        self, response: dict[str, Any], text: str, call: tuple[str, dict[str, str]] | None, result: str
    ) -> None:
        usage = response.get("usage") or {}
        fields: dict[str, Any] = {
            "model_name": str(response.get("model", "")),
            "metrics": {
                "prompt_tokens": int(usage.get("prompt_tokens", 0)),
                "completion_tokens": int(usage.get("completion_tokens", 0)),
            },
        }
        if call is not None:
            self.calls += 1
            call_id = f"call_{self.calls}"
            fields["tool_calls"] = [{"tool_call_id": call_id, "function_name": call[0], "arguments": call[1]}]
            fields["observation"] = {"results": [{"source_call_id": call_id, "content": result}]}
        elif result:
            fields["observation"] = {"results": [{"content": result}]}
        self.add("agent", text, **fields)


def run(harness_dir: Path, task_dir: Path, output_dir: Path, seed: int) -> dict[str, Any]:
    """Run one trial and write the output files. A harness, task or endpoint that cannot be used leaves a
    trajectory ending in an error step, and no answer."""
    output_dir.mkdir(parents=True, exist_ok=True)
    transcript = Transcript()
    extra: dict[str, Any] = {"submitted": False}
    model = os.environ.get("RSI_LLM_MODEL", "")
    started = time.monotonic()
    harness: Harness | None = None
    try:
        instruction, files = read_task(task_dir)
        harness = load_harness(harness_dir)
        (output_dir / harness.settings.answer_file).unlink(missing_ok=True)
        extra = drive(harness, instruction, files, output_dir, seed, transcript)
    except (HarnessError, EndpointError) as exc:
        transcript.add("system", f"error: {exc}")
        extra = {"error": str(exc), "submitted": False}
    model_steps = [s for s in transcript.steps if "metrics" in s]
    model = next((s["model_name"] for s in model_steps if s["model_name"]), model)
    document = {
        "schema_version": "ATIF-v1.5",
        "session_id": f"{AGENT_NAME}-{seed}-{os.getpid()}-{int(time.time() * 1000)}",
        "agent": {"name": AGENT_NAME, "version": AGENT_VERSION, "model_name": model},
        "steps": transcript.steps,
        "final_metrics": {
            "total_prompt_tokens": sum(s["metrics"]["prompt_tokens"] for s in model_steps),
            "total_completion_tokens": sum(s["metrics"]["completion_tokens"] for s in model_steps),
            "total_steps": len(transcript.steps),
            "extra": {"model_calls": len(model_steps), "wall_seconds": round(time.monotonic() - started, 3), **extra},
        },
    }
    if harness is not None:
        document["agent"]["tool_definitions"] = [_tool_definition(t) for t in harness.tools]
    _write_json(output_dir / "trajectory.json", document)
    return extra


def drive(
    harness: Harness, instruction: str, files: str, output_dir: Path, seed: int, transcript: Transcript
) -> dict[str, Any]:
    settings = harness.settings
    limit = settings.max_request_chars
    request = instruction[:limit] if limit > 0 else instruction
    user = request + (f"\n\n{files}" if settings.include_public_files and files else "")
    system = system_message(harness)
    transcript.add("system", system)
    transcript.add("user", user)
    schema = answer_schema(harness.tools)
    opening = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    exchanges: list[dict[str, str]] = []
    tries = 1 + (settings.max_retries if "verify" in settings.steps else 0)
    best: tuple[ToolSpec, dict[str, str]] | None = None
    reason = ""
    for attempt in range(min(tries, settings.max_steps)):
        # "last" keeps only the latest exchange in front of the model; "full" the whole history.
        history = exchanges if settings.history == "full" else exchanges[-2:]
        response = chat([*opening, *history], schema=schema, temperature=settings.temperature, seed=seed + attempt)
        text = str(((response["choices"][0] or {}).get("message") or {}).get("content") or "")
        tool, args, problem = parse_answer(text, harness.tools)
        if tool is not None:
            problems = problems_of(tool, args) if "verify" in settings.steps else []
            if best is None or len(problems_of(tool, args)) < len(problems_of(*best)):
                best = (tool, args)
            problem = "; ".join(problems)
        result = f"refused: {problem}" if problem else "accepted"
        transcript.model_step(response, text, (tool.name, args) if tool else None, result)
        if not problem:
            break
        reason = problem
        exchanges += [{"role": "assistant", "content": text}, {"role": "user", "content": f"{result}. Try again."}]
    submitted = False
    if best is not None:
        tool, args = best
        missing = [arg.name for arg in tool.args if arg.name not in args]
        if missing and settings.on_missing_args == "skip":
            reason = f"not submitted: missing {', '.join(missing)}"
        elif "submit" not in settings.steps:
            reason = "not submitted: the control flow has no submit step"
        else:
            _write_json(output_dir / settings.answer_file, {settings.tool_key: tool.name, settings.args_key: args})
            submitted = True
            transcript.add("system", f"submitted {tool.name}: answer written to {settings.answer_file}")
    if not submitted:
        transcript.add("system", reason or "not submitted: no usable answer")
    return {"submitted": submitted, "tool": best[0].name if best else None}


def main(argv: list[str] | None = None) -> int:
    return cli(run, __doc__ or "", "llm agent", argv)


if __name__ == "__main__":
    sys.exit(main())
