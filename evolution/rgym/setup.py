"""Set up the reasoning-gym benchmark in the database: its tasks, evaluator, surface and an experiment.

Tasks are drawn here from the installed reasoning-gym package (``benchmark.toml`` names the families and
the seed range of every split); nothing is downloaded. ``manage.py load_example --benchmark reasoning-gym``
calls ``rgym_experiment_create``.
"""

from __future__ import annotations

from django.db import transaction

from evolution.models import Experiment
from evolution.rgym.tasks import RGYM_DIR, SPLIT_NAMES, Drawn, config_read, package_version, tasks_by_split
from evolution.services.experiments import (
    TaskInput,
    benchmark_from_config,
    evaluator_from_config,
    experiment_create,
    surface_create,
)
from evolution.services.snapshots import tree_import_directory

EXPERIMENT_NAME = "example-reasoning-gym"


def rgym_experiment_create(*, name: str = EXPERIMENT_NAME, per_split: int | None = None) -> Experiment:
    """Create the benchmark, its held-out benchmark, the evaluator, the
    surface and an experiment named ``name`` whose splits are the seed ranges of ``benchmark.toml``.

    ``per_split``: only the first N seeds of each family in each split, as benchmarks of their own names.
    Benchmark, evaluator and surface are reused when identical; the experiment name must be new. All or
    nothing.
    """
    version = package_version()  # first: it says how to install the package when it is missing
    config = config_read()
    by_split = {s: [_input(t) for t in items] for s, items in tasks_by_split(config, per_split=per_split).items()}
    # The name compare_recipes --benchmark finds; the version is in every task's expected data (so in the
    # split digests) and in the title.
    suffix = f"-{per_split}-per-split" if per_split is not None else ""
    bench = {
        **config.benchmark,
        "name": f"{config.benchmark['name']}{suffix}",
        "title": f"{config.benchmark['title']} {version}",
    }
    heldout_bench = {
        "name": f"{config.benchmark['name']}-heldout{suffix}",
        "title": f"reasoning-gym held-out families ({', '.join(config.heldout_families)})",
    }
    lists = {split: [t.external_id for t in by_split[split]] for split in SPLIT_NAMES}
    with transaction.atomic():
        return experiment_create(
            name=name,
            description=bench.get("description", ""),
            benchmark=benchmark_from_config(config=bench, tasks=[t for s in SPLIT_NAMES for t in by_split[s]]),
            heldout=[benchmark_from_config(config=heldout_bench, tasks=by_split.get("heldout", []))],
            evaluator=evaluator_from_config(
                config=config.evaluator, files=tree_import_directory(path=RGYM_DIR / config.evaluator["files"])
            ),
            surface=surface_create(
                name=f"{config.benchmark['name']} surface", spec=(RGYM_DIR / bench["surface"]).read_text()
            ),
            seed_tree=tree_import_directory(path=RGYM_DIR / bench["seed_harness"]),
            split_lists=lists,
            trials_per_task=config.k,
            run_settings={"model": "rgym-scripted-v1", "seed": 0, "reasoning_gym": version},
        )


def _input(task: Drawn) -> TaskInput:
    return TaskInput(
        external_id=task.external_id,
        instruction=task.instruction,
        expected=task.expected,
        criteria=task.criteria,
        metadata=task.metadata,
    )
