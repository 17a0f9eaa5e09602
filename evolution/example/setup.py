"""Set up the bundled example in the database: benchmark, evaluator, surface and experiment, and a first run.

``manage.py load_example`` calls these; the trust suite and the tests build their experiments with them too.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path

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

EXAMPLE_DIR = Path(__file__).resolve().parent
EXPERIMENT_NAME = "example-routing"


def read_tasks(path: Path) -> list[TaskInput]:
    """The tasks of a JSONL file, one object a line; ValueError names the line of a task missing a field."""
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


def example_experiment_create(*, name: str, task_limit: int | None = None) -> Experiment:
    """Create the example's benchmark, evaluator, surface and an experiment named ``name`` with its seed harness.

    With ``task_limit``, only the first tasks, as a benchmark of its own name (never mixed with the full one), so
    a run takes seconds. Benchmark, evaluator and surface are reused when identical (their services are
    idempotent); the experiment name must be new. All or nothing.
    """
    config = tomllib.loads((EXAMPLE_DIR / "evaluator.toml").read_text())
    bench, evaluator_config = config["benchmark"], config["evaluator"]
    tasks = read_tasks(EXAMPLE_DIR / bench["tasks"])
    if task_limit is not None:
        tasks = tasks[:task_limit]
        bench = {**bench, "name": f"{bench['name']}-first-{len(tasks)}"}
    seed_dir = EXAMPLE_DIR / bench["seed_harness"]
    harness_config = tomllib.loads((seed_dir / "config.toml").read_text())
    with transaction.atomic():
        return experiment_create(
            name=name,
            description=bench.get("description", ""),
            benchmark=benchmark_from_config(config=bench, tasks=tasks),
            evaluator=evaluator_from_config(
                config=evaluator_config, files=tree_import_directory(path=EXAMPLE_DIR / evaluator_config["files"])
            ),
            surface=surface_create(
                name=f"{config['benchmark']['name']} surface", spec=(EXAMPLE_DIR / bench["surface"]).read_text()
            ),
            seed_tree=tree_import_directory(path=seed_dir),
            split_seed=int(config["splits"]["seed"]),
            split_ratios=config["splits"]["ratios"],
            trials_per_task=int(config["trials"]["k"]),
            run_settings={"model": harness_config.get("model", ""), "seed": 0},
        )


def example_recipe(*, rounds: int, candidates: int, k: int) -> Recipe:
    """The rrsi recipe with the example proposer, sized for a first look:
    the proposer's leaky, costly and generic edits give every rule work."""
    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=rounds, candidates_per_round=candidates)
    weights = {"generic": 0.4, "leaky": 0.5, "cost": 0.1}
    data["proposal"] = {"operator": "example", "params": {"family_weights": weights}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": k}
    data["edit_budget"] = {**data["edit_budget"], "T": 6}
    return parse_recipe(data)


def example_run_create(*, experiment: Experiment, rounds: int, candidates: int, k: int) -> Run:
    """A run of ``example_recipe`` on ``experiment``, not started (``example_run_drive`` drives it)."""
    import evolution.proposers  # noqa: F401  (registers the example proposer)
    from evolution.loop import lifecycle

    return lifecycle.run_create(experiment=experiment, recipe=example_recipe(rounds=rounds, candidates=candidates, k=k))


def example_run_drive(run: Run, *, on_round: Callable[[int, int], None] | None = None) -> Run:
    """Drive ``run`` to its end in this process (no worker); ``on_round(round, rounds)`` as each round starts.

    Safe to repeat: it resumes from the state the database holds.
    """
    from evolution.services.inline import run_drive

    seen = {"round": -1}

    def progress(run: Run) -> None:
        if run.current_round != seen["round"] and 0 < run.current_round <= run.rounds:
            seen["round"] = run.current_round
            if on_round is not None:
                on_round(run.current_round, run.rounds)

    return run_drive(run, on_step=progress)
