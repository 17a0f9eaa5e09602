"""Compare recipes across proposer seeds and split draws: the published effect (docs/concepts.md) told with
several seeds, measured so that a reviewer can rerun it.

``recipes_compare`` runs every recipe from the same start (a twin of the experiment per run: same benchmark,
evaluator, surface and seed harness, so no run borrows another's parents) once per proposer seed and split draw
(draw 0 keeps the experiment's splits, draw d cuts its ratios with split seed + d). The runs go through the
trial workers like any other run (``run_create`` sends their first step; a worker drives them), and so do the
transfer evaluations: this process starts them and waits for the records. ``inline`` drives everything in this
process instead (no worker needed), and a worker that runs meanwhile takes some trials, which changes nothing:
both ways wait for each evaluation's certification, never read one still running.

Each accepted candidate (and the start) is evaluated on the transfer splits (sealed, held-out) with several
trial seeds. Each row gives the final harness's train, gate and transfer scores, its cost and the leaky edits the
run accepted, judged two ways: by the leakage critic's rules (the ones rrsi runs before evaluation) and by a rule
the critic does not use, sealed transfer: an accepted edit that raised its parent's evolve score while its
sealed score did not rise. Each recipe gets the mean over its runs with a 95% t-interval, and every other
recipe the paired difference against the first one (paired by seed and split draw). Nothing here is tuned: the
table reports what the runs measured.
"""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from evolution import example, measurements, operators
from evolution.critic import build_index, critique
from evolution.example.setup import example_evaluator_with_recall
from evolution.loop import lifecycle, load, measure, regularization
from evolution.loop.certify import result_certify
from evolution.loop.inline import run_drive
from evolution.loop.state import RunState
from evolution.models import (
    RUN_UNFINISHED,
    Candidate,
    Evaluation,
    Evaluator,
    Experiment,
    GateDecision,
    LedgerEntry,
    RecipeComparison,
    Run,
    SplitName,
    Trial,
)
from evolution.recipes import PRESET_NAMES, Recipe, load_preset, parse_recipe, recipe_to_dict, run_recipe
from evolution.services import evaluation as evaluation_services
from evolution.services import proposals
from evolution.services.experiments import experiment_twin
from evolution.services.snapshots import tree_diff

__all__ = [
    "COLUMNS",
    "Comparison",
    "CompareError",
    "RunOutcome",
    "comparison_table",
    "comparisons_reap",
    "recipes_compare",
    "rules_fired",
    "t_interval",
]

COLUMNS = ("train", "gate", "sealed", "held_out", "cost", "leaky_accepted", "leaky_by_transfer")
TRANSFER_SEED_BASE = 100_000  # trial seeds of the transfer evaluations: apart from every run's own
POLL_SECONDS = 1.0
HEARTBEAT_SECONDS = 15.0  # how often a running comparison writes that its command is alive
# Two-sided 95% Student t quantiles by degrees of freedom (1..30); 1.96 beyond.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


class CompareError(ValueError):
    pass


@dataclass(frozen=True)
class EditTransfer:
    """One accepted edit judged by sealed transfer: its parent's and its own evolve and sealed S."""

    candidate: int
    parent: int
    evolve_gain: float | None  # S on the evolve splits, the candidate's minus its parent's
    sealed_gain: float | None  # mean sealed S over the transfer seeds, the candidate's minus its parent's
    critic_flagged: bool

    @property
    def leaky(self) -> bool:
        """Raised the evolve score while sealed did not rise: a gain that does not transfer."""
        return (
            self.evolve_gain is not None
            and self.sealed_gain is not None
            and self.evolve_gain > 0
            and self.sealed_gain <= 0
        )


@dataclass(frozen=True)
class RunOutcome:
    """One run of one recipe with one proposer seed on one split draw, measured at its end."""

    recipe: str
    seed: int
    run: int
    experiment: int
    status: str
    final_candidate: int | None
    accepted: int  # candidates the run accepted, the seed not counted
    leaky_accepted: int  # flagged by the critic's rules
    train: float | None
    gate: float | None
    sealed: float | None  # mean over the transfer seeds
    held_out: float | None
    cost: float | None  # policy tokens per trial on the evolve splits
    transfer_by_seed: dict[str, list[float]] = field(default_factory=dict)
    split_draw: int = 0
    leaky_by_transfer: int | None = None  # accepted edits whose gain did not transfer to sealed
    edits: list[EditTransfer] = field(default_factory=list)
    rules: dict[str, int] = field(default_factory=dict)  # how often each regularizer fired (loop.rules_fired)


def t_interval(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and two-sided 95% Student t interval of ``values`` (no interval with fewer than 2)."""
    mean = statistics.fmean(values) if values else None
    low = high = None
    if mean is not None and len(values) >= 2:
        half = _t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
        low, high = mean - half, mean + half
    return {"mean": mean, "low": low, "high": high, "n": float(len(values))}


@dataclass(frozen=True)
class Comparison:
    experiment: int
    recipes: list[str]
    seeds: int
    rounds: int | None
    transfer_seeds: int
    start: dict[str, float | None]  # the seed harness on split draw 0, measured like a final harness
    runs: list[RunOutcome]
    seed_start: int = 0
    split_seeds: int = 1
    starts: dict[int, dict[str, float | None]] = field(default_factory=dict)  # by split draw
    record: int | None = None  # the RecipeComparison that stores it
    case_recall_similarity: float | None = None  # the example agent's threshold (None: the agent's own)

    def of(self, recipe: str, draw: int | None = None) -> list[RunOutcome]:
        return [r for r in self.runs if r.recipe == recipe and (draw is None or r.split_draw == draw)]

    def summary(self, recipe: str, draw: int | None = None) -> dict[str, dict[str, float | None]]:
        """Per column: mean over the recipe's runs (of one split draw, or all), and the 95% t-interval."""
        return {
            column: t_interval([float(v) for r in self.of(recipe, draw) if (v := getattr(r, column)) is not None])
            for column in COLUMNS
        }

    def paired(self, recipe: str) -> dict[str, dict[str, float | None]]:
        """Per column: ``recipe`` minus the first recipe, paired by proposer seed and split draw; mean and
        95% t-interval of the differences."""
        reference = {(r.seed, r.split_draw): r for r in self.of(self.recipes[0])}
        result = {}
        for column in COLUMNS:
            differences = []
            for r in self.of(recipe):
                other = reference.get((r.seed, r.split_draw))
                mine, theirs = getattr(r, column), getattr(other, column) if other is not None else None
                if mine is not None and theirs is not None:
                    differences.append(float(mine) - float(theirs))
            result[column] = t_interval(differences)
        return result

    def rules(self, recipe: str) -> dict[str, dict[str, float]]:
        """Per rule: how often it fired in the recipe's runs, in total and in how many runs."""
        names = [name for name in RULES if any(name in r.rules for r in self.of(recipe))]
        return {
            name: {
                "total": float(sum(r.rules.get(name, 0) for r in self.of(recipe))),
                "runs": float(sum(1 for r in self.of(recipe) if r.rules.get(name, 0))),
            }
            for name in names
        }

    def to_json(self) -> dict[str, Any]:
        draws = range(self.split_seeds)
        return {
            "comparison": self.record,
            "experiment": self.experiment,
            "rounds": self.rounds,
            "seeds": self.seeds,
            "seed_start": self.seed_start,
            "split_seeds": self.split_seeds,
            "transfer_seeds": self.transfer_seeds,
            "case_recall_similarity": self.case_recall_similarity,
            "start": self.start,
            "starts": {str(d): self.starts.get(d, {}) for d in draws},
            "reference": self.recipes[0],
            "recipes": {
                name: {
                    "runs": [_run_json(r) for r in self.of(name)],
                    "summary": self.summary(name),
                    "by_draw": {str(d): self.summary(name, d) for d in draws},
                    "paired": self.paired(name) if name != self.recipes[0] else None,
                    "rules": self.rules(name),
                }
                for name in self.recipes
            },
        }


def _run_json(r: RunOutcome) -> dict[str, Any]:
    data = asdict(r)
    data["edits"] = [{**asdict(e), "leaky": e.leaky} for e in r.edits]
    return data


def _t95(df: int) -> float:
    return _T95[df - 1] if df <= len(_T95) else 1.96


@dataclass
class _Planned:
    recipe: str
    seed: int
    draw: int
    run: Run


def recipes_compare(
    *,
    experiment: Experiment,
    recipes: Sequence[str],
    seeds: int,
    seed_start: int = 0,
    split_seeds: int = 1,
    rounds: int | None = None,
    candidates: int | None = None,
    k: int | None = None,
    proposer: str | None = None,
    transfer_seeds: int = 3,
    inline: bool = False,
    timeout: float = 6 * 3600,
    on_progress: Callable[[str], None] | None = None,
    command: str = "",
    case_recall_similarity: float | None = None,
) -> Comparison:
    """Run each of ``recipes`` (preset names) with proposer seeds ``seed_start``.. ``seed_start + seeds - 1`` on
    ``split_seeds`` split draws, each in a twin of ``experiment``, and measure every accepted harness (see the
    module docstring). Through the workers unless ``inline``; CompareError when a run's transfer evaluation
    fails or nothing finishes within ``timeout`` seconds (every run and evaluation made so far stays).

    Stored as a ``RecipeComparison`` (with ``command``, the line that reruns it) from the start: running,
    then finished with its JSON, or failed with the reason.

    ``case_recall_similarity``: the example agent's ``CASE_RECALL_SIMILARITY`` for every trial of the
    comparison (None: the agent's own), given to the agent in the sandbox through an evaluator of its own
    (``example_evaluator_with_recall``); stamped in ``params`` and in the JSON. CompareError on another
    evaluator, or a proposer that edits another benchmark's harness."""
    unknown = [name for name in recipes if name not in PRESET_NAMES]
    if unknown:
        raise CompareError(f"unknown recipe(s) {', '.join(unknown)}: expected presets ({', '.join(PRESET_NAMES)})")
    if not recipes:
        raise CompareError("--recipes names no recipe")
    if seeds < 1 or transfer_seeds < 1 or split_seeds < 1:
        raise CompareError("--seeds, --split-seeds and --transfer-seeds must be at least 1")
    if seed_start < 0:
        raise CompareError("--seed-start must be 0 or more")
    if experiment.seed_candidate is None:
        raise CompareError(f"experiment {experiment.pk} has no seed harness")
    benchmark = experiment.benchmark.name
    proposer = proposer or example.preset_proposer(benchmark=benchmark)
    if proposer is not None and (mismatch := example.proposer_mismatch(benchmark=benchmark, proposer=proposer)):
        raise CompareError(mismatch)
    evaluator = None
    if case_recall_similarity is not None:
        try:
            evaluator = example_evaluator_with_recall(experiment.evaluator, case_recall_similarity)
        except ValueError as exc:
            raise CompareError(str(exc)) from exc
    params = {
        "recipes": list(recipes),
        "seeds": seeds,
        "seed_start": seed_start,
        "split_seeds": split_seeds,
        "rounds": rounds,
        "candidates": candidates,
        "k": k,
        "proposer": proposer,
        "transfer_seeds": transfer_seeds,
        "case_recall_similarity": case_recall_similarity,
        "evaluator": (evaluator or experiment.evaluator).name,
    }
    specs = {name: _recipe(name, rounds=rounds, candidates=candidates, k=k, proposer=proposer) for name in recipes}
    for spec in specs.values():
        lifecycle.check_llm_endpoints(spec)  # refused before anything is stored
    stored = RecipeComparison.objects.create(
        experiment=experiment, params=params, command=command, owner=process_owner(), heartbeat_at=timezone.now()
    )
    beat = _Heartbeat(stored.pk)
    try:
        comparison = _compare(
            experiment=experiment,
            specs=specs,
            seeds=seeds,
            seed_start=seed_start,
            split_seeds=split_seeds,
            rounds=rounds,
            transfer_seeds=transfer_seeds,
            inline=inline,
            deadline=time.monotonic() + timeout,
            evaluator=evaluator,
            beat=beat,
            record=stored.pk,
            say=on_progress or (lambda text: None),
        )
    except Exception as exc:
        RecipeComparison.objects.filter(pk=stored.pk).update(
            status=RecipeComparison.Status.FAILED, error=str(exc) or type(exc).__name__, finished_at=timezone.now()
        )
        raise
    comparison = dataclasses.replace(comparison, record=stored.pk, case_recall_similarity=case_recall_similarity)
    RecipeComparison.objects.filter(pk=stored.pk).update(
        status=RecipeComparison.Status.FINISHED, result=comparison.to_json(), finished_at=timezone.now()
    )
    return comparison


def _compare(
    *,
    experiment: Experiment,
    specs: dict[str, Recipe],
    seeds: int,
    seed_start: int,
    split_seeds: int,
    rounds: int | None,
    transfer_seeds: int,
    inline: bool,
    deadline: float,
    say: Callable[[str], None],
    evaluator: Evaluator | None = None,
    beat: Callable[[], None] = lambda: None,
    record: int | None = None,
) -> Comparison:
    recipes = list(specs)
    # The comparison's id keeps the twins of two comparisons started in the same second apart.
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S") + (f" · comparison {record}" if record else "")
    planned: list[_Planned] = []
    for draw in range(split_seeds):
        for name, spec in specs.items():
            for seed in range(seed_start, seed_start + seeds):
                twin = experiment_twin(
                    like=experiment,
                    name=f"{experiment.name} · {name} seed {seed} draw {draw} · {stamp}",
                    split_seed=experiment.split_seed + draw if draw else None,
                    evaluator=evaluator,
                )
                run = lifecycle.run_create(experiment=twin, recipe=_seeded(spec, seed))
                planned.append(_Planned(name, seed, draw, run))
                say(f"{name} seed {seed} draw {draw}: run {run.pk} on experiment {twin.pk}")
    if inline:
        for item in planned:
            item.run = run_drive(item.run, max_steps=100_000, on_step=lambda run: beat())
    _wait(
        lambda: not Run.objects.filter(pk__in=[p.run.pk for p in planned], status__in=RUN_UNFINISHED).exists(),
        deadline,
        "the runs",
        beat,
    )
    for item in planned:
        item.run.refresh_from_db()
    measured = _TransferMeasure(transfer_seeds, inline=inline, deadline=deadline, beat=beat)
    # The start of each split draw: the seed harness in the first run's twin of that draw.
    firsts = {p.draw: p for p in reversed(planned)}
    for item in planned:
        measured.want(_accepted(item.run) + [_seed_of(item.run)], specs[item.recipe])
    measured.measure(say)
    starts = {draw: _start(p.run, specs[p.recipe], measured) for draw, p in sorted(firsts.items())}
    runs = []
    for item in planned:
        runs.append(_outcome(item, specs[item.recipe], measured))
        say(_row_text(runs[-1]))
    return Comparison(
        experiment=experiment.pk,
        recipes=list(recipes),
        seeds=seeds,
        rounds=rounds,
        transfer_seeds=transfer_seeds,
        start=starts[0],
        runs=runs,
        seed_start=seed_start,
        split_seeds=split_seeds,
        starts=starts,
    )


def _wait(done: Callable[[], bool], deadline: float, what: str, beat: Callable[[], None] = lambda: None) -> None:
    while not done():
        beat()
        if time.monotonic() > deadline:
            raise CompareError(f"timed out waiting for {what} (is a worker running? --inline runs them here)")
        time.sleep(POLL_SECONDS)


# --- A comparison whose command stopped ------------------------------------------------------------------


class _Heartbeat:
    """Writes, at most every HEARTBEAT_SECONDS, that comparison ``pk``'s command is alive (its ``heartbeat_at``)."""

    def __init__(self, pk: int) -> None:
        self.pk, self.last = pk, time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.last >= HEARTBEAT_SECONDS:
            self.last = time.monotonic()
            RecipeComparison.objects.filter(pk=self.pk, status=RecipeComparison.Status.RUNNING).update(
                heartbeat_at=timezone.now()
            )


def process_owner(pid: int | None = None) -> str:
    """A process as a comparison's owner, ``host:pid:start`` (``start``: its start time in clock ticks since
    boot, so that a pid the system reused later is not taken for it; empty without /proc)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_process_start(pid) or ''}"


def _process_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (the start time); None when the process is gone or a zombie, or no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()  # the fields after the command's name: 3, 4, ...
    except (OSError, IndexError):
        return None
    return None if fields[0] == b"Z" else fields[19].decode()


def interruption(comparison: RecipeComparison, *, now: datetime | None = None) -> str | None:
    """Why running ``comparison`` will never finish, or None when nothing says so: its command ran on this
    host and that process is gone (killed, or the machine restarted), or (from any host) its last heartbeat is
    older than ``RSI_COMPARISON_STALE_SECONDS``."""
    if comparison.status != RecipeComparison.Status.RUNNING:
        return None
    host, _, rest = comparison.owner.partition(":")
    pid, _, start = rest.partition(":")
    if host == socket.gethostname() and pid.isdigit() and start and _process_start(int(pid)) != start:
        return (
            f"interrupted: the command that ran it (pid {pid} on {host}) stopped before it finished (killed, or "
            f"the machine restarted); it is not running any more. Rerun it with its command line."
        )
    stale = float(settings.RSI_COMPARISON_STALE_SECONDS)
    last = comparison.heartbeat_at or comparison.created_at
    if ((now or timezone.now()) - last).total_seconds() > stale:
        return (
            f"interrupted: no heartbeat from its command ({comparison.owner or 'unknown'}) since "
            f"{last:%Y-%m-%d %H:%M:%S} UTC, more than {stale:.0f} s ago. Rerun it with its command line."
        )
    return None


def comparisons_reap(*, now: datetime | None = None) -> int:
    """Mark every running comparison whose command stopped (``interruption``) interrupted, with the reason as
    its error; how many. A conditional update per comparison: safe to repeat and to run beside a command that
    finishes meanwhile (a finishing command still writes its result: what it measured is the truth)."""
    marked = 0
    for comparison in RecipeComparison.objects.filter(status=RecipeComparison.Status.RUNNING):
        reason = interruption(comparison, now=now)
        if reason is not None:
            marked += RecipeComparison.objects.filter(
                pk=comparison.pk, status=RecipeComparison.Status.RUNNING, heartbeat_at=comparison.heartbeat_at
            ).update(status=RecipeComparison.Status.INTERRUPTED, error=reason, finished_at=now or timezone.now())
    return marked


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


def _seed_of(run: Run) -> Candidate:
    assert run.start_candidate_id is not None  # run_create always sets it
    return Candidate.objects.select_related("tree", "experiment").get(pk=run.start_candidate_id)


def _accepted(run: Run) -> list[Candidate]:
    return list(
        Candidate.objects.filter(run=run, state=Candidate.State.ACCEPTED)
        .exclude(origin=Candidate.Origin.SEED)
        .select_related("parent__tree", "tree", "experiment")
        .order_by("pk")
    )


class _TransferMeasure:
    """The transfer evaluations of many candidates, started together and awaited together: S per transfer
    split, one value per trial seed, each from a certified evaluation of its own."""

    def __init__(self, seeds: int, *, inline: bool, deadline: float, beat: Callable[[], None]) -> None:
        self.seeds, self.inline, self.deadline, self.beat = seeds, inline, deadline, beat
        self.wanted: dict[int, tuple[Candidate, Recipe]] = {}
        self.evaluations: dict[int, list[Evaluation]] = {}
        self.scores: dict[int, dict[str, list[float]]] = {}

    def want(self, candidates: Iterable[Candidate], recipe: Recipe) -> None:
        for candidate in candidates:
            self.wanted.setdefault(candidate.pk, (candidate, recipe))

    def measure(self, say: Callable[[str], None]) -> None:
        for candidate, recipe in self.wanted.values():
            splits = _transfer_splits(candidate.experiment)
            self.evaluations[candidate.pk] = [
                evaluation_services.evaluation_start(
                    candidate=candidate,
                    splits=splits,
                    k=recipe.evaluation.trials_per_task,
                    purpose=Evaluation.Purpose.TRANSFER,
                    seed=TRANSFER_SEED_BASE + index,
                    run=candidate.run,
                )
                for index in range(self.seeds)
                if splits
            ]
        ids = [e.pk for evaluations in self.evaluations.values() for e in evaluations]
        say(f"transfer: {len(ids)} evaluations of {len(self.wanted)} harnesses")
        if self.inline:
            pending = Trial.objects.filter(evaluation_id__in=ids, state=Trial.State.PENDING).order_by("pk")
            for trial_id in pending.values_list("pk", flat=True):
                evaluation_services.trial_execute_in_process(trial_id=trial_id, owner="compare")
                self.beat()
            complete = Evaluation.objects.filter(pk__in=ids, state=Evaluation.State.COMPLETE)
            for evaluation_id in complete.values_list("pk", flat=True):
                result_certify(evaluation_id=evaluation_id)
        # A worker may hold some of these trials (or certify them): wait for every record either way.
        ended = (Evaluation.State.CERTIFIED, Evaluation.State.FAILED)
        _wait(
            lambda: not Evaluation.objects.filter(pk__in=ids).exclude(state__in=ended).exists(),
            self.deadline,
            f"{len(ids)} transfer evaluations",
            self.beat,
        )
        for pk, evaluations in self.evaluations.items():
            candidate, recipe = self.wanted[pk]
            by_split: dict[str, list[float]] = {s: [] for s in _transfer_splits(candidate.experiment)}
            for evaluation in evaluations:
                evaluation.refresh_from_db()
                if evaluation.state != Evaluation.State.CERTIFIED:
                    raise CompareError(
                        f"the transfer evaluation {evaluation.pk} of #{candidate.pk} failed: {_failure(evaluation)}"
                    )
                for split, rows in load.evaluation_split_rows(evaluation).items():
                    value = measure.score(measure.totals(rows), recipe.evaluation.score_metric)
                    if value is not None:
                        by_split[split].append(value)
            self.scores[pk] = by_split

    def of(self, candidate_id: int) -> dict[str, list[float]]:
        return self.scores.get(candidate_id, {})

    def sealed(self, candidate_id: int) -> float | None:
        return _mean(self.of(candidate_id).get(SplitName.SEALED))


def _failure(evaluation: Evaluation) -> str:
    """Why an evaluation failed, never empty: its error, else its trials' errors, else its state."""
    if evaluation.error:
        return evaluation.error
    errors = list(
        Trial.objects.filter(evaluation=evaluation)
        .exclude(error="")
        .values_list("error_kind", "error")
        .order_by("pk")[:3]
    )
    if errors:
        return "; ".join(f"{kind or 'error'}: {text[:200]}" for kind, text in errors)
    return f"it ended {evaluation.state} with {evaluation.trials_finished} of {evaluation.trials_total} trials"


def _outcome(item: _Planned, recipe: Recipe, measured: _TransferMeasure) -> RunOutcome:
    run = item.run
    final = run.current_candidate
    metric = recipe.evaluation.score_metric
    accepted = _accepted(run)
    edits = _edits(run, accepted, recipe, measured)
    leaky = sum(1 for e in edits if e.critic_flagged)
    by_transfer = sum(1 for e in edits if e.leaky)
    rules = rules_fired(run)
    if final is None or run.status != Run.Status.FINISHED:
        return RunOutcome(
            item.recipe,
            item.seed,
            run.pk,
            run.experiment_id,
            run.status,
            None,
            len(accepted),
            leaky,
            None,
            None,
            None,
            None,
            None,
            split_draw=item.draw,
            leaky_by_transfer=by_transfer,
            edits=edits,
            rules=rules,
        )
    scores = measurements.split_scores(candidate_id=final.pk, metric=metric)
    transfer = measured.of(final.pk)
    stats = load.candidate_stats(final, list(recipe.evaluation.evolve_splits), metric)
    return RunOutcome(
        recipe=item.recipe,
        seed=item.seed,
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
        split_draw=item.draw,
        leaky_by_transfer=by_transfer,
        edits=edits,
        rules=rules,
    )


def _start(run: Run, recipe: Recipe, measured: _TransferMeasure) -> dict[str, float | None]:
    """The seed harness of a split draw measured like a final harness: its run's certified baseline on the
    evolve splits, and the transfer evaluations."""
    seed = _seed_of(run)
    metric = recipe.evaluation.score_metric
    scores = measurements.split_scores(candidate_id=seed.pk, metric=metric)
    stats = load.candidate_stats(seed, list(recipe.evaluation.evolve_splits), metric)
    transfer = measured.of(seed.pk)
    return {
        "train": scores.get(SplitName.TRAIN),
        "gate": scores.get(SplitName.GATE),
        "sealed": _mean(transfer.get(SplitName.SEALED)),
        "held_out": _mean(transfer.get(SplitName.HELDOUT)),
        "cost": stats.cost if stats is not None and stats.cost else None,
        "leaky_accepted": 0.0,
        "leaky_by_transfer": 0.0,
    }


def _edits(run: Run, accepted: Sequence[Candidate], recipe: Recipe, measured: _TransferMeasure) -> list[EditTransfer]:
    """Each accepted edit against its parent: the evolve gain from the certified records, the sealed gain
    from the transfer evaluations, and whether the leakage critic's rules flag its diff."""
    if not accepted:
        return []
    index = build_index(proposals.evolve_tasks_for_critic(run=run))
    metric = recipe.evaluation.score_metric
    evolve = list(recipe.evaluation.evolve_splits)

    def evolve_score(candidate: Candidate) -> float | None:
        stats = load.candidate_stats(candidate, evolve, metric)
        return stats.score if stats is not None else None

    edits = []
    for c in accepted:
        if c.parent is None or c.parent_id is None:
            continue
        mine, theirs = evolve_score(c), evolve_score(c.parent)
        sealed_mine, sealed_theirs = measured.sealed(c.pk), measured.sealed(c.parent_id)
        edits.append(
            EditTransfer(
                candidate=c.pk,
                parent=c.parent_id,
                evolve_gain=mine - theirs if mine is not None and theirs is not None else None,
                sealed_gain=sealed_mine - sealed_theirs
                if sealed_mine is not None and sealed_theirs is not None
                else None,
                critic_flagged=bool(critique(tree_diff(old=c.parent.tree, new=c.tree, binary_as_text=True), index)),
            )
        )
    return edits


# The regularizers whose firing a comparison counts (docs/loop.md, "Every regularizer exercised").
RULES = (
    "edit_budget",
    "ledger_refusals",
    "stall_exploration",
    "critic",
    "noise_band",
    "floor",
    "cost_admissibility",
    "novelty_bonus",
    "guards",
    "pruning",
)
_NOISE_BAND_RULES = ("inside_noise_gain", "inside_noise_no_gain", "noise_unknown")
_STALLED = "stalled:"  # the reason a stall slot's candidate that explored nothing new is rejected with


def rules_fired(run: Run) -> dict[str, int]:
    """How often each regularizer fired in ``run``, counted from what the run stored where each rule decided
    (no counter of its own):

    - edit_budget: candidates rejected for more atomic edits than the round's budget (their state);
    - ledger_refusals: refuted ledger rows the proposer was shown as hypotheses not to repeat (ledger on);
    - stall_exploration: rounds proposed while stalled (the run's ``stalled_rounds``);
    - critic: candidates the leakage critic flagged (their flags);
    - noise_band, floor, cost_admissibility, guards: gate decisions whose rule is the band's (inside the
      band, or the band unknown), ``floor``, ``cost_too_high``, ``guard_*``;
    - novelty_bonus: gate decisions inside the band whose objective counted a new structural kind
      (N_new > 0 with lambda_N > 0);
    - pruning: rounds after which pruning advised deleting some component: ``regularization.pruning_targets``
      over the run's ledger, as the gate computed it (pruning on).
    """
    recipe = run_recipe(run)
    candidates = Candidate.objects.filter(run=run)
    budget = candidates.filter(state=Candidate.State.REJECTED_BUDGET)
    decisions = list(GateDecision.objects.filter(run=run).values_list("rule", "numbers"))
    ledger = list(LedgerEntry.objects.filter(run=run).values_list("round", "component", "delta_score", "admissible"))
    novelty = sum(
        1
        for rule, numbers in decisions
        if rule in _NOISE_BAND_RULES and (numbers.get("N_new") or 0) > 0 and (numbers.get("lambda_N") or 0) > 0
    )
    pruned = 0
    if recipe.pruning.enabled:
        points = [regularization.LedgerPoint(round=r, component=c, dS=d) for r, c, d, _ in ledger]
        for number in sorted({r for r, *_ in ledger}):
            so_far = [p for p in points if p.round <= number]
            window, threshold = recipe.pruning.window, recipe.pruning.threshold
            if regularization.pruning_targets(so_far, current_round=number, window=window, threshold=threshold):
                pruned += 1
    return {
        "edit_budget": budget.exclude(state_reason__startswith=_STALLED).count(),
        "ledger_refusals": sum(1 for *_, admissible in ledger if not admissible) if recipe.ledger.enabled else 0,
        "stall_exploration": len(RunState.of(run).stalled_rounds),
        "critic": candidates.filter(leakage_flags__isnull=False).distinct().count(),
        "noise_band": sum(1 for rule, _ in decisions if rule in _NOISE_BAND_RULES),
        "floor": sum(1 for rule, _ in decisions if rule == "floor"),
        "cost_admissibility": sum(1 for rule, _ in decisions if rule == "cost_too_high"),
        "novelty_bonus": novelty,
        "guards": sum(1 for rule, _ in decisions if rule.startswith("guard_")),
        "pruning": pruned,
    }


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
    """The tables ``compare_recipes`` prints: the start of each split draw, each run, each recipe's mean and 95%
    interval, the paired difference against the first recipe, and how often each regularizer fired."""
    columns = [c for c in COLUMNS if c != "held_out" or any(r.held_out is not None for r in comparison.runs)]
    header = f"{'recipe':<20} {'seed':>4} {'draw':>4} {'run':>5} " + " ".join(f"{c:>17}" for c in columns)
    lines = [header]
    counts = {"cost", "leaky_accepted", "leaky_by_transfer"}

    def cell(column: str, value: float | None) -> str:
        if value is None:
            return f"{'-':>17}"
        return f"{value:>17.0f}" if column in counts else _fmt(value, 17)

    def interval(column: str, values: dict[str, float | None], signed: bool = False) -> str:
        low, high = values["low"], values["high"]
        if low is None or high is None:
            return f"{'-':>17}"
        if column in counts:
            return f"{f'[{round(low)},{round(high)}]':>17}"  # round(): no "-0"
        return f"{f'[{low:+.3f},{high:+.3f}]' if signed else f'[{low:.3f},{high:.3f}]':>17}"

    def row(label: str, seed: str, draw: str, run: str, cells: Iterable[str]) -> str:
        return f"{label:<20} {seed:>4} {draw:>4} {run:>5} " + " ".join(cells)

    for draw, start in sorted(comparison.starts.items()):
        lines.append(row("(start)", "", str(draw), "", (cell(c, start.get(c)) for c in columns)))
    for name in comparison.recipes:
        for r in comparison.of(name):
            lines.append(
                row(name, str(r.seed), str(r.split_draw), str(r.run), (cell(c, getattr(r, c)) for c in columns))
            )
        summary = comparison.summary(name)
        lines.append(row(name + " mean", "", "", "", (cell(c, summary[c]["mean"]) for c in columns)))
        lines.append(row("  95% interval", "", "", "", (interval(c, summary[c]) for c in columns)))
        if name != comparison.recipes[0]:
            paired = comparison.paired(name)
            signed = (f"{v:>+17.3f}" if (v := paired[c]["mean"]) is not None else f"{'-':>17}" for c in columns)
            lines.append(row(f"  - {comparison.recipes[0]}"[:20], "", "", "", signed))
            lines.append(row("  95% interval", "", "", "", (interval(c, paired[c], signed=True) for c in columns)))
    lines.append("")
    lines.append(f"{'rule fired (runs)':<20} " + " ".join(f"{name:>17}" for name in comparison.recipes))
    for rule in RULES:
        fired = [comparison.rules(name).get(rule) for name in comparison.recipes]
        texts = [f"{f['total']:.0f} ({f['runs']:.0f})" if f else "-" for f in fired]
        lines.append(f"{rule:<20} " + " ".join(f"{text:>17}" for text in texts))
    return lines
