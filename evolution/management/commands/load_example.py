"""Load the bundled offline example (benchmark, evaluator, surface, experiment). Idempotent."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from evolution.example.setup import EXPERIMENT_NAME, example_experiment_create, example_run_create, example_run_drive
from evolution.models import Experiment


class Command(BaseCommand):
    help = "Create the offline example: benchmark, evaluator, surface and an experiment with its seed harness."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default=EXPERIMENT_NAME, help="experiment name")
        parser.add_argument(
            "--rounds",
            type=int,
            default=0,
            help="also run the example for this many rounds of the rrsi recipe, in this process "
            "(skipped when the experiment already has a run)",
        )
        parser.add_argument("--candidates", type=int, default=3, help="candidates per round with --rounds")
        parser.add_argument("--k", type=int, default=1, help="trials per task with --rounds")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        experiment = Experiment.objects.filter(name=name).first()
        if experiment is not None:
            rest = "" if options["rounds"] > 0 else "; nothing to do"
            self.stdout.write(f"example experiment {name!r} exists (id {experiment.pk}){rest}")
        else:
            experiment = example_experiment_create(name=name)
            counts = Counter(experiment.split_memberships.values_list("split", flat=True))
            self.stdout.write(
                f"loaded example experiment {name!r} (id {experiment.pk}): {experiment.benchmark.tasks.count()} tasks "
                f"({', '.join(f'{k} {counts[k]}' for k in sorted(experiment.split_digests))}), "
                f"seed candidate {experiment.seed_candidate_id}"
            )
        if options["rounds"] <= 0:
            return
        if experiment.runs.exists():
            self.stdout.write("it already has a run; not running it again")
            return
        rounds = options["rounds"]
        run = example_run_create(experiment=experiment, rounds=rounds, candidates=options["candidates"], k=options["k"])
        self.stdout.write(f"running the example for {rounds} round(s) in this process (run {run.pk})...")
        run = example_run_drive(run, on_round=lambda number, total: self.stdout.write(f"  round {number} of {total}"))
        states = Counter(experiment.candidates.values_list("state", flat=True))
        self.stdout.write(
            f"run {run.pk} {run.status}: " + ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
        )
