"""Experiments list, experiment dashboard, lineage, and run control.

Reads gather plain numbers in a fixed number of queries (aggregates and
``values()``, never a query per candidate), then ``review.charts`` and
``review.lineage`` lay them out. Runs change state only through
``evolution.services.loop``.
"""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, F, Max, OuterRef, Q, Subquery
from django.db.models.functions import Left
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import path, reverse
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_POST

from evolution import example, operators, selectors
from evolution.models import (
    Candidate,
    ComponentKind,
    Evaluation,
    Experiment,
    GateDecision,
    LedgerEntry,
    Run,
    SplitMembership,
    SplitName,
    Trial,
)
from evolution.recipes import PRESET_NAMES, Recipe, RecipeError, load_preset, parse_recipe, recipe_to_dict
from evolution.services import loop
from review import access, charts
from review import lineage as lineage_layout
from review.http import HtmxHttpRequest

_escape = html.escape  # django.utils.html.escape without its lazy-string wrapper
# A run that may still change on its own: the progress section polls while one is shown.
MOVING = (Run.Status.PENDING, Run.Status.RUNNING)
UNFINISHED = (Run.Status.PENDING, Run.Status.RUNNING, Run.Status.PAUSED)
TRIAL_FINISHED = (Trial.State.DONE, Trial.State.ERROR, Trial.State.CANCELLED)
MEASURED_PURPOSES = (Evaluation.Purpose.BASELINE, Evaluation.Purpose.NOISE, Evaluation.Purpose.CANDIDATE)
TRANSFER_SPLITS = (SplitName.SEALED, SplitName.HELDOUT)
LEDGER_PAGE_SIZE = 50
ROUNDS_PAGE_SIZE = 50
LINEAGE_MAX_NODES = 400  # candidates drawn at once on the lineage page
# Beyond these, charts draw a server-side sample (the page says so).
COST_CHART_POINTS = 400
SCORE_CHART_ROUNDS = 300
LIGHT_CATEGORIES = frozenset({"flagged", "other"})  # dark text on these node colours
# The loop records dC = 1e9 when the harness it was compared with cost nothing.
NO_COST_BEFORE = 1e8
# action -> (what it did, why it may be refused)
RUN_ACTIONS = {
    "pause": ("paused", "only a running run can be paused"),
    "resume": ("resumed", "only a paused run can be resumed"),
    "cancel": ("cancelled", "it has already ended"),
}


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
    def phase(self) -> str:
        return str(self.run.state.get("phase", ""))

    @property
    def trials_total(self) -> int:
        if not self.unfinished or self.trials_planned is None:
            return max(self.trials_started, 1)
        return max(self.trials_planned, self.trials_started, 1)

    @property
    def rounds_total(self) -> int:
        return max(self.run.rounds, 1)


def _recipe_of(run: Run) -> Recipe | None:
    try:
        return loop.run_recipe(run)
    except (RecipeError, ValueError):
        return None  # a recipe naming an operator this process does not load: shown without a plan


def _trials_planned(recipe: Recipe | None, split_sizes: dict[str, int]) -> int | None:
    """Trials the run would make if every proposal were evaluated."""
    if recipe is None:
        return None
    k = recipe.evaluation.trials_per_task
    evolve = sum(split_sizes.get(s, 0) for s in recipe.evaluation.evolve_splits) * k
    transfer = sum(split_sizes.get(s, 0) for s in TRANSFER_SPLITS) * k
    repeats = recipe.noise.repeats if recipe.needs_noise_estimate else 1
    per_candidate = evolve + (transfer if recipe.evaluation.sealed == "every_round" else 0)
    final = 2 * transfer if recipe.evaluation.sealed != "never" else 0
    return repeats * evolve + recipe.rounds * recipe.candidates_per_round * per_candidate + final


def _rounds_done(run: Run) -> int:
    return len([key for key in run.state.get("rounds", {}) if key != "0"])


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


def _split_sizes(experiment_ids: list[int]) -> dict[int, dict[str, int]]:
    sizes: dict[int, dict[str, int]] = defaultdict(dict)
    for row in (
        SplitMembership.objects.filter(experiment_id__in=experiment_ids)
        .values("experiment_id", "split")
        .annotate(n=Count("pk"))
    ):
        sizes[row["experiment_id"]][row["split"]] = row["n"]
    return sizes


def _progress(run: Run, counts: dict[str, int] | None, split_sizes: dict[str, int]) -> RunProgress:
    counts = counts or {}
    recipe = _recipe_of(run)
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
    experiments = list(
        selectors.experiment_overview().annotate(
            latest_run_id=Subquery(Run.objects.filter(experiment=OuterRef("pk")).order_by("-pk").values("pk")[:1])
        )
    )
    run_ids = [e.latest_run_id for e in experiments if e.latest_run_id]
    runs = {run.pk: run for run in Run.objects.filter(pk__in=run_ids).select_related("recipe")}
    counts = _trial_counts(run_ids)
    sizes = _split_sizes([e.pk for e in experiments])
    rows = []
    for experiment in experiments:
        run = runs.get(experiment.latest_run_id)
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
    dropped: list[dict[str, Any]] = field(default_factory=list)
    scores: dict[str, float] = field(default_factory=dict)
    best: float | None = None
    tokens: float | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    stalled: bool = False
    in_progress: bool = False
    gated: bool = False  # the loop wrote its summary: the gate has decided this round
    split_values: list[tuple[str, float | None]] = field(default_factory=list)


@dataclass(frozen=True)
class Divergence:
    text: str
    rows: list[dict[str, Any]]


def _selected_run(experiment: Experiment, runs: list[Run], raw: str | None) -> Run | None:
    if raw and raw.isdigit():
        for run in runs:
            if run.pk == int(raw):
                return run
    return runs[0] if runs else None


def _candidate_scores(
    experiment: Experiment, recipe: Recipe | None, candidate_ids: Any = None
) -> dict[int, tuple[float, float | None]]:
    """Evolve score S and mean policy tokens per trial of the measured
    candidates (all, or those of the ``candidate_ids`` queryset), computed as
    the gate computes them from the totals stored at certification."""
    evolve: list[str] = list(recipe.evaluation.evolve_splits) if recipe else [SplitName.TRAIN, SplitName.GATE]
    return selectors.candidate_scores(
        experiment_id=experiment.pk,
        splits=evolve,
        purposes=MEASURED_PURPOSES,
        mean_score=recipe is not None and recipe.evaluation.score_metric == "mean_score",
        candidate_ids=candidate_ids,
    )


def _round_states(run: Run) -> dict[int, Counter[str]]:
    """Per round of ``run``: its proposed candidates counted by state (one query)."""
    states: dict[int, Counter[str]] = defaultdict(Counter)
    rows = (
        Candidate.objects.filter(run=run)
        .exclude(origin=Candidate.Origin.SEED)
        .values("round", "state")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for row in rows:
        states[row["round"] or 0][row["state"]] += row["n"]
    return states


def _round_rows(
    run: Run, round_states: dict[int, Counter[str]], decisions: Sequence[Mapping[str, Any]]
) -> list[RoundRow]:
    """One row per round: the loop's round summary where it wrote one, else
    counts from the candidates (the round in progress, or rows added later).
    ``decisions``: the run's gate decisions that accepted or chose."""
    state = run.state
    summaries = state.get("rounds", {})
    best_by_round = state.get("best_by_round", [])
    stalled = set(state.get("stalled_rounds", []))
    events: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for event in state.get("events", []):
        events[int(event.get("round", 0))].append(event)
    accepted: dict[int, list[int]] = defaultdict(list)
    chosen: dict[int, int] = {}
    for decision in decisions:
        if decision["accepted"] and decision["round"] > 0:
            accepted[decision["round"]].append(decision["candidate_id"])
        if decision["chosen"]:
            chosen[decision["round"]] = decision["candidate_id"]
    numbers = {int(k) for k in summaries} | set(round_states) | set(events)
    if run.status in UNFINISHED and state.get("phase") in {"propose", "proposing", "evaluating"}:
        numbers.add(run.current_round)
    rows = []
    for number in sorted(numbers):
        summary = summaries.get(str(number))
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
            states = round_states.get(number, Counter())
            row.parent = state.get("round_parents", {}).get(str(number))
            row.budget = state.get("round_budgets", {}).get(str(number))
            row.proposed = sum(states.values())
            row.flagged = states[Candidate.State.FLAGGED] + states[Candidate.State.REJECTED_REVIEW]
            row.rejected_surface = states[Candidate.State.REJECTED_SURFACE]
            row.rejected_budget = states[Candidate.State.REJECTED_BUDGET]
            row.evaluated = sum(
                states[s] for s in (Candidate.State.CERTIFIED, Candidate.State.ACCEPTED, Candidate.State.REJECTED_GATE)
            )
            row.dropped = list(state.get("dropped", {}).get(str(number), []))
            row.in_progress = run.status in UNFINISHED and number == run.current_round
        row.accepted = accepted.get(number, [])
        row.chosen = chosen.get(number) if number > 0 else None
        if number < len(best_by_round):
            row.best = best_by_round[number]
        rows.append(row)
    return rows


def _with_transfer(rows: list[RoundRow], run: Run) -> list[RoundRow]:
    """Sealed and held-out are measured at the end (unless the recipe says
    every round): put the seed's on round 0 and the final harness's on the
    last round, so the chart shows transfer beside the evolve scores."""
    final = run.state.get("final") or {}
    if not rows or not final:
        return rows
    gated = [r for r in rows if str(r.number) in run.state.get("rounds", {})]
    first, last = gated[0] if gated else rows[0], gated[-1] if gated else rows[-1]
    for split in TRANSFER_SPLITS:
        if split in final.get("seed_scores", {}) and first.number == 0:
            first.scores.setdefault(split, final["seed_scores"][split])
        if split in final.get("scores", {}):
            last.scores.setdefault(split, final["scores"][split])
    return rows


def _divergence(run: Run, recipe: Recipe | None, rows: list[RoundRow]) -> tuple[Divergence | None, list[dict]]:
    """The divergence warning (evolve up, sealed or held-out down) and the
    seed-versus-latest comparison per split it is based on."""
    final = run.state.get("final") or {}
    if final:
        start, end, text = final.get("seed_scores", {}), final.get("scores", {}), final.get("divergence", "")
    else:
        measured = [r for r in rows if r.scores]
        if len(measured) < 2 or measured[0].number != 0:
            return None, []
        start, end = measured[0].scores, measured[-1].scores
        text = loop.divergence(start, end, recipe) if recipe else ""
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
    """The cost chart of ``run``'s candidates and the seed; with the number
    of points drawn and measured (beyond COST_CHART_POINTS a sample is drawn:
    every labelled point and the Pareto front, the others evenly spaced)."""
    shown = Candidate.objects.filter(
        Q(run=run) | Q(run__isnull=True) | Q(origin=Candidate.Origin.SEED), experiment=experiment
    )
    evolve: list[str] = list(recipe.evaluation.evolve_splits) if recipe else [SplitName.TRAIN, SplitName.GATE]
    # Thousands may be measured: the database keeps the front, the seed and
    # an even sample of the rest, and the chart draws COST_CHART_POINTS or so
    # of those, with their links and tooltips.
    sample = selectors.measured_candidates_sample(
        experiment_id=experiment.pk,
        splits=evolve,
        purposes=MEASURED_PURPOSES,
        mean_score=recipe is not None and recipe.evaluation.score_metric == "mean_score",
        limit=COST_CHART_POINTS,
        candidate_ids=shown.values("pk"),
    )
    points = []
    for candidate in sample.candidates:
        assert candidate.tokens is not None  # the sample holds only candidates that report tokens
        category = lineage_layout.category(state=candidate.state, origin=candidate.origin)
        points.append(
            _Measured(candidate.pk, candidate.tokens, candidate.score, category, category in {"seed", "accepted"})
        )
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
                name="seed" if candidate.origin == Candidate.Origin.SEED else f"#{point.candidate_id}",
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
    targets = set(run.state.get("pruning_targets", []))
    rows = (
        LedgerEntry.objects.filter(run=run)
        .values("component")
        .annotate(
            edits=Count("pk"),
            accepted_edits=Count("pk", filter=Q(accepted=True)),
            best=Max("delta_score"),
            best_window=Max("delta_score", filter=Q(round__gt=last_round - window)),
            last_round=Max("round"),
        )
        .order_by("component")
    )
    measured = {row["component"]: {**row, "target": row["component"] in targets} for row in rows}
    return [
        measured.get(kind, {"component": kind, "edits": 0, "target": kind in targets}) for kind in ComponentKind.values
    ]


# --- Ledger ------------------------------------------------------------------------


LEDGER_SORTS = {
    "round": ("round", "pk"),
    "-round": ("-round", "-pk"),
    "dS": ("delta_score", "pk"),
    "-dS": ("-delta_score", "pk"),
    "dC": ("delta_cost", "pk"),
    "-dC": ("-delta_cost", "pk"),
}


class LedgerFilterForm(forms.Form):
    run = forms.IntegerField(required=False)
    component = forms.ChoiceField(required=False, choices=[("", "any component"), *ComponentKind.choices])
    q = forms.CharField(required=False, max_length=200, strip=True)
    accepted = forms.ChoiceField(required=False, choices=[("", "any"), ("yes", "accepted"), ("no", "rejected")])
    sort = forms.ChoiceField(required=False, choices=[(key, key) for key in LEDGER_SORTS])
    page = forms.IntegerField(required=False, min_value=1)


def _ledger_context(request: HttpRequest, experiment: Experiment, run: Run | None) -> dict[str, Any]:
    form = LedgerFilterForm(request.GET)
    form.is_valid()  # a bad value falls back to "no filter" for that field
    values = {key: form.cleaned_data.get(key) for key in ("component", "q", "accepted", "sort", "page")}
    sort = values["sort"] or "round"
    entries = LedgerEntry.objects.none()
    if run is not None:
        entries = LedgerEntry.objects.filter(run=run).select_related("candidate")
        if values["component"]:
            entries = entries.filter(component=values["component"])
        if values["q"]:
            entries = entries.filter(hypothesis__icontains=values["q"])
        if values["accepted"] in {"yes", "no"}:
            entries = entries.filter(accepted=values["accepted"] == "yes")
        entries = entries.order_by(*LEDGER_SORTS[sort])
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
            "dC": "no earlier cost" if entry.delta_cost >= NO_COST_BEFORE else f"{entry.delta_cost * 100:+.1f}%",
            "accepted": entry.accepted,
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


# --- Run start form ------------------------------------------------------------------


class RunStartForm(forms.Form):
    recipe = forms.ChoiceField(label="recipe")
    rounds = forms.IntegerField(required=False, min_value=1, max_value=500, label="rounds")
    k = forms.IntegerField(required=False, min_value=1, max_value=32, label="k (trials per task)")
    candidates = forms.IntegerField(required=False, min_value=1, max_value=64, label="candidates per round")
    proposer = forms.ChoiceField(required=False, label="proposer")

    def __init__(self, *args: Any, latest: Run | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [(name, f"preset: {name}") for name in PRESET_NAMES]
        if latest is not None:
            choices.insert(0, (f"run-{latest.pk}", f"as run #{latest.pk} ({latest.recipe.name})"))
        recipe_field = self.fields["recipe"]
        assert isinstance(recipe_field, forms.ChoiceField)
        recipe_field.choices = choices
        loop._load_operators()
        proposers = sorted(operators.known_operators().get("proposal", set()))
        proposer_field = self.fields["proposer"]
        assert isinstance(proposer_field, forms.ChoiceField)
        proposer_field.choices = [("", "the recipe's own"), *((name, name) for name in proposers)]


def _start_form_initial(latest: Run | None) -> dict[str, Any]:
    if latest is None:
        return {"recipe": "rrsi"}
    spec = latest.recipe.spec
    return {
        "recipe": f"run-{latest.pk}",
        "rounds": spec.get("rounds"),
        "k": spec.get("evaluation", {}).get("trials_per_task"),
        "candidates": spec.get("candidates_per_round"),
        # Keep the proposer that worked last time, also when another preset is chosen.
        "proposer": spec.get("proposal", {}).get("operator", ""),
    }


def start_recipe(*, name: str, experiment: Experiment, candidates_per_round: int | None) -> Recipe:
    """The recipe a start request names: a preset, or ``run-<pk>`` for the
    recipe of one of the experiment's runs; with ``candidates_per_round``
    overriding its own (``loop.run_create`` overrides rounds, k and the
    proposer itself, and checks the operators after its overrides, so they
    are not checked here: the preset's proposer may be replaced).
    Raises RecipeError or LoopError."""
    if name in PRESET_NAMES:
        recipe = load_preset(name)
    elif name.startswith("run-") and name[4:].isdigit():
        run = Run.objects.filter(pk=int(name[4:]), experiment=experiment).select_related("recipe").first()
        if run is None:
            raise loop.LoopError(f"no run {name[4:]} in this experiment")
        recipe = parse_recipe(run.recipe.spec)
    else:
        raise loop.LoopError(f"unknown recipe {name!r}: choose a preset ({', '.join(PRESET_NAMES)}) or a run's")
    if candidates_per_round is not None and candidates_per_round != recipe.candidates_per_round:
        data = recipe_to_dict(recipe)
        data["candidates_per_round"] = candidates_per_round
        recipe = parse_recipe(data)
    return recipe


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
        selectors.experiment_overview().select_related("recipe", "seed_candidate"),
        pk=pk,
    )


def _runs(experiment: Experiment) -> list[Run]:
    return list(
        Run.objects.filter(experiment=experiment)
        .select_related("recipe", "started_by", "current_candidate")
        .order_by("-pk")
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
    failed_evaluations = list(
        Evaluation.objects.filter(run=run, state=Evaluation.State.FAILED)
        .exclude(error="")
        .values("pk", "candidate_id", "purpose", "error")
        .order_by("-pk")[:10]
    )
    failed_candidates = list(
        Candidate.objects.filter(run=run, state=Candidate.State.FAILED)
        .values("pk", "label", "state_reason")
        .order_by("-pk")[:10]
    )
    error_kinds = list(
        Trial.objects.filter(evaluation__run=run, state=Trial.State.ERROR)
        .values("error_kind")
        .annotate(n=Count("pk"))
        .order_by("-n")
    )
    # Per-task rows: sealed ones only for those who may see them.
    error_trials = list(
        access.hide_sealed(
            Trial.objects.filter(evaluation__run=run, state=Trial.State.ERROR), request.user, split_field="split"
        )
        .values("pk", "candidate_id", "split", "error_kind", "error", task_name=F("task__external_id"))
        .order_by("-pk")[:5]
    )
    dropped = [
        {"round": int(r), **item}
        for r, items in sorted(run.state.get("dropped", {}).items(), key=lambda kv: int(kv[0]))
        for item in items
        if item.get("why") == "proposer_error"
    ]
    return {
        "experiment": experiment,
        "run": run,
        "progress": progress,
        "failed_evaluations": failed_evaluations,
        "failed_candidates": failed_candidates,
        "error_kinds": error_kinds,
        "error_trials": error_trials,
        "proposer_errors": dropped[-10:],
        "recent_events": list(reversed(run.state.get("events", [])[-6:])),
    }


@require_GET
@access.permission_required()
def experiment(request: HttpRequest, pk: int) -> HttpResponse:
    """The dashboard: facts, runs, live progress, charts, rounds, ledger."""
    experiment = _experiment_or_404(pk)
    runs = _runs(experiment)
    run = _selected_run(experiment, runs, request.GET.get("run"))
    sizes = _split_sizes([experiment.pk])[experiment.pk]
    states = (
        Candidate.objects.filter(experiment=experiment).values_list("state").annotate(n=Count("pk")).order_by("state")
    )
    context: dict[str, Any] = {
        "experiment": experiment,
        "runs": runs,
        "run": run,
        "split_sizes": [(s, sizes[s]) for s in SplitName.values if s in sizes],
        "task_total": sum(sizes.values()),
        "heldout_benchmarks": list(experiment.heldout_benchmarks.values_list("name", flat=True)),
        "state_counts": list(states),
        "unexplored": [],
    }
    counts = _trial_counts([r.pk for r in runs])
    context["run_rows"] = [{"run": r, "progress": _progress(r, counts.get(r.pk), sizes)} for r in runs]
    if run is not None:
        context.update(_progress_context(request, experiment, run, sizes, all_counts=counts))
        recipe = context["progress"].recipe
        decisions = list(
            GateDecision.objects.filter(Q(accepted=True) | Q(chosen=True), run=run)
            .values("candidate_id", "round", "accepted", "chosen")
            .order_by("pk")
        )
        rows = _with_transfer(_round_rows(run, _round_states(run), decisions), run)
        divergence, comparison = _divergence(run, recipe, rows)
        splits = [s for s in charts.SPLIT_COLOURS if any(s in row.scores for row in rows)]
        rounds_page = _rounds_page(request, rows, run)
        for row in rounds_page["rounds"]:
            row.split_values = [(s, row.scores.get(s)) for s in splits]
        cost_chart, cost_drawn, cost_total = _cost_chart(experiment, run, recipe)
        last_gated = max((int(k) for k in run.state.get("rounds", {})), default=0)
        measured = set(run.state.get("measured_components", []))
        context.update(
            recipe=recipe,
            **rounds_page,
            round_splits=splits,
            score_chart=_score_chart(rows, run),
            score_chart_sampled=sum(1 for r in rows if r.scores or r.best is not None) > SCORE_CHART_ROUNDS,
            cost_chart=cost_chart,
            cost_drawn=cost_drawn,
            cost_total=cost_total,
            divergence=divergence,
            comparison=comparison,
            components=_component_table(run, recipe, last_gated),
            pruning_targets=run.state.get("pruning_targets", []),
            stalled_rounds=run.state.get("stalled_rounds", []),
            unexplored=[kind for kind in ComponentKind.values if kind not in measured],
            exploration_rejects=list(
                Candidate.objects.filter(
                    run=run, state=Candidate.State.REJECTED_BUDGET, state_reason__startswith="stalled"
                )
                .annotate(reason=Left("state_reason", 240))
                .values("pk", "label", "round", "reason")
                .order_by("pk")
            ),
            special_events=[e for e in run.state.get("events", []) if e.get("kind") in {"stop", "error", "divergence"}],
        )
        context.update(_ledger_context(request, experiment, run))
    if request.user.has_perm(access.OPERATE):
        latest = runs[0] if runs else None
        context["start_form"] = RunStartForm(initial=_start_form_initial(latest), latest=latest)
        context["has_unfinished_run"] = any(r.status in UNFINISHED for r in runs)
    return render(request, "review/experiments/dashboard.html", context)


@require_GET
@access.permission_required()
def experiment_progress(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The live progress section. It polls itself while the run moves; the
    answer for a run that stopped has no trigger, so polling ends, and when
    the poller saw it moving (``was=moving``) the page reloads to show the
    final charts."""
    experiment = get_object_or_404(Experiment.objects.all(), pk=pk)
    runs = list(Run.objects.filter(experiment=experiment).select_related("recipe", "current_candidate").order_by("-pk"))
    run = _selected_run(experiment, runs, request.GET.get("run"))
    if run is None:
        raise Http404("this experiment has no run")
    sizes = _split_sizes([experiment.pk])[experiment.pk]
    context = _progress_context(request, experiment, run, sizes)
    response = render(request, "review/experiments/dashboard.html#progress", context)
    if request.GET.get("was") == "moving" and run.status not in MOVING and request.htmx:
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
    runs = list(Run.objects.filter(experiment=experiment).order_by("-pk"))
    run = _selected_run(experiment, runs, request.GET.get("run"))
    context = {"experiment": experiment, "run": run, **_ledger_context(request, experiment, run)}
    response = render(request, "review/experiments/dashboard.html#ledger", context)
    response["HX-Push-Url"] = f"{dashboard}?{context['ledger_query']}#ledger"
    return response


# --- Lineage -------------------------------------------------------------------------


def _round_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "")
    return int(raw) if raw.isdigit() else None


@require_GET
@access.permission_required()
def lineage(request: HttpRequest, pk: int) -> HttpResponse:
    """The candidate tree, rounds left to right, nodes coloured by state.

    A window of consecutive rounds holding at most LINEAGE_MAX_NODES
    candidates is drawn (the latest, or ``?from=R`` / ``?to=R``), with the
    parents of its candidates from earlier rounds; plain links page to
    earlier and later rounds. Four queries whatever the experiment's size."""
    experiment = get_object_or_404(Experiment.objects.select_related("benchmark"), pk=pk)
    latest = Run.objects.filter(experiment=experiment).select_related("recipe").order_by("-pk").first()
    per_round: Counter[int] = Counter()
    legend_counts: Counter[str] = Counter()
    for number, state, origin, n in (
        Candidate.objects.filter(experiment=experiment)
        .values_list("round", "state", "origin")
        .annotate(n=Count("pk"))
        .order_by()
    ):
        per_round[number or 0] += n
        legend_counts[lineage_layout.category(state=state, origin=origin)] += n
    first, last = lineage_layout.round_window(
        per_round, start=_round_param(request, "from"), end=_round_param(request, "to"), cap=LINEAGE_MAX_NODES
    )
    in_window = Q(round__gte=first, round__lte=last)
    if first == 0:
        in_window |= Q(round__isnull=True)
    window = Candidate.objects.filter(in_window, experiment=experiment)
    shown = Candidate.objects.filter(in_window | Q(pk__in=window.values("parent_id")), experiment=experiment)
    candidates = list(
        shown.annotate(reason=Left("state_reason", 240))
        .values("pk", "parent_id", "state", "origin", "round", "label", "reason")
        .order_by("pk")
    )
    scores = _candidate_scores(experiment, _recipe_of(latest) if latest else None, shown.values("pk"))
    rows = [
        lineage_layout.NodeInput(
            id=c["pk"],
            parent_id=c["parent_id"],
            state=c["state"],
            origin=c["origin"],
            round=c["round"],
            label=c["label"],
            score=scores[c["pk"]][0] if c["pk"] in scores else None,
        )
        for c in candidates
    ]
    highlight = latest.current_candidate_id if latest else None
    tree = lineage_layout.layout(rows, highlight=highlight, node_width=140)
    reasons = {c["pk"]: c["reason"] for c in candidates}
    href = url_maker("review:candidate")
    # The SVG of the nodes and edges is written here: hundreds of nodes with
    # a dozen attributes each cost more in a template loop than the rest of
    # the page. Labels, states and reasons are escaped; the rest are numbers
    # formatted here and the view's own colours.
    node_width, node_height = f"{tree.node_width:.0f}", f"{tree.node_height:.0f}"
    parts = []
    for node in tree.nodes:
        score = f"{node.score:.3f}" if node.score is not None else ""
        reason = reasons.get(node.id, "")
        label = node.label if len(node.label) <= 12 else node.label[:11] + "…"
        title = (
            f"#{node.id} {node.label} · {node.state} · round {node.round}"
            + (f" · S {score}" if score else "")
            + (f" · {reason}" if reason else "")
        )
        colour = charts.CATEGORY_COLOURS.get(node.category, charts.CATEGORY_COLOURS["other"])
        ink = "#1d2330" if node.category in LIGHT_CATEGORIES else "#fff"
        stroke = "#1d2330" if node.id == highlight else "none"
        text_y = f"{node.y + tree.node_height / 2 + 4:.1f}"
        parts.append(
            f'<a href="{_escape(href(node.id))}" class="node cat-{_escape(node.category)}'
            f'{" main" if node.on_path else ""}" aria-label="candidate {node.id} {_escape(node.label)}, '
            f'{_escape(node.state)}"><title>{_escape(title)}</title>'
            f'<rect x="{node.x:.1f}" y="{node.y:.1f}" width="{node_width}" height="{node_height}" rx="4" '
            f'fill="{colour}" stroke="{stroke}" stroke-width="2"/>'
            f'<text x="{node.x + 6:.1f}" y="{text_y}" font-size="11" fill="{ink}" font-weight="600">#{node.id} '
            f'<tspan font-weight="400">{_escape(label)}</tspan></text>'
            + (
                f'<text x="{node.x + tree.node_width - 6:.1f}" y="{text_y}" font-size="10.5" fill="{ink}" '
                f'text-anchor="end">{score}</text>'
                if score
                else ""
            )
            + "</a>"
        )
    nodes_html = mark_safe("".join(parts))  # every string from a candidate went through escape above
    edges_html = mark_safe(
        "".join(
            f'<path d="{_escape(edge.path)}" class="edge{" main" if edge.on_path else ""}" '
            f'stroke="{"#1a7f37" if edge.on_path else "#afb8c1"}" stroke-width="{"2.5" if edge.on_path else "1.2"}"/>'
            for edge in tree.edges
        )
    )
    legend = [(key, title, legend_counts.get(key, 0)) for key, title in lineage_layout.CATEGORIES]
    rounds = sorted(per_round)
    earlier = [r for r in rounds if r < first]
    later = [r for r in rounds if r > last]
    return render(
        request,
        "review/experiments/lineage.html",
        {
            "experiment": experiment,
            "latest": latest,
            "tree": tree,
            "tree_width": f"{tree.width:.0f}",
            "tree_height": f"{tree.height:.0f}",
            "columns": [{"x": f"{c.x:.1f}", "title": c.title, "count": c.count} for c in tree.columns],
            "nodes": bool(tree.nodes),
            "nodes_html": nodes_html,
            "edges_html": edges_html,
            "legend": legend,
            "highlight": highlight,
            "window_first": first,
            "window_last": last,
            "window_count": sum(per_round[r] for r in rounds if first <= r <= last),
            "candidate_total": sum(per_round.values()),
            "windowed": bool(earlier or later),
            "earlier_url": f"?to={earlier[-1]}" if earlier else "",
            "later_url": f"?from={later[0]}" if later else "",
            "first_url": f"?from={rounds[0]}" if earlier else "",
            "latest_url": "?" if later else "",
            "max_nodes": LINEAGE_MAX_NODES,
        },
    )


# --- Run control -----------------------------------------------------------------------


@require_POST
@access.permission_required(access.OPERATE)
def run_start(request: HttpRequest, pk: int) -> HttpResponse:
    """Start a run of a preset (or of an earlier run's recipe) with the
    form's overrides. Any error is a message and nothing is created."""
    experiment = get_object_or_404(Experiment.objects.select_related("benchmark"), pk=pk)
    dashboard = reverse("review:experiment", args=[experiment.pk])
    latest = Run.objects.filter(experiment=experiment).select_related("recipe").order_by("-pk").first()
    form = RunStartForm(request.POST, latest=latest)
    if not form.is_valid():
        problems = "; ".join(
            f"{form.fields[name].label if name in form.fields else name}: {' '.join(str(error) for error in errors)}"
            for name, errors in form.errors.items()
        )
        messages.error(request, f"The run was not started: {problems}")
        return HttpResponseRedirect(dashboard)
    data = form.cleaned_data
    proposer = data["proposer"] or None
    if proposer is None and data["recipe"] in PRESET_NAMES:  # the bundled example's offline proposer
        proposer = example.preset_proposer(benchmark=experiment.benchmark.name)
    try:
        recipe = start_recipe(name=data["recipe"], experiment=experiment, candidates_per_round=data["candidates"])
        run = loop.run_create(
            experiment=experiment,
            recipe=recipe,
            rounds=data["rounds"],
            k=data["k"],
            proposer=proposer,
            user=request.user,
        )
    except (RecipeError, loop.LoopError) as exc:
        messages.error(request, f"The run was not started: {exc}")
        return HttpResponseRedirect(dashboard)
    spec = run.recipe.spec
    messages.success(
        request,
        f"Run #{run.pk} started: recipe {run.recipe.name}, {run.rounds} round(s), "
        f"k={spec['evaluation']['trials_per_task']}, {spec['candidates_per_round']} candidate(s) per round, "
        f"proposer {spec['proposal']['operator']}.",
    )
    return HttpResponseRedirect(f"{dashboard}?run={run.pk}")


@require_POST
@access.permission_required(access.OPERATE)
def run_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    """Pause, resume or cancel a run; a run in the wrong state is a message."""
    if action not in RUN_ACTIONS:
        raise Http404(f"unknown run action {action!r}")
    run = get_object_or_404(Run.objects.all(), pk=pk)
    done, refusal = RUN_ACTIONS[action]
    if action == "pause":
        changed = loop.run_pause(run=run)
    elif action == "resume":
        changed = loop.run_resume(run=run)
    else:
        changed = loop.run_cancel(run=run, reason=f"cancelled by {request.user.get_username()}")
    if changed:
        messages.success(request, f"Run #{run.pk} {done}.")
    else:
        run.refresh_from_db(fields=["status"])
        messages.error(request, f"Run #{run.pk} was not {done}: it is {run.status}, and {refusal}.")
    return HttpResponseRedirect(f"{reverse('review:experiment', args=[run.experiment_id])}?run={run.pk}")


urlpatterns = [
    path("", home, name="home"),
    path("experiments/<int:pk>/", experiment, name="experiment"),
    path("experiments/<int:pk>/progress/", experiment_progress, name="experiment_progress"),
    path("experiments/<int:pk>/ledger/", experiment_ledger, name="experiment_ledger"),
    path("experiments/<int:pk>/lineage/", lineage, name="lineage"),
    path("experiments/<int:pk>/runs/start/", run_start, name="run_start"),
    path("runs/<int:pk>/<str:action>/", run_action, name="run_action"),
]
