"""Factories: small, real benchmarks, evaluators and experiments for tests.

The tiny evaluator is a real agent program and a real verifier run as
subprocesses: the agent answers with the text of ``answers/<task>.txt`` from
the harness when present, else with ``default.txt``, and reports usage.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Mapping
from io import StringIO
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import CommandError

from evolution.loop.certify import result_certify
from evolution.models import Candidate, Evaluation, Experiment, Tree, Trial
from evolution.services import evaluation as evaluation_services
from evolution.services.experiments import (
    TaskInput,
    benchmark_upsert,
    evaluator_upsert,
    experiment_create,
    experiment_twin,
    surface_create,
)
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry

TINY_AGENT = textwrap.dedent(
    """
    import json, pathlib, sys
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    harness, task, out = (pathlib.Path(args[k]) for k in ("--harness", "--task", "--output"))
    task_id = (task / "id.txt").read_text().strip()
    answer_file = harness / "answers" / f"{task_id}.txt"
    answer = (answer_file if answer_file.exists() else harness / "default.txt").read_text().strip()
    (out / "answer.txt").write_text(answer)
    words = len((harness / "default.txt").read_text().split()) + len((task / "instruction.md").read_text().split())
    (out / "usage.json").write_text(json.dumps({"tokens": 10 + words, "steps": 1}))
    """
)

TINY_VERIFIER = textwrap.dedent(
    """
    import json, pathlib, sys
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    out = pathlib.Path(args["--output"])
    expected = json.loads(pathlib.Path(args["--expected"]).read_text())["expected"]["answer"]
    answer_path = out / "answer.txt"
    submitted = answer_path.exists()
    answer = answer_path.read_text().strip() if submitted else None
    passed = answer == expected
    print(json.dumps({"passed": passed, "score": 1.0 if passed else 0.0,
                      "criteria": [{"id": "answer", "met": passed}],
                      "valid_output": submitted, "submitted": submitted}))
    """
)

TINY_SURFACE = """
include: ["default.txt", "answers/**", "notes/**"]
components: {"default.txt": prompt, "answers/**": memory, "notes/**": memory}
"""

_counter = itertools.count(1)


def tiny_evaluator_tree(*, agent: str = TINY_AGENT, verifier: str = TINY_VERIFIER) -> Tree:
    return tree_store(
        entries=[FileEntry("agent.py", "100644", agent.encode()), FileEntry("verify.py", "100644", verifier.encode())]
    )


def seed_of(experiment: Experiment) -> Candidate:
    """The experiment's seed candidate, which experiment_create always makes."""
    seed = experiment.seed_candidate
    assert seed is not None, f"experiment {experiment.pk} has no seed"
    return seed


def seed_id(experiment: Experiment) -> int:
    seed = experiment.seed_candidate_id
    assert seed is not None, f"experiment {experiment.pk} has no seed"
    return seed


def make_tiny_experiment(
    *,
    tasks: int = 6,
    harness: Mapping[str, str] | None = None,
    k: int = 2,
    name: str | None = None,
    split_lists: Mapping[str, list[str]] | None = None,
    like: Experiment | None = None,
    agent_network: bool = False,
    agent: str = TINY_AGENT,
) -> Experiment:
    """An experiment over ``tasks`` tasks whose expected answer is "yes" for
    even task numbers and "no" for odd ones; the default seed harness
    answers "yes" everywhere, so it passes half the tasks. With ``like``, a
    twin of that experiment (same benchmark, evaluator, seed and splits).
    ``agent_network``: the evaluator's agent keeps the host's network. ``agent``: the agent's source (the
    default answers from the harness, the same every time)."""
    number = next(_counter)
    if like is not None:
        # Same benchmark, evaluator and seed harness: records comparable with like's.
        return experiment_twin(like=like, name=name or f"tiny experiment {number}")
    benchmark = benchmark_upsert(
        name=f"tiny-{number}",
        tasks=[
            TaskInput(
                external_id=f"t{i:02d}",
                instruction=f"Answer task t{i:02d} with yes or no.",
                expected={"answer": "yes" if i % 2 == 0 else "no"},
                criteria=[{"id": "answer", "description": "the answer is right"}],
                files={"id.txt": f"t{i:02d}\n"},
            )
            for i in range(tasks)
        ],
    )
    evaluator = evaluator_upsert(
        name=f"tiny-evaluator-{number}",
        files=tiny_evaluator_tree(agent=agent),
        runner_argv=[
            "{python}",
            "{evaluator}/agent.py",
            "--harness",
            "{harness}",
            "--task",
            "{task}",
            "--output",
            "{output}",
        ],
        verifier_argv=[
            "{python}",
            "{evaluator}/verify.py",
            "--output",
            "{output}",
            "--expected",
            "{private}/expected.json",
        ],
        env_allowlist=["PATH"],
        timeout_seconds=30,
        agent_network=agent_network,
    )
    files = harness or {"default.txt": "yes\n"}
    seed_tree = tree_store(entries=[FileEntry(path, "100644", text.encode()) for path, text in files.items()])
    return experiment_create(
        name=name or f"tiny experiment {number}",
        benchmark=benchmark,
        evaluator=evaluator,
        surface=surface_create(name="tiny", spec=TINY_SURFACE),
        seed_tree=seed_tree,
        split_seed=7,
        split_ratios={"train": 0.5, "gate": 0.25, "sealed": 0.25},
        split_lists=split_lists,
        trials_per_task=k,
        run_settings={"model": "tiny", "seed": 11},
    )


def run_evaluation_inline(evaluation: Evaluation) -> None:
    """Execute every trial and the certification in this process (no worker):
    the same services the Celery tasks call, one after the other."""
    for trial_id in Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True):
        evaluation_services.trial_execute(trial_id=trial_id, owner="inline")
    result_certify(evaluation_id=evaluation.pk)
    evaluation.refresh_from_db()


def evaluate_seed_inline(experiment: Experiment, splits: tuple[str, ...] = ("train", "gate", "sealed")) -> Evaluation:
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=list(splits), purpose=Evaluation.Purpose.BASELINE
    )
    run_evaluation_inline(evaluation)
    return evaluation


def write_file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def command_run(name: str, *args: str) -> tuple[int, str]:
    """Run a management command as a user would: its exit code, and what it wrote with its error's line."""
    out = StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()
