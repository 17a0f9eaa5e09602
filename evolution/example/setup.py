"""Set up the bundled example in the database: benchmark, evaluator, surface and experiment, and a first run.

``manage.py load_example`` calls these; the trust suite and the tests build their experiments with them too.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path

from django.db import transaction

from evolution.models import Evaluator, Experiment, ModelEndpoint, Run
from evolution.recipes import Recipe, load_preset, parse_recipe, recipe_to_dict
from evolution.services.experiments import (
    TaskInput,
    benchmark_from_config,
    evaluator_from_config,
    evaluator_upsert,
    experiment_create,
    surface_create,
)
from evolution.services.snapshots import tree_import_directory

EXAMPLE_DIR = Path(__file__).resolve().parent
EXPERIMENT_NAME = "example-routing"
# The agent a trial runs, by the file that names its evaluator.
AGENTS = {"scripted": "evaluator.toml", "llm": "evaluator-llm.toml"}
# The benchmarks ``load_example --benchmark`` (and the comparisons) know by name, each with the offline
# proposer whose edits it understands: this example's, and reasoning-gym's (evolution/rgym/).
BENCHMARKS = {"support-routing": "example", "reasoning-gym": "rgym"}
REASONING_GYM_EXPERIMENT = "example-reasoning-gym"


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


def example_experiment_create(*, name: str, task_limit: int | None = None, agent: str = "scripted") -> Experiment:
    """Create the example's benchmark, evaluator, surface and an experiment named ``name`` with its seed harness.

    With ``task_limit``, only the first tasks, as a benchmark of its own name (never mixed with the full one), so
    a run takes seconds. ``agent`` "llm" makes the evaluator's runner the real model's agent
    (``evaluator-llm.toml``: ``llm_agent.py`` against RSI_LLM_BASE_URL), with the endpoint's in-flight limit;
    "scripted" (the default) the offline policy. Benchmark, evaluator and surface are reused when identical
    (their services are idempotent); the experiment name must be new. All or nothing.
    """
    if agent not in AGENTS:
        raise ValueError(f"unknown agent {agent!r}; known: {', '.join(AGENTS)}")
    config = tomllib.loads((EXAMPLE_DIR / "evaluator.toml").read_text())
    agent_config = tomllib.loads((EXAMPLE_DIR / AGENTS[agent]).read_text())
    bench, evaluator_config = config["benchmark"], agent_config["evaluator"]
    tasks = read_tasks(EXAMPLE_DIR / bench["tasks"])
    if task_limit is not None:
        tasks = tasks[:task_limit]
        bench = {**bench, "name": f"{bench['name']}-first-{len(tasks)}"}
    seed_dir = EXAMPLE_DIR / bench["seed_harness"]
    harness_config = tomllib.loads((seed_dir / "config.toml").read_text())
    with transaction.atomic():
        experiment = experiment_create(
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
            split_stratify_by=str(config["splits"].get("stratify_by", "")),
            trials_per_task=int(config["trials"]["k"]),
            run_settings={"model": model_of(agent, harness_config), "seed": 0},
        )
        if "endpoint" in agent_config:
            endpoint, _ = ModelEndpoint.objects.get_or_create(
                name=agent_config["endpoint"]["name"],
                defaults={"max_in_flight": int(agent_config["endpoint"]["max_in_flight"])},
            )
            Experiment.objects.filter(pk=experiment.pk).update(endpoint=endpoint)
            experiment.endpoint = endpoint
        return experiment


def benchmark_experiment_create(
    *, benchmark: str, name: str | None = None, task_limit: int | None = None, agent: str = "scripted"
) -> Experiment:
    """An experiment on the benchmark named ``benchmark`` (a key of BENCHMARKS). ``task_limit``: for
    support-routing the first N tasks, for reasoning-gym the first N seeds of every family in every split.
    ``agent`` "llm" exists for support-routing only. ValueError for an unknown benchmark or agent."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
    if benchmark == "support-routing":
        return example_experiment_create(name=name or EXPERIMENT_NAME, task_limit=task_limit, agent=agent)
    if agent != "scripted":
        raise ValueError("the reasoning-gym benchmark has the scripted agent only")
    from evolution.rgym.setup import rgym_experiment_create

    return rgym_experiment_create(name=name or REASONING_GYM_EXPERIMENT, per_split=task_limit)


# The example's offline agent: its runner names this script (evaluator.toml), which takes the option below.
SCRIPTED_AGENT = "{evaluator}/agent.py"
RECALL_OPTION = "--case-recall-similarity"


def example_evaluator_with_recall(evaluator: Evaluator, similarity: float) -> Evaluator:
    """``evaluator`` (the example's offline agent) with the agent's ``CASE_RECALL_SIMILARITY`` set to
    ``similarity`` for every trial: the same files, the runner given ``--case-recall-similarity``, under a
    name of its own (``<name>-recall-0-6``: an evaluator is immutable, and its name in the records says which
    threshold its trials ran with). Safe to repeat. ValueError when ``evaluator`` does not run the example's
    offline agent, already sets the option, or ``similarity`` is not in (0, 1]."""
    if not 0.0 < similarity <= 1.0:
        raise ValueError(f"the case recall similarity must be in (0, 1], not {similarity!r}")
    argv = list(evaluator.runner_argv)
    if SCRIPTED_AGENT not in argv or RECALL_OPTION in argv:
        raise ValueError(
            f"a case recall similarity needs the example's offline agent ({SCRIPTED_AGENT}); evaluator "
            f"{evaluator.name!r} runs {' '.join(argv)!r}"
        )
    return evaluator_upsert(
        name=f"{evaluator.name}-recall-{similarity:g}".replace(".", "-"),
        files=evaluator.files,
        runner_argv=[*argv, RECALL_OPTION, f"{similarity:g}"],
        verifier_argv=evaluator.verifier_argv,
        env_allowlist=evaluator.env_allowlist,
        timeout_seconds=evaluator.timeout_seconds,
        limits=evaluator.limits,
        agent_network=evaluator.agent_network,
    )


def model_of(agent: str, harness_config: dict[str, object]) -> str:
    """The model a trial's agent uses: the harness's offline policy, or the endpoint's model."""
    if agent == "llm":
        return os.environ.get("RSI_LLM_MODEL", "") or "(RSI_LLM_MODEL)"
    return str(harness_config.get("model", ""))


def example_recipe(*, rounds: int, candidates: int, k: int, proposer: str = "example") -> Recipe:
    """The rrsi recipe sized for a first look. With the example proposer (the default), its leaky, costly and
    generic edits give every rule work; with ``proposer="llm"`` the model proposes and the model's critic
    reviews (LLM_PROPOSER_PARAMS, LLM_CRITIC_PARAMS: prompts and answers kept short, a CPU's minutes
    allowed), and the seed's noise band is measured from two single-trial repeats, so a run on a slice takes
    minutes."""
    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=rounds, candidates_per_round=candidates)
    if proposer == "llm":
        data["proposal"] = {"operator": "llm", "params": dict(LLM_PROPOSER_PARAMS)}
        data["critique"] = {**data["critique"], "operator": "llm", "params": dict(LLM_CRITIC_PARAMS)}
        data["noise"] = {**data["noise"], "repeats": 2, "trials_per_task": k}
    elif proposer == "rgym":
        # The scripted solver is deterministic (its seed changes no answer), so one trial a task measures it
        # and two single-trial repeats of the seed show its noise band (zero).
        data["proposal"] = {"operator": "rgym", "params": {}}
        data["noise"] = {**data["noise"], "repeats": 2, "trials_per_task": k}
    else:
        weights = {"generic": 0.4, "leaky": 0.5, "cost": 0.1}
        data["proposal"] = {"operator": "example", "params": {"family_weights": weights}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": k}
    data["edit_budget"] = {**data["edit_budget"], "T": 6}
    return parse_recipe(data)


# The LLM operators' params in the example's LLM recipe: a small model on one CPU thread reads about a hundred
# prompt tokens a second and writes about thirty, so prompts are kept short and answers bounded.
LLM_PROPOSER_PARAMS = {
    # llama.cpp's server holds the answer to the proposer's schema: a 135M model writes edits, not prose.
    "json_schema": "llama.cpp",
    "timeout_seconds": 600,
    "max_retries": 2,
    "max_tokens": 600,
    "max_evidence": 4,
    "max_message_chars": 400,
}
LLM_CRITIC_PARAMS = {
    "timeout_seconds": 600,
    "max_retries": 2,
    "max_tokens": 300,
    "max_task_chars": 300,
    "max_diff_chars": 8000,
}


def example_run_create(
    *, experiment: Experiment, rounds: int, candidates: int, k: int, proposer: str = "example"
) -> Run:
    """A run of ``example_recipe`` on ``experiment``, not started (``example_run_drive`` drives it)."""
    import evolution.proposers  # noqa: F401  (registers the example and reasoning-gym proposers)
    from evolution.loop import lifecycle

    recipe = example_recipe(rounds=rounds, candidates=candidates, k=k, proposer=proposer)
    return lifecycle.run_create(experiment=experiment, recipe=recipe)


def example_run_drive(run: Run, *, on_round: Callable[[int, int], None] | None = None) -> Run:
    """Drive ``run`` to its end in this process (no worker); ``on_round(round, rounds)`` as each round starts.

    Safe to repeat: it resumes from the state the database holds.
    """
    from evolution.loop.inline import run_drive

    seen = {"round": -1}

    def progress(run: Run) -> None:
        if run.current_round != seen["round"] and 0 < run.current_round <= run.rounds:
            seen["round"] = run.current_round
            if on_round is not None:
                on_round(run.current_round, run.rounds)

    return run_drive(run, on_step=progress)
