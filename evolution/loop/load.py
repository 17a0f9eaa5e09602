"""What the loop reads from the database to measure a harness: its trials in certified evaluations, as rows for
``evolution.loop.measure`` (which alone computes S, cost and the rates)."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Q

from evolution.loop import measure
from evolution.loop.regularization import CandidateStats
from evolution.models import Candidate, Evaluation, Experiment, TreeEntry, Trial
from evolution.surfaces import STRUCTURAL_KINDS, kinds_present, parse_surface, reachable_kinds

__all__ = [
    "MEASURED_PURPOSES",
    "candidate_stats",
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


def evaluation_score(evaluation: Evaluation, metric: str) -> float | None:
    """S of one evaluation (a repeat of the seed's, for the noise band)."""
    rows = Trial.objects.filter(evaluation=evaluation).values_list(*ROW)
    return measure.score(measure.totals(measure.TrialRow(*row) for row in rows), metric)


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
    of their trees: N_new counts only kinds beyond these (CONCEPTS.md 4 F), sorted."""
    spec = parse_surface(experiment.surface.spec)
    harnesses = Q(tree__candidates__experiment=experiment, tree__candidates__state=Candidate.State.ACCEPTED)
    if experiment.seed_candidate_id is not None:
        harnesses |= Q(tree__candidates__pk=experiment.seed_candidate_id)
    paths = TreeEntry.objects.filter(harnesses).values_list("path", flat=True).distinct()
    return sorted(kinds_present(spec, paths) & STRUCTURAL_KINDS)


def reachable_components(experiment: Experiment) -> list[str]:
    """The component kinds the experiment's surface lets the proposer reach (stall exploration draws from these)."""
    return reachable_kinds(parse_surface(experiment.surface.spec))
