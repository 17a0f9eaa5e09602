"""Run any command-line agent as a trial's runner.

    cli_runner.py --harness DIR --task DIR --output DIR [--config FILE]

The evaluator's runner_argv starts this script (it is copied into the
evaluator's files, so it runs inside the trial sandbox, standard library
only). It reads the agent command from the harness (``agent.toml`` by
default), so the command itself is part of the candidate and can evolve::

    command = ["{python}", "{harness}/scripted_agent.py", "--instruction", "{task}/instruction.md",
               "--workdir", "{workspace}", "--trajectory", "{output}/trajectory.json"]
    timeout_seconds = 60                       # optional, the agent's own limit
    trajectory = "{output}/trajectory.json"    # optional, where the agent leaves its trajectory
    trajectory_format = "atif"                 # or "openai-messages" (converted to ATIF)
    usage = "{output}/usage.json"              # optional, where the agent leaves its token usage

Placeholders in those strings (only these exact tokens are replaced):
{python} this interpreter, {harness} the candidate's files, {task} the
task's public folder (``instruction.md`` and public files), {instruction}
``{task}/instruction.md``, {output} the trial's output folder and
{workspace} ``{output}/workspace``, the agent's working directory, seeded
with the task's ``workspace/`` files. The verifier grades what the agent
leaves in {workspace}.

Afterwards the runner leaves in {output}: ``trajectory.json`` (ATIF; an
OpenAI-style message list is converted) and ``usage.json`` (``tokens`` =
prompt + completion tokens, ``steps``), from the agent's usage file or else
the trajectory's ``final_metrics``; and ``agent.log``, the tail of the
agent's stdout and stderr. Exit status: the agent's own, 124 when it ran out
of time, 2 when the configuration or the agent's trajectory or usage file is
unusable (JSON, and a tool call's arguments string, over the platform's input
limits included).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

CONFIG_FILE = "agent.toml"
TRAJECTORY_FILE = "trajectory.json"
USAGE_FILE = "usage.json"
LOG_FILE = "agent.log"
LOG_TAIL_BYTES = 64 * 1024
PLACEHOLDERS = ("python", "harness", "task", "instruction", "output", "workspace")
_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
TRAJECTORY_FORMATS = ("atif", "openai-messages")
# The default of RSI_MAX_INPUT_DEPTH (evolution/limits.py): this file runs in the
# sandbox with the standard library only, so it cannot read the setting (a test keeps the two equal).
MAX_INPUT_DEPTH = 100
# A JSON string from its opening quote to its closing one (or the end of the text), as evolution/limits.py skips them.
_STRING = re.compile(r'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class ConfigError(Exception):
    """The harness's agent configuration cannot be used."""


class InputLimitError(ValueError):
    """JSON over the platform's input limits; the message is one line naming the limit."""


def json_loads_limited(text: str, *, what: str) -> Any:
    """``json.loads(text)`` within the limits evolution/limits.py's ``json_loads``
    sets (it cannot be imported here): nesting over MAX_INPUT_DEPTH is refused
    before the parser recurses into it, and an integer over Python's digit
    limit is refused instead of raising a bare ValueError. InputLimitError
    naming ``what``, or json.JSONDecodeError as ``json.loads`` raises it."""
    if text.count("[") + text.count("{") > MAX_INPUT_DEPTH:
        depth = 0
        for bracket in _BRACKET.finditer(_STRING.sub("", text)):
            depth += 1 if bracket.group() in "[{" else -1
            if depth > MAX_INPUT_DEPTH:
                raise InputLimitError(f"{what} is nested more than {MAX_INPUT_DEPTH} levels deep (RSI_MAX_INPUT_DEPTH)")
            if depth < 0:
                break  # a closing bracket too many: json.loads stops there
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        if "integer string conversion" not in str(exc):
            raise
        raise InputLimitError(
            f"{what} holds an integer of more than {sys.get_int_max_str_digits()} digits (Python's int_max_str_digits)"
        ) from None


def substitute(template: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER_RE.sub(lambda match: values[match.group(1)], template)


def load_config(path: Path, values: dict[str, str]) -> dict[str, Any]:
    """The agent configuration with placeholders filled in; ConfigError when unusable."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path.name}: {exc}") from exc
    command = data.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(arg, str) for arg in command):
        raise ConfigError(f"{path.name}: `command` must be a non-empty list of strings")
    timeout = data.get("timeout_seconds", 0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout < 0:
        raise ConfigError(f"{path.name}: `timeout_seconds` must be a non-negative number")
    fmt = data.get("trajectory_format", "atif")
    if fmt not in TRAJECTORY_FORMATS:
        raise ConfigError(f"{path.name}: `trajectory_format` must be one of {', '.join(TRAJECTORY_FORMATS)}")
    paths = {}
    for key, default in (("trajectory", f"{{output}}/{TRAJECTORY_FILE}"), ("usage", f"{{output}}/{USAGE_FILE}")):
        value = data.get(key, default)
        if not isinstance(value, str):
            raise ConfigError(f"{path.name}: `{key}` must be a path string")
        paths[key] = Path(substitute(value, values))
    return {
        "command": [substitute(arg, values) for arg in command],
        "timeout": float(timeout) or None,
        "trajectory_format": fmt,
        **paths,
    }


def messages_to_atif(messages: Any, *, agent: str = "cli-agent") -> dict[str, Any]:
    """Convert an OpenAI-style chat message list to an ATIF v1.5 trajectory.

    system/user messages become system/user steps, assistant messages agent
    steps with their tool calls; a ``tool`` message becomes the observation of
    the agent step that made the call. Per-message ``usage`` (prompt_tokens,
    completion_tokens) becomes step metrics. ValueError for anything else.
    """
    if not isinstance(messages, list):
        raise ValueError("a message list must be a JSON array")
    steps: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"message {position}: needs a role of system, user, assistant or tool")
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content) if content is not None else ""
        if message["role"] == "tool":
            step = calls.get(str(message.get("tool_call_id")))
            if step is None:
                raise ValueError(f"message {position}: tool result for an unknown call {message.get('tool_call_id')!r}")
            results = step.setdefault("observation", {"results": []})["results"]
            results.append({"source_call_id": str(message["tool_call_id"]), "content": text})
            continue
        step = {
            "step_id": len(steps) + 1,
            # No timestamp: a message list has none, and ATIF's is optional (a made-up one would show as a
            # duration of 0 s between steps on the trial page).
            "source": "agent" if message["role"] == "assistant" else message["role"],
            "message": text,
        }
        tool_calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments", {})
            call_id = str(call.get("id") or f"call_{len(calls) + 1}")
            if isinstance(arguments, str):
                # The string is a JSON document of its own, so it gets the limits the file it came in got.
                try:
                    arguments = json_loads_limited(arguments, what=f"tool call {call_id!r} (its arguments string)")
                except InputLimitError as exc:
                    raise ValueError(f"message {position}: {exc}") from None
                except json.JSONDecodeError:
                    arguments = {"raw": arguments}
            tool_calls.append(
                {"tool_call_id": call_id, "function_name": function.get("name", ""), "arguments": arguments}
            )
            calls[call_id] = step
        if tool_calls:
            step["tool_calls"] = tool_calls
        usage = message.get("usage")
        if isinstance(usage, dict):
            step["metrics"] = {
                k: usage[k] for k in ("prompt_tokens", "completion_tokens") if isinstance(usage.get(k), int)
            }
        steps.append(step)
    document: dict[str, Any] = {
        "schema_version": "ATIF-v1.5",
        "session_id": "converted",
        "agent": {"name": agent, "version": "unknown"},
        "steps": steps,
    }
    metered = [s["metrics"] for s in steps if s.get("metrics")]
    if metered:
        document["final_metrics"] = {
            "total_prompt_tokens": sum(m.get("prompt_tokens", 0) for m in metered),
            "total_completion_tokens": sum(m.get("completion_tokens", 0) for m in metered),
            "total_steps": len(steps),
        }
    return document


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_from(usage: Any, trajectory: Any) -> dict[str, int] | None:
    """Normalized usage: ``tokens`` (prompt + completion), ``steps`` and the parts.

    From the agent's usage file (``prompt_tokens``/``completion_tokens`` or
    ``tokens``), else from the trajectory's ``final_metrics``; None when neither reports tokens.
    """
    steps = (
        len(trajectory["steps"]) if isinstance(trajectory, dict) and isinstance(trajectory.get("steps"), list) else None
    )
    sources = []
    if isinstance(usage, dict):
        sources.append((usage, "prompt_tokens", "completion_tokens"))
    if isinstance(trajectory, dict) and isinstance(trajectory.get("final_metrics"), dict):
        sources.append((trajectory["final_metrics"], "total_prompt_tokens", "total_completion_tokens"))
    for data, prompt_key, completion_key in sources:
        prompt, completion = _count(data.get(prompt_key)), _count(data.get(completion_key))
        if prompt is not None or completion is not None:
            result = {"tokens": (prompt or 0) + (completion or 0), "prompt_tokens": prompt or 0}
            result["completion_tokens"] = completion or 0
        elif _count(data.get("tokens")) is not None:
            result = {"tokens": data["tokens"]}
        else:
            continue
        own_steps = _count(data.get("steps"))
        if own_steps is not None or steps is not None:
            result["steps"] = own_steps if own_steps is not None else steps  # type: ignore[assignment]
        return result
    return None


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json_loads_limited(path.read_text(encoding="utf-8"), what=path.name)
    except InputLimitError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path.name} is not valid JSON: {exc}") from exc


def collect(config: dict[str, Any], output: Path) -> None:
    """Leave ``trajectory.json`` (ATIF) and ``usage.json`` (normalized) in ``output``."""
    trajectory = _read_json(config["trajectory"])
    if trajectory is not None and config["trajectory_format"] == "openai-messages":
        try:
            trajectory = messages_to_atif(trajectory)
        except ValueError as exc:
            raise ConfigError(f"cannot convert the agent's messages: {exc}") from exc
    target = output / TRAJECTORY_FILE
    if trajectory is not None and (config["trajectory"] != target or config["trajectory_format"] != "atif"):
        target.write_text(json.dumps(trajectory, indent=1) + "\n", encoding="utf-8")
    usage = usage_from(_read_json(config["usage"]), trajectory)
    if usage is not None:
        (output / USAGE_FILE).write_text(json.dumps(usage) + "\n", encoding="utf-8")


def prepare_workspace(task: Path, workspace: Path) -> None:
    """A fresh working directory holding the task's public ``workspace/`` files."""
    seed = task / "workspace"
    if seed.is_dir():
        shutil.copytree(seed, workspace, symlinks=True)
    else:
        workspace.mkdir()


def _tail(path: Path) -> bytes:
    with path.open("rb") as stream:
        size = stream.seek(0, os.SEEK_END)
        stream.seek(max(0, size - LOG_TAIL_BYTES))
        return stream.read()


def run(harness: Path, task: Path, output: Path, config_path: Path) -> int:
    harness, task, output = harness.absolute(), task.absolute(), output.absolute()
    workspace = output / "workspace"
    values = {
        "python": sys.executable,
        "harness": str(harness),
        "task": str(task),
        "instruction": str(task / "instruction.md"),
        "output": str(output),
        "workspace": str(workspace),
    }
    config = load_config(config_path, values)
    prepare_workspace(task, workspace)
    env = {**os.environ, "AGENT_WORKSPACE": str(workspace), "AGENT_OUTPUT": str(output)}
    log = output / LOG_FILE
    with log.open("wb") as sink:
        try:
            process = subprocess.run(
                config["command"],
                cwd=workspace,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=config["timeout"],
                check=False,
            )
            status = process.returncode
        except subprocess.TimeoutExpired:
            status = 124
        except OSError as exc:
            raise ConfigError(f"cannot start the agent {config['command'][0]!r}: {exc}") from exc
    # Keep only the tail: the output folder has a size limit.
    tail = _tail(log)
    log.write_bytes(tail)
    if status != 0:
        reason = f"ran longer than {config['timeout']} s" if status == 124 else f"exited with status {status}"
        sys.stderr.write(f"cli_runner: the agent {reason}; log tail:\n{tail[-4000:].decode(errors='replace')}\n")
        return status if 0 < status < 256 else 1
    collect(config, output)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", required=True, type=Path)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--config", type=Path, help=f"agent configuration (default: HARNESS/{CONFIG_FILE})")
    options = parser.parse_args(argv)
    try:
        return run(options.harness, options.task, options.output, options.config or options.harness / CONFIG_FILE)
    except ConfigError as exc:
        sys.stderr.write(f"cli_runner: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
