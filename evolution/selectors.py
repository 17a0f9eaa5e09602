"""Reads of the evolution domain (no writes here)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import BigIntegerField, Count, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.fields.json import KT
from django.db.models.functions import MD5, Cast, Coalesce
from django.utils import timezone

from evolution import measurements, metrics, pricing, splits
from evolution.loop import lifecycle, load, measure
from evolution.models import (
    AtomicEdit,
    Candidate,
    CertifiedResult,
    Evaluation,
    EvaluationSplitStats,
    Experiment,
    GateDecision,
    ReviewCorrection,
    ReviewDecision,
    ReviewItem,
    Run,
    SplitMembership,
    SplitName,
    TrajectoryStep,
    Trial,
)
from evolution.recipes import PRESET_NAMES, Recipe, load_preset, parse_recipe


def step_tokens_money(*, trials: QuerySet[Trial]) -> pricing.Money:
    """The money cost of the per-step tokens of ``trials``' trajectories at each step model's list prices
    (``evolution.pricing``), with what has no price said. One query, summing in the database per step model;
    stored step token counts are non-negative integers (``trials.atif_usage`` refuses others). Read-only."""
    prompt = Coalesce(Sum(Cast(KT("metrics__prompt_tokens"), BigIntegerField())), Value(0))
    completion = Coalesce(Sum(Cast(KT("metrics__completion_tokens"), BigIntegerField())), Value(0))
    rows = (
        TrajectoryStep.objects.filter(trajectory__trial__in=trials)
        .filter(Q(metrics__has_key="prompt_tokens") | Q(metrics__has_key="completion_tokens"))
        .values("model_name")
        .annotate(prompt=prompt, completion=completion, steps=Count("pk"))
        .order_by("model_name")
        .values_list("model_name", "prompt", "completion", "steps")
    )
    return pricing.tokens_money(pricing.ModelTokens(*row) for row in rows)


def _count_of(queryset: QuerySet[Any]) -> Coalesce:
    """A correlated ``COUNT(*)`` of ``queryset`` (filtered on ``OuterRef``):
    one index probe per row, where joining two many-sided tables and counting
    distinct would multiply them."""
    counted = queryset.order_by().values("experiment_id").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def experiment_seed(experiment: Experiment) -> Candidate:
    """The experiment's seed candidate, which ``experiment_create`` always makes."""
    seed = experiment.seed_candidate
    if seed is None:
        raise ValueError(f"experiment {experiment.name!r} has no seed candidate")
    return seed


def experiment_overview() -> QuerySet[Experiment]:
    """Experiments with candidate and certified-record counts, newest first."""
    return (
        Experiment.objects.select_related("benchmark", "surface", "evaluator")
        .annotate(
            candidate_count=_count_of(Candidate.objects.filter(experiment=OuterRef("pk"))),
            accepted_count=_count_of(
                Candidate.objects.filter(experiment=OuterRef("pk"), state=Candidate.State.ACCEPTED)
            ),
            record_count=_count_of(CertifiedResult.objects.filter(experiment=OuterRef("pk"))),
        )
        .order_by("-created_at")
    )


def run_trial_counts(*, run_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per run: trials started, finished and finished with an error, from the
    evaluations' own counters (two queries whatever the number of trials:
    errors are found through the trial state index)."""
    counts: dict[int, dict[str, int]] = {}
    for row in (
        Evaluation.objects.filter(run_id__in=run_ids)
        .values("run_id")
        .annotate(started=Sum("trials_total"), done=Sum("trials_finished"))
        .order_by()
    ):
        counts[row["run_id"]] = {"started": row["started"] or 0, "done": row["done"] or 0, "errors": 0}
    for errored in (
        Trial.objects.filter(state=Trial.State.ERROR, evaluation__run_id__in=run_ids)
        .values("evaluation__run_id")
        .annotate(n=Count("pk"))
        .order_by()
    ):
        run_counts = counts.setdefault(errored["evaluation__run_id"], {"started": 0, "done": 0, "errors": 0})
        run_counts["errors"] = errored["n"]
    return counts


def _totals_queries(
    *,
    experiment_id: int,
    splits: list[str],
    candidate_ids: QuerySet[Any] | None,
    key: tuple[str, ...],
) -> tuple[QuerySet[Any], QuerySet[Any]]:
    """Two ``values_list`` queries grouped by ``key`` (the candidate's id
    first): trials ``n``, ``passed``, ``score_sum``, ``tokens_total`` and
    ``tokens_n`` of each candidate's counted evaluations (``measurements``) on
    ``splits``; from the totals stored at certification, and from the trials
    of any certified evaluation stored without them (e.g. imported ones;
    none in the usual case)."""
    certified = measurements.counted_evaluations().filter(experiment_id=experiment_id)
    if candidate_ids is not None:
        certified = certified.filter(candidate_id__in=candidate_ids)
    stored = (
        EvaluationSplitStats.objects.filter(evaluation__in=certified.values("pk"), split__in=splits)
        .values_list(*key)
        .annotate(
            n=Sum("trials"),
            passed=Sum("passed"),
            score_sum=Sum("score_sum"),
            # SUM of a bigint is a numeric on PostgreSQL: cast back, so the
            # driver gives a plain int (see plain_rows).
            tokens_total=Cast(Sum("tokens_sum"), BigIntegerField()),
            tokens_n=Sum("tokens_count"),
        )
        .order_by()
    )
    unstored = (
        Trial.objects.filter(
            evaluation__in=certified.filter(
                ~Exists(EvaluationSplitStats.objects.filter(evaluation=OuterRef("pk")))
            ).values("pk"),
            split__in=splits,
        )
        .values_list(*key)
        .annotate(
            n=Count("pk"),
            passed=Count("pk", filter=Q(outcome=Trial.Outcome.PASS)),
            score_sum=Sum("score", filter=~Q(outcome=Trial.Outcome.ERROR)),
            tokens_total=Cast(Sum("tokens"), BigIntegerField()),
            tokens_n=Count("tokens"),
        )
        .order_by()
    )
    return stored, unstored


def _score_totals(
    *,
    experiment_id: int,
    splits: list[str],
    candidate_ids: QuerySet[Any] | None,
    fields: tuple[str, ...],
) -> dict[tuple[Any, ...], list[float]]:
    """Per candidate (keyed by its id and its ``fields``): trials, passed,
    score sum, tokens sum and trials reporting tokens over its counted
    evaluations (``measurements``) on ``splits``. Two queries (``_totals_queries``)."""
    key = ("candidate_id", *(f"candidate__{name}" for name in fields))
    stored, unstored = _totals_queries(experiment_id=experiment_id, splits=splits, candidate_ids=candidate_ids, key=key)
    width = len(key)
    # One row per candidate among the stored totals (grouped by it, every
    # column NOT NULL); an evaluation without them adds its trials' totals.
    totals = {row[:width]: list(row[width:]) for row in plain_rows(stored)}
    for row in plain_rows(unstored):
        parts = totals.setdefault(row[:width], [0, 0, 0.0, 0, 0])
        for i, value in enumerate(row[width:]):
            parts[i] += value or 0
    return totals


def plain_rows(queryset: QuerySet[Any]) -> list[tuple[Any, ...]]:
    """The rows of a ``values_list`` queryset as the driver returns them.
    For columns the driver already returns as Python ints, floats and
    strings: Django's per-value converters (a Python call for each value of
    thousands of rows) are skipped."""
    try:
        sql, params = queryset.query.sql_with_params()
    except EmptyResultSet:  # e.g. an empty list of splits: Django runs no query either
        return []
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


def _score_of(parts: list[float], *, mean_score: bool) -> tuple[float, float | None] | None:
    """S and C of summed totals (``_score_totals``), by ``evolution.loop.measure``."""
    n, passed, score_sum, tokens, tokens_n = parts
    totals = measure.Totals(
        trials=int(n), passed=int(passed), score_sum=score_sum, tokens_sum=int(tokens), tokens_count=int(tokens_n)
    )
    score = measure.score(totals, "mean_score" if mean_score else "pass_at_1")
    return None if score is None else (score, measure.cost(totals))


def candidate_scores(
    *,
    experiment_id: int,
    splits: list[str],
    mean_score: bool,
    candidate_ids: QuerySet[Any] | None = None,
) -> dict[int, tuple[float, float | None]]:
    """Score (pass@1, or mean score when ``mean_score``) and mean tokens per
    trial of each candidate over its counted evaluations (``measurements``) on
    ``splits``, as the gate computes them; optionally only the candidates of
    ``candidate_ids`` (a values("pk") queryset). Read from the per-split
    totals stored at certification (two queries, see ``_score_totals``)."""
    totals = _score_totals(experiment_id=experiment_id, splits=splits, candidate_ids=candidate_ids, fields=())
    result = {}
    for (candidate_id,), parts in totals.items():
        score = _score_of(parts, mean_score=mean_score)
        if score is not None:
            result[candidate_id] = score
    return result


class _TotalsSql(NamedTuple):
    """The per-candidate totals of ``_totals_queries`` as SQL for a query of one's own: ``ctes`` defines
    ``stored`` and ``unstored`` (by candidate_id, with ``params``); joined as ``s`` and ``u``, ``total(column)``
    is a candidate's sum over both as a double and ``score`` its S (``measure.score_sql``)."""

    ctes: str
    params: tuple[Any, ...]
    score: str
    connection: Any

    @staticmethod
    def total(column: str) -> str:
        return f"CAST(COALESCE(s.{column}, 0) + COALESCE(u.{column}, 0) AS DOUBLE PRECISION)"


def _totals_sql(
    *,
    experiment_id: int,
    splits: list[str],
    mean_score: bool,
    candidate_ids: QuerySet[Any] | None,
) -> _TotalsSql | None:
    """``_TotalsSql`` for these arguments; None when Django would run no query (an empty list of splits)."""
    stored, unstored = _totals_queries(
        experiment_id=experiment_id,
        splits=splits,
        candidate_ids=candidate_ids,
        key=("candidate_id",),
    )
    try:
        stored_sql, stored_params = stored.query.sql_with_params()
        unstored_sql, unstored_params = unstored.query.sql_with_params()
    except EmptyResultSet:
        return None
    total = _TotalsSql.total
    score = measure.score_sql(
        "mean_score" if mean_score else "pass_at_1",
        passed=total("passed"),
        score_sum=total("score_sum"),
        trials=total("n"),
    )
    return _TotalsSql(
        ctes=f"stored AS ({stored_sql}), unstored AS ({unstored_sql})",
        params=(*stored_params, *unstored_params),
        score=score,
        connection=connections[stored.db],
    )


def best_scored_candidate(
    *,
    experiment_id: int,
    splits: list[str],
    mean_score: bool,
    candidate_ids: QuerySet[Any],
) -> int | None:
    """The id of the best candidate of ``candidate_ids`` by the totals of ``candidate_scores``, or None when
    none was measured: the highest S; on a tie the lower cost (the gate's own admissibility: a harness as good
    for fewer tokens replaces it; a candidate reporting no tokens after one that does); then the one most
    recently accepted (its latest accepting gate decision); then the higher id. Summed and ranked in one query,
    so a dashboard with thousands of accepted candidates moves one row, not thousands, to Python."""
    totals = _totals_sql(
        experiment_id=experiment_id,
        splits=splits,
        mean_score=mean_score,
        candidate_ids=candidate_ids,
    )
    if totals is None:
        return None
    connection = totals.connection
    both = totals.total
    decisions = connection.ops.quote_name(GateDecision._meta.db_table)
    sql = f"""
        WITH {totals.ctes}
        SELECT c.id FROM {connection.ops.quote_name(Candidate._meta.db_table)} c
        LEFT JOIN stored s ON s.candidate_id = c.id
        LEFT JOIN unstored u ON u.candidate_id = c.id
        WHERE c.experiment_id = %s AND {both("n")} > 0
        ORDER BY {totals.score} DESC,
            CASE WHEN {both("tokens_n")} > 0 THEN {both("tokens_total")} / {both("tokens_n")} END ASC NULLS LAST,
            (SELECT MAX(g.id) FROM {decisions} g WHERE g.candidate_id = c.id AND g.accepted) DESC NULLS LAST,
            c.id DESC
        LIMIT 1
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, (*totals.params, experiment_id))
        row = cursor.fetchone()
    return None if row is None else int(row[0])


class MeasuredCandidate(NamedTuple):
    pk: int
    state: str
    origin: str
    round: int | None
    score: float
    tokens: float | None  # mean policy tokens per trial; None when no trial reported tokens


def measured_candidates(
    *,
    experiment_id: int,
    splits: list[str],
    mean_score: bool,
    candidate_ids: QuerySet[Any] | None = None,
) -> list[MeasuredCandidate]:
    """``candidate_scores`` with each candidate's state, origin and round, by
    candidate id, in the same two queries (for charts of every measured
    candidate, where a second pass over the candidates costs as much again)."""
    totals = _score_totals(
        experiment_id=experiment_id,
        splits=splits,
        candidate_ids=candidate_ids,
        fields=("state", "origin", "round"),
    )
    found = []
    for key, parts in sorted(totals.items(), key=lambda item: item[0][0]):
        measured = _score_of(parts, mean_score=mean_score)
        if measured is not None:
            pk, state, origin, round_number = key
            found.append(MeasuredCandidate(pk, state, origin, round_number, *measured))
    return found


class MeasuredSample(NamedTuple):
    candidates: list[MeasuredCandidate]  # by id; each reports tokens
    measured: int  # the measured candidates reporting tokens, sampled or not


def measured_candidates_sample(
    *,
    experiment_id: int,
    splits: list[str],
    mean_score: bool,
    limit: int,
    candidate_ids: QuerySet[Any] | None = None,
    start_id: int | None = None,
) -> MeasuredSample:
    """``measured_candidates`` that report tokens, thinned by the database
    for a cost chart of about ``limit`` points, and how many there are.

    Every one when there are at most ``limit``; else the Pareto front on
    (mean tokens, score) (no other candidate costs less or the same for a
    score as high or higher: the points ``review.charts.pareto_front``
    keeps), the run's start (``start_id``; else the seed), and every k-th of the accepted candidates and of the
    others in id order, k the smallest step that leaves at most ``limit`` of
    each. The chart draws its own sample from these: thousands of candidates
    are summed, ranked and picked in one query, and a few hundred rows reach
    Python. Scores and tokens are those of ``measured_candidates`` (the same
    totals, divided as doubles the integer totals convert to exactly)."""
    totals = _totals_sql(
        experiment_id=experiment_id,
        splits=splits,
        mean_score=mean_score,
        candidate_ids=candidate_ids,
    )
    if totals is None:
        return MeasuredSample([], 0)
    connection, both = totals.connection, totals.total
    candidate = connection.ops.quote_name(Candidate._meta.db_table)
    sql = f"""
        WITH {totals.ctes},
        measured AS (
            SELECT c.id, c.state, c.origin, c.{connection.ops.quote_name("round")},
                {totals.score} AS score, {both("tokens_total")} / {both("tokens_n")} AS cost,
                CASE WHEN c.id = %s OR c.state = %s THEN 1 ELSE 0 END AS labelled
            FROM {candidate} c
            LEFT JOIN stored s ON s.candidate_id = c.id
            LEFT JOIN unstored u ON u.candidate_id = c.id
            WHERE c.experiment_id = %s AND {both("n")} > 0 AND {both("tokens_n")} > 0
        ),
        ranked AS (
            SELECT m.*,
                MAX(score) OVER (ORDER BY cost, score DESC, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
                    AS best_before,
                ROW_NUMBER() OVER (PARTITION BY labelled ORDER BY id) - 1 AS nth,
                COUNT(*) OVER (PARTITION BY labelled) AS of_group,
                COUNT(*) OVER () AS total
            FROM measured m
        )
        SELECT id, state, origin, {connection.ops.quote_name("round")}, score, cost, total FROM ranked
        WHERE total <= %s OR best_before IS NULL OR score > best_before OR id = %s
            OR nth %% ((of_group + %s - 1) / %s) = 0
        ORDER BY id
    """
    kept = start_id if start_id is not None else Experiment.objects.get(pk=experiment_id).seed_candidate_id
    kept = -1 if kept is None else kept
    params = (
        *totals.params,
        kept,
        Candidate.State.ACCEPTED.value,
        experiment_id,
        limit,
        kept,
        limit,
        limit,
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return MeasuredSample([MeasuredCandidate(*row[:6]) for row in rows], rows[0][6] if rows else 0)


def _trial_record(
    task: str, split: str, index: int, outcome: str, score: float | None, tokens: int | None, steps: int | None
) -> metrics.TrialRecord:
    return metrics.TrialRecord(
        task=task,
        split=split,
        index=index,
        passed=outcome == Trial.Outcome.PASS,
        score=score if score is not None else 0.0,
        tokens=tokens,
        steps=steps,
        error=outcome == Trial.Outcome.ERROR,
    )


def evaluation_trial_records(*, evaluation: Evaluation) -> list[metrics.TrialRecord]:
    """An evaluation's finished trials as metric inputs (one query)."""
    rows = Trial.objects.filter(evaluation=evaluation).values_list(
        "task__external_id", "split", "index", "outcome", "score", "tokens", "steps"
    )
    return [_trial_record(*row) for row in rows]


def evaluation_summary(*, evaluation: Evaluation) -> dict[str, metrics.SplitSummary]:
    """Per-split rate, contribution, pass@k, pass^k and cost of an evaluation.

    Contributions are relative to all tasks of the experiment's own
    benchmark (held-out tasks excluded), so train + gate + sealed
    contributions add up to the benchmark-wide pass@1.
    """
    counts = SplitMembership.objects.filter(experiment_id=evaluation.experiment_id)
    own_total = counts.exclude(split=SplitName.HELDOUT).count()
    heldout_total = counts.filter(split=SplitName.HELDOUT).count()
    records = evaluation_trial_records(evaluation=evaluation)
    own = [r for r in records if r.split != SplitName.HELDOUT]
    heldout = [r for r in records if r.split == SplitName.HELDOUT]
    summary = metrics.split_summaries(own, own_total) if own else {}
    if heldout:
        # Held-out benchmarks are reported against their own size.
        summary.update(metrics.split_summaries(heldout, heldout_total))
    return summary


@dataclass(frozen=True)
class CandidateMetrics:
    splits: dict[str, metrics.SplitSummary]
    # dS (with its interval) and dC against the harness the gate compared it with, else its parent:
    # ``loop.load.candidate_delta``, the one dS the gate, the ledger and the API give too.
    delta: load.ComparedDelta | None


def candidate_metrics(*, candidate: Candidate) -> CandidateMetrics:
    """Per-split rate and contribution (labelled apart), pass@k, pass^k,
    tokens and steps over the counted trials (``measurements.candidate_split_summaries``);
    and dS with its interval and dC (``loop.load.candidate_delta``)."""
    summaries = measurements.candidate_split_summaries(candidate_id=candidate.pk, experiment_id=candidate.experiment_id)
    return CandidateMetrics(summaries, load.candidate_delta(candidate))


@dataclass(frozen=True)
class ExternalResult:
    """One ingested external submission: never certified, always labelled external."""

    evaluation: Evaluation
    source: dict[str, Any]
    trials: int
    passed: int
    mean_score: float | None
    mean_tokens: float | None
    splits: dict[str, metrics.SplitSummary]  # empty when tasks have uneven trial counts


def candidate_external_results(*, candidate: Candidate) -> list[ExternalResult]:
    """The candidate's external evaluations, newest first, with their numbers.

    Kept apart from ``candidate_metrics`` (``measurements``), which
    count certified evaluations only.
    """
    total = (
        SplitMembership.objects.filter(experiment_id=candidate.experiment_id).exclude(split=SplitName.HELDOUT).count()
    )
    evaluations = Evaluation.objects.filter(
        candidate=candidate, external=True, state=Evaluation.State.EXTERNAL
    ).order_by("-created_at", "-pk")
    found = []
    for evaluation in evaluations:
        records = evaluation_trial_records(evaluation=evaluation)
        tokens = [r.tokens for r in records if r.tokens is not None]
        try:
            own = [r for r in records if r.split != SplitName.HELDOUT]
            splits = metrics.split_summaries(own, total) if own else {}
        except ValueError:
            splits = {}
        found.append(
            ExternalResult(
                evaluation=evaluation,
                source=evaluation.source,
                trials=len(records),
                passed=sum(r.passed for r in records),
                mean_score=sum(r.score for r in records) / len(records) if records else None,
                mean_tokens=sum(tokens) / len(tokens) if tokens else None,
                splits=splits,
            )
        )
    return found


def trials_in_flight(*, experiment_id: int | None = None, endpoint_id: int | None = None) -> int:
    """Trials running now under a live lease, of one experiment or of every
    experiment calling one model endpoint. A trial whose worker died stops
    counting when its lease lapses. The claim's limits count with this."""
    running = Trial.objects.filter(state=Trial.State.RUNNING, lease_expires_at__gt=timezone.now())
    if experiment_id is not None:
        running = running.filter(evaluation__experiment_id=experiment_id)
    if endpoint_id is not None:
        running = running.filter(evaluation__experiment__endpoint_id=endpoint_id)
    return running.count()


@dataclass(frozen=True)
class InFlight:
    """Trials in flight against their limits, as the dashboard shows them."""

    experiment: int
    experiment_limit: int | None
    endpoint_name: str | None
    endpoint: int | None
    endpoint_limit: int | None


def in_flight(*, experiment: Experiment) -> InFlight:
    """The experiment's trials in flight and its limit; its model endpoint's
    (every experiment calling it, on every worker) and that limit."""
    endpoint = experiment.endpoint
    return InFlight(
        experiment=trials_in_flight(experiment_id=experiment.pk),
        experiment_limit=experiment.max_trials_in_flight,
        endpoint_name=endpoint.name if endpoint else None,
        endpoint=trials_in_flight(endpoint_id=endpoint.pk) if endpoint else None,
        endpoint_limit=endpoint.max_in_flight if endpoint else None,
    )


# The start request's name for "the experiment's own recipe" (no preset has this name).
OWN_RECIPE = "own"


def recipe_for_start(*, name: str, experiment: Experiment) -> Recipe:
    """The recipe a start request names: a preset, ``run-<pk>`` for the
    recipe of one of the experiment's runs, or ``own`` for the experiment's
    own recipe (the one its first run set). The operators are not checked
    here (``lifecycle.run_create`` checks them after its overrides: the
    preset's proposer may be replaced). Raises RecipeError or LoopError.
    ``lifecycle.run_start``, the one way to start a run, calls it."""
    if name in PRESET_NAMES:
        return load_preset(name)
    if name.startswith("run-") and name[4:].isdigit():
        run = Run.objects.filter(pk=int(name[4:]), experiment=experiment).select_related("recipe").first()
        if run is None:
            raise lifecycle.LoopError(f"no run {name[4:]} in this experiment")
        return parse_recipe(run.recipe.spec)
    if name == OWN_RECIPE:
        own = experiment.recipe
        if own is None:
            raise lifecycle.LoopError("it has no recipe of its own yet (its first run sets one): choose a preset")
        return parse_recipe(own.spec)
    raise lifecycle.LoopError(
        f"unknown recipe {name!r}: choose a preset ({', '.join(PRESET_NAMES)}), a run's (run-<id>) or "
        f"the experiment's own ({OWN_RECIPE})"
    )


# --- Review history: identical edits decided before ---------------------------------------

# Review items whose decision took effect.
DECIDED_ITEMS = (ReviewItem.State.APPROVED, ReviewItem.State.REJECTED, ReviewItem.State.PARTIAL)


def diff_md5(diff: str) -> str:
    """The MD5 of an edit's diff as the database computes it (``MD5("diff")``, indexed). Pure."""
    return hashlib.md5(diff.encode(), usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class EarlierVerdict:
    """The verdict that stands on an identical edit (the same diff) of another reviewed candidate."""

    edit_id: int  # the earlier identical edit
    edit_index: int
    item_id: int
    candidate_id: int
    verdict: str  # "approve" or "reject"
    whole: bool  # True: the verdict was on its whole candidate (which may hold other edits); False: on this edit
    reviewer: str
    at: datetime
    reason: str
    corrected: bool  # the verdict is a correction's

    @property
    def words(self) -> str:
        if self.verdict == "approve":
            return "approved" if self.whole else "kept (its other edits were rejected)"
        return "rejected with its whole candidate" if self.whole else "rejected (this edit alone)"


def earlier_verdicts(*, edits: Sequence[AtomicEdit]) -> dict[int, EarlierVerdict]:
    """For each of ``edits`` (by id), the newest verdict standing on an identical edit (same non-empty diff)
    of another candidate whose review took effect: its correction's when corrected, else the decision's
    (approved, rejected, or for a partial decision this edit's own: rejected or kept). Edits with no such
    earlier edit are left out. Four queries whatever the number of edits (the diff's MD5 is indexed)."""
    wanted = {edit.pk: edit.diff for edit in edits if edit.diff.strip()}
    if not wanted:
        return {}
    own = {edit.candidate_id for edit in edits}
    by_diff: dict[str, list[int]] = {}
    for pk, diff in wanted.items():
        by_diff.setdefault(diff, []).append(pk)
    others = list(
        AtomicEdit.objects.alias(h=MD5("diff"))
        .filter(h__in={diff_md5(diff) for diff in by_diff}, candidate__review_item__state__in=DECIDED_ITEMS)
        .exclude(candidate_id__in=own)
        .values_list("pk", "index", "diff", "candidate_id", "candidate__review_item")
    )
    others = [row for row in others if row[2] in by_diff]
    if not others:
        return {}
    item_ids = {row[4] for row in others}
    decisions = {
        d.item_id: d
        for d in ReviewDecision.objects.filter(item_id__in=item_ids, record__isnull=False).select_related("reviewer")
    }
    rejected = set(
        ReviewDecision.rejected_edits.through.objects.filter(reviewdecision__item_id__in=item_ids).values_list(
            "atomicedit_id", flat=True
        )
    )
    corrections: dict[int, ReviewCorrection] = {}
    for correction in (
        ReviewCorrection.objects.filter(item_id__in=item_ids, record__isnull=False)
        .select_related("reviewer")
        .order_by("created_at", "pk")
    ):
        corrections[correction.item_id] = correction  # the newest stands
    found: dict[int, EarlierVerdict] = {}
    for pk, index, diff, candidate_id, item_id in others:
        latest = corrections.get(item_id)
        decision = decisions.get(item_id)
        if latest is not None:
            verdict = EarlierVerdict(
                pk, index, item_id, candidate_id, latest.verdict, True,
                latest.reviewer.get_username(), latest.created_at, latest.reason, True,
            )  # fmt: skip
        elif decision is not None:
            if decision.verdict == ReviewDecision.Verdict.REJECT_EDITS:
                said, whole = ("reject" if pk in rejected else "approve"), False
            else:
                said, whole = str(decision.verdict), True
            verdict = EarlierVerdict(
                pk, index, item_id, candidate_id, said, whole,
                decision.reviewer.get_username(), decision.created_at, decision.reason, False,
            )  # fmt: skip
        else:
            continue
        for mine in by_diff[diff]:
            if mine not in found or verdict.at > found[mine].at:
                found[mine] = verdict
    return found


def same_verdict(*, edits: Sequence[AtomicEdit], earlier: dict[int, EarlierVerdict]) -> tuple[str, list[int]] | None:
    """The decision that repeats the earlier verdicts when every edit has one: ("approve", []) when all were
    approved or kept, ("reject", []) when all were rejected, ("reject_edits", ids) for the rejected ones
    when mixed; None when an edit has no earlier verdict. Pure."""
    if not edits or any(edit.pk not in earlier for edit in edits):
        return None
    rejected = [edit.pk for edit in edits if earlier[edit.pk].verdict == "reject"]
    if not rejected:
        return "approve", []
    if len(rejected) == len(edits):
        return "reject", []
    return "reject_edits", rejected


def identical_waiting(*, item_ids: Iterable[int], waiting_states: Iterable[str]) -> dict[int, list[int]]:
    """For each of ``item_ids``, the other waiting review items holding an edit with the same diff. One query
    over the waiting items' edits."""
    rows = AtomicEdit.objects.filter(candidate__review_item__state__in=list(waiting_states)).exclude(diff="")
    by_hash: dict[str, set[int]] = {}
    for item_id, digest in rows.annotate(h=MD5("diff")).values_list("candidate__review_item", "h"):
        by_hash.setdefault(digest, set()).add(item_id)
    wanted = set(item_ids)
    same: dict[int, set[int]] = {}
    for items in by_hash.values():
        for item_id in items & wanted:
            same.setdefault(item_id, set()).update(items - {item_id})
    return {item_id: sorted(others) for item_id, others in same.items() if others}


def split_concentration_warnings(*, experiment_id: int) -> list[str]:
    """Every value of a categorical task attribute (``splits.categorical_attributes``) whose tasks all sit
    in one of train, gate or sealed ("sealed holds all 3 tasks of kind from_ticket"): a capability only
    that split measures. One query."""
    rows = SplitMembership.objects.filter(experiment_id=experiment_id, split__in=splits.SPLITS).values_list(
        "task__external_id", "split", "task__metadata"
    )
    assignment = {task_id: split for task_id, split, _ in rows}
    metadata = {task_id: meta for task_id, _, meta in rows if isinstance(meta, dict)}
    return [
        line
        for attribute in splits.categorical_attributes(metadata)
        for line in splits.concentration_warnings(
            assignment, {t: m.get(attribute) for t, m in metadata.items()}, attribute=attribute
        )
    ]
