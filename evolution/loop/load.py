"""What the loop reads from the database to measure a harness: its trials in certified evaluations, as rows for
``evolution.loop.measure`` (which alone computes S, cost and the rates)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import Q

from evolution.loop import measure
from evolution.loop.regularization import CandidateStats
from evolution.metrics import relative_cost_change
from evolution.models import Candidate, Evaluation, Experiment, GateDecision, Run, TreeEntry, Trial
from evolution.recipes import EVOLVE_SPLIT_CHOICES, parse_recipe
from evolution.surfaces import STRUCTURAL_KINDS, kinds_present, parse_surface, reachable_kinds

__all__ = [
    "MEASURED_PURPOSES",
    "best_candidate",
    "ComparedDelta",
    "candidate_delta",
    "candidate_stats",
    "candidate_task_rows",
    "candidate_totals",
    "evaluation_score",
    "mean_tokens",
    "split_scores",
]

# The evaluations the gate measures a harness by (transfer and external ones are reported, not gated on).
MEASURED_PURPOSES = (Evaluation.Purpose.BASELINE, Evaluation.Purpose.NOISE, Evaluation.Purpose.CANDIDATE)
ROW = ("outcome", "score", "tokens", "valid_output", "submitted")


def candidate_totals(candidate: Candidate, splits: Sequence[str]) -> measure.Totals:
    """The totals of the candidate's trials on ``splits`` over its certified measured evaluations."""
    rows = Trial.objects.filter(
        candidate=candidate,
        split__in=splits,
        evaluation__state=Evaluation.State.CERTIFIED,
        evaluation__purpose__in=MEASURED_PURPOSES,
    ).values_list(*ROW)
    return measure.totals(measure.TrialRow(*row) for row in rows)


def candidate_stats(candidate: Candidate, splits: Sequence[str], metric: str) -> CandidateStats | None:
    """What the gate knows of ``candidate`` on ``splits``; None when it has no certified trial there."""
    measured = measure.measure(candidate_totals(candidate, splits), metric)
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
    """The experiment's best harness so far: the accepted candidate with the highest S on the evolve splits
    (``experiment_measure``) over its certified measured trials, the earlier on a tie; None when nothing is
    accepted yet. A new run starts from it unless told otherwise."""
    from evolution.selectors import best_scored_candidate  # selectors reads this module

    splits, metric = experiment_measure(experiment)
    accepted = Candidate.objects.filter(experiment=experiment, state=Candidate.State.ACCEPTED)
    # The totals stored at certification, summed, scored (``measure.score_sql``, as ``measure.score``) and
    # ranked in one query (the dashboard asks this on every load).
    best = best_scored_candidate(
        experiment_id=experiment.pk,
        splits=list(splits),
        purposes=MEASURED_PURPOSES,
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


def split_scores(*, candidate: Candidate, metric: str) -> dict[str, float]:
    """S per split over every certified evaluation of the candidate (transfer ones included), by name."""
    by_split: dict[str, list[measure.TrialRow]] = {}
    for split, *row in Trial.objects.filter(
        candidate=candidate, evaluation__state=Evaluation.State.CERTIFIED
    ).values_list("split", *ROW):
        by_split.setdefault(split, []).append(measure.TrialRow(*row))
    scores = {split: measure.score(measure.totals(rows), metric) for split, rows in sorted(by_split.items())}
    return {split: value for split, value in scores.items() if value is not None}


def mean_tokens(candidate: Candidate, splits: Sequence[str]) -> float | None:
    """C of the candidate over every certified evaluation on ``splits``."""
    rows = Trial.objects.filter(
        candidate=candidate, split__in=splits, evaluation__state=Evaluation.State.CERTIFIED
    ).values_list(*ROW)
    return measure.cost(measure.totals(measure.TrialRow(*row) for row in rows))


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
    """The candidate's trials the gate measures it by (``candidate_totals``'s), as rows by task."""
    found: dict[str, list[measure.TrialRow]] = {}
    for task, *row in Trial.objects.filter(
        candidate_id=candidate_id,
        split__in=splits,
        evaluation__state=Evaluation.State.CERTIFIED,
        evaluation__purpose__in=MEASURED_PURPOSES,
    ).values_list("task__external_id", *ROW):
        found.setdefault(task, []).append(measure.TrialRow(*row))
    return found


@dataclass(frozen=True)
class ComparedDelta:
    """dS of a candidate against the harness it is compared with, as the gate compared them."""

    base_id: int
    gated: bool  # True: the harness the gate compared it with; False: its parent (not gated yet)
    splits: tuple[str, ...]
    estimate: measure.DeltaEstimate
    delta_cost: float | None  # relative change in tokens per trial (None: no cost on one side, or from 0)
    noise_delta: float | None  # the run's noise band, beside dS


def candidate_delta(candidate: Candidate) -> ComparedDelta | None:
    """The one dS of ``candidate``: against the harness its latest gate decision compared it with (else its
    parent), in its run's recipe's metric over the recipe's evolve splits, on the trials the gate reads, with
    its paired bootstrap interval (``measure.paired_delta``). None for the seed or without certified trials on
    both sides. The gate's dS in its decision, the ledger's, this and the API's are one number."""
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
    base_rows, rows = candidate_task_rows(base_id, splits), candidate_task_rows(candidate.pk, splits)
    estimate = measure.paired_delta(base_rows, rows, metric, seed=candidate.pk)
    if estimate is None:
        return None
    base_cost = measure.cost(measure.totals(row for task in base_rows.values() for row in task))
    cost = measure.cost(measure.totals(row for task in rows.values() for row in task))
    delta_cost = relative_cost_change(cost, base_cost) if cost is not None and base_cost is not None else None
    noise = run.noise_delta if run is not None else None
    return ComparedDelta(base_id, gated, tuple(splits), estimate, delta_cost, noise)
