"""Set up a Harbor-style benchmark folder in the database (``manage.py load_harbor_example`` calls it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from django.db import transaction

from evolution.agents import harbor
from evolution.models import Experiment
from evolution.services.experiments import (
    benchmark_from_config,
    evaluator_from_config,
    experiment_create,
    surface_create,
)
from evolution.services.snapshots import tree_import_directory, tree_store

EXAMPLE_DIR = Path(__file__).resolve().parent / "harbor_example"
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
