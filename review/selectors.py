"""Reads of the review screens: plain keyword-only functions over the ORM.

Each returns rows in a fixed number of queries, whatever the experiment's size: aggregates and ``values()``, never
a query per candidate. Per-task rows go through ``access.hide_sealed``. The views only parse, call these and
``evolution.selectors``, lay out (``review.charts``, ``review.lineage``, ``review.matrix``) and render.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import Count, Exists, F, Max, Min, OuterRef, Q, QuerySet, Subquery, Sum, TextField
from django.db.models.expressions import OrderBy
from django.db.models.functions import Cast, Coalesce, Left

from evolution import access, measurements, selectors
from evolution.loop import lifecycle, load, measure
from evolution.loop.state import RunState
from evolution.measurements import COUNTED_PURPOSES
from evolution.models import (
    Candidate,
    Evaluation,
    Experiment,
    GateDecision,
    LedgerEntry,
    ParityCheck,
    RecipeComparison,
    ReviewDecision,
    ReviewItem,
    Run,
    SplitMembership,
    TrajectoryStep,
    TreeEntry,
    Trial,
)
from evolution.recipes import Recipe, RecipeError

if TYPE_CHECKING:  # django-stubs-ext is a development requirement
    from django_stubs_ext import WithAnnotations

# --- Runs ------------------------------------------------------------------------------


# How many accepted candidates the dashboard's start form lists (the most recent);
# any other is given by its number. An experiment of thousands would otherwise
# render a select of thousands of options on every dashboard request.
START_CHOICES_SHOWN = 25


def start_choices(*, experiment: Experiment, shown: int) -> tuple[list[tuple[int, str]], int]:
    """What a new run may start from, for the start form (the default, blank, is the experiment's best:
    ``evolution.loop.load.best_candidate``): the seed, every run's start and the ``shown`` most recently
    accepted candidates, by number, and how many accepted candidates were left out (given by number)."""
    accepted = Candidate.objects.filter(experiment=experiment, state=Candidate.State.ACCEPTED)
    starts = Run.objects.filter(experiment=experiment).values("start_candidate_id")
    wanted = (
        Q(pk=experiment.seed_candidate_id)
        | Q(pk__in=starts, state=Candidate.State.ACCEPTED)
        | Q(pk__in=accepted.order_by("-pk").values("pk")[:shown])
    )
    found = list(
        Candidate.objects.filter(wanted, experiment=experiment)
        .order_by("pk")
        .values_list("pk", "label", "run_id", "state")
    )
    listed = sum(1 for *_, state in found if state == Candidate.State.ACCEPTED)
    hidden = max(0, accepted.count() - listed)
    choices = [
        (
            pk,
            f"#{pk}"
            + (" seed" if pk == experiment.seed_candidate_id else f" {label}" if label else "")
            + (f" (run {run_id})" if run_id else ""),
        )
        for pk, label, run_id, _ in found
    ]
    return choices, hidden


class BestHarness(TypedDict):
    candidate: Candidate
    scores: dict[str, float]  # certified S per split (train, gate, sealed, held-out where measured)
    score: float | None  # S on the evolve splits, what it was chosen by
    cost: float | None  # tokens per trial on the evolve splits, the tie-break
    run_id: int | None  # the run whose gate accepted it (None: the seed)
    label: str  # "#24 label · S 0.905 · 5,303 tokens/trial", for the start form


def best_harness(*, experiment: Experiment) -> BestHarness | None:
    """The best harness so far across the experiment's runs (``load.best_candidate``), its certified scores per
    split in the experiment's metric, and the run that accepted it. None before anything is accepted."""
    best = load.best_candidate(experiment)
    if best is None:
        return None
    splits, metric = load.experiment_measure(experiment)
    totals = measurements.candidate_totals(best.pk, splits)
    score, cost = measure.score(totals, metric), measure.cost(totals)
    accepted_by = (
        GateDecision.objects.filter(candidate=best, accepted=True, round__gt=0)
        .order_by("pk")
        .values_list("run_id", flat=True)
        .first()
    )
    return {
        "candidate": best,
        "scores": measurements.split_scores(candidate_id=best.pk, metric=metric),
        "score": score,
        "cost": cost,
        "run_id": accepted_by if accepted_by is not None else best.run_id,
        "label": " · ".join(
            part
            for part in (
                f"#{best.pk}" + (f" {best.label}" if best.label else ""),
                f"S {score:.3f}" if score is not None else "",
                f"{cost:,.0f} tokens/trial" if cost is not None else "",
            )
            if part
        ),
    }


def run_with_evidence(*, runs: Sequence[Run]) -> Run | None:
    """The run a dashboard shows by default: the newest that is not over or that gated a round, so a cancelled
    or failed run with nothing in it never hides an earlier run's evidence; else the newest."""
    for run in runs:
        if run.status in lifecycle.LIVE or run.status == Run.Status.PENDING or RunState.of(run).gated_rounds:
            return run
    return runs[0] if runs else None


def recipe_of(run: Run) -> Recipe | None:
    """The run's recipe, or None when it names an operator this process does not load (shown without a plan)."""
    try:
        return lifecycle.run_recipe(run)
    except (RecipeError, ValueError):
        return None


class _LatestRun(TypedDict):
    latest_run_id: int | None
    waiting_review: int


def experiments_with_latest_run() -> list[WithAnnotations[Experiment, _LatestRun]]:
    """Every experiment with its overview counts and ``latest_run_id``: the newest run with evidence, as the
    dashboard shows by default (``run_with_evidence``: in progress, or it gated round 1), else the newest."""
    runs = Run.objects.filter(experiment=OuterRef("pk")).order_by("-pk")
    with_evidence = runs.filter(
        Q(status__in=[Run.Status.PENDING, *lifecycle.LIVE]) | Q(state__rounds__has_key="1")
    ).values("pk")[:1]
    latest = Coalesce(Subquery(with_evidence), Subquery(runs.values("pk")[:1]))
    # Flagged candidates whose review item nobody has decided yet (open or claimed).
    waiting = ReviewItem.objects.filter(
        candidate__experiment=OuterRef("pk"), state__in=[ReviewItem.State.OPEN, ReviewItem.State.CLAIMED]
    )
    waiting_count = Coalesce(
        Subquery(waiting.order_by().values("candidate__experiment").annotate(n=Count("pk")).values("n")[:1]), 0
    )
    return list(selectors.experiment_overview().annotate(latest_run_id=latest, waiting_review=waiting_count))


def runs_by_id(*, run_ids: Iterable[int]) -> dict[int, Run]:
    return {run.pk: run for run in Run.objects.filter(pk__in=list(run_ids)).select_related("recipe")}


def experiment_comparisons(*, experiment: Experiment) -> list[RecipeComparison]:
    """The recipe comparisons started from the experiment, newest first (without their stored JSON)."""
    return list(RecipeComparison.objects.filter(experiment=experiment).defer("result").order_by("-pk")[:20])


def experiment_runs(*, experiment: Experiment) -> list[Run]:
    """The experiment's runs, newest first, with what the dashboard shows of each."""
    return list(
        Run.objects.filter(experiment=experiment)
        .select_related("recipe", "started_by", "current_candidate")
        .order_by("-pk")
    )


def split_sizes(*, experiment_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per experiment: tasks per split (one query)."""
    sizes: dict[int, dict[str, int]] = defaultdict(dict)
    for row in (
        SplitMembership.objects.filter(experiment_id__in=experiment_ids)
        .values("experiment_id", "split")
        .annotate(n=Count("pk"))
    ):
        sizes[row["experiment_id"]][row["split"]] = row["n"]
    return sizes


def last_parity_check(*, evaluator_id: int) -> ParityCheck | None:
    """The evaluator's latest ``manage.py parity`` result, or None (one query)."""
    return ParityCheck.objects.filter(evaluator_id=evaluator_id).order_by("-created_at", "-pk").first()


def candidate_state_counts(*, experiment: Experiment) -> list[tuple[str, int]]:
    return list(
        Candidate.objects.filter(experiment=experiment).values_list("state").annotate(n=Count("pk")).order_by("state")
    )


def gate_choices(*, run: Run) -> list[Mapping[str, Any]]:
    """The run's gate decisions that accepted or chose a candidate, in order."""
    return list(
        GateDecision.objects.filter(Q(accepted=True) | Q(chosen=True), run=run)
        .values("candidate_id", "round", "accepted", "chosen")
        .order_by("pk")
    )


def run_failures(*, run: Run, user: Any) -> dict[str, list[Mapping[str, Any]]]:
    """What went wrong in ``run``: failed evaluations and candidates, error trials by kind, and the latest error
    trials (per-task rows: sealed ones only for a user who may see them)."""
    error_trials = Trial.objects.filter(evaluation__run=run, state=Trial.State.ERROR)
    return {
        "failed_evaluations": list(
            Evaluation.objects.filter(run=run, state=Evaluation.State.FAILED)
            .exclude(error="")
            .values("pk", "candidate_id", "purpose", "error")
            .order_by("-pk")[:10]
        ),
        "failed_candidates": list(
            Candidate.objects.filter(run=run, state=Candidate.State.FAILED)
            .values("pk", "label", "state_reason")
            .order_by("-pk")[:10]
        ),
        "error_kinds": list(error_trials.values("error_kind").annotate(n=Count("pk")).order_by("-n")),
        "error_trials": list(
            access.hide_sealed(error_trials, user, split_field="split")
            .values("pk", "candidate_id", "split", "error_kind", "error", task_name=F("task__external_id"))
            .order_by("-pk")[:5]
        ),
    }


def exploration_rejects(*, run: Run) -> list[Mapping[str, Any]]:
    """Candidates refused while the run was stalled because they explored no new kind."""
    return list(
        Candidate.objects.filter(run=run, state=Candidate.State.REJECTED_BUDGET, state_reason__startswith="stalled")
        .annotate(reason=Left("state_reason", 240))
        .values("pk", "label", "round", "reason")
        .order_by("pk")
    )


def chart_candidates(*, experiment: Experiment, run: Run) -> QuerySet[Candidate]:
    """The candidates a run's cost chart draws: the run's, its start and those of no run (imported)."""
    return Candidate.objects.filter(
        Q(run=run) | Q(run__isnull=True) | Q(pk=run.start_candidate_id), experiment=experiment
    )


# --- Ledger ------------------------------------------------------------------------------


def component_ledger(*, run: Run, window_after: int) -> list[Mapping[str, Any]]:
    """Per component kind with ledger entries: edits measured and accepted, best dS overall and in the rounds
    after ``window_after``, last round (one query)."""
    return list(
        LedgerEntry.objects.filter(run=run)
        .values("component")
        .annotate(
            edits=Count("pk"),
            accepted_edits=Count("pk", filter=Q(accepted=True)),
            best=Max("delta_score"),
            best_window=Max("delta_score", filter=Q(round__gt=window_after)),
            last_round=Max("round"),
        )
        .order_by("component")
    )


def ledger_entries(
    *,
    run: Run | None,
    component: str = "",
    text: str = "",
    verdict: str = "",
    order: Sequence[str | OrderBy] = (),
) -> QuerySet[LedgerEntry]:
    """The run's ledger entries filtered by component, hypothesis text and verdict ("accepted"; "admissible":
    passed the gate but not chosen; "rejected": a rule rejected it) (none without a run)."""
    if run is None:
        return LedgerEntry.objects.none()
    entries = LedgerEntry.objects.filter(run=run).select_related("candidate")
    if component:
        entries = entries.filter(component=component)
    if text:
        entries = entries.filter(hypothesis__icontains=text)
    if verdict == "accepted":
        entries = entries.filter(accepted=True)
    elif verdict == "admissible":
        entries = entries.filter(accepted=False, admissible=True)
    elif verdict == "rejected":
        entries = entries.filter(accepted=False, admissible=False)
    return entries.order_by(*order)


# --- Lineage -----------------------------------------------------------------------------


def _of_run(experiment: Experiment, run: Run | None) -> QuerySet[Candidate]:
    """The experiment's candidates, or one run's: those it proposed, its start, and those that joined its gate (a
    candidate of an ended run approved later is evaluated for, and gated by, the live run)."""
    found = Candidate.objects.filter(experiment=experiment)
    if run is None:
        return found
    joined = Evaluation.objects.filter(run=run, purpose=Evaluation.Purpose.CANDIDATE).values("candidate_id")
    gated = GateDecision.objects.filter(run=run).values("candidate_id")
    return found.filter(Q(run=run) | Q(pk=run.start_candidate_id) | Q(pk__in=joined) | Q(pk__in=gated))


def lineage_counts(*, experiment: Experiment, run: Run | None = None) -> list[tuple[int | None, str, str, int]]:
    """(round, state, origin, count) of the experiment's candidates, or of one run's (one query)."""
    return list(_of_run(experiment, run).values_list("round", "state", "origin").annotate(n=Count("pk")).order_by())


def lineage_window(*, experiment: Experiment, first: int, last: int, run: Run | None = None) -> QuerySet[Candidate]:
    """The candidates of rounds ``first`` to ``last`` (the seed's none counts as 0), of one run when given, and
    their parents."""
    in_window = Q(round__gte=first, round__lte=last)
    if first == 0:
        in_window |= Q(round__isnull=True)
    window = _of_run(experiment, run).filter(in_window)
    return Candidate.objects.filter(Q(pk__in=window.values("pk")) | Q(pk__in=window.values("parent_id")))


def lineage_nodes(*, shown: QuerySet[Candidate]) -> list[Mapping[str, Any]]:
    return list(
        shown.annotate(reason=Left("state_reason", 240))
        .values("pk", "parent_id", "state", "origin", "round", "label", "reason", "run_id")
        .order_by("pk")
    )


def derived_from(*, shown: QuerySet[Candidate]) -> dict[int, int]:
    """For each derived candidate of ``shown``: the flagged candidate a reviewer derived it from."""
    return dict(
        ReviewDecision.objects.filter(derived_candidate__in=shown.values("pk")).values_list(
            "derived_candidate_id", "item__candidate_id"
        )
    )


def run_numbers(*, experiment: Experiment) -> dict[int, int]:
    """Each run's number within the experiment (1 for the first), by run id."""
    ids = Run.objects.filter(experiment=experiment).order_by("pk").values_list("pk", flat=True)
    return {pk: number for number, pk in enumerate(ids, start=1)}


# --- Results matrix ----------------------------------------------------------------------

FINISHED = (Trial.State.DONE, Trial.State.ERROR)
UNFINISHED = (Trial.State.PENDING, Trial.State.RUNNING)


def reported_trials(user: Any | None, *, external: bool = False) -> QuerySet[Trial]:
    """Trials shown per task: those of the counted evaluations
    (``measurements.COUNTED_PURPOSES``, certified) and of the ones still under
    way (their trials are pending until certification); never a cancelled or
    failed evaluation's. Sealed ones only for users who may see them (``user`` None:
    all of them, for aggregates). External results are left out: we did not
    run them, so they must not sit in a cell as if we had (the candidate page
    shows them apart, labelled external); ``external`` includes them, for an
    experiment that is all imported (``imported_from``)."""
    shown = [Evaluation.State.CERTIFIED, *measurements.UNFINISHED_EVALUATIONS]
    trials = Trial.objects.filter(evaluation__purpose__in=COUNTED_PURPOSES)
    if external:
        shown.append(Evaluation.State.EXTERNAL)
    else:
        trials = trials.filter(evaluation__external=False)
    trials = trials.filter(evaluation__state__in=shown)
    return trials if user is None else access.hide_sealed(trials, user)


def imported_from(experiment: Experiment) -> str:
    """The format an experiment was imported from (an RSIHub workspace, Harbor
    jobs, terminal-bench runs, Inspect AI logs), or "". Such an experiment holds only external results, none of
    ours, so its matrix shows them, under a notice saying so."""
    origin = experiment.run_settings.get("imported_from") if isinstance(experiment.run_settings, dict) else None
    fmt = origin.get("format") if isinstance(origin, dict) else None
    return fmt if fmt in ("rsihub-workspace", "harbor-job", "terminal-bench-run", "inspect-log") else ""


def split_counts(*, experiment: Experiment) -> dict[str, int]:
    """Tasks per split. Aggregates per split are not per-task data: everyone may see the counts."""
    return dict(
        SplitMembership.objects.filter(experiment=experiment)
        .values_list("split")
        .annotate(n=Count("pk"))
        .values_list("split", "n")
    )


def matrix_candidates(
    *, experiment: Experiment, selected: list[int], external: bool = False
) -> QuerySet[Candidate, Mapping[str, Any]]:
    """The candidates with trials of their own (all, or the ``selected`` ids), in round order, as values;
    ``external``: external evaluations count too (see ``reported_trials``).

    An evaluation's trials are created with it (trials_total counts them):
    probing the evaluations is far cheaper than probing the trials."""
    with_trials = Exists(
        Evaluation.objects.filter(
            candidate=OuterRef("pk"),
            purpose__in=COUNTED_PURPOSES,
            trials_total__gt=0,
            **({} if external else {"external": False}),
        )
    )
    candidates = Candidate.objects.filter(with_trials, experiment=experiment)
    if selected:
        candidates = candidates.filter(pk__in=selected)
    return candidates.order_by(F("round").asc(nulls_first=True), "pk").values(
        "pk", "label", "round", "state", "origin", "parent_id"
    )


def visible_task_count(*, experiment: Experiment, user: Any) -> int:
    """How many of the experiment's tasks ``user`` may see per task (every split)."""
    return access.hide_sealed(SplitMembership.objects.filter(experiment=experiment), user).count()


def visible_tasks(*, experiment: Experiment, user: Any, split: str) -> list[tuple[int, str, str]]:
    """(task id, external id, split) of the tasks ``user`` may see, of one split or all (unsorted)."""
    memberships = access.hide_sealed(SplitMembership.objects.filter(experiment=experiment), user)
    if split:
        memberships = memberships.filter(split=split)
    return list(memberships.values_list("task_id", "task__external_id", "split"))


def matrix_cells(
    *, user: Any | None, candidate_ids: list[int], external: bool = False
) -> QuerySet[Trial, Mapping[str, Any]]:
    """Per candidate, task and split: finished trials, passes, errors, pending, score sum and first trial id (the
    whole grid of the shown candidates and their parents in one aggregated query; ``user`` None: every task).
    Finished counts only trials of certified (or, with ``external``, external) evaluations, the trials every other
    screen counts; a trial of an evaluation still under way is pending, finished or not."""
    counted = Q(state__in=FINISHED) & ~Q(evaluation__state__in=measurements.UNFINISHED_EVALUATIONS)
    return (
        reported_trials(user, external=external)
        .filter(candidate_id__in=candidate_ids)
        .values("candidate_id", "task_id", "split")
        .annotate(
            n=Count("pk", filter=counted),
            passes=Count("pk", filter=counted & Q(outcome=Trial.Outcome.PASS)),
            errors=Count("pk", filter=counted & (Q(outcome=Trial.Outcome.ERROR) | Q(state=Trial.State.ERROR))),
            pending=Count(
                "pk",
                filter=Q(state__in=UNFINISHED) | Q(evaluation__state__in=measurements.UNFINISHED_EVALUATIONS),
            ),
            score_sum=Sum(
                "score", filter=counted & Q(state=Trial.State.DONE) & ~Q(outcome=Trial.Outcome.ERROR), default=0.0
            ),
            first_trial=Min("pk"),
        )
        .order_by()
    )


def matrix_trials(
    *, user: Any, candidate_ids: list[int], task_ids: list[int], external: bool = False
) -> QuerySet[Trial, Mapping[str, Any]]:
    """Every trial of those candidates on those tasks (k per cell), for the cells' links."""
    return (
        reported_trials(user, external=external)
        .filter(candidate_id__in=candidate_ids, task_id__in=task_ids)
        .order_by("index", "pk")
        .values("pk", "candidate_id", "task_id", "index", "outcome", "state")
    )


# --- Diffs -------------------------------------------------------------------------------


def tree_file(*, candidate: Candidate, path: str) -> bytes | None:
    """The content of one file of the candidate's stored tree (None when the tree has no such file)."""
    entry = TreeEntry.objects.filter(tree_id=candidate.tree_id, path=path).select_related("blob").first()
    return bytes(entry.blob.content) if entry is not None else None


# --- Trajectories ---------------------------------------------------------------------


def trajectory_steps_matching(
    *, trajectory_id: int, text: str = "", source: str = "", tool_calls: bool = False, columns: Sequence[str]
) -> QuerySet[TrajectoryStep, dict[str, Any]]:
    """A trajectory's steps, in order, that hold ``text`` (case-insensitive,
    in the message, reasoning, tool calls or observation), come from
    ``source`` and, with ``tool_calls``, call a tool; as ``values(*columns)``."""
    steps = TrajectoryStep.objects.filter(trajectory_id=trajectory_id)
    if source:
        steps = steps.filter(source=source)
    if tool_calls:
        steps = steps.exclude(tool_calls=[]).exclude(tool_calls__isnull=True)
    if text:
        steps = steps.annotate(
            calls_text=Cast("tool_calls", TextField()), observation_text=Cast("observation", TextField())
        ).filter(
            Q(message__icontains=text)
            | Q(reasoning_content__icontains=text)
            | Q(calls_text__icontains=text)
            | Q(observation_text__icontains=text)
        )
    return steps.order_by("step_id").values(*columns)
