"""Load the bundled offline example (benchmark, evaluator, surface, experiment), and run it. Idempotent."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.example.setup import (
    AGENTS,
    BENCHMARKS,
    EXPERIMENT_NAME,
    REASONING_GYM_EXPERIMENT,
    benchmark_experiment_create,
    example_run_create,
    example_run_drive,
)
from evolution.loop.enqueue import advance_after_commit
from evolution.loop.lifecycle import LoopError
from evolution.models import RUN_MOVING, Experiment, Run

ACTIVE = RUN_MOVING
# The slice a real model's run takes on a CPU in minutes (docs/llm.md).
LLM_TASKS = 6


class Command(BaseCommand):
    help = "Create the offline example: benchmark, evaluator, surface and an experiment with its seed harness."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--benchmark",
            choices=sorted(BENCHMARKS),
            default="support-routing",
            help="support-routing (the bundled example, default) or reasoning-gym (questions drawn from the "
            "reasoning-gym package's generators, splits by seed range; docs/loop.md)",
        )
        parser.add_argument(
            "--agent",
            choices=sorted(AGENTS),
            default="scripted",
            help="the trials' agent: the offline scripted policy (default), or a real model at RSI_LLM_BASE_URL "
            "(llm_agent.py), which the model's proposer and critic then evolve (docs/llm.md)",
        )
        parser.add_argument(
            "--name", default=None, help=f"experiment name (default {EXPERIMENT_NAME!r}, with --agent llm '-llm' added)"
        )
        parser.add_argument(
            "--tasks",
            type=int,
            default=None,
            help=f"only the first N tasks, as a benchmark of their own (default: all; with --agent llm {LLM_TASKS}); "
            "with --benchmark reasoning-gym the first N seeds of every family in every split",
        )
        parser.add_argument(
            "--rounds",
            type=int,
            default=0,
            help="also run the example for this many rounds of the rrsi recipe; a run of the example that was "
            "interrupted is continued instead, and one that has ended is left as it is",
        )
        parser.add_argument(
            "--through-workers",
            action="store_true",
            help="with --rounds: start (or continue) the run and leave its rounds to the Celery workers, which take "
            "its messages from the broker when they start; without it the rounds run in this process",
        )
        parser.add_argument(
            "--candidates", type=int, default=None, help="candidates per round with --rounds (default 3; llm 1)"
        )
        parser.add_argument("--k", type=int, default=1, help="trials per task with --rounds")

    def handle(self, *args: Any, **options: Any) -> None:
        agent, benchmark = options["agent"], options["benchmark"]
        llm = agent == "llm"
        if llm and benchmark != "support-routing":
            raise CommandError(f"--agent llm runs on the support-routing benchmark only, not {benchmark}")
        default_name = EXPERIMENT_NAME if benchmark == "support-routing" else REASONING_GYM_EXPERIMENT
        name = options["name"] or (f"{default_name}-llm" if llm else default_name)
        tasks = options["tasks"] if options["tasks"] is not None else (LLM_TASKS if llm else None)
        candidates = options["candidates"] or (1 if llm else 3)
        if (tasks is not None and tasks < 1) or candidates < 1 or options["k"] < 1:
            raise CommandError("--tasks, --candidates and --k must be at least 1")
        experiment = Experiment.objects.filter(name=name).first()
        if experiment is not None:
            rest = "" if options["rounds"] > 0 else "; nothing to do"
            self.stdout.write(f"example experiment {name!r} exists (id {experiment.pk}){rest}")
        else:
            try:
                experiment = benchmark_experiment_create(benchmark=benchmark, name=name, task_limit=tasks, agent=agent)
            except ValueError as exc:  # e.g. reasoning-gym not installed: it says how to install it
                raise CommandError(str(exc)) from exc
            counts = Counter(experiment.split_memberships.values_list("split", flat=True))
            self.stdout.write(
                f"loaded example experiment {name!r} (id {experiment.pk}): {experiment.benchmark.tasks.count()} tasks "
                f"({', '.join(f'{k} {counts[k]}' for k in sorted(experiment.split_digests))}), "
                f"seed candidate {experiment.seed_candidate_id}"
            )
        if options["rounds"] <= 0:
            return
        through_workers = options["through_workers"]
        where = "through the workers" if through_workers else "in this process"
        # The example's own run is its first; later runs are a person's, started from the screens.
        run = experiment.runs.order_by("pk").first()
        if run is None:
            rounds = options["rounds"]
            try:
                run = example_run_create(
                    experiment=experiment,
                    rounds=rounds,
                    candidates=candidates,
                    k=options["k"],
                    proposer="llm" if llm else BENCHMARKS[benchmark],
                )
            except LoopError as exc:  # e.g. --agent llm with no endpoint configured: it says which variables
                raise CommandError(f"the example's run was not started: {exc}") from exc
            self.stdout.write(f"started the example's run {run.pk}: {rounds} round(s) {where}")
        elif run.status in ACTIVE:
            # Interrupted midway (the previous start was stopped): every step resumes from the database.
            self.stdout.write(
                f"continuing the example's run {run.pk}, interrupted at round {max(run.current_round, 1)} of "
                f"{run.rounds}, {where}"
            )
            if through_workers:
                advance_after_commit(run.pk)
        else:
            reason = f" ({run.stop_reason})" if run.stop_reason else ""
            hint = "; resume it from the dashboard" if run.status == Run.Status.PAUSED else ""
            self.stdout.write(f"the example's run {run.pk} is {run.get_status_display().lower()}{reason}{hint}")
            return
        if through_workers:
            return
        run = example_run_drive(run, on_round=lambda number, total: self.stdout.write(f"  round {number} of {total}"))
        states = Counter(experiment.candidates.values_list("state", flat=True))
        self.stdout.write(
            f"run {run.pk} {run.status}: " + ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
        )
