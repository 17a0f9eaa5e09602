"""Score a harness of the reasoning-gym benchmark on every split, outside the platform (no database).

    python -m evolution.rgym.bench [--edit NAME ...] [--memorize-sealed] [--per-family]

Draws the tasks of ``benchmark.toml`` from the installed package, runs the agent (``evaluator/agent.py``)
on each in a temporary directory and grades its answer with reasoning-gym's ``score_answer``, as the
platform's verifier does, in one process (the platform runs each in its own sandbox). ``--edit`` applies
the proposer's edits (``evolution.rgym.proposer.EDITS``) to the seed harness in order, with the train
tasks as evidence. ``--memorize-sealed`` (a broken mechanism, for the story test's counter-check) also
gives the memorizing edit the sealed answers. Prints one line per split: mean score, pass rate and tokens
per trial.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from evolution.operators import TrialEvidence
from evolution.rgym import proposer
from evolution.rgym.tasks import RGYM_DIR, Drawn, config_read, tasks_by_split


def _agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rgym_agent", RGYM_DIR / "evaluator" / "agent.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seed_files() -> dict[str, str]:
    root = RGYM_DIR / "harness"
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*")) if p.is_file()}


def evidence_of(tasks: Iterable[Drawn]) -> list[TrialEvidence]:
    """Tasks as the proposer's evidence (instruction and expected data; the outcome does not matter here)."""
    return [
        TrialEvidence(
            task_id=t.external_id,
            instruction=t.instruction,
            index=0,
            passed=False,
            score=0.0,
            criteria=[],
            error="",
            trajectory=[],
            expected=t.expected,
        )
        for t in tasks
    ]


def harness_with(edits: Sequence[str], evidence: Sequence[TrialEvidence]) -> dict[str, str]:
    files = seed_files()
    for name in edits:
        files = proposer.edit_apply(name, files, evidence)
    return files


@dataclass(frozen=True)
class SplitScore:
    split: str
    trials: int
    score: float
    passed: float
    tokens: float
    by_family: Mapping[str, float]


def score(files: Mapping[str, str], tasks: Sequence[Drawn], *, split: str = "") -> SplitScore:
    """Run the agent with harness ``files`` on ``tasks`` and grade each answer with reasoning-gym."""
    import reasoning_gym

    agent = _agent()
    scores: list[float] = []
    tokens: list[int] = []
    family_scores: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="rgym-bench-") as tmp:
        harness = Path(tmp) / "harness"
        for path, text in files.items():
            (harness / path).parent.mkdir(parents=True, exist_ok=True)
            (harness / path).write_text(text, encoding="utf-8")
        for number, task in enumerate(tasks):
            task_dir, output = Path(tmp) / f"task{number}", Path(tmp) / f"out{number}"
            task_dir.mkdir()
            (task_dir / "instruction.md").write_text(task.instruction, encoding="utf-8")
            result = agent.run(harness, task_dir, output, 0)
            expected = task.expected
            value = float(reasoning_gym.get_score_answer_fn(expected["family"])(result["answer"], expected["entry"]))
            scores.append(value)
            family_scores.setdefault(expected["family"], []).append(value)
            trajectory = agent.json.loads((output / "trajectory.json").read_text())
            final = trajectory["final_metrics"]
            tokens.append(final["total_prompt_tokens"] + final["total_completion_tokens"])
    n = max(1, len(scores))
    return SplitScore(
        split=split,
        trials=len(scores),
        score=sum(scores) / n,
        passed=sum(s >= 1.0 for s in scores) / n,
        tokens=sum(tokens) / n,
        by_family={f: sum(v) / len(v) for f, v in sorted(family_scores.items())},
    )


def measure(edits: Sequence[str], *, memorize_sealed: bool = False) -> dict[str, SplitScore]:
    tasks = tasks_by_split(config_read())
    evidence = evidence_of(tasks["train"] + (tasks["sealed"] if memorize_sealed else []))
    files = harness_with(edits, evidence)
    return {split: score(files, items, split=split) for split, items in tasks.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--edit", action="append", default=[], choices=sorted(proposer.EDITS_BY_NAME))
    parser.add_argument("--memorize-sealed", action="store_true")
    parser.add_argument("--per-family", action="store_true")
    options = parser.parse_args(argv)
    results = measure(options.edit, memorize_sealed=options.memorize_sealed)
    print(f"harness: seed{''.join(' + ' + e for e in options.edit)}")
    for split, result in results.items():
        print(
            f"  {split:8} {result.trials:3} trials  score {result.score:.3f}  passed {result.passed:.3f}  "
            f"tokens/trial {result.tokens:,.0f}"
        )
        if options.per_family:
            for family, value in result.by_family.items():
                print(f"      {family:18} {value:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
