"""The offline agents run the subagents their proposers can add (a new structural kind), and the example
agent takes its case recall threshold from its command line. Real agent processes; no database, and no
reasoning-gym package (the reasoning-gym agent is standard library; only its verifier needs the package)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from evolution.example import bench, reference_edits
from evolution.example import proposer as example_proposer
from evolution.rgym import proposer as rgym_proposer

RGYM_DIR = Path(rgym_proposer.__file__).resolve().parent
TASKS = {task["id"]: task for task in bench.load_tasks()}


def run_example(harness: Path, task: dict[str, Any], workdir: Path, *options: str) -> dict[str, Any]:
    bench.write_task(task, workdir / "task", workdir / "private")
    subprocess.run(
        [sys.executable, str(bench.EVALUATOR_DIR / "agent.py"), "--harness", str(harness),
         "--task", str(workdir / "task"), "--output", str(workdir / "output"), "--seed", "0", *options],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    document: dict[str, Any] = json.loads((workdir / "output" / "trajectory.json").read_text())
    return document


def messages(document: dict[str, Any]) -> list[str]:
    return [str(step.get("message", "")) for step in document["steps"]]


def test_the_example_agent_starts_the_ticket_reader_for_a_missing_argument(tmp_path: Path) -> None:
    task = TASKS["route-019"]  # the account id is in the ticket only, and the seed leaves the ticket out
    before = run_example(bench.HARNESS_DIR, task, tmp_path / "seed")
    assert messages(before)[-1] == "not submitted: missing account_id"

    harness = bench.copy_harness(tmp_path / "harness")
    (harness / "subagents").mkdir()
    (harness / example_proposer.SUBAGENT_PATH).write_text(example_proposer.SUBAGENT_TEXT)
    after = run_example(harness, task, tmp_path / "subagent")

    started = [s for s in after["steps"] if s.get("tool_calls", [{}])[0].get("function_name") == "start_subagent"]
    assert len(started) == 1
    assert started[0]["tool_calls"][0]["arguments"] == {"name": "ticket_reader", "missing": ["account_id"]}
    submitted = json.loads((tmp_path / "subagent" / "output" / "answer.json").read_text())
    assert submitted["tool"] == "cancel_subscription"
    assert submitted["args"]["account_id"] in task["files"]["ticket.json"]
    # What the subagent read in its own context is counted: more than the ticket's tokens on that step.
    previous = after["steps"][after["steps"].index(started[0]) - 1]["metrics"]["prompt_tokens"]
    assert started[0]["metrics"]["prompt_tokens"] - previous >= len(task["files"]["ticket.json"]) // 4


def test_the_example_agent_takes_its_case_recall_threshold_from_the_command_line(tmp_path: Path) -> None:
    harness = bench.copy_harness(tmp_path / "harness")
    reference_edits.apply("memory-known-cases", harness, tasks=list(TASKS.values()))
    # A message that shares some, not all, of its words with a memorized case: recalled at or below that share.
    cases = _cases(harness)
    task, similarity = next(
        (t, s) for t in TASKS.values() if 0.4 < (s := max(_jaccard(_words(t), c) for c in cases)) < 1.0
    )
    recalled = run_example(harness, task, tmp_path / "low", "--case-recall-similarity", f"{similarity - 0.001:.6f}")
    ignored = run_example(harness, task, tmp_path / "high", "--case-recall-similarity", f"{similarity + 0.001:.6f}")
    assert any(m.startswith("Memory has a known case like this message") for m in messages(recalled))
    assert not any(m.startswith("Memory has a known case") for m in messages(ignored))


def _words(task: dict[str, Any]) -> frozenset[str]:
    quoted = [line[2:] for line in task["instruction"].splitlines() if line.startswith("> ")]
    return frozenset(re.findall(r"[a-z0-9]+", " ".join(quoted).lower()))


def _cases(harness: Path) -> list[frozenset[str]]:
    text = "\n".join(p.read_text() for p in sorted((harness / "memory").glob("*.md")))
    return [frozenset(re.findall(r"[a-z0-9]+", m.lower())) for m in re.findall(r'^\s*-\s*"([^"]+)"\s*=>', text, re.M)]


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def test_the_reasoning_gym_agent_starts_its_calculator_when_no_skill_answers(tmp_path: Path) -> None:
    question = "State the final answer to the following arithmetic problem: 4 + 3 - 10 ="
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "instruction.md").write_text(question + "\n")

    def answer(harness: Path, out: str) -> tuple[str, dict[str, Any]]:
        subprocess.run(
            [sys.executable, str(RGYM_DIR / "evaluator" / "agent.py"), "--harness", str(harness),
             "--task", str(tmp_path / "task"), "--output", str(tmp_path / out), "--seed", "0"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        document = json.loads((tmp_path / out / "trajectory.json").read_text())
        return (tmp_path / out / "answer.txt").read_text(), document

    seed = RGYM_DIR / "harness"
    guessed, before = answer(seed, "seed")
    harness = tmp_path / "harness"
    shutil.copytree(seed, harness)
    edited = rgym_proposer.edit_apply("subagent-calculator", {})
    for path, text in edited.items():
        (harness / path).parent.mkdir(parents=True, exist_ok=True)
        (harness / path).write_text(text)
    computed, after = answer(harness, "subagent")

    assert (guessed, computed) == ("4", "-3")
    assert "subagent calculator.toml: arith" in after["steps"][-1]["message"]
    # The subagent's file is in every question's context, and its own read is counted when it runs.
    delta = after["final_metrics"]["total_prompt_tokens"] - before["final_metrics"]["total_prompt_tokens"]
    assert delta == (len(rgym_proposer.SUBAGENT_TEXT) + 3) // 4 * 2 + (len(question) + 3) // 4
