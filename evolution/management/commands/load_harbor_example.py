"""Load the Harbor-style worked example (benchmark, evaluator, surface, experiment). Idempotent."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from evolution.agents import harbor
from evolution.models import Experiment
from evolution.services.experiments import (
    ExperimentError,
    benchmark_from_config,
    evaluator_from_config,
    experiment_create,
    surface_create,
)
from evolution.services.snapshots import tree_import_directory, tree_store

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "agents" / "harbor_example"
EXPERIMENT_NAME = "harbor-example"


def harbor_experiment_create(*, folder: Path, name: str) -> Experiment:
    """Create the benchmark, evaluator, surface and experiment that ``folder/benchmark.toml`` describes.

    Benchmark, evaluator and surface are reused when identical (their services are
    idempotent); the experiment name must be new. All or nothing.
    """
    config = tomllib.loads((folder / "benchmark.toml").read_text())
    bench, evaluator_config = config["benchmark"], config["evaluator"]
    splits = config["splits"]
    with transaction.atomic():
        benchmark = benchmark_from_config(config=bench, tasks=harbor.read_tasks(folder / bench["tasks"]))
        evaluator = evaluator_from_config(
            config=evaluator_config,
            files=tree_store(entries=harbor.evaluator_entries(folder, evaluator_config["files"])),
        )
        return experiment_create(
            name=name,
            description=bench.get("description", ""),
            benchmark=benchmark,
            evaluator=evaluator,
            surface=surface_create(name=f"{bench['name']} surface", spec=(folder / bench["surface"]).read_text()),
            seed_tree=tree_import_directory(path=folder / bench["seed_harness"]),
            split_lists={split: splits[split] for split in ("train", "gate", "sealed") if split in splits},
            trials_per_task=int(config["trials"]["k"]),
            run_settings=config.get("run_settings", {}),
        )


class Command(BaseCommand):
    help = "Create the Harbor-style worked example: a command-line agent run by cli_runner.py on four tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default=EXPERIMENT_NAME, help="experiment name")
        parser.add_argument("--folder", type=Path, default=EXAMPLE_DIR, help="a Harbor-style benchmark folder")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        existing = Experiment.objects.filter(name=name).first()
        if existing is not None:
            self.stdout.write(f"experiment {name!r} exists (id {existing.pk}); nothing to do")
            return
        try:
            experiment = harbor_experiment_create(folder=options["folder"], name=name)
        except (harbor.HarborFolderError, ExperimentError, OSError, KeyError, tomllib.TOMLDecodeError) as exc:
            raise CommandError(f"cannot load {options['folder']}: {exc}") from exc
        counts = {
            split: experiment.split_memberships.filter(split=split).count()
            for split in sorted(experiment.split_digests)
        }
        self.stdout.write(
            f"loaded Harbor example experiment {name!r} (id {experiment.pk}): "
            f"{experiment.benchmark.tasks.count()} tasks ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
            f"seed candidate {experiment.seed_candidate_id}"
        )
