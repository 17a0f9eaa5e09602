"""Parity: an evaluator's commands run directly and through the platform, compared.

The protocol (docs/concepts.md, section 6, trust properties): per iteration,
run every trial directly (A), then through the platform (P), then directly
again (B), with the same trial seeds; ``evolution.parity`` compares the outcomes. Iteration i uses
the evaluation seed the platform gives repeat i (the experiment's seed + i).

*Direct* is the evaluator's runner and verifier on the candidate's files, the
task's public input and the evaluator's files materialized once into a
scratch folder, through ``evolution.trials.run_trial`` (the process plumbing:
placeholders, environment allowlist plus ``RSI_SEED``/``RSI_TRIAL_INDEX``,
limits, sandbox), with the evaluator's own timeout. No database rows, no
queue, no leases.

*Platform* is a real evaluation: ``evaluation_start`` makes the trial rows
and their seeds, and every trial goes through ``trial_execute``, the function
the worker's ``evolution.trial_run`` task calls (claim, materialize from the
database, run, finish), in this process, one after the other. It all happens
inside one transaction that is rolled back once the outcomes are read: the
candidate's state, the run's records and the broker are left as they were
(the messages ``evaluation_start`` enqueues on commit are never sent). So
the command works on a fresh checkout with the embedded broker and no worker.
What it does not exercise: the broker, a worker process's own environment
(``env_allowlist`` is read from this process's), and certification (which
reads the stored outcomes and does not change them).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from evolution import parity
from evolution.models import Candidate, Evaluator, Experiment, ParityCheck, SplitMembership, Task, Trial
from evolution.sandbox import Limits
from evolution.services import evaluation as evaluation_services
from evolution.services.records import evaluator_config_digest
from evolution.services.snapshots import tree_materialize
from evolution.trials import TrialSpec, run_trial

PLATFORM_OWNER = "parity"
Progress = Callable[[str], None]


class ParityError(ValueError):
    """The check cannot start: an unknown candidate, a split the experiment lacks, a bad count."""


@dataclass(frozen=True)
class _Plan:
    experiment: Experiment
    candidate: Candidate
    evaluator: Evaluator
    splits: list[str]
    k: int
    tasks: list[Task]
    base_seed: int


def parity_check(
    *,
    experiment: Experiment,
    candidate: Candidate | None = None,
    iterations: int = 3,
    splits: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> ParityCheck:
    """Run the protocol ``iterations`` times and store the result as a ParityCheck.

    ``candidate`` defaults to the experiment's seed, ``splits`` to all of the
    experiment's. Raises ParityError before running anything when the input is
    unusable. Safe to repeat: each call is a new check and leaves nothing
    else behind.
    """
    plan = _plan(experiment=experiment, candidate=candidate, iterations=iterations, splits=splits)
    say = progress or (lambda _message: None)
    triples: list[tuple[dict[parity.TrialKey, str], ...]] = []
    seconds = {"direct": 0.0, "platform": 0.0}
    for iteration in range(iterations):
        seed = plan.base_seed + iteration
        runs = []
        for leg in ("direct A", "platform", "direct B"):
            say(f"iteration {iteration + 1} of {iterations} (seed {seed}): {leg}")
            started = time.monotonic()
            runs.append(_platform_run(plan, iteration) if leg == "platform" else _direct_run(plan, seed))
            seconds["platform" if leg == "platform" else "direct"] += time.monotonic() - started
        triples.append((runs[0], runs[1], runs[2]))
    report = parity.parity_compare([(a, p, b) for a, p, b in triples])
    numbers = {
        "experiment": plan.experiment.pk,
        "experiment_name": plan.experiment.name,
        "candidate": plan.candidate.pk,
        "evaluator": plan.evaluator.name,
        "evaluator_id": plan.evaluator.pk,
        "splits": plan.splits,
        "k": plan.k,
        "tasks_per_run": len(plan.tasks),
        "trials_per_run": len(plan.tasks) * plan.k,
        "iterations": iterations,
        "seeds": [plan.base_seed + i for i in range(iterations)],
        "platform": "in-process, rolled back",
        **report.as_dict(),
        "seconds": {name: round(value, 2) for name, value in seconds.items()},
    }
    for run, seed in zip(numbers["runs"], numbers["seeds"], strict=True):
        run["seed"] = seed
    return ParityCheck.objects.create(
        evaluator=plan.evaluator,
        evaluator_digest=evaluator_config_digest(plan.evaluator),
        experiment=plan.experiment,
        candidate=plan.candidate,
        iterations=iterations,
        numbers=numbers,
        verdict=ParityCheck.Verdict.PASS if report.passed else ParityCheck.Verdict.FAIL,
    )


def _plan(
    *, experiment: Experiment, candidate: Candidate | None, iterations: int, splits: Sequence[str] | None
) -> _Plan:
    if iterations < 1:
        raise ParityError("iterations must be at least 1")
    if candidate is None:
        candidate = experiment.seed_candidate
        if candidate is None:
            raise ParityError(f"experiment {experiment.pk} has no seed candidate; name one with --candidate")
    elif candidate.experiment_id != experiment.pk:
        raise ParityError(
            f"candidate {candidate.pk} belongs to experiment {candidate.experiment_id}, not {experiment.pk}"
        )
    if candidate.state not in evaluation_services.EVALUABLE_STATES:
        raise ParityError(f"candidate {candidate.pk} is {candidate.state}; the platform does not evaluate it")
    chosen = sorted(splits) if splits else sorted(experiment.split_digests)
    unknown = sorted(set(chosen) - set(experiment.split_digests))
    if unknown or not chosen:
        raise ParityError(f"experiment {experiment.pk} has no split(s) {', '.join(unknown) or '(none)'}")
    tasks = [
        membership.task
        for membership in SplitMembership.objects.filter(experiment=experiment, split__in=chosen)
        .select_related("task__public_files")
        .order_by("split", "task__external_id")
    ]
    if not tasks:
        raise ParityError(f"experiment {experiment.pk} has no tasks in {', '.join(chosen)}")
    return _Plan(
        experiment=experiment,
        candidate=candidate,
        evaluator=experiment.evaluator,
        splits=chosen,
        k=experiment.trials_per_task,
        tasks=tasks,
        # What evaluation_start uses when no seed is given: repeat i adds i.
        base_seed=int(experiment.run_settings.get("seed", 0)),
    )


def _scratch() -> Path:
    # As trial_execute makes its folder: traversable (not listable), so the
    # unprivileged trial user of a root process reaches its workspace.
    settings.RSI_WORK_DIR.mkdir(mode=0o711, parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="parity-", dir=settings.RSI_WORK_DIR))
    root.chmod(0o711)
    return root


def _direct_run(plan: _Plan, seed: int) -> dict[parity.TrialKey, str]:
    """Every trial of the plan, run directly with evaluation seed ``seed``."""
    evaluator = plan.evaluator
    root = _scratch()
    try:
        harness, evaluator_dir = root / "harness", root / "evaluator"
        tree_materialize(tree=plan.candidate.tree, dest=harness)
        tree_materialize(tree=evaluator.files, dest=evaluator_dir)
        outcomes: dict[parity.TrialKey, str] = {}
        for number, task in enumerate(plan.tasks):
            task_dir = root / "tasks" / str(number)
            if task.public_files is not None:
                tree_materialize(tree=task.public_files, dest=task_dir)
            task_dir.mkdir(parents=True, exist_ok=True)
            (task_dir / "instruction.md").write_text(task.instruction)
            for index in range(plan.k):
                trial_seed = evaluation_services.trial_seed(seed, task.external_id, index)
                spec = TrialSpec(
                    harness_dir=harness,
                    task_dir=task_dir,
                    evaluator_dir=evaluator_dir,
                    private={"expected": task.expected, "criteria": task.criteria},
                    runner_argv=list(evaluator.runner_argv),
                    verifier_argv=list(evaluator.verifier_argv),
                    env_allowlist=list(evaluator.env_allowlist),
                    extra_env={"RSI_SEED": str(trial_seed), "RSI_TRIAL_INDEX": str(index)},
                    timeout_seconds=float(evaluator.timeout_seconds),
                    limits=Limits.from_dict(evaluator.limits),
                    seed=trial_seed,
                    trial_index=index,
                    sandbox_mode=settings.RSI_SANDBOX,
                    python=settings.RSI_PYTHON,
                    agent_network=evaluator.agent_network,
                )
                outcomes[(task.external_id, index)] = run_trial(spec, work_root=root / "trials").outcome
        return outcomes
    finally:
        shutil.rmtree(root, ignore_errors=True)


class _RolledBack(Exception):
    """Leaves the platform leg's transaction without committing it."""


def _platform_run(plan: _Plan, iteration: int) -> dict[parity.TrialKey, str]:
    """Every trial of the plan through the platform's services, then rolled back."""
    outcomes: dict[parity.TrialKey, str] = {}
    try:
        with transaction.atomic():
            try:
                evaluation = evaluation_services.evaluation_start(
                    candidate=plan.candidate, splits=plan.splits, k=plan.k, repeat=iteration
                )
            except evaluation_services.EvaluationError as exc:
                # The candidate moved on meanwhile (a run is certifying it, say): no platform leg to compare.
                raise ParityError(f"the platform refused to evaluate candidate {plan.candidate.pk}: {exc}") from exc
            trial_ids = Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True)
            for trial_id in list(trial_ids):
                evaluation_services.trial_execute_in_process(trial_id=trial_id, owner=PLATFORM_OWNER)
            for task_id, index, outcome, state in Trial.objects.filter(evaluation=evaluation).values_list(
                "task__external_id", "index", "outcome", "state"
            ):
                # A trial the platform left unfinished is not a result: an error, as the platform would report it.
                outcomes[(task_id, index)] = outcome if state in (Trial.State.DONE, Trial.State.ERROR) else "error"
            raise _RolledBack
    except _RolledBack:
        pass
    return outcomes


def parity_json(check: ParityCheck) -> str:
    return json.dumps({"parity_check": check.pk, **check.numbers}, indent=2, sort_keys=False)


def verdict_text(passed: bool) -> str:
    if passed:
        return "the platform adds no disagreement beyond what direct runs show among themselves"
    return "the platform adds disagreement beyond what direct runs show among themselves"


def parity_table(numbers: dict[str, Any]) -> list[str]:
    """The command's table, from a check's numbers."""

    def rate(cell: dict[str, Any]) -> str:
        value = "-" if cell["rate"] is None else f"{100 * cell['rate']:.1f}%"
        return f"{cell['disagree']:>5} of {cell['of']:<5} {value:>7}"

    def odd(level: dict[str, Any]) -> str:
        return f"{level['platform_odd']:>5} of {level['discordant']:<5} {'p=' + format(level['p_value'], '.3f'):>7}"

    trials, tasks = numbers["trials"], numbers["tasks"]
    lines = [
        f"parity of evaluator {numbers['evaluator']} on experiment {numbers['experiment']} "
        f"({numbers['experiment_name']}), candidate {numbers['candidate']}",
        f"splits {', '.join(numbers['splits'])}: {numbers['tasks_per_run']} tasks x k={numbers['k']} = "
        f"{numbers['trials_per_run']} trials a run; {numbers['iterations']} iteration(s) of direct A, platform, "
        f"direct B; seeds {', '.join(str(s) for s in numbers['seeds'])}",
        "",
        f"{'':22}{'trials disagreeing':<24}{'tasks disagreeing'}",
        f"{'direct vs direct':22}{rate(trials['direct_vs_direct']):<24}{rate(tasks['direct_vs_direct'])}",
        f"{'platform vs direct':22}{rate(trials['platform_vs_direct']):<24}{rate(tasks['platform_vs_direct'])}",
        f"{'platform odd one out':22}{odd(trials):<24}{odd(tasks)}",
        "",
        "outcomes per run (pass/fail/error):",
    ]
    for number, run in enumerate(numbers["runs"]):
        cells = [f"{name} {c['pass']}/{c['fail']}/{c['error']}" for name, c in _legs(run)]
        lines.append(f"  iteration {number + 1} (seed {run['seed']}): " + "; ".join(cells))
    lines += [
        f"time: direct {numbers['seconds']['direct']:.1f} s, platform {numbers['seconds']['platform']:.1f} s "
        f"(platform trials {numbers['platform']})",
        "",
        f"verdict: {numbers['verdict']}: {verdict_text(numbers['verdict'] == 'pass')}",
        f"rule: fail when, among the trials (or tasks) where one run of three differs, the platform is that run "
        f"more often than chance (1 in 3) allows: one-sided binomial p < {numbers['level_alpha']:g} at either level",
    ]
    return [line.rstrip() for line in lines]


def _legs(run: dict[str, Any]) -> list[tuple[str, dict[str, int]]]:
    return [("direct A", run["direct_a"]), ("platform", run["platform"]), ("direct B", run["direct_b"])]
