"""Set up a Harbor-style benchmark folder in the database (``manage.py load_harbor_example`` calls it)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
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


@dataclass
class HarborTasksImport:
    experiment: Experiment
    refused: list[str]


def harbor_tasks_import(*, folder: Path, name: str, harness: Path = EXAMPLE_DIR / "harness") -> HarborTasksImport:
    """A Harbor dataset folder (one folder per task: task.toml,
    instruction.md, environment/Dockerfile, tests/) as a benchmark, an
    evaluator running the command-line agent wrapper, a surface and an
    experiment named ``name`` whose seed harness is ``harness``.

    A task whose environment cannot be rebuilt from Debian here is left out
    and named in ``refused`` with its reason; HarborFolderError when no task
    is left. All or nothing otherwise; the experiment name must be new.
    """
    tasks, refused = [], []
    if not folder.is_dir():
        raise harbor.HarborFolderError(f"{folder}: not a folder")
    for task_folder in sorted(path for path in folder.iterdir() if path.is_dir() and not path.name.startswith(".")):
        try:
            tasks.append(harbor.read_task(task_folder))
        except harbor.HarborTaskRefused as exc:
            refused.append(str(exc))
    if not tasks:
        raise harbor.HarborFolderError(f"{folder}: no task can run here ({'; '.join(refused) or 'no task folders'})")
    example = tomllib.loads((EXAMPLE_DIR / "benchmark.toml").read_text())
    evaluator_config = {**example["evaluator"], "name": f"{name}-cli-debian"}
    # Timeouts of real tasks: the longest the tasks ask for, within the platform's own cap.
    evaluator_config["timeout_seconds"] = int(max(float(t.metadata.get("agent_timeout_sec", 60)) for t in tasks))
    ids = [task.external_id for task in tasks]
    with transaction.atomic():
        benchmark = benchmark_from_config(
            config={
                "name": name,
                "title": f"{name} (Harbor tasks, Debian-built environments)",
                "description": (
                    f"{len(tasks)} Harbor tasks imported from {folder.name}; environments built from Debian packages"
                ),
            },
            tasks=tasks,
        )
        evaluator = evaluator_from_config(
            config=evaluator_config,
            files=tree_store(entries=harbor.evaluator_entries(EXAMPLE_DIR, evaluator_config["files"])),
        )
        experiment = experiment_create(
            name=name,
            description=benchmark.description,
            benchmark=benchmark,
            evaluator=evaluator,
            surface=surface_create(name=f"{name} surface", spec=(EXAMPLE_DIR / "surface.yaml").read_text()),
            seed_tree=tree_import_directory(path=harness),
            split_lists={"train": ids},
            trials_per_task=1,
            run_settings=example.get("run_settings", {}),
        )
    return HarborTasksImport(experiment=experiment, refused=refused)
