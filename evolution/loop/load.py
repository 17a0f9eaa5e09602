"""What the loop reads from the database to measure a harness: its trials in certified evaluations, as rows for
``evolution.loop.measure`` (which alone computes S, cost and the rates)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from django.core.cache import cache
from django.db.models import Q

from evolution import measurements
from evolution.loop import measure
from evolution.loop.regularization import CandidateStats
from evolution.measurements import COUNTED_PURPOSES, candidate_totals
from evolution.metrics import relative_cost_change
from evolution.models import Candidate, Evaluation, Experiment, GateDecision, Run, TreeEntry, Trial
from evolution.recipes import EVOLVE_SPLIT_CHOICES, parse_recipe
from evolution.surfaces import STRUCTURAL_KINDS, kinds_present, parse_surface, reachable_kinds

__all__ = [
    "COUNTED_PURPOSES",
    "AtDecision",
    "best_candidate",
    "ComparedDelta",
    "Comparison",
    "candidate_delta",
    "comparison",
    "comparison_key",
    "candidate_stats",
    "candidate_task_rows",
    "candidate_totals",
    "evaluation_score",
    "mean_tokens",
]

# The evaluations the gate measures a harness by (transfer and external ones are reported, not gated on).
ROW = measurements.ROW


def candidate_stats(candidate: Candidate, splits: Sequence[str], metric: str) -> CandidateStats | None:
    """What the gate knows of ``candidate`` on ``splits``; None when it has no certified trial there."""
    measured = measure.measure(candidate_totals(candidate.pk, splits), metric)
    if measured is None:
        return None
    return CandidateStats(
        candidate_id=candidate.pk,
        score=measured.score,
        cost=measured.cost if measured.cost is not None else 0.0,
        valid_rate=measured.valid_rate,
        no_submission_rate=measured.no_submission_rate,
        components=frozenset(candidate.edits.values_list("component", flat=True)),
    )


def experiment_measure(experiment: Experiment) -> tuple[tuple[str, ...], str]:
    """The evolve splits and the metric an experiment's harnesses are compared in across runs: its recipe's
    (the first run's), else the defaults."""
    spec = experiment.recipe.spec if experiment.recipe_id is not None and experiment.recipe is not None else None
    evaluation = parse_recipe(spec).evaluation if spec else None
    if evaluation is None:
        return tuple(EVOLVE_SPLIT_CHOICES), "pass_at_1"
    return tuple(evaluation.evolve_splits), evaluation.score_metric


def best_candidate(experiment: Experiment) -> Candidate | None:
    """The experiment's best harness so far: among the accepted candidates, the highest S on the evolve splits
    (``experiment_measure``) over their counted trials (``evolution.measurements``); on a tie the lower cost (as
    the gate's admissibility prefers), then the most recently accepted; None when nothing is accepted yet. The
    dashboard, the API's ``best_candidate`` and a new run's default start (``lifecycle.run_create``) use it."""
    from evolution.selectors import best_scored_candidate  # selectors reads this module

    splits, metric = experiment_measure(experiment)
    accepted = Candidate.objects.filter(experiment=experiment, state=Candidate.State.ACCEPTED)
    # The totals stored at certification, summed, scored (``measure.score_sql``, as ``measure.score``) and
    # ranked in one query (the dashboard asks this on every load).
    best = best_scored_candidate(
        experiment_id=experiment.pk,
        splits=list(splits),
        mean_score=metric == "mean_score",
        candidate_ids=accepted.values("pk"),
    )
    return None if best is None else accepted.filter(pk=best).first()


def evaluation_score(evaluation: Evaluation, metric: str) -> float | None:
    """S of one evaluation (a repeat of the seed's, for the noise band)."""
    rows = Trial.objects.filter(evaluation=evaluation).values_list(*ROW)
    return measure.score(measure.totals(measure.TrialRow(*row) for row in rows), metric)


def evaluation_task_values(evaluation: Evaluation, metric: str) -> dict[str, list[float]]:
    """Each task's trial values (``measure.trial_value``) in one evaluation: what the noise bootstrap draws."""
    values: dict[str, list[float]] = {}
    for task, *row in (
        Trial.objects.filter(evaluation=evaluation)
        .order_by("task__external_id", "index")
        .values_list("task__external_id", *ROW)
    ):
        values.setdefault(task, []).append(measure.trial_value(measure.TrialRow(*row), metric))
    return values


def evaluation_split_rows(evaluation: Evaluation) -> dict[str, list[measure.TrialRow]]:
    """One evaluation's trials by split, as the measurement reads them."""
    rows: dict[str, list[measure.TrialRow]] = {}
    for split, *row in Trial.objects.filter(evaluation=evaluation).values_list("split", *ROW):
        rows.setdefault(split, []).append(measure.TrialRow(*row))
    return rows


def mean_tokens(candidate: Candidate, splits: Sequence[str]) -> float | None:
    """C of the candidate over its counted trials on ``splits`` (``measurements.candidate_cost``)."""
    return measurements.candidate_cost(candidate.pk, splits)


def structural_kinds_had(experiment: Experiment) -> list[str]:
    """The structural kinds some accepted harness of the experiment has had (the seed's included), by the files
    of their trees: N_new counts only kinds beyond these (docs/concepts.md, rule F), sorted."""
    spec = parse_surface(experiment.surface.spec)
    harnesses = Q(tree__candidates__experiment=experiment, tree__candidates__state=Candidate.State.ACCEPTED)
    if experiment.seed_candidate_id is not None:
        harnesses |= Q(tree__candidates__pk=experiment.seed_candidate_id)
    paths = TreeEntry.objects.filter(harnesses).values_list("path", flat=True).distinct()
    return sorted(kinds_present(spec, paths) & STRUCTURAL_KINDS)


def reachable_components(experiment: Experiment) -> list[str]:
    """The component kinds the experiment's surface lets the proposer reach (stall exploration draws from these)."""
    return reachable_kinds(parse_surface(experiment.surface.spec))


def candidate_task_rows(candidate_id: int, splits: Sequence[str]) -> dict[str, list[measure.TrialRow]]:
    """The candidate's trials the gate measures it by (``candidate_totals``'s), as rows by task, each task's in
    trial order (the bootstrap draws by position)."""
    return {task: [row for _, row in rows] for task, rows in _identified_task_rows(candidate_id, splits).items()}


def _identified_task_rows(candidate_id: int, splits: Sequence[str]) -> dict[str, list[tuple[int, measure.TrialRow]]]:
    found: dict[str, list[tuple[int, measure.TrialRow]]] = {}
    for pk, task, *row in (
        measurements.counted_trials(candidate_id=candidate_id, split__in=list(splits))
        .order_by("pk")
        .values_list("pk", "task__external_id", *ROW)
    ):
        found.setdefault(task, []).append((pk, measure.TrialRow(*row)))
    return found


@dataclass(frozen=True)
class Comparison:
    """dS of a harness against another with its paired bootstrap interval, and dC, on given trials."""

    estimate: measure.DeltaEstimate
    delta_cost: float | None  # relative change in tokens per trial (None: no cost on one side, or from 0)
    trials: str = ""  # the digest of the two sets of trials (and metric and seed) it was computed on

    def numbers(self) -> dict[str, object]:
        """The interval as a gate decision keeps it in its numbers (and so in its certified record), with the
        digest of the trials it was computed on."""
        e = self.estimate
        return {
            "dS_low": e.low,
            "dS_high": e.high,
            "paired_tasks": e.pairs,
            "confidence": e.confidence,
            "trials_digest": self.trials,
        }


COMPARISON_CACHE_SECONDS = 7 * 24 * 3600


def comparison(
    base_id: int, candidate_id: int, splits: Sequence[str], metric: str, *, kept: AtDecision | None = None
) -> Comparison | None:
    """dS of candidate ``candidate_id`` against ``base_id`` in ``metric`` over ``splits``, on the trials the gate
    reads, with its paired bootstrap interval (``measure.paired_delta``, seeded by the candidate's id) and dC;
    None when either side has no such trial.

    The bootstrap is a pure function of the two sets of trials, so its result is cached (Django's cache) under
    a digest of them (each trial's id and every value the measurement reads, the metric, the seed): a repeat
    asks the database for the trials and nothing more, and a trial added, removed or changed on either side
    is a new key. ``kept``: the numbers a gate decision kept; when they were computed on these very trials
    they are the answer (nothing is computed or cached). Safe to call from any request."""
    base, new = _identified_task_rows(base_id, splits), _identified_task_rows(candidate_id, splits)
    key = _comparison_key(base, new, metric=metric, seed=candidate_id)
    digest = key.rsplit(":", 1)[1]
    if kept is not None and kept.trials == digest and kept.pairs is not None and kept.confidence is not None:
        at = measure.DeltaEstimate(kept.delta, kept.low, kept.high, kept.pairs, metric, kept.confidence)
        return Comparison(at, kept.delta_cost, digest)
    found = cache.get(key)
    if isinstance(found, Comparison):
        return found
    base_rows = {task: [row for _, row in rows] for task, rows in base.items()}
    rows = {task: [row for _, row in task_rows] for task, task_rows in new.items()}
    estimate = measure.paired_delta(base_rows, rows, metric, seed=candidate_id)
    if estimate is None:
        return None
    base_cost = measure.cost(measure.totals(row for task in base_rows.values() for row in task))
    cost = measure.cost(measure.totals(row for task in rows.values() for row in task))
    delta_cost = relative_cost_change(cost, base_cost) if cost is not None and base_cost is not None else None
    result = Comparison(estimate, delta_cost, digest)
    cache.set(key, result, COMPARISON_CACHE_SECONDS)
    return result


def comparison_key(base_id: int, candidate_id: int, splits: Sequence[str], metric: str) -> str:
    """The cache key ``comparison`` files its answer under, for the trials as they are now."""
    base, new = _identified_task_rows(base_id, splits), _identified_task_rows(candidate_id, splits)
    return _comparison_key(base, new, metric=metric, seed=candidate_id)


def _comparison_key(
    base: dict[str, list[tuple[int, measure.TrialRow]]],
    new: dict[str, list[tuple[int, measure.TrialRow]]],
    *,
    metric: str,
    seed: int,
) -> str:
    def side(rows: dict[str, list[tuple[int, measure.TrialRow]]]) -> list[object]:
        return [[task, [[pk, *row] for pk, row in trials]] for task, trials in sorted(rows.items())]

    text = json.dumps([COMPARISON_VERSION, metric, seed, side(base), side(new)], separators=(",", ":"))
    return f"evolution:comparison:{hashlib.sha256(text.encode()).hexdigest()}"


# Part of every comparison's cache key: raise it when what ``comparison`` computes changes.
COMPARISON_VERSION = 1


@dataclass(frozen=True)
class AtDecision:
    """dS, its interval and dC as the gate decision kept them (``GateDecision.numbers``, certified with it).
    ``pairs`` is None for a decision made before decisions kept their interval (``low``/``high`` None then)."""

    decision_id: int
    delta: float
    low: float | None
    high: float | None
    pairs: int | None
    confidence: float | None
    delta_cost: float | None
    trials: str | None = None  # the digest of the trials the interval was computed on (``Comparison.trials``)

    @classmethod
    def of(cls, decision: GateDecision) -> AtDecision | None:
        numbers = decision.numbers if isinstance(decision.numbers, dict) else {}
        d_score = numbers.get("dS")
        if not isinstance(d_score, int | float):
            return None
        pairs = numbers.get("paired_tasks")
        confidence = numbers.get("confidence")
        return cls(
            decision_id=decision.pk,
            delta=float(d_score),
            low=_number(numbers.get("dS_low")),
            high=_number(numbers.get("dS_high")),
            pairs=pairs if isinstance(pairs, int) else None,
            confidence=_number(confidence),
            delta_cost=_number(numbers.get("dC")),
            trials=str(numbers["trials_digest"]) if isinstance(numbers.get("trials_digest"), str) else None,
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _same(a: float | None, b: float | None) -> bool:
    # The gate and the page sum the same trials, possibly in another order: equal up to rounding.
    return (a is None) == (b is None) and (a is None or b is None or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12))


@dataclass(frozen=True)
class ComparedDelta:
    """dS of a candidate against the harness it is compared with: the numbers its gate decision kept
    (``at_decision``; None when no gate decided it) and the current estimate on the trials measured now
    (``estimate``, ``delta_cost``)."""

    base_id: int
    gated: bool  # True: the harness the gate compared it with; False: its parent (not gated yet)
    splits: tuple[str, ...]
    estimate: measure.DeltaEstimate  # the current estimate
    delta_cost: float | None  # the current dC: relative change in tokens per trial (None: no cost on one side)
    noise_delta: float | None  # the run's noise band, beside dS
    at_decision: AtDecision | None = None

    @property
    def moved(self) -> bool:
        """Whether the current estimate differs from the decision's numbers (later measurements of either
        side), or the decision kept no interval; False when no gate decided it."""
        at = self.at_decision
        if at is None:
            return False
        e = self.estimate
        return (
            at.pairs is None
            or not _same(at.delta, e.delta)
            or not _same(at.low, e.low)
            or not _same(at.high, e.high)
            or at.pairs != e.pairs
            or not _same(at.delta_cost, self.delta_cost)
        )


def candidate_delta(candidate: Candidate) -> ComparedDelta | None:
    """The one dS of ``candidate``: against the harness its latest gate decision compared it with (else its
    parent), in its run's recipe's metric over the recipe's evolve splits, on the trials the gate reads, with
    its paired bootstrap interval and dC (``comparison``, cached by the trials). A decided candidate also has
    the numbers its decision kept (``at_decision``). None for the seed or without certified trials on both
    sides. The gate's dS in its decision, the ledger's, this and the API's are one number."""
    decision = (
        GateDecision.objects.filter(candidate=candidate, round__gt=0, current__isnull=False)
        .select_related("run__recipe")
        .order_by("-round", "-pk")
        .first()
    )
    run: Run | None
    if decision is not None and decision.current_id is not None:
        base_id, run, gated = decision.current_id, decision.run, True
    elif candidate.parent_id is not None:
        base_id, run, gated = candidate.parent_id, candidate.run, False
    else:
        return None
    spec = run.recipe.spec if run is not None else None
    if spec is None and candidate.experiment.recipe_id is not None:
        spec = candidate.experiment.recipe.spec if candidate.experiment.recipe else None
    evaluation = parse_recipe(spec).evaluation if spec else None
    metric = evaluation.score_metric if evaluation else "pass_at_1"
    splits = evaluation.evolve_splits if evaluation else EVOLVE_SPLIT_CHOICES
    at_decision = AtDecision.of(decision) if decision is not None and gated else None
    found = comparison(base_id, candidate.pk, splits, metric, kept=at_decision)
    if found is None:
        return None
    noise = run.noise_delta if run is not None else None
    return ComparedDelta(base_id, gated, tuple(splits), found.estimate, found.delta_cost, noise, at_decision)
