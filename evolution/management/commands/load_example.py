"""Load the bundled offline example (benchmark, evaluator, surface, experiment). Idempotent."""

from __future__ import annotations

import json
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from evolution.models import Experiment, Run
from evolution.recipes import Recipe, load_preset, parse_recipe, recipe_to_dict
from evolution.services.experiments import (
    TaskInput,
    benchmark_from_config,
    evaluator_from_config,
    experiment_create,
    surface_create,
)
from evolution.services.snapshots import tree_import_directory

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "example"
EXPERIMENT_NAME = "example-routing"


def read_tasks(path: Path) -> list[TaskInput]:
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        item = json.loads(line)
        try:
            tasks.append(
                TaskInput(
                    external_id=item["id"],
                    instruction=item["instruction"],
                    expected=item.get("expected"),
                    criteria=item.get("criteria") or [],
                    files=item.get("files") or {},
                    metadata=item.get("metadata") or {},
                )
            )
        except KeyError as exc:
            raise ValueError(f"{path}:{number}: task is missing {exc}") from exc
    return tasks


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
            experiment = self.create(name)
        if options["rounds"] > 0:
            if experiment.runs.exists():
                self.stdout.write("it already has a run; not running it again")
            else:
                self.run_rounds(experiment, rounds=options["rounds"], candidates=options["candidates"], k=options["k"])

    def run_rounds(self, experiment: Experiment, *, rounds: int, candidates: int, k: int) -> None:
        import evolution.proposers  # noqa: F401  (registers the example proposer)
        from evolution.services import loop
        from evolution.services.inline import run_drive

        run = loop.run_create(experiment=experiment, recipe=example_recipe(rounds=rounds, candidates=candidates, k=k))
        self.stdout.write(f"running the example for {rounds} round(s) in this process (run {run.pk})...")
        seen = {"round": -1}

        def progress(run: Run) -> None:
            if run.current_round != seen["round"] and 0 < run.current_round <= run.rounds:
                seen["round"] = run.current_round
                self.stdout.write(f"  round {run.current_round} of {run.rounds}")

        run = run_drive(run, on_step=progress)
        counts = Counter(experiment.candidates.values_list("state", flat=True))
        self.stdout.write(
            f"run {run.pk} {run.status}: " + ", ".join(f"{count} {state}" for state, count in sorted(counts.items()))
        )

    def create(self, name: str) -> Experiment:
        config = tomllib.loads((EXAMPLE_DIR / "evaluator.toml").read_text())
        bench = config["benchmark"]
        evaluator_config = config["evaluator"]
        with transaction.atomic():
            benchmark = benchmark_from_config(config=bench, tasks=read_tasks(EXAMPLE_DIR / bench["tasks"]))
            evaluator = evaluator_from_config(
                config=evaluator_config, files=tree_import_directory(path=EXAMPLE_DIR / evaluator_config["files"])
            )
            surface = surface_create(name=f"{bench['name']} surface", spec=(EXAMPLE_DIR / bench["surface"]).read_text())
            seed_dir = EXAMPLE_DIR / bench["seed_harness"]
            harness_config = tomllib.loads((seed_dir / "config.toml").read_text())
            experiment = experiment_create(
                name=name,
                description=bench.get("description", ""),
                benchmark=benchmark,
                evaluator=evaluator,
                surface=surface,
                seed_tree=tree_import_directory(path=seed_dir),
                split_seed=int(config["splits"]["seed"]),
                split_ratios=config["splits"]["ratios"],
                trials_per_task=int(config["trials"]["k"]),
                run_settings={"model": harness_config.get("model", ""), "seed": 0},
            )
        counts = dict.fromkeys(experiment.split_digests, 0)
        for split in experiment.split_memberships.values_list("split", flat=True):
            counts[split] += 1
        self.stdout.write(
            f"loaded example experiment {name!r} (id {experiment.pk}): {benchmark.tasks.count()} tasks "
            f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}), "
            f"seed candidate {experiment.seed_candidate_id}"
        )
        return experiment


def example_recipe(*, rounds: int, candidates: int, k: int) -> Recipe:
    """The rrsi recipe with the example proposer, sized for a first look:
    the proposer's leaky, costly and generic edits give every rule work."""
    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=rounds, candidates_per_round=candidates)
    weights = {"generic": 0.4, "leaky": 0.5, "cost": 0.1}
    data["proposal"] = {"operator": "example", "params": {"family_weights": weights}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": k}
    data["noise"] = {**data["noise"], "repeats": 2}
    data["edit_budget"] = {**data["edit_budget"], "T": 6}
    return parse_recipe(data)
