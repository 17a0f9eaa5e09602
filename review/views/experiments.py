"""Experiments list and the experiment dashboard (its live progress and ledger sections too).

Reads gather plain numbers in a fixed number of queries (``review.selectors`` and ``evolution.selectors``:
aggregates and ``values()``, never a query per candidate), then ``review.charts`` lays them out. The lineage page
is ``lineage.py``, run control ``runs.py``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlencode

from django import forms
from django.core.paginator import Paginator
from django.db.models import F
from django.db.models.expressions import OrderBy
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.urls import path, reverse
from django.views.decorators.http import require_GET

from evolution import access, measurements, selectors
from evolution.loop import load
from evolution.loop import steps as loop_steps
from evolution.loop.state import Dropped, Event, RunState
from evolution.metrics import relative_cost_change
from evolution.models import (
    RUN_MOVING,
    RUN_UNFINISHED,
    Candidate,
    ComponentKind,
    Experiment,
    Run,
    SplitName,
    Trial,
)
from evolution.recipes import Recipe
from evolution.services.records import evaluator_config_digest
from evolution.surfaces import parse_surface, reachable_kinds
from review import charts
from review import lineage as lineage_layout
from review import selectors as review_selectors
from review.http import HtmxHttpRequest
from review.views.runs import RunStartForm, start_form_initial

# A run that may still change on its own.
MOVING = RUN_MOVING
# The progress section polls while its run is unfinished: a paused run's in-flight trials still finish, and it
# may be resumed or cancelled from another tab, the API or the admin.
UNFINISHED = RUN_UNFINISHED
TRIAL_FINISHED = (Trial.State.DONE, Trial.State.ERROR, Trial.State.CANCELLED)
TRANSFER_SPLITS = (SplitName.SEALED, SplitName.HELDOUT)
LEDGER_PAGE_SIZE = 50
ROUNDS_PAGE_SIZE = 50
# Beyond these, charts draw a server-side sample (the page says so).
COST_CHART_POINTS = 400
SCORE_CHART_ROUNDS = 300


# --- Run progress ------------------------------------------------------------------


@dataclass
class RunProgress:
    """What a progress bar needs: rounds and trials done, with their totals."""

    run: Run
    recipe: Recipe | None
    rounds_done: int
    trials_done: int
    trials_started: int
    trials_planned: int | None  # an upper bound from the recipe (proposals may be dropped)
    trial_errors: int

    @property
    def moving(self) -> bool:
        return self.run.status in MOVING

    @property
    def unfinished(self) -> bool:
        return self.run.status in UNFINISHED

    @property
    def poll_seconds(self) -> int:
        """How often the live section asks again: 2 s while the run moves, 5 s while it is paused."""
        return 2 if self.moving else 5

    @property
    def phase(self) -> str:
        return RunState.of(self.run).phase

    @property
    def trials_total(self) -> int:
        if not self.unfinished or self.trials_planned is None:
            return max(self.trials_started, 1)
        return max(self.trials_planned, self.trials_started, 1)

    @property
    def rounds_total(self) -> int:
        return max(self.run.rounds, 1)


def _trials_planned(recipe: Recipe | None, split_sizes: dict[str, int]) -> int | None:
    """Trials the run would make if every proposal were evaluated."""
    if recipe is None:
        return None
    k = recipe.evaluation.trials_per_task
    evolve = sum(split_sizes.get(s, 0) for s in recipe.evaluation.evolve_splits) * k
    transfer = sum(split_sizes.get(s, 0) for s in TRANSFER_SPLITS) * k
    baseline = sum(split_sizes.get(s, 0) for s in recipe.evaluation.evolve_splits)
    per_candidate = evolve + (transfer if recipe.evaluation.sealed == "every_round" else 0)
    final = 2 * transfer if recipe.evaluation.sealed != "never" else 0
    return (
        baseline * recipe.baseline_trials_per_task()
        + recipe.rounds * recipe.candidates_per_round * per_candidate
        + final
    )


def _rounds_done(run: Run) -> int:
    return RunState.of(run).gated_rounds


def _trial_counts(run_ids: list[int]) -> dict[int, dict[str, int]]:
    """Per run: trials started, finished and finished with an error (from the
    evaluations' counters, not by counting every trial)."""
    return selectors.run_trial_counts(run_ids=run_ids)


def url_maker(name: str) -> Any:
    """``pk -> reverse(name, args=[pk])`` with one ``reverse`` call: pages that
    link thousands of rows build each href with an f-string."""
    marker = "987654321"
    head, tail = reverse(name, args=[int(marker)]).split(marker)
    return lambda pk: f"{head}{pk}{tail}"


def _progress(run: Run, counts: dict[str, int] | None, split_sizes: dict[str, int]) -> RunProgress:
    counts = counts or {}
    recipe = review_selectors.recipe_of(run)
    return RunProgress(
        run=run,
        recipe=recipe,
        rounds_done=_rounds_done(run),
        trials_done=counts.get("done", 0),
        trials_started=counts.get("started", 0),
        trials_planned=_trials_planned(recipe, split_sizes),
        trial_errors=counts.get("errors", 0),
    )


# --- Experiments list --------------------------------------------------------------


@require_GET
@access.permission_required()
def home(request: HttpRequest) -> HttpResponse:
    """Every experiment with its counts and its latest run's progress."""
    experiments = review_selectors.experiments_with_latest_run()
    run_ids = [e.latest_run_id for e in experiments if e.latest_run_id]
    runs = review_selectors.runs_by_id(run_ids=run_ids)
    counts = _trial_counts(run_ids)
    sizes = review_selectors.split_sizes(experiment_ids=[e.pk for e in experiments])
    rows = []
    for experiment in experiments:
        run = runs.get(experiment.latest_run_id) if experiment.latest_run_id is not None else None
        progress = _progress(run, counts.get(run.pk), sizes[experiment.pk]) if run else None
        rows.append({"experiment": experiment, "progress": progress})
    return render(request, "review/home.html", {"rows": rows})


# --- Dashboard ---------------------------------------------------------------------


@dataclass
class RoundRow:
    number: int
    parent: int | None = None
    budget: int | None = None
    proposed: int = 0
    flagged: int = 0
    rejected_surface: int = 0
    rejected_budget: int = 0
    evaluated: int = 0
    accepted: list[int] = field(default_factory=list)
    chosen: int | None = None
    dropped: list[Dropped] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    best: float | None = None
    tokens: float | None = None
    events: list[Event] = field(default_factory=list)
    stalled: bool = False
    in_progress: bool = False
    gated: bool = False  # the loop wrote its summary: the gate has decided this round
    split_values: list[tuple[str, float | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Divergence:
    text: str
    rows: list[dict[str, Any]]


def _selected_run(experiment: Experiment, runs: list[Run], raw: str | None) -> Run | None:
    """The run ``?run=`` names; by default the newest with evidence (``review_selectors.run_with_evidence``)."""
    if raw and raw.isdigit():
        for run in runs:
            if run.pk == int(raw):
                return run
    return review_selectors.run_with_evidence(runs=runs)


def _run_outcome(run: Run, costs: Mapping[int, float | None]) -> dict[str, Any]:
    """What a run achieved, from its own start: for the runs table across runs. ``costs``: tokens per trial of
    candidates by id (``_run_costs``)."""
    state = RunState.of(run)
    gained, sealed = state.evolve_gain, state.transfer_change(SplitName.SEALED)
    start_cost = costs.get(run.start_candidate_id) if run.start_candidate_id else None
    final_cost = costs.get(run.current_candidate_id) if run.current_candidate_id else None
    cost = ""
    if start_cost is not None and final_cost is not None:
        change = relative_cost_change(final_cost, start_cost)
        cost = f"{start_cost:,.0f} → {final_cost:,.0f}" + (f" ({change * 100:+.1f}%)" if change is not None else "")
    return {
        "start": run.start_candidate_id,
        "final": run.current_candidate_id,
        "gained": f"{gained:+.3f}" if gained is not None else "",
        "sealed": f"{sealed:+.3f}" if sealed is not None else "",
        "cost": cost,
        "empty": not state.gated_rounds,
    }


def _run_costs(experiment: Experiment, runs: Sequence[Run]) -> dict[int, float | None]:
    """Tokens per trial on the experiment's evolve splits of every run's start and final harness (one query)."""
    ids = {pk for r in runs for pk in (r.start_candidate_id, r.current_candidate_id) if pk is not None}
    if not ids:
        return {}
    splits, metric = load.experiment_measure(experiment)
    scores = selectors.candidate_scores(
        experiment_id=experiment.pk,
        splits=list(splits),
        mean_score=metric == "mean_score",
        candidate_ids=Candidate.objects.filter(pk__in=ids).values("pk"),
    )
    return {pk: cost for pk, (_, cost) in scores.items()}


def _round_rows(
    run: Run, round_states: Mapping[int, measurements.RoundCounts], decisions: Sequence[Mapping[str, Any]]
) -> list[RoundRow]:
    """One row per round: the loop's round summary where it wrote one, else
    counts from the candidates (the round in progress, or rows added later).
    ``decisions``: the run's gate decisions that accepted or chose."""
    state = RunState.of(run)
    summaries = state.rounds
    best_by_round = state.best_by_round
    stalled = set(state.stalled_rounds)
    events: dict[int, list[Event]] = defaultdict(list)
    for event in state.events:
        events[int(event.get("round", 0))].append(event)
    accepted: dict[int, list[int]] = defaultdict(list)
    chosen: dict[int, int] = {}
    for decision in decisions:
        if decision["accepted"] and decision["round"] > 0:
            accepted[decision["round"]].append(decision["candidate_id"])
        if decision["chosen"]:
            chosen[decision["round"]] = decision["candidate_id"]
    numbers = set(summaries) | set(round_states) | set(events)
    if run.status in UNFINISHED and state.in_round:
        numbers.add(run.current_round)
    unfinished = run.status in UNFINISHED
    rows = []
    for number in sorted(numbers):
        summary = summaries.get(number)
        row = RoundRow(number=number, events=events.get(number, []), stalled=number in stalled)
        if summary:
            row.gated = True
            row.parent = summary.get("parent")
            row.budget = summary.get("budget")
            row.proposed = summary.get("proposed", 0)
            row.flagged = summary.get("flagged", 0)
            row.rejected_surface = summary.get("rejected_surface", 0)
            row.rejected_budget = summary.get("rejected_budget", 0)
            row.evaluated = summary.get("evaluated", 0)
            row.scores = dict(summary.get("scores", {}))
            row.tokens = summary.get("tokens_per_trial")
            row.dropped = list(summary.get("dropped", []))
        else:
            counts = round_states.get(number) or measurements.RoundCounts()
            row.parent = state.round_parents.get(number)
            row.budget = state.round_budgets.get(number)
            row.proposed = counts.proposed
            row.flagged = counts.flagged
            row.rejected_surface = counts.rejected_surface
            row.rejected_budget = counts.rejected_budget
            row.evaluated = counts.evaluated
            row.dropped = state.dropped_in(number)
            row.in_progress = unfinished and number == run.current_round
        row.accepted = accepted.get(number, [])
        row.chosen = chosen.get(number) if number > 0 else None
        if number < len(best_by_round):
            row.best = best_by_round[number]
        rows.append(row)
    return rows


def _with_transfer(rows: list[RoundRow], run: Run) -> list[RoundRow]:
    """Sealed and held-out are measured at the end (unless the recipe says
    every round): put the run's start's on round 0 and the final harness's on the
    last round, so the chart shows transfer beside the evolve scores."""
    state = RunState.of(run)
    final = state.final or {}
    if not rows or not final:
        return rows
    gated = [r for r in rows if r.number in state.rounds]
    first, last = gated[0] if gated else rows[0], gated[-1] if gated else rows[-1]
    start_scores = state.start_scores
    for split in TRANSFER_SPLITS:
        if split in start_scores and first.number == 0:
            first.scores.setdefault(split, start_scores[split])
        if split in final.get("scores", {}):
            last.scores.setdefault(split, final["scores"][split])
    return rows


def _divergence(run: Run, recipe: Recipe | None, rows: list[RoundRow]) -> tuple[Divergence | None, list[dict]]:
    """The divergence warning (evolve up, sealed or held-out down) and the
    seed-versus-latest comparison per split it is based on."""
    state = RunState.of(run)
    final = state.final or {}
    if final:
        start, end, text = state.start_scores, final.get("scores", {}), final.get("divergence", "")
    else:
        measured = [r for r in rows if r.scores]
        if len(measured) < 2 or measured[0].number != 0:
            return None, []
        start, end = measured[0].scores, measured[-1].scores
        text = loop_steps.divergence(start, end, recipe.evaluation.evolve_splits) if recipe else ""
    evolve = set(recipe.evaluation.evolve_splits) if recipe else {SplitName.TRAIN, SplitName.GATE}
    comparison = [
        {
            "split": split,
            "kind": "evolve" if split in evolve else ("transfer" if split in TRANSFER_SPLITS else "reported"),
            "start": start[split],
            "end": end[split],
            "change": end[split] - start[split],
        }
        for split in charts.SPLIT_COLOURS
        if split in start and split in end
    ]
    return (Divergence(text, comparison) if text else None), comparison


def _score_chart(rows: list[RoundRow], run: Run) -> str:
    data = [
        charts.RoundScores(
            round=row.number,
            splits=row.scores,
            best=row.best,
            accepted=tuple(f"#{pk}" for pk in row.accepted),
        )
        for row in rows
        if row.scores or row.best is not None
    ]
    data = charts.thin_rounds(data, SCORE_CHART_ROUNDS)
    return charts.score_chart(data, delta=run.noise_delta, total_rounds=run.rounds)


class _Measured(NamedTuple):
    """A measured candidate as the cost chart's sample sees it (charts.Plotted)."""

    candidate_id: int
    cost: float
    score: float
    category: str
    label: bool


def _cost_chart(experiment: Experiment, run: Run, recipe: Recipe | None) -> tuple[str, int, int]:
    """The cost chart of ``run``'s candidates and its start; with the number
    of points drawn and measured (beyond COST_CHART_POINTS a sample is drawn:
    every labelled point and the Pareto front, the others evenly spaced)."""
    shown = review_selectors.chart_candidates(experiment=experiment, run=run)
    evolve: list[str] = list(recipe.evaluation.evolve_splits) if recipe else [SplitName.TRAIN, SplitName.GATE]
    # Thousands may be measured: the database keeps the front, the seed and
    # an even sample of the rest, and the chart draws COST_CHART_POINTS or so
    # of those, with their links and tooltips.
    sample = selectors.measured_candidates_sample(
        experiment_id=experiment.pk,
        splits=evolve,
        mean_score=recipe is not None and recipe.evaluation.score_metric == "mean_score",
        limit=COST_CHART_POINTS,
        candidate_ids=shown.values("pk"),
        start_id=run.start_candidate_id,
    )
    points = []
    for candidate in sample.candidates:
        assert candidate.tokens is not None  # the sample holds only candidates that report tokens
        category = lineage_layout.category(state=candidate.state, origin=candidate.origin)
        labelled = category in {"seed", "accepted"} or candidate.pk == run.start_candidate_id
        points.append(_Measured(candidate.pk, candidate.tokens, candidate.score, category, labelled))
    href = url_maker("review:candidate")
    facts = {candidate.pk: candidate for candidate in sample.candidates}
    drawn = []
    for point in charts.thin_cost_points(points, COST_CHART_POINTS):
        candidate = facts[point.candidate_id]
        drawn.append(
            charts.CostPoint(
                candidate_id=point.candidate_id,
                cost=point.cost,
                score=point.score,
                category=point.category,
                name=f"start #{point.candidate_id}"
                if point.candidate_id == run.start_candidate_id
                else f"#{point.candidate_id}",
                href=href(point.candidate_id),
                label=point.label,
                detail=f"{candidate.state}, round {candidate.round}",
            )
        )
    return charts.cost_chart(drawn, category_titles=lineage_layout.CATEGORY_TITLES), len(drawn), sample.measured


def _component_table(run: Run, recipe: Recipe | None, last_round: int) -> list[dict[str, Any]]:
    """Per component kind: edits measured and accepted, best dS overall and
    in the pruning window, and whether it is a pruning target now."""
    window = recipe.pruning.window if recipe else 3
    targets = set(RunState.of(run).pruning_targets)
    rows = review_selectors.component_ledger(run=run, window_after=last_round - window)
    measured = {row["component"]: {**row, "target": row["component"] in targets} for row in rows}
    return [
        measured.get(kind, {"component": kind, "edits": 0, "target": kind in targets}) for kind in ComponentKind.values
    ]


# --- Ledger ------------------------------------------------------------------------


LEDGER_SORTS: dict[str, tuple[str | OrderBy, str]] = {
    "round": ("round", "pk"),
    "-round": ("-round", "-pk"),
    "dS": ("delta_score", "pk"),
    "-dS": ("-delta_score", "pk"),
    # A rise from no cost (no dC) counts as the largest increase.
    "dC": (F("delta_cost").asc(nulls_last=True), "pk"),
    "-dC": (F("delta_cost").desc(nulls_first=True), "pk"),
}


class LedgerFilterForm(forms.Form):
    run = forms.IntegerField(required=False)
    component = forms.ChoiceField(required=False, choices=[("", "any component"), *ComponentKind.choices])
    q = forms.CharField(required=False, max_length=200, strip=True)
    accepted = forms.ChoiceField(
        required=False,
        choices=[("", "any"), ("yes", "accepted"), ("admissible", "admissible, not chosen"), ("no", "rejected")],
    )
    sort = forms.ChoiceField(required=False, choices=[(key, key) for key in LEDGER_SORTS])
    page = forms.IntegerField(required=False, min_value=1)


def _ledger_context(request: HttpRequest, experiment: Experiment, run: Run | None) -> dict[str, Any]:
    form = LedgerFilterForm(request.GET)
    form.is_valid()  # a bad value falls back to "no filter" for that field
    values = {key: form.cleaned_data.get(key) for key in ("component", "q", "accepted", "sort", "page")}
    sort = values["sort"] or "round"
    entries = review_selectors.ledger_entries(
        run=run,
        component=values["component"] or "",
        text=values["q"] or "",
        verdict={"yes": "accepted", "admissible": "admissible", "no": "rejected"}.get(values["accepted"] or "", ""),
        order=LEDGER_SORTS[sort],
    )
    page = Paginator(entries, LEDGER_PAGE_SIZE).get_page(values["page"] or 1)
    base = {"run": run.pk if run else ""}
    filters = {key: values[key] for key in ("component", "q", "accepted") if values[key]}

    def query(**changes: Any) -> str:
        merged = {**base, **filters, "sort": sort, **changes}
        return urlencode({k: v for k, v in merged.items() if v not in ("", None)})

    sort_links = {
        column: query(sort=(f"-{column}" if sort != f"-{column}" else column), page="")
        for column in ("round", "dS", "dC")
    }
    rows = [
        {
            "round": entry.round,
            "candidate_id": entry.candidate_id,
            "label": entry.candidate.label,
            "component": entry.component,
            "hypothesis": entry.hypothesis,
            "delta_score": entry.delta_score,
            "delta_cost": entry.delta_cost,
            "dS": f"{entry.delta_score:+.3f}",
            # No dC when the harness it was compared with reported no cost: a rise from 0 has no relative change.
            "dC": "no earlier cost" if entry.delta_cost is None else f"{entry.delta_cost * 100:+.1f}%",
            "accepted": entry.accepted,
            "admissible": entry.admissible,
        }
        for entry in page.object_list
    ]
    return {
        "ledger_page": page,
        "ledger_rows": rows,
        "ledger_filters": {**filters, "sort": sort},
        "ledger_sort_links": sort_links,
        "ledger_query": query(),
        "ledger_prev": query(page=page.previous_page_number()) if page.has_previous() else "",
        "ledger_next": query(page=page.next_page_number()) if page.has_next() else "",
        "components_choices": [("", "any"), *ComponentKind.choices],
    }


# --- Dashboard views ---------------------------------------------------------------


def _rounds_page(request: HttpRequest, rows: list[RoundRow], run: Run) -> dict[str, Any]:
    """ROUNDS_PAGE_SIZE rounds of the table; the latest ones unless
    ``?rounds=N`` asks for another page. Pager links are plain links."""
    paginator = Paginator(rows, ROUNDS_PAGE_SIZE)
    raw = request.GET.get("rounds", "")
    number = int(raw) if raw.isdigit() else paginator.num_pages
    page = paginator.get_page(number)
    links = []
    if paginator.num_pages > 1:
        wanted = {1, paginator.num_pages, *range(page.number - 2, page.number + 3)}
        for n in sorted(x for x in wanted if 1 <= x <= paginator.num_pages):
            first, last = rows[(n - 1) * ROUNDS_PAGE_SIZE].number, rows[min(n * ROUNDS_PAGE_SIZE, len(rows)) - 1].number
            links.append({"number": n, "url": f"?run={run.pk}&rounds={n}#rounds", "title": f"rounds {first}–{last}"})
    shown = list(page.object_list)
    span = f"rounds {shown[0].number}–{shown[-1].number}" if shown else ""
    return {
        "rounds": shown,
        "rounds_pager": page,
        "rounds_links": links,
        "rounds_total": len(rows),
        "rounds_span": span,
    }


def _experiment_or_404(pk: int) -> Experiment:
    return get_object_or_404(
        selectors.experiment_overview().select_related("recipe", "seed_candidate", "endpoint"),
        pk=pk,
    )


def _progress_context(
    request: HttpRequest,
    experiment: Experiment,
    run: Run,
    sizes: dict[str, int],
    *,
    all_counts: dict[int, dict[str, int]] | None = None,
) -> dict[str, Any]:
    """The live section of the dashboard: progress, errors, controls.
    ``all_counts``: the trial counts per run when the caller has them already
    (a count over every trial of the run is the page's most expensive query)."""
    counts = (all_counts if all_counts is not None else _trial_counts([run.pk])).get(run.pk)
    progress = _progress(run, counts, sizes)
    state = RunState.of(run)
    dropped = [
        {"round": r, **item}
        for r, items in sorted(state.dropped.items())
        for item in items
        if item.get("why") == "proposer_error"
    ]
    return {
        "experiment": experiment,
        "run": run,
        "progress": progress,
        # Per-task rows among them: sealed ones only for those who may see them.
        **review_selectors.run_failures(run=run, user=request.user),
        "proposer_errors": dropped[-10:],
        "recent_events": list(reversed(state.events[-6:])),
        "state": state,
        # Trials running now against the limits that hold them (every worker's).
        "in_flight": selectors.in_flight(experiment=experiment),
        # The run's steps' tokens in money: every trial it ran (noise repeats too, they were spent).
        "run_money": selectors.step_tokens_money(trials=Trial.objects.filter(evaluation__run=run)),
    }


def _run_sections(request: HttpRequest, experiment: Experiment, run: Run, recipe: Recipe | None) -> dict[str, Any]:
    """The dashboard's sections about one run (below its live progress): charts, rounds, divergence, components,
    stall and exploration. ``recipe`` is the run's, or None when this process cannot parse it."""
    rows = _with_transfer(
        _round_rows(run, measurements.round_counts(run_id=run.pk), review_selectors.gate_choices(run=run)), run
    )
    divergence, comparison = _divergence(run, recipe, rows)
    splits = [s for s in charts.SPLIT_COLOURS if any(s in row.scores for row in rows)]
    rounds_page = _rounds_page(request, rows, run)
    for row in rounds_page["rounds"]:
        row.split_values = [(s, row.scores.get(s)) for s in splits]
    cost_chart, cost_drawn, cost_total = _cost_chart(experiment, run, recipe)
    state = RunState.of(run)
    return {
        "recipe": recipe,
        **rounds_page,
        "round_splits": splits,
        "score_chart": _score_chart(rows, run),
        "score_chart_sampled": sum(1 for r in rows if r.scores or r.best is not None) > SCORE_CHART_ROUNDS,
        "cost_chart": cost_chart,
        "cost_drawn": cost_drawn,
        "cost_total": cost_total,
        "divergence": divergence,
        "comparison": comparison,
        "components": _component_table(run, recipe, state.last_gated_round),
        "pruning_targets": state.pruning_targets,
        "stalled_rounds": state.stalled_rounds,
        "unexplored": state.unexplored_kinds(reachable_kinds(parse_surface(experiment.surface.spec))),
        "exploration_rejects": review_selectors.exploration_rejects(run=run),
        "special_events": state.special_events(),
        "state": state,
    }


def _run_rows(
    experiment: Experiment, runs: list[Run], counts: dict[int, dict[str, int]], sizes: dict[str, int]
) -> list[dict[str, Any]]:
    """The runs table: each run's progress and outcome, cost start -> final included (the live section refreshes
    it too)."""
    costs = _run_costs(experiment, runs)
    return [
        {"run": r, "progress": _progress(r, counts.get(r.pk), sizes), "outcome": _run_outcome(r, costs)} for r in runs
    ]


def _parity_fact(experiment: Experiment) -> dict[str, Any] | None:
    """The latest parity check of the experiment's evaluator, as the facts list shows it."""
    check = review_selectors.last_parity_check(evaluator_id=experiment.evaluator_id)
    if check is None:
        return None

    def percent(pair: str) -> str:
        rate = check.numbers.get("trials", {}).get(pair, {}).get("rate")
        return "-" if rate is None else f"{100 * rate:.1f}%"

    return {
        "check": check,
        "platform_vs_direct": percent("platform_vs_direct"),
        "direct_vs_direct": percent("direct_vs_direct"),
        "stale": check.evaluator_digest != evaluator_config_digest(experiment.evaluator),
    }


@require_GET
@access.permission_required()
def experiment(request: HttpRequest, pk: int) -> HttpResponse:
    """The dashboard: facts, runs, live progress, charts, rounds, ledger."""
    experiment = _experiment_or_404(pk)
    runs = review_selectors.experiment_runs(experiment=experiment)
    run = _selected_run(experiment, runs, request.GET.get("run"))
    sizes = review_selectors.split_sizes(experiment_ids=[experiment.pk])[experiment.pk]
    counts = _trial_counts([r.pk for r in runs])
    context: dict[str, Any] = {
        "experiment": experiment,
        "runs": runs,
        "run": run,
        "split_sizes": [(s, sizes[s]) for s in SplitName.values if s in sizes],
        "task_total": sum(sizes.values()),
        "heldout_benchmarks": list(experiment.heldout_benchmarks.values_list("name", flat=True)),
        "split_warnings": selectors.split_concentration_warnings(experiment_id=experiment.pk),
        "state_counts": review_selectors.candidate_state_counts(experiment=experiment),
        # k as the runs used it (a start form or a recipe may override the experiment's default).
        "run_ks": sorted({r.trials_per_task for r in runs if r.trials_per_task is not None}),
        "parity": _parity_fact(experiment),
        "unexplored": [],
        "run_rows": _run_rows(experiment, runs, counts, sizes),
        "comparisons": review_selectors.experiment_comparisons(experiment=experiment),
        "best": review_selectors.best_harness(experiment=experiment),
        "runs_chart": charts.runs_chart(
            [
                charts.RunCurve(f"run {number} (#{r.pk})", tuple(RunState.of(r).best_by_round))
                for number, r in enumerate(reversed(runs), start=1)
            ]
        ),
    }
    if run is not None:
        context.update(_progress_context(request, experiment, run, sizes, all_counts=counts))
        context.update(_run_sections(request, experiment, run, context["progress"].recipe))
        context.update(_ledger_context(request, experiment, run))
    if request.user.has_perm(access.OPERATE):
        latest = runs[0] if runs else None
        starts, context["starts_hidden"] = review_selectors.start_choices(
            experiment=experiment, shown=review_selectors.START_CHOICES_SHOWN
        )
        best = context["best"]
        context["start_form"] = RunStartForm(
            initial=start_form_initial(latest), latest=latest, starts=starts, best=best["label"] if best else ""
        )
        context["has_unfinished_run"] = any(r.status in UNFINISHED for r in runs)
    return render(request, "review/experiments/dashboard.html", context)


@require_GET
@access.permission_required()
def experiment_progress(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The live progress section, with the runs table swapped out of band so both show the same counts. It polls
    itself while the run is unfinished (paused too); the answer for a run that ended has no trigger, so polling
    ends, and when the poller saw it unfinished (``was=moving``) the page reloads to show the final charts."""
    experiment = get_object_or_404(Experiment.objects.select_related("endpoint"), pk=pk)
    runs = review_selectors.experiment_runs(experiment=experiment)
    run = _selected_run(experiment, runs, request.GET.get("run"))
    if run is None:
        raise Http404("this experiment has no run")
    sizes = review_selectors.split_sizes(experiment_ids=[experiment.pk])[experiment.pk]
    counts = _trial_counts([r.pk for r in runs])
    context = _progress_context(request, experiment, run, sizes, all_counts=counts)
    response = render(request, "review/experiments/dashboard.html#progress", context)
    if request.htmx:
        table = {
            "experiment": experiment,
            "run": run,
            "run_rows": _run_rows(experiment, runs, counts, sizes),
            "oob": True,
        }
        response.write(render_to_string("review/experiments/dashboard.html#runs-table", table, request=request))
    if request.GET.get("was") == "moving" and run.status not in UNFINISHED and request.htmx:
        response["HX-Refresh"] = "true"
    return response


@require_GET
@access.permission_required()
def experiment_ledger(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The ledger table (htmx swaps it in); a plain request goes to the dashboard."""
    experiment = get_object_or_404(Experiment.objects.all(), pk=pk)
    dashboard = reverse("review:experiment", args=[experiment.pk])
    query = request.GET.urlencode()
    if not request.htmx:
        return HttpResponseRedirect(f"{dashboard}?{query}#ledger" if query else f"{dashboard}#ledger")
    runs = review_selectors.experiment_runs(experiment=experiment)
    run = _selected_run(experiment, runs, request.GET.get("run"))
    context = {"experiment": experiment, "run": run, **_ledger_context(request, experiment, run)}
    response = render(request, "review/experiments/dashboard.html#ledger", context)
    response["HX-Push-Url"] = f"{dashboard}?{context['ledger_query']}#ledger"
    return response


urlpatterns = [
    path("", home, name="home"),
    path("experiments/<int:pk>/", experiment, name="experiment"),
    path("experiments/<int:pk>/progress/", experiment_progress, name="experiment_progress"),
    path("experiments/<int:pk>/ledger/", experiment_ledger, name="experiment_ledger"),
]
