"""Run a harness over the offline example's tasks, outside the platform.

    python -m evolution.example.bench [--harness DIR] [--seeds 0 1] [--edit NAME ...]

For measuring the example while designing it (and for tests): every trial
runs ``agent.py`` and ``verify.py`` as real subprocesses, through the argv
templates of ``evaluator.toml``, in a throw-away directory. No database, no
Django. ``--edit`` applies reference edits (see ``reference_edits.py``) to a
copy of the harness first.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolution.example import reference_edits

EXAMPLE_DIR = Path(__file__).resolve().parent
HARNESS_DIR = EXAMPLE_DIR / "harness"
EVALUATOR_DIR = EXAMPLE_DIR / "evaluator"
TASKS_PATH = EXAMPLE_DIR / "tasks.jsonl"
SETTINGS_PATH = EXAMPLE_DIR / "evaluator.toml"


@dataclass(frozen=True)
class TrialResult:
    task_id: str
    seed: int
    passed: bool
    score: float
    valid_output: bool
    submitted: bool
    prompt_tokens: int
    completion_tokens: int
    agent_steps: int
    seconds: float


def load_settings() -> dict[str, Any]:
    return tomllib.loads(SETTINGS_PATH.read_text(encoding="utf-8"))


def load_tasks(path: Path = TASKS_PATH) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_task(task: dict[str, Any], task_dir: Path, private_dir: Path) -> None:
    """Lay out one task as the platform does: public files in ``task_dir``, the answer key apart."""
    task_dir.mkdir(parents=True, exist_ok=True)
    private_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / "instruction.md").write_text(task["instruction"], encoding="utf-8")
    for name, text in task.get("files", {}).items():
        (task_dir / name).write_text(text, encoding="utf-8")
    expected = {"expected": task["expected"], "criteria": task["criteria"]}
    (private_dir / "expected.json").write_text(json.dumps(expected, indent=2), encoding="utf-8")


def fill(argv: Sequence[str], values: dict[str, str]) -> list[str]:
    return [part.format(**values) for part in argv]


@functools.cache
def _grade_function() -> Callable[[Path, dict[str, Any]], dict[str, Any]]:
    """``verify.grade`` loaded from source, without writing bytecode next to the evaluator's files."""
    path = EVALUATOR_DIR / "verify.py"
    namespace: dict[str, Any] = {"__name__": "example_verify"}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    grade: Callable[[Path, dict[str, Any]], dict[str, Any]] = namespace["grade"]
    return grade


def run_trial(
    harness: Path,
    task: dict[str, Any],
    seed: int,
    workdir: Path,
    *,
    python: str = sys.executable,
    grade_in_process: bool = False,
) -> TrialResult:
    """One trial in ``workdir`` (created; must not exist yet).

    The agent always runs as a subprocess; ``grade_in_process`` calls the
    verifier's ``grade`` directly instead of starting ``verify.py`` (same
    code, a third of the time), for bulk measurements.
    """
    settings = load_settings()["evaluator"]
    task_dir, private_dir, output_dir = workdir / "task", workdir / "private", workdir / "output"
    write_task(task, task_dir, private_dir)
    values = {
        "python": python,
        "evaluator": str(EVALUATOR_DIR),
        "harness": str(harness),
        "task": str(task_dir),
        "output": str(output_dir),
        "private": str(private_dir),
        "seed": str(seed),
    }
    started = time.perf_counter()
    subprocess.run(
        fill(settings["runner_argv"], values), capture_output=True, text=True, timeout=settings["timeout_seconds"]
    )
    seconds = time.perf_counter() - started
    if grade_in_process:
        expected = json.loads((private_dir / "expected.json").read_text(encoding="utf-8"))
        grade = _grade_function()(output_dir, expected)
    else:
        graded = subprocess.run(
            fill(settings["verifier_argv"], values),
            capture_output=True,
            text=True,
            check=True,
            timeout=settings["timeout_seconds"],
        )
        grade = json.loads(graded.stdout)
    metrics: dict[str, Any] = {}
    trajectory_path = output_dir / "trajectory.json"
    if trajectory_path.is_file():
        metrics = json.loads(trajectory_path.read_text(encoding="utf-8"))["final_metrics"]
    return TrialResult(
        task_id=task["id"],
        seed=seed,
        passed=grade["passed"],
        score=grade["score"],
        valid_output=grade["valid_output"],
        submitted=grade["submitted"],
        prompt_tokens=metrics.get("total_prompt_tokens", 0),
        completion_tokens=metrics.get("total_completion_tokens", 0),
        agent_steps=metrics.get("extra", {}).get("agent_steps", 0),
        seconds=seconds,
    )


def evaluate(
    harness: Path,
    tasks: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    *,
    workers: int | None = None,
    grade_in_process: bool = True,
) -> list[TrialResult]:
    """Every task with every seed, in that order; agents run in parallel subprocesses."""
    with tempfile.TemporaryDirectory(prefix="example-bench-") as tmp:
        jobs = [(task, seed, Path(tmp) / f"{task['id']}-{seed}") for seed in seeds for task in tasks]
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2) as pool:
            return list(
                pool.map(
                    lambda job: run_trial(harness, job[0], job[1], job[2], grade_in_process=grade_in_process), jobs
                )
            )


def summarize(results: Sequence[TrialResult]) -> dict[str, float]:
    n = len(results) or 1
    return {
        "trials": len(results),
        "pass_rate": sum(r.passed for r in results) / n,
        "mean_score": sum(r.score for r in results) / n,
        "submitted_rate": sum(r.submitted for r in results) / n,
        "valid_rate": sum(r.valid_output for r in results) / n,
        "mean_prompt_tokens": sum(r.prompt_tokens for r in results) / n,
        "mean_tokens": sum(r.prompt_tokens + r.completion_tokens for r in results) / n,
        "mean_steps": sum(r.agent_steps for r in results) / n,
        "mean_seconds": sum(r.seconds for r in results) / n,
    }


def copy_harness(destination: Path, source: Path = HARNESS_DIR) -> Path:
    shutil.copytree(source, destination)
    return destination


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a harness over the offline example's tasks.")
    parser.add_argument("--harness", type=Path, default=HARNESS_DIR)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--edit", action="append", default=[], help="reference edit to apply (repeatable)")
    parser.add_argument("--split", choices=["all", "train", "gate", "sealed"], default="all")
    parser.add_argument("--per-task", action="store_true")
    options = parser.parse_args(argv)
    tasks = load_tasks()
    with tempfile.TemporaryDirectory(prefix="example-harness-") as tmp:
        harness = options.harness
        if options.edit:
            harness = copy_harness(Path(tmp) / "harness", options.harness)
            for name in options.edit:
                reference_edits.apply(name, harness, tasks=tasks)
        chosen = tasks if options.split == "all" else reference_edits.split_tasks(tasks)[options.split]
        results = evaluate(harness, chosen, options.seeds)
    print(json.dumps(summarize(results), indent=2))
    if options.per_task:
        for task in chosen:
            mine = [r for r in results if r.task_id == task["id"]]
            print(
                task["id"],
                "".join("P" if r.passed else "." for r in mine),
                task["expected"]["tool"],
                task["metadata"].get("kind"),
                task["metadata"].get("phrasing", task["metadata"].get("reason")),
                task["metadata"].get("formats", ""),
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
