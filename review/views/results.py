"""Screens 5 and 6: the per-task results matrix, the trial page with its
trajectory, and the side-by-side comparison of two trajectories.

Every query returning per-task rows goes through ``access.hide_sealed``:
without the sealed permission a sealed task is not listed in the matrix and
a sealed trial's page, steps and comparison are 404. Page sizes bound the
work: the matrix shows at most ``CANDIDATES_PER_PAGE`` candidates and
``TASKS_PER_PAGE`` tasks, a trajectory ``STEPS_PER_PAGE`` steps at a time,
and the number of queries of each page does not depend on how many
candidates, trials or steps there are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.paginator import Paginator
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, render
from django.urls import path, reverse
from django.views.decorators.http import require_GET

from evolution import access, hidden_chars, selectors
from evolution.loop import load
from evolution.models import (
    Candidate,
    CertifiedResult,
    Evaluation,
    Experiment,
    SplitName,
    Trajectory,
    TrajectoryStep,
    Trial,
)
from review import selectors as review_selectors
from review import trajectories as tj
from review.matrix import CHANGES, Cell, Column, Row, cells_html
from review.pages import SPLIT_ORDER, BadInput, compare, external_source_text, query_url
from review.pages import trials as trial_pages
from review.pages.trials import STEP_COLUMNS, STEPS_PER_PAGE

CANDIDATES_PER_PAGE = 30
TASKS_PER_PAGE = 200

ERROR_STEPS_LISTED = 50


class InputError(Exception):
    """Input the page cannot use; shown to the user as a 400 with the message."""


def _bad_request(request: HttpRequest, message: str) -> HttpResponse:
    return render(request, "review/results/bad_request.html", {"message": message}, status=400)


def _positive_int(value: str | None, name: str, default: int = 1) -> int:
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        raise InputError(f"{name} must be a whole number, got {value[:40]!r}") from None
    if number < 1:
        raise InputError(f"{name} must be 1 or more, got {number}")
    return number


# --- Screen 5: the results matrix ----------------------------------------------


def _url_maker(name: str) -> Any:
    """``pk -> reverse(name, args=[pk])`` with one ``reverse``: thousands of
    trial links are then f-strings, not URL resolutions in the template."""
    marker = "987654321"
    head, tail = reverse(name, args=[int(marker)]).split(marker)
    return lambda pk: f"{head}{pk}{tail}"


def _pager_numbers(current: int, last: int, *, around: int = 3) -> list[tuple[int, bool]]:
    """Page numbers to link: the first, the last and ``around`` either side of
    ``current``; each with whether a gap (…) comes before it."""
    wanted = sorted({1, last, *range(current - around, current + around + 1)} & set(range(1, last + 1)))
    return [(n, i > 0 and n - wanted[i - 1] > 1) for i, n in enumerate(wanted)]


def _parse_candidate_ids(raw: str) -> list[int]:
    ids = []
    for part in raw.replace(" ", "").split(","):
        if not part:
            continue
        if not part.isdigit():
            raise InputError(f"candidates must be a comma-separated list of candidate ids, got {raw[:60]!r}")
        ids.append(int(part))
    return ids


@dataclass(frozen=True)
class MatrixQuery:
    """What the matrix's query string asks for."""

    split: str
    change: str
    selected: list[int]
    raw_candidates: str
    candidate_page: int
    task_page: int


def _matrix_query(request: HttpRequest) -> MatrixQuery:
    """The query string, checked; InputError names the first unusable parameter."""
    split = request.GET.get("split", "")
    if split and split not in SplitName.values:
        raise InputError(f"unknown split {split[:40]!r}: use one of {', '.join(SplitName.values)}")
    change = request.GET.get("change", "")
    if change and change not in CHANGES:
        raise InputError(f"unknown change {change[:40]!r}: use one of {', '.join(CHANGES)}")
    return MatrixQuery(
        split=split,
        change=change,
        selected=_parse_candidate_ids(request.GET.get("candidates", "")),
        raw_candidates=request.GET.get("candidates", ""),
        candidate_page=_positive_int(request.GET.get("cpage"), "cpage"),
        task_page=_positive_int(request.GET.get("page"), "page"),
    )


def _grid(
    columns: list[Column],
    *,
    experiment: Experiment,
    shown_tasks: set[int],
    evolve: tuple[str, ...],
    metric: str,
    external: bool,
) -> dict[tuple[int, int], Cell]:
    """The cells of the shown candidates and of their parents on the ``shown_tasks`` (one aggregated query); sets
    each column's evolve score S, the one every screen shows (``selectors.candidate_scores``; an imported
    experiment's, from its external trials). Scores are aggregates, which every user may see: they count every
    trial (a task sealed in another experiment is still scored here), while cells are made for the visible tasks
    only."""
    parent_ids = {column.parent_id for column in columns if column.parent_id is not None}
    grid: dict[tuple[int, int], Cell] = {}
    score_parts: dict[int, list[float]] = {}
    trial_href = _url_maker("review:trial")
    shown_ids = [*(c.pk for c in columns), *parent_ids]
    for row in review_selectors.matrix_cells(user=None, candidate_ids=shown_ids, external=external):
        if row["split"] in evolve and row["n"]:
            parts = score_parts.setdefault(row["candidate_id"], [0.0, 0])
            parts[0] += row["passes"] if metric == "pass_at_1" else float(row["score_sum"] or 0.0)
            parts[1] += row["n"]
        if row["task_id"] not in shown_tasks:
            continue
        key = (row["candidate_id"], row["task_id"])
        grid[key] = Cell(
            candidate_id=row["candidate_id"],
            task_id=row["task_id"],
            n=row["n"],
            passes=row["passes"],
            errors=row["errors"],
            pending=row["pending"],
            first_trial=row["first_trial"],
            first_href=trial_href(row["first_trial"]),
        )
    if external:
        for column in columns:
            value, trials = score_parts.get(column.pk, (0.0, 0))
            column.score = value / trials if trials else None
        return grid
    scores = selectors.candidate_scores(
        experiment_id=experiment.pk,
        splits=list(evolve),
        mean_score=metric == "mean_score",
        candidate_ids=Candidate.objects.filter(pk__in=[c.pk for c in columns]).values("pk"),
    )
    for column in columns:
        column.score = scores[column.pk][0] if column.pk in scores else None
    return grid


def _rows(
    tasks: list[tuple[int, str, str]], columns: list[Column], grid: dict[tuple[int, int], Cell], change: str
) -> tuple[list[Row], dict[str, int]]:
    """One row per task, with a cell per column (its parent's cell beside it); with ``change``, only the rows
    with a cell of that change, the other cells dimmed. Also how many cells of each change there are."""
    rows = []
    change_counts = dict.fromkeys(CHANGES, 0)
    for task_id, external_id, task_split in tasks:
        cells = []
        for column in columns:
            cell = grid.get((column.pk, task_id)) or Cell(candidate_id=column.pk, task_id=task_id)
            cell.has_parent = column.parent_id is not None
            if column.parent_id is not None:
                cell.parent = grid.get((column.parent_id, task_id))
            if cell.change:
                change_counts[cell.change] += 1
            cells.append(cell)
        if change and not any(cell.change == change for cell in cells):
            continue
        if change:
            for cell in cells:
                cell.dim = cell.change != change
        rows.append(Row(task_id=task_id, external_id=external_id, split=task_split, cells=cells))
    return rows, change_counts


def _fill_page(
    user: Any, page_rows: list[Row], columns: list[Column], grid: dict[tuple[int, int], Cell], *, external: bool
) -> None:
    """Links to every trial of the cells on this page (k of them per cell), the columns' totals over the page, and
    each row's cells as HTML."""
    page_tasks = [row.task_id for row in page_rows]
    column_ids = [column.pk for column in columns]
    if page_tasks and column_ids:
        trial_href = _url_maker("review:trial")
        links = review_selectors.matrix_trials(
            user=user, candidate_ids=column_ids, task_ids=page_tasks, external=external
        )
        for link in links:
            linked = grid.get((link["candidate_id"], link["task_id"]))
            if linked is not None:
                linked.trials.append({**link, "href": trial_href(link["pk"])})
    for task_row in page_rows:
        for column, cell in zip(columns, task_row.cells, strict=True):
            column.shown_passes += cell.passes
            column.shown_n += cell.n
        task_row.cells_html = cells_html(task_row.cells)


def _filter_links(
    base: str,
    query: MatrixQuery,
    split_counts: dict[str, int],
    change_counts: dict[str, int],
    *,
    can_sealed: bool,
    sealed_hidden: int,
) -> dict[str, Any]:
    """The split and change filters as plain links, each with its count."""
    keep = {"split": query.split, "change": query.change, "candidates": query.raw_candidates}
    split_links = [
        {
            "value": value,
            "label": label,
            "count": split_counts.get(value, 0),
            "url": query_url(base, **{**keep, "split": value}),
            "hidden": value == SplitName.SEALED and not can_sealed,
        }
        for value, label in [("", "all"), *((split, split) for split in SPLIT_ORDER)]
        if value == "" or split_counts.get(value)
    ]
    split_links[0]["count"] = sum(split_counts.values()) - sealed_hidden
    change_links = [
        {"value": "", "label": "any", "count": None, "url": query_url(base, **{**keep, "change": ""})},
        *(
            {
                "value": value,
                "label": value,
                "count": change_counts[value],
                "url": query_url(base, **{**keep, "change": value}),
            }
            for value in CHANGES
        ),
    ]
    return {"split_links": split_links, "change_links": change_links, "sealed_hidden": sealed_hidden}


def _pager_links(
    base: str, query: MatrixQuery, candidate_pages: Paginator, candidate_page: int, task_pages: Paginator
) -> dict[str, Any]:
    keep = {"split": query.split, "change": query.change, "candidates": query.raw_candidates}
    return {
        "candidate_pages": [
            {"number": number, "url": query_url(base, **keep, cpage=number), "gap": gap}
            for number, gap in _pager_numbers(candidate_page, candidate_pages.num_pages)
        ]
        if candidate_pages.num_pages > 1
        else [],
        "task_pages": [
            {"number": number, "url": query_url(base, **keep, cpage=candidate_page, page=number)}
            for number in task_pages.page_range
        ]
        if task_pages.num_pages > 1
        else [],
    }


@require_GET
@access.permission_required()
def matrix(request: HttpRequest, pk: int) -> HttpResponse:
    """Tasks (rows) by candidates (columns), each cell the candidate's trials on the task."""
    experiment = get_object_or_404(Experiment.objects.select_related("recipe", "benchmark"), pk=pk)
    try:
        query = _matrix_query(request)
    except InputError as exc:
        return _bad_request(request, str(exc))
    split_counts = review_selectors.split_counts(experiment=experiment)
    imported_from = review_selectors.imported_from(experiment)
    external = bool(imported_from)
    # Paginated in the database: one count and one page of rows.
    candidate_rows = review_selectors.matrix_candidates(
        experiment=experiment, selected=query.selected, external=external
    )
    candidate_pages = Paginator(candidate_rows, CANDIDATES_PER_PAGE)
    candidate_page = min(query.candidate_page, candidate_pages.num_pages)
    shown = candidate_pages.page(candidate_page)
    columns = [Column(**row) for row in shown]  # the values() are exactly Column's leading fields
    can_sealed = access.can_see_sealed(request.user)
    # Tasks of this experiment sealed here or in another experiment (the sealed rule).
    visible = review_selectors.visible_task_count(experiment=experiment, user=request.user)
    sealed_hidden = 0 if can_sealed else sum(split_counts.values()) - visible
    tasks = sorted(
        review_selectors.visible_tasks(experiment=experiment, user=request.user, split=query.split),
        key=lambda row: (SPLIT_ORDER.index(row[2]) if row[2] in SPLIT_ORDER else 9, row[1]),
    )
    evolve, metric = load.experiment_measure(experiment)
    shown_tasks = {task_id for task_id, _, _ in tasks}
    grid = _grid(
        columns, experiment=experiment, shown_tasks=shown_tasks, evolve=evolve, metric=metric, external=external
    )
    rows, change_counts = _rows(tasks, columns, grid, query.change)
    task_pages = Paginator(rows, TASKS_PER_PAGE)
    task_page = min(query.task_page, task_pages.num_pages)
    page_rows = list(task_pages.page(task_page))
    _fill_page(request.user, page_rows, columns, grid, external=external)
    base = reverse("review:matrix", args=[experiment.pk])
    context = {
        "experiment": experiment,
        "columns": columns,
        "rows": page_rows,
        "rows_total": len(rows),
        "tasks_total": len(tasks),
        "split": query.split,
        "change": query.change,
        "change_words": CHANGES.get(query.change, ""),
        "imported_from": imported_from,
        "selected": query.selected,
        "candidates_total": candidate_pages.count,
        "candidate_page": shown,
        "task_page": task_pages.page(task_page),
        "evolve_splits": " + ".join(evolve),
        "score_metric": "mean score" if metric == "mean_score" else "pass@1",
        "clear_selection_url": query_url(base, split=query.split, change=query.change),
        **_filter_links(base, query, split_counts, change_counts, can_sealed=can_sealed, sealed_hidden=sealed_hidden),
        **_pager_links(base, query, candidate_pages, candidate_page, task_pages),
    }
    return render(request, "review/results/matrix.html", context)


# --- Screen 6: the trial page and its trajectory ---------------------------------


@dataclass
class StepPage:
    number: int
    count: int  # pages
    total: int  # steps
    start: int  # 1-based position of the first step of the page
    steps: list[tj.StepView]

    @property
    def end(self) -> int:
        return self.start + len(self.steps) - 1

    @property
    def has_next(self) -> bool:
        return self.number < self.count

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def next_start(self) -> int:
        return self.number * STEPS_PER_PAGE + 1

    @property
    def next_end(self) -> int:
        return min(self.total, (self.number + 1) * STEPS_PER_PAGE)

    @property
    def previous_start(self) -> int:
        return (self.number - 2) * STEPS_PER_PAGE + 1


def _step_page(trajectory: Trajectory | None, number: int) -> StepPage:
    """One page of steps in step order (one query); the page number is
    clamped to the last page."""
    if trajectory is None:
        return StepPage(number=1, count=1, total=0, start=1, steps=[])
    total = trajectory.step_count
    count = trial_pages.page_count(total)
    number = min(number, count)
    offset = (number - 1) * STEPS_PER_PAGE
    steps = trial_pages.steps_from(trajectory, offset)
    return StepPage(number=number, count=count, total=max(total, offset + len(steps)), start=offset + 1, steps=steps)


def _page_of_step(trajectory: Trajectory, step_id: int) -> int:
    before = TrajectoryStep.objects.filter(trajectory=trajectory, step_id__lt=step_id).count()
    return before // STEPS_PER_PAGE + 1


def _external_notice(evaluation: Evaluation) -> str:
    when = evaluation.finished_at or evaluation.created_at
    stamp = f" on {when:%Y-%m-%d %H:%M}" if when else ""
    return (
        f"External result — not run or certified by rsiweb. Ingested{stamp} as evaluation #{evaluation.pk}; "
        f"source: {external_source_text(evaluation.source)}"
    )


def _trajectory_summary(trajectory: Trajectory | None) -> dict[str, Any] | None:
    if trajectory is None:
        return None
    agent = trajectory.agent if isinstance(trajectory.agent, dict) else {}
    final = trajectory.final_metrics if isinstance(trajectory.final_metrics, dict) else {}
    extra = trajectory.extra if isinstance(trajectory.extra, dict) else {}
    tools = []
    for tool in agent.get("tool_definitions") or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name"):
            tools.append(str(function["name"]))
    prompt, completion = final.get("total_prompt_tokens"), final.get("total_completion_tokens")
    total = None
    if isinstance(prompt, int) or isinstance(completion, int):
        total = (prompt if isinstance(prompt, int) else 0) + (completion if isinstance(completion, int) else 0)
    shown_keys = (
        "total_prompt_tokens",
        "total_completion_tokens",
        "total_cached_tokens",
        "total_cost_usd",
        "total_steps",
    )
    other_final = {key: value for key, value in final.items() if key not in shown_keys}
    other_agent = {
        key: value for key, value in agent.items() if key not in ("name", "version", "model_name", "tool_definitions")
    }
    return {
        "agent_name": agent.get("name", ""),
        "agent_version": agent.get("version", ""),
        "model_name": agent.get("model_name", ""),
        "tools": tools,
        "agent_extra": tj.text_block(tj.pretty_json(other_agent)) if other_agent else None,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_tokens": final.get("total_cached_tokens"),
        "cost_usd": final.get("total_cost_usd"),
        "total_tokens": total,
        "priced": trial_pages.trajectory_price(trajectory),
        "final_steps": final.get("total_steps"),
        "final_extra": tj.text_block(tj.pretty_json(other_final)) if other_final else None,
        "notes": tj.text_block(trajectory.notes) if trajectory.notes else None,
        "extra": tj.text_block(tj.pretty_json(trajectory.extra)) if trajectory.extra else None,
        # A lenient import's deviations, the run's end (mini-swe-agent), the files joined and linked.
        "deviations": [str(item) for item in extra.get("deviations") or []],
        "exit_status": str(extra.get("exit_status") or ""),
        "continuation_files": [str(item) for item in extra.get("continuation_files") or []],
        "subagents": [
            {
                "name": str(sub.get("trajectory_path") or sub.get("session_id") or ""),
                "steps": len(sub.get("steps") or []),
            }
            for sub in extra.get("subagent_trajectories") or []
            if isinstance(sub, dict)
        ],
    }


def _error_steps(trajectory: Trajectory) -> list[int]:
    """Ids of steps that look like errors, for jump links (one query; the
    per-step check on the page is more thorough, see ``step_error``)."""
    looks = (
        Q(extra__has_key="error")
        | Q(extra__has_key="is_error")
        | Q(message__istartswith="error")
        | Q(message__istartswith="traceback")
    )
    return list(
        TrajectoryStep.objects.filter(looks, trajectory=trajectory)
        .order_by("step_id")
        .values_list("step_id", flat=True)[:ERROR_STEPS_LISTED]
    )


def _hidden_banner(text: str, subject: str) -> str:
    """The warning for a text holding hidden characters, "" when it holds none."""
    summary = hidden_chars.summarize(hidden_chars.find(text)) if hidden_chars.has_hidden(text) else None
    return summary.message(subject) if summary is not None else ""


@require_GET
@access.permission_required()
def trial(request: HttpRequest, pk: int) -> HttpResponse:
    """One trial: task, candidate, result, and its trajectory, one page of steps at a time."""
    trial = trial_pages.visible_trial(
        user=request.user, pk=pk, related=("task", "candidate", "candidate__experiment", "evaluation", "trajectory")
    )
    trajectory = trial_pages.trajectory_of(trial)
    try:
        number = _positive_int(request.GET.get("page"), "page")
        wanted_step = _positive_int(request.GET.get("step"), "step", default=0) if request.GET.get("step") else None
    except InputError as exc:
        return _bad_request(request, str(exc))
    if wanted_step is not None and trajectory is not None:
        number = _page_of_step(trajectory, wanted_step)
    page = _step_page(trajectory, number)
    step_filter = _step_filter(request)
    step_missing = wanted_step is not None and all(step.step_id != wanted_step for step in page.steps)

    siblings = list(
        access.hide_sealed(Trial.objects.filter(evaluation_id=trial.evaluation_id, task_id=trial.task_id), request.user)
        .order_by("index")
        .values("pk", "index", "outcome", "state")
    )
    record = CertifiedResult.objects.filter(evaluation_id=trial.evaluation_id).values_list("pk", flat=True).first()
    experiment = trial.candidate.experiment
    context: dict[str, Any] = {
        "trial": trial,
        "task": trial.task,
        "candidate": trial.candidate,
        "experiment": experiment,
        "evaluation": trial.evaluation,
        "record_pk": record,
        "noise": trial.evaluation.purpose == Evaluation.Purpose.NOISE,
        "external": trial.evaluation.external,
        "external_notice": _external_notice(trial.evaluation) if trial.evaluation.external else "",
        "external_source": external_source_text(trial.evaluation.source) if trial.evaluation.external else "",
        "instruction": tj.text_block(trial.task.instruction, max_lines=12, max_chars=1200),
        "instruction_hidden": _hidden_banner(trial.task.instruction, "task's instruction"),
        "error_text": tj.text_block(trial.error) if trial.error else None,
        "criteria": (criteria := _criteria(trial.criteria_results)),
        "criteria_met": sum(1 for c in criteria if c["met"]),
        "siblings": siblings,
        "parent_trial": trial_pages.parent_trial(trial),
        "trajectory": trajectory,
        "summary": _trajectory_summary(trajectory),
        "error_steps": _error_steps(trajectory) if trajectory is not None else [],
        "page": page,
        "wanted_step": wanted_step,
        "step_missing": step_missing,
        "side_trial": trial,
        "matrix_url": query_url(reverse("review:matrix", args=[experiment.pk]), split=trial.split)
        + f"#task-{trial.task_id}",
        "step_filter": step_filter,
        "step_sources": STEP_SOURCES,
    }
    if step_filter.active and trajectory is not None:
        matches, capped = _matching_steps(trajectory, step_filter)
        context.update({"matches": matches, "matches_capped": capped})
    return render(request, "review/results/trial.html", context)


STEP_SOURCES = ("agent", "user", "system")
# A search shows at most this many steps (and looks at no more than MATCH_SCAN for errors).
MATCHES_SHOWN = 200
MATCH_SCAN = 5000


@dataclass(frozen=True)
class StepFilter:
    """Search and filters of a transcript (``?q=&source=&only=tools|errors``)."""

    text: str = ""
    source: str = ""
    only: str = ""

    @property
    def active(self) -> bool:
        return bool(self.text or self.source or self.only)


def _step_filter(request: HttpRequest) -> StepFilter:
    """The filters the request asks for; an unknown value is ignored (the form offers only known ones)."""
    source = request.GET.get("source", "")
    only = request.GET.get("only", "")
    return StepFilter(
        text=request.GET.get("q", "").strip()[:200],
        source=source if source in STEP_SOURCES else "",
        only=only if only in ("tools", "errors") else "",
    )


def _matching_steps(trajectory: Trajectory, wanted: StepFilter) -> tuple[list[tj.StepView], bool]:
    """The steps the filters keep, in order, and whether more exist than are shown.
    Errors are recognised per step (``step_error``), so that filter runs here."""
    rows = review_selectors.trajectory_steps_matching(
        trajectory_id=trajectory.pk,
        text=wanted.text,
        source=wanted.source,
        tool_calls=wanted.only == "tools",
        columns=STEP_COLUMNS,
    )
    limit = MATCH_SCAN if wanted.only == "errors" else MATCHES_SHOWN + 1
    views = [tj.step_view(row) for row in rows[:limit]]
    if wanted.only == "errors":
        views = [view for view in views if view.error]
    return views[:MATCHES_SHOWN], len(views) > MATCHES_SHOWN


def _criteria(results: Any) -> list[dict[str, Any]]:
    shown = []
    for item in results if isinstance(results, list) else []:
        if isinstance(item, dict):
            shown.append(
                {
                    "id": str(item.get("id", "")),
                    "met": item.get("met"),
                    "detail": {k: v for k, v in item.items() if k not in ("id", "met")},
                }
            )
    return shown


@require_GET
@access.permission_required()
def trial_steps(request: HttpRequest, pk: int) -> HttpResponse:
    """A page of a trial's steps as list items (htmx appends them on scroll),
    ending with the sentinel that loads the next page."""
    trial = trial_pages.visible_trial(user=request.user, pk=pk, related=("trajectory",))
    trajectory = trial_pages.trajectory_of(trial)
    if trajectory is None:
        raise Http404("this trial has no trajectory")
    try:
        number = _positive_int(request.GET.get("page"), "page")
    except InputError as exc:
        return HttpResponseBadRequest(str(exc))
    if number > trial_pages.page_count(trajectory.step_count):
        raise Http404(f"the trajectory has {trial_pages.page_count(trajectory.step_count)} pages of steps")
    page = _step_page(trajectory, number)
    return render(request, "review/results/trial.html#steps", {"trial": trial, "side_trial": trial, "page": page})


# --- Screen 6: two trajectories side by side ---------------------------------------


@require_GET
@access.permission_required()
def trial_compare(request: HttpRequest, pk: int) -> HttpResponse:
    """This trial (right) against the parent's trial of the same task and
    index, or ``?with=<trial>`` (left), aligned by content or, with
    ``?align=position``, step by step; ``?page=`` pages the rows."""
    try:
        with_pk = _positive_int(request.GET.get("with"), "with") if request.GET.get("with") else None
        page = compare.compare_page(
            user=request.user,
            pk=pk,
            with_pk=with_pk,
            page=_positive_int(request.GET.get("page"), "page"),
            by_position=request.GET.get("align") == "position",
        )
    except (InputError, BadInput) as exc:
        return _bad_request(request, str(exc))
    return render(request, "review/results/compare.html", page.context())


urlpatterns = [
    path("experiments/<int:pk>/matrix/", matrix, name="matrix"),
    path("trials/<int:pk>/", trial, name="trial"),
    path("trials/<int:pk>/steps/", trial_steps, name="trial_steps"),
    path("trials/<int:pk>/compare/", trial_compare, name="trial_compare"),
]
