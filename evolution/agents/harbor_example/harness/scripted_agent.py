"""A scripted command-line agent that stands in for a model in the Harbor example.

    scripted_agent.py --instruction FILE --workdir DIR --prompt FILE --trajectory FILE

It reads the task's instruction, picks a skill by the first rule of the
prompt file whose phrase occurs in the instruction (``rule: "phrase" ->
skill``), applies it to the files named in backticks in the instruction,
and writes the answer into DIR. Without a matching rule it gives up and
writes nothing. It also writes an ATIF v1.5 trajectory (system prompt,
instruction, one agent step per tool call, token metrics of about four
characters a token) to FILE. Its abilities are fixed, like a frozen model's;
which one it uses is decided by the harness's rules, so a harness edit can
make it pass or fail a task. Deterministic; standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

AGENT_NAME = "scripted-cli-agent"
MODEL = "scripted-policy-1"


def _names(instruction: str) -> list[str]:
    return re.findall(r"`([^`/\\]+)`", instruction)


def write_literal(instruction: str, workdir: Path) -> tuple[str, str]:
    match = re.search(r"`([^`/\\]+)`\s+containing exactly:\s*(.+)", instruction)
    if not match:
        raise ValueError("no file name and text found")
    return match.group(1), match.group(2).strip() + "\n"


def _input_output(instruction: str, workdir: Path) -> tuple[str, Path]:
    names = _names(instruction)
    if len(names) < 2:
        raise ValueError("expected an input and an output file name in backticks")
    return names[1], workdir / names[0]


def sum_numbers(instruction: str, workdir: Path) -> tuple[str, str]:
    target, source = _input_output(instruction, workdir)
    return target, f"{sum(int(line) for line in source.read_text().split())}\n"


def count_lines(instruction: str, workdir: Path) -> tuple[str, str]:
    target, source = _input_output(instruction, workdir)
    return target, f"{len(source.read_text().splitlines())}\n"


def count_words(instruction: str, workdir: Path) -> tuple[str, str]:
    target, source = _input_output(instruction, workdir)
    return target, f"{len(source.read_text().split())}\n"


def reverse_lines(instruction: str, workdir: Path) -> tuple[str, str]:
    target, source = _input_output(instruction, workdir)
    return target, "".join(line + "\n" for line in reversed(source.read_text().splitlines()))


SKILLS: dict[str, Callable[[str, Path], tuple[str, str]]] = {
    fn.__name__: fn for fn in (write_literal, sum_numbers, count_lines, count_words, reverse_lines)
}


def parse_rules(prompt: str) -> list[tuple[str, str]]:
    return [(m.group(1).lower(), m.group(2)) for m in re.finditer(r'^rule:\s*"([^"]+)"\s*->\s*(\w+)\s*$', prompt, re.M)]


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


class Trajectory:
    def __init__(self, prompt: str, instruction: str) -> None:
        self.steps: list[dict[str, Any]] = []
        self.context = prompt + instruction
        self._add({"source": "system", "message": prompt})
        self._add({"source": "user", "message": instruction})

    def _add(self, step: dict[str, Any]) -> dict[str, Any]:
        number = len(self.steps) + 1
        # A fixed clock keeps trajectories reproducible.
        step = {"step_id": number, "timestamp": f"2026-01-01T00:00:{number:02d}Z", **step}
        self.steps.append(step)
        return step

    def act(self, message: str, tool: str | None = None, arguments: Any = None, result: str = "") -> None:
        step: dict[str, Any] = {"source": "agent", "model_name": MODEL, "message": message}
        completion = message
        if tool is not None:
            call_id = f"call_{len(self.steps) + 1}"
            step["tool_calls"] = [{"tool_call_id": call_id, "function_name": tool, "arguments": arguments}]
            step["observation"] = {"results": [{"source_call_id": call_id, "content": result}]}
            completion += json.dumps(arguments)
        step["metrics"] = {"prompt_tokens": tokens(self.context), "completion_tokens": tokens(completion)}
        self.context += message + result
        self._add(step)

    def document(self, extra: dict[str, Any]) -> dict[str, Any]:
        metered = [s["metrics"] for s in self.steps if "metrics" in s]
        return {
            "schema_version": "ATIF-v1.5",
            "session_id": "scripted",
            "agent": {"name": AGENT_NAME, "version": "1.0.0", "model_name": MODEL},
            "steps": self.steps,
            "final_metrics": {
                "total_prompt_tokens": sum(m["prompt_tokens"] for m in metered),
                "total_completion_tokens": sum(m["completion_tokens"] for m in metered),
                "total_steps": len(self.steps),
                "extra": extra,
            },
        }


def run(instruction: str, prompt: str, workdir: Path) -> tuple[Trajectory, dict[str, Any]]:
    trajectory = Trajectory(prompt, instruction)
    lowered = instruction.lower()
    rule = next(((phrase, skill) for phrase, skill in parse_rules(prompt) if phrase in lowered), None)
    if rule is None or rule[1] not in SKILLS:
        trajectory.act("No rule of my instructions covers this task; I stop without an answer.")
        return trajectory, {"submitted": False, "skill": None}
    phrase, skill = rule
    for name in _names(instruction)[1:2]:
        path = workdir / name
        content = path.read_text() if path.is_file() else "(missing)"
        trajectory.act(f"Rule {phrase!r} applies: using {skill}. Reading {name}.", "read_file", {"path": name}, content)
    try:
        target, answer = SKILLS[skill](instruction, workdir)
    except (OSError, ValueError) as exc:
        trajectory.act(f"{skill} failed: {exc}")
        return trajectory, {"submitted": False, "skill": skill}
    (workdir / target).write_text(answer)
    trajectory.act(f"Writing the answer to {target}.", "write_file", {"path": target, "content": answer}, "written")
    return trajectory, {"submitted": True, "skill": skill}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instruction", required=True, type=Path)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--prompt", required=True, type=Path)
    parser.add_argument("--trajectory", required=True, type=Path)
    options = parser.parse_args(argv)
    trajectory, extra = run(options.instruction.read_text(), options.prompt.read_text(), options.workdir)
    options.trajectory.write_text(json.dumps(trajectory.document(extra), indent=1) + "\n")
    print(f"{AGENT_NAME}: {'answered' if extra['submitted'] else 'gave up'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
