"""Compare recipes across proposer seeds: the published effect (docs/concepts.md) told with several seeds.

``recipes_compare`` runs every recipe from the same start (a twin of the experiment per run: same benchmark,
evaluator, surface, seed harness and splits, so no run borrows another's parents) once per proposer seed,
drives each run to its end in this process (the services the workers call, as ``parity`` and
``load_example`` do; no worker or broker needed), then evaluates every final harness on the transfer splits
(sealed, held-out) with several trial seeds. Each row gives the final harness's train, gate and transfer
scores, its cost and the leaky edits the run accepted; each recipe gets the mean over seeds with a 95%
t-interval. Nothing here is tuned: the table reports what the runs measured.

A leaky edit is one the leakage critic's rules flag in the candidate's diff against its parent (the rules
rrsi runs before evaluation), applied after the fact to every recipe's accepted candidates alike.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from evolution import example, measurements, operators
from evolution.critic import build_index, critique
from evolution.loop import lifecycle, load, measure
from evolution.loop.certify import result_certify
from evolution.loop.inline import run_drive
from evolution.models import Candidate, Evaluation, Experiment, Run, SplitName
from evolution.recipes import PRESET_NAMES, Recipe, load_preset, parse_recipe, recipe_to_dict
from evolution.services import evaluation as evaluation_services
from evolution.services import proposals
from evolution.services.experiments import experiment_twin
from evolution.services.snapshots import tree_diff

__all__ = ["COLUMNS", "Comparison", "CompareError", "RunOutcome", "comparison_table", "recipes_compare"]

COLUMNS = ("train", "gate", "sealed", "held_out", "cost", "leaky_accepted")
TRANSFER_SEED_BASE = 100_000  # trial seeds of the transfer evaluations: apart from every run's own
# Two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


class CompareError(ValueError):
    pass


@dataclass(frozen=True)
class RunOutcome:
    """One run of one recipe with one proposer seed, measured at its end."""

    recipe: str
    seed: int
    run: int
    experiment: int
    status: str
    final_candidate: int | None
    accepted: int  # candidates the run accepted, the seed not counted
    leaky_accepted: int
    train: float | None
    gate: float | None
    sealed: float | None  # mean over the transfer seeds
    held_out: float | None
    cost: float | None  # policy tokens per trial on the evolve splits
    transfer_by_seed: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    experiment: int
    recipes: list[str]
    seeds: int
    rounds: int | None
    transfer_seeds: int
    start: dict[str, float | None]  # the seed harness, measured like a final harness
    runs: list[RunOutcome]

    def of(self, recipe: str) -> list[RunOutcome]:
        return [r for r in self.runs if r.recipe == recipe]

    def summary(self, recipe: str) -> dict[str, dict[str, float | None]]:
        """Per column: mean over the recipe's seeds, and the 95% t-interval (None with fewer than 2 values)."""
        result: dict[str, dict[str, float | None]] = {}
        for column in COLUMNS:
            values = [float(v) for r in self.of(recipe) if (v := getattr(r, column)) is not None]
            mean = statistics.fmean(values) if values else None
            low = high = None
            if len(values) >= 2:
                half = _t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
                low, high = mean - half if mean is not None else None, mean + half if mean is not None else None
            result[column] = {"mean": mean, "low": low, "high": high, "n": float(len(values))}
        return result

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "rounds": self.rounds,
            "seeds": self.seeds,
            "transfer_seeds": self.transfer_seeds,
            "start": self.start,
            "recipes": {
                name: {"runs": [asdict(r) for r in self.of(name)], "summary": self.summary(name)}
                for name in self.recipes
            },
        }


def _t95(df: int) -> float:
    return _T95[df - 1] if df <= len(_T95) else 1.96


def recipes_compare(
    *,
    experiment: Experiment,
    recipes: Sequence[str],
    seeds: int,
    rounds: int | None = None,
    candidates: int | None = None,
    k: int | None = None,
    proposer: str | None = None,
    transfer_seeds: int = 3,
    on_progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Run each of ``recipes`` (preset names) with proposer seeds 0..``seeds``-1, each in a twin of
    ``experiment``, and measure every final harness (see the module docstring)."""
    unknown = [name for name in recipes if name not in PRESET_NAMES]
    if unknown:
        raise CompareError(f"unknown recipe(s) {', '.join(unknown)}: expected presets ({', '.join(PRESET_NAMES)})")
    if seeds < 1 or transfer_seeds < 1:
        raise CompareError("--seeds and --transfer-seeds must be at least 1")
    if experiment.seed_candidate is None:
        raise CompareError(f"experiment {experiment.pk} has no seed harness")
    say = on_progress or (lambda text: None)
    proposer = proposer or example.preset_proposer(benchmark=experiment.benchmark.name)
    specs = {name: _recipe(name, rounds=rounds, candidates=candidates, k=k, proposer=proposer) for name in recipes}
    for spec in specs.values():
        lifecycle.check_llm_endpoints(spec)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    runs = []
    for name, spec in specs.items():
        for seed in range(seeds):
            twin = experiment_twin(like=experiment, name=f"{experiment.name} · {name} seed {seed} · {stamp}")
            run = lifecycle.run_create(experiment=twin, recipe=_seeded(spec, seed))
            say(f"{name} seed {seed}: run {run.pk} on experiment {twin.pk}")
            run = run_drive(run, max_steps=100_000)
            runs.append(_outcome(name, seed, run, transfer_seeds, spec))
            say(_row_text(runs[-1]))
    start = _start(experiment, specs, transfer_seeds)
    return Comparison(experiment.pk, list(recipes), seeds, rounds, transfer_seeds, start, runs)


def _recipe(name: str, *, rounds: int | None, candidates: int | None, k: int | None, proposer: str | None) -> Recipe:
    data = recipe_to_dict(load_preset(name))
    if rounds is not None:
        if data["edit_budget"].get("T") in (None, data["rounds"]):
            data["edit_budget"] = {**data["edit_budget"], "T": rounds}
        data["rounds"] = rounds
    if candidates is not None:
        data["candidates_per_round"] = candidates
        data["stall"] = {**data["stall"], "m_draft": min(data["stall"]["m_draft"], candidates)}
    if k is not None:
        data["evaluation"] = {**data["evaluation"], "trials_per_task": k}
    if proposer is not None:
        data["proposal"] = {"operator": proposer, "params": {}}
    return parse_recipe(data, known_operators=operators.known_operators())


def _seeded(recipe: Recipe, seed: int) -> Recipe:
    data = recipe_to_dict(recipe)
    data["seed"] = seed
    return parse_recipe(data, known_operators=operators.known_operators())


def _transfer_splits(experiment: Experiment) -> list[str]:
    return [s for s in (SplitName.SEALED, SplitName.HELDOUT) if s in experiment.split_digests]


def _transfer(candidate: Candidate, *, k: int, seeds: int, run: Run | None, metric: str) -> dict[str, list[float]]:
    """S per transfer split, one value per trial seed: each a certified evaluation of its own."""
    splits = _transfer_splits(candidate.experiment)
    by_split: dict[str, list[float]] = {s: [] for s in splits}
    if not splits:
        return by_split
    for index in range(seeds):
        evaluation = evaluation_services.evaluation_start(
            candidate=candidate,
            splits=splits,
            k=k,
            purpose=Evaluation.Purpose.TRANSFER,
            seed=TRANSFER_SEED_BASE + index,
            run=run,
        )
        for trial_id in evaluation.trials.order_by("pk").values_list("pk", flat=True):
            evaluation_services.trial_execute_in_process(trial_id=trial_id, owner="compare")
        result_certify(evaluation_id=evaluation.pk)
        evaluation.refresh_from_db()
        if evaluation.state != Evaluation.State.CERTIFIED:
            raise CompareError(f"the transfer evaluation {evaluation.pk} of #{candidate.pk} failed: {evaluation.error}")
        for split, rows in load.evaluation_split_rows(evaluation).items():
            value = measure.score(measure.totals(rows), metric)
            if value is not None:
                by_split[split].append(value)
    return by_split


def _outcome(name: str, seed: int, run: Run, transfer_seeds: int, recipe: Recipe) -> RunOutcome:
    final = run.current_candidate
    metric = recipe.evaluation.score_metric
    accepted = list(
        Candidate.objects.filter(run=run, state=Candidate.State.ACCEPTED)
        .exclude(origin=Candidate.Origin.SEED)
        .select_related("parent__tree", "tree")
    )
    leaky = _leaky(run, accepted)
    if final is None or run.status != Run.Status.FINISHED:
        return RunOutcome(
            name, seed, run.pk, run.experiment_id, run.status, None, len(accepted), leaky, None, None, None, None, None
        )
    scores = measurements.split_scores(candidate_id=final.pk, metric=metric)
    transfer = _transfer(final, k=recipe.evaluation.trials_per_task, seeds=transfer_seeds, run=run, metric=metric)
    stats = load.candidate_stats(final, list(recipe.evaluation.evolve_splits), metric)
    return RunOutcome(
        recipe=name,
        seed=seed,
        run=run.pk,
        experiment=run.experiment_id,
        status=run.status,
        final_candidate=final.pk,
        accepted=len(accepted),
        leaky_accepted=leaky,
        train=scores.get(SplitName.TRAIN),
        gate=scores.get(SplitName.GATE),
        sealed=_mean(transfer.get(SplitName.SEALED)),
        held_out=_mean(transfer.get(SplitName.HELDOUT)),
        cost=stats.cost if stats is not None and stats.cost else None,
        transfer_by_seed=transfer,
    )


def _start(experiment: Experiment, specs: dict[str, Recipe], transfer_seeds: int) -> dict[str, float | None]:
    """The seed harness measured like a final harness, in a twin of its own (evolve splits once)."""
    recipe = next(iter(specs.values()))
    twin = experiment_twin(like=experiment, name=f"{experiment.name} · compare start · {datetime.now(UTC):%H%M%S%f}")
    seed = twin.seed_candidate
    assert seed is not None
    k, metric = recipe.evaluation.trials_per_task, recipe.evaluation.score_metric
    with transaction.atomic():
        evaluation = evaluation_services.evaluation_start(
            candidate=seed, splits=list(recipe.evaluation.evolve_splits), k=k, purpose=Evaluation.Purpose.BASELINE
        )
    for trial_id in evaluation.trials.order_by("pk").values_list("pk", flat=True):
        evaluation_services.trial_execute_in_process(trial_id=trial_id, owner="compare")
    result_certify(evaluation_id=evaluation.pk)
    seed.refresh_from_db()
    rows_by_split = load.evaluation_split_rows(evaluation)
    scores = {split: measure.score(measure.totals(rows), metric) for split, rows in rows_by_split.items()}
    transfer = _transfer(seed, k=k, seeds=transfer_seeds, run=None, metric=metric)
    totals = measure.totals(row for rows in rows_by_split.values() for row in rows)
    return {
        "train": scores.get(SplitName.TRAIN),
        "gate": scores.get(SplitName.GATE),
        "sealed": _mean(transfer.get(SplitName.SEALED)),
        "held_out": _mean(transfer.get(SplitName.HELDOUT)),
        "cost": measure.cost(totals),
        "leaky_accepted": 0.0,
    }


def _leaky(run: Run, accepted: Sequence[Candidate]) -> int:
    """Accepted candidates whose diff against their parent the leakage critic's rules flag."""
    if not accepted:
        return 0
    index = build_index(proposals.evolve_tasks_for_critic(run=run))
    flagged = [
        c
        for c in accepted
        if c.parent is not None and critique(tree_diff(old=c.parent.tree, new=c.tree, binary_as_text=True), index)
    ]
    return len(flagged)


def _mean(values: Sequence[float] | None) -> float | None:
    return statistics.fmean(values) if values else None


def _fmt(value: float | None, width: int = 6, digits: int = 3) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def _row_text(r: RunOutcome) -> str:
    return (
        f"{r.recipe} seed {r.seed}: {r.status}, final #{r.final_candidate}, train {_fmt(r.train).strip()}, "
        f"gate {_fmt(r.gate).strip()}, sealed {_fmt(r.sealed).strip()}, {r.leaky_accepted} leaky accepted"
    )


def comparison_table(comparison: Comparison) -> list[str]:
    """The table ``compare_recipes`` prints: the start, each run, each recipe's mean and 95% interval."""
    columns = [c for c in COLUMNS if c != "held_out" or any(r.held_out is not None for r in comparison.runs)]
    header = f"{'recipe':<20} {'seed':>4} {'run':>5} " + " ".join(f"{c:>15}" for c in columns)
    lines = [header]

    def cell(column: str, value: float | None) -> str:
        if column == "leaky_accepted":
            return f"{value:>15.0f}" if value is not None else f"{'-':>15}"
        if column == "cost":
            return f"{value:>15.0f}" if value is not None else f"{'-':>15}"
        return f"{_fmt(value, 15)}"

    lines.append(f"{'(start)':<20} {'':>4} {'':>5} " + " ".join(cell(c, comparison.start.get(c)) for c in columns))
    for name in comparison.recipes:
        for r in comparison.of(name):
            values = " ".join(cell(c, getattr(r, c)) for c in columns)
            lines.append(f"{name:<20} {r.seed:>4} {r.run:>5} {values}")
        summary = comparison.summary(name)
        lines.append(f"{name + ' mean':<20} {'':>4} {'':>5} " + " ".join(cell(c, summary[c]["mean"]) for c in columns))

        def interval(column: str, summary: dict[str, dict[str, float | None]] = summary) -> str:
            low, high = summary[column]["low"], summary[column]["high"]
            if low is None or high is None:
                return f"{'-':>15}"
            if column in {"cost", "leaky_accepted"}:
                return f"{f'[{round(low)},{round(high)}]':>15}"  # round(): no "-0"
            return f"{f'[{low:.3f},{high:.3f}]':>15}"

        lines.append(f"{'  95% interval':<20} {'':>4} {'':>5} " + " ".join(interval(c) for c in columns))
    return lines
