"""Screen 8: failure annotation of failed trials.

- the annotation queue: failed trials, the ones nobody labelled first, then
  the ones others labelled but I did not, then the rest; progress per
  annotator;
- the annotation panel of one trial (an htmx fragment the trial page loads;
  also a page of its own): the annotations so far, add / edit / delete
  one's own;
- per-experiment statistics: label counts per experiment and per
  candidate, progress, Cohen's kappa per pair of annotators, and the
  exports (CSV and JSONL, streamed);
- team labels per experiment.

Writes go through ``evolution.services.annotations``; annotations never
touch trials or certified results. Sealed trials and their annotations are
left out for users without the sealed permission, everywhere.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypedDict

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Case, Count, Exists, IntegerField, Max, Min, OuterRef, Prefetch, Q, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import slugify
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from evolution import access, agreement
from evolution.models import (
    Annotation,
    AnnotationScore,
    AnnotationScoreConfig,
    Candidate,
    Experiment,
    Trajectory,
    Trial,
)
from evolution.services import annotations as annotation_services
from evolution.services.annotations import EXTERNAL_REFUSAL, FAILED_OUTCOMES, AnnotationError, AnnotationNotYours
from review import hidden
from review.http import HtmxHttpRequest

if TYPE_CHECKING:  # django-stubs-ext is a development requirement
    from django_stubs_ext import WithAnnotations

QUEUE_PAGE_SIZE = 50
DISAGREEMENTS_SHOWN = 25
# Spreadsheet programs run cells starting with these as formulas (OWASP "CSV injection").
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
EXPORT_FIELDS = (
    "experiment",
    "candidate_id",
    "trial_id",
    "task",
    "split",
    "trial_index",
    "outcome",
    "label_slug",
    "label_name",
    "note",
    "step_id",
    "author",
    "created_at",
    "updated_at",
)
QUEUE_SHOW = {
    "all": "all failed trials",
    "unlabelled": "labelled by nobody",
    "todo": "not labelled by me",
    "others": "labelled by others, not by me",
    "mine": "labelled by me",
}
# Annotators wanted per trial (as a Langfuse annotation queue assigns N per item): "labelled by others, not by
# me" lists the trials that have fewer, so a second annotator is sent to a colleague's items. ``?per_trial=``.
ANNOTATORS_PER_TRIAL = 2
ANNOTATORS_PER_TRIAL_MAX = 10


# --- helpers ------------------------------------------------------------------


def _failed_trials(user: Any, *, experiment_id: int | None = None) -> QuerySet[Trial]:
    """Failed trials the user may see (sealed ones only with the permission).
    External results are left out: we did not run them, there is no
    trajectory of ours to read, so labelling why they failed is out of scope."""
    trials = Trial.objects.filter(outcome__in=FAILED_OUTCOMES, evaluation__external=False)
    if experiment_id is not None:
        trials = trials.filter(candidate__experiment_id=experiment_id)
    return access.hide_sealed(trials, user, split_field="split")


def _visible_annotations(user: Any, *, experiment_id: int) -> QuerySet[Annotation]:
    annotations = Annotation.objects.filter(trial__candidate__experiment_id=experiment_id)
    return access.hide_sealed(annotations, user, split_field="trial__split")


def _progress(trials: QuerySet[Trial], user: Any) -> dict[str, Any]:
    """How many of ``trials`` are labelled: by anyone, by two or more, by me,
    and per annotator (two queries whatever the number of trials)."""
    counted = trials.annotate(annotators=Count("annotations"))
    totals = counted.aggregate(
        total=Count("pk"),
        labelled=Count("pk", filter=Q(annotators__gte=1)),
        shared=Count("pk", filter=Q(annotators__gte=2)),
    )
    per_author = list(
        Annotation.objects.filter(trial__in=trials.values("pk"))
        .values("author_id", "author__username")
        .annotate(done=Count("trial", distinct=True))
        .order_by("-done", "author__username")
    )
    total = totals["total"] or 0
    mine = next((row["done"] for row in per_author if row["author_id"] == user.pk), 0)
    return {
        "total": total,
        "labelled": totals["labelled"] or 0,
        "shared": totals["shared"] or 0,
        "unlabelled": total - (totals["labelled"] or 0),
        "mine": mine,
        "annotators": [
            {
                "name": row["author__username"],
                "done": row["done"],
                "percent": 100.0 * row["done"] / total if total else 0.0,
                "is_me": row["author_id"] == user.pk,
            }
            for row in per_author
        ],
    }


def _trial_visible(request: HttpRequest, pk: int) -> Trial:
    """The trial, or 404 (also for a sealed one without the sealed permission)."""
    trials = access.hide_sealed(
        Trial.objects.select_related("candidate__experiment", "task", "trajectory", "evaluation"),
        request.user,
        split_field="split",
    )
    return get_object_or_404(trials, pk=pk)


def _trial_url(trial_id: int) -> str:
    return reverse("review:trial", args=[trial_id]) + "#annotations"


SCORE_FIELD = "score-"  # a score's form field: "score-<config id>"


def _scores_posted(request: HttpRequest) -> dict[str | int, str | float | bool | None]:
    """The scores of the form, by config id (every config of the form posts its field, empty = no score)."""
    return {key[len(SCORE_FIELD) :]: request.POST.get(key, "") for key in request.POST if key.startswith(SCORE_FIELD)}


def _score_shown(config: AnnotationScoreConfig, value: float) -> str:
    if config.kind == AnnotationScoreConfig.Kind.BOOLEAN:
        return "yes" if value else "no"
    return f"{value:.15g}"


def _safe_next(request: HttpRequest, fallback: str) -> str:
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, require_https=request.is_secure()):
        return target
    return fallback


# --- the queue ----------------------------------------------------------------


class _QueueOrder(TypedDict):
    annotators: int
    labelled_by_me: bool
    bucket: int


def _in_queue_order(trials: QuerySet[Trial], user: Any) -> QuerySet[WithAnnotations[Trial, _QueueOrder]]:
    """``trials`` with ``annotators``, ``labelled_by_me`` and ``bucket``, in
    queue order: nobody labelled it (0), others did but not I (1), I did (2);
    within a bucket by experiment, round, candidate, task and trial index."""
    mine = Annotation.objects.filter(trial=OuterRef("pk"), author=user)
    return (
        trials.annotate(annotators=Count("annotations"), labelled_by_me=Exists(mine))
        .annotate(
            bucket=Case(
                When(annotators=0, then=Value(0)),
                When(labelled_by_me=False, then=Value(1)),
                default=Value(2),
                output_field=IntegerField(),
            )
        )
        .order_by(
            "bucket",
            "candidate__experiment__name",
            "candidate__round",
            "candidate_id",
            "task__external_id",
            "index",
            "pk",
        )
    )


@require_GET
@access.permission_required()
def annotate_queue(request: HttpRequest) -> HttpResponse:
    """Failed trials to label, the ones nobody labelled first."""
    experiments = list(Experiment.objects.order_by("name").values("pk", "name"))
    experiment_id: int | None = None
    raw = request.GET.get("experiment", "")
    if raw:
        if not raw.isdigit() or not any(e["pk"] == int(raw) for e in experiments):
            messages.error(request, f"unknown experiment {raw!r}; showing all experiments")
        else:
            experiment_id = int(raw)
    show = request.GET.get("show", "all")
    if show not in QUEUE_SHOW:
        show = "all"
    split = request.GET.get("split", "")
    raw_per_trial = request.GET.get("per_trial", "")
    per_trial = ANNOTATORS_PER_TRIAL
    if raw_per_trial.isdigit() and 2 <= int(raw_per_trial) <= ANNOTATORS_PER_TRIAL_MAX:
        per_trial = int(raw_per_trial)

    trials = _failed_trials(request.user, experiment_id=experiment_id)
    progress = _progress(trials, request.user)

    listed = _in_queue_order(trials, request.user)
    if split:
        listed = listed.filter(split=split)
    if show == "unlabelled":
        listed = listed.filter(annotators=0)
    elif show == "todo":
        listed = listed.filter(labelled_by_me=False)
    elif show == "others":
        listed = listed.filter(annotators__gte=1, annotators__lt=per_trial, labelled_by_me=False)
    elif show == "mine":
        listed = listed.filter(labelled_by_me=True)
    listed = listed.select_related("candidate__experiment", "task").prefetch_related(
        Prefetch(
            "annotations",
            queryset=Annotation.objects.select_related("label", "author").order_by("created_at", "pk"),
        )
    )
    page = Paginator(listed, QUEUE_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "experiments": experiments,
        "experiment_id": experiment_id,
        "show": show,
        "show_choices": QUEUE_SHOW,
        "per_trial": per_trial,
        "per_trial_choices": range(2, ANNOTATORS_PER_TRIAL_MAX + 1),
        "split": split,
        "splits": ["train", "gate", "sealed", "heldout"]
        if access.can_see_sealed(request.user)
        else ["train", "gate", "heldout"],
        "page": page,
        "query": query.urlencode(),
        "progress": progress,
    }
    return render(request, "review/annotations/queue.html", context)


# --- the panel of one trial ---------------------------------------------------


def _panel_context(
    request: HttpRequest, trial: Trial, *, error: str = "", notice: str = "", posted: dict[str, str] | None = None
) -> dict[str, Any]:
    experiment = trial.candidate.experiment
    annotations = list(
        Annotation.objects.filter(trial=trial)
        .select_related("label", "author", "step")
        .prefetch_related(Prefetch("scores", queryset=AnnotationScore.objects.select_related("config")))
        .order_by("created_at", "pk")
    )
    configs = list(annotation_services.score_configs(experiment=experiment))
    for annotation in annotations:
        given = {score.config_id: score.value for score in annotation.scores.all()}
        annotation.scores_shown = [  # type: ignore[attr-defined]
            (config, _score_shown(config, given[config.pk])) for config in configs if config.pk in given
        ]
    mine = next((a for a in annotations if a.author_id == request.user.pk), None)
    labels = list(annotation_services.labels_available(experiment=experiment))
    trajectory: Trajectory | None = getattr(trial, "trajectory", None)
    step_range = None
    if trajectory is not None:
        step_range = trajectory.steps.aggregate(first=Min("step_id"), last=Max("step_id"), count=Count("pk"))
        if not step_range["count"]:
            step_range = None
    posted = posted or {}
    # After a failed POST the form shows what was typed, not the saved values.
    new_form = {key: posted.get(key, "") for key in ("label", "note", "step")} if not posted.get("annotation") else {}
    new_scores = _score_fields(configs, posted if not posted.get("annotation") else {})
    if posted.get("annotation"):
        edit_form = {key: posted.get(key, "") for key in ("label", "note", "step")}
        edit_scores = _score_fields(configs, posted)
    elif mine is not None:
        step = str(mine.step.step_id) if mine.step else ""
        edit_form = {"label": str(mine.label_id), "note": mine.note, "step": step}
        edit_scores = _score_fields(
            configs,
            {f"{SCORE_FIELD}{config.pk}": shown for config, shown in mine.scores_shown},  # type: ignore[attr-defined]
        )
    else:
        edit_form = {}
        edit_scores = []
    return {
        "trial": trial,
        "experiment": experiment,
        "annotations": annotations,
        "mine": mine,
        "new_form": new_form,
        "edit_form": edit_form,
        "new_scores": new_scores,
        "edit_scores": edit_scores,
        "default_labels": [label for label in labels if label.experiment_id is None],
        "team_labels": [label for label in labels if label.experiment_id is not None],
        # The label keys' order: defaults first, as in the select.
        "all_labels": [label for label in labels if label.experiment_id is None]
        + [label for label in labels if label.experiment_id is not None],
        "step_range": step_range,
        "failed": trial.outcome in FAILED_OUTCOMES,
        "external": trial.evaluation.external,
        "external_refusal": EXTERNAL_REFUSAL,
        "error": error,
        "notice": notice,
        "posted": posted,
        "trial_url": reverse("review:trial", args=[trial.pk]),
        "distinct_labels": len({a.label_id for a in annotations}),
        "next_trial": _next_to_label(request.user, experiment_id=experiment.pk, after=trial.pk),
    }


def _score_fields(configs: list[AnnotationScoreConfig], values: dict[str, str]) -> list[dict[str, Any]]:
    """One form field per score config, with the value to show (as posted or saved)."""
    return [
        {
            "config": config,
            "name": f"{SCORE_FIELD}{config.pk}",
            "value": values.get(f"{SCORE_FIELD}{config.pk}", ""),
            "range": annotation_services.score_range_text(config),
        }
        for config in configs
    ]


def _next_to_label(user: Any, *, experiment_id: int, after: int) -> int | None:
    """The first trial of the experiment's queue the user has not labelled
    (other than ``after``), so an annotator can go on without the queue."""
    if not user.has_perm(access.ANNOTATE):
        return None
    trials = _failed_trials(user, experiment_id=experiment_id).exclude(pk=after)
    return _in_queue_order(trials, user).filter(labelled_by_me=False).values_list("pk", flat=True).first()


def _panel(request: HtmxHttpRequest, trial: Trial, *, status: int = 200, **kwargs: Any) -> HttpResponse:
    template = "review/annotations/panel.html"
    if request.htmx:
        template += "#panel"
    return render(request, template, _panel_context(request, trial, **kwargs), status=status)


@require_http_methods(["GET", "POST"])
@access.permission_required()
def trial_annotations(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """GET: the annotation panel (fragment for htmx, a page otherwise).
    POST: add an annotation, or update one's own (``annotation`` = its id)."""
    trial = _trial_visible(request, pk)
    if request.method == "GET":
        return _panel(request, trial)
    if not request.user.has_perm(access.ANNOTATE):
        raise PermissionDenied("you need the annotator role to annotate trials")
    fields = {key: request.POST.get(key, "") for key in ("label", "note", "step", "annotation")}
    scores = _scores_posted(request)
    fields.update({f"{SCORE_FIELD}{key}": str(value) for key, value in scores.items()})
    try:
        done = _annotation_save(request, trial, fields, scores)
    except AnnotationNotYours as exc:
        raise PermissionDenied(str(exc)) from exc
    except AnnotationError as exc:
        if request.htmx:
            # htmx does not swap 4xx responses; the panel shows the message instead.
            return _panel(request, trial, error=str(exc), posted=fields)
        messages.error(request, f"not saved: {exc}")
        return HttpResponseRedirect(_trial_url(trial.pk))
    if request.htmx:
        return _panel(request, trial, notice=done)
    messages.success(request, done)
    return HttpResponseRedirect(_trial_url(trial.pk))


def _annotation_save(request: HttpRequest, trial: Trial, fields: dict[str, str], scores: dict[Any, Any]) -> str:
    """Add the user's annotation of ``trial``, or update their own (``fields["annotation"]``); what was done."""
    common: dict[str, Any] = {
        "label": fields["label"],
        "note": fields["note"],
        "step": fields["step"],
        "scores": scores,
    }
    if fields["annotation"]:
        annotation = _own_annotation(request, fields["annotation"], trial=trial)
        annotation_services.annotation_update(annotation=annotation, author=request.user, **common)
        return "your annotation was updated"
    annotation_services.annotation_create(trial=trial, author=request.user, **common)
    return "annotation saved"


def _own_annotation(request: HttpRequest, raw_id: str, *, trial: Trial) -> Annotation:
    if not raw_id.isdigit():
        raise AnnotationError(f"unknown annotation {raw_id!r}")
    annotation = Annotation.objects.filter(pk=int(raw_id), trial=trial).first()
    if annotation is None:
        raise AnnotationError("this annotation no longer exists")
    if annotation.author_id != request.user.pk:
        raise AnnotationNotYours("you can only edit your own annotations")
    return annotation


@require_POST
@access.permission_required(access.ANNOTATE)
def annotation_delete(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Delete one's own annotation; anyone else's is 403."""
    annotation = get_object_or_404(Annotation.objects.select_related("trial"), pk=pk)
    trial = _trial_visible(request, annotation.trial_id)
    try:
        annotation_services.annotation_delete(annotation=annotation, author=request.user)
    except AnnotationNotYours as exc:
        raise PermissionDenied(str(exc)) from exc
    if request.htmx:
        return _panel(request, trial, notice="your annotation was deleted")
    messages.success(request, "your annotation was deleted")
    return HttpResponseRedirect(_trial_url(trial.pk))


# --- labels -------------------------------------------------------------------


@require_POST
@access.permission_required(access.ANNOTATE)
def label_add(request: HttpRequest, pk: int) -> HttpResponse:
    """Add a team label to the experiment, then go back where the form was."""
    experiment = get_object_or_404(Experiment, pk=pk)
    back = _safe_next(request, reverse("review:annotation_stats", args=[experiment.pk]))
    try:
        label = annotation_services.label_create(
            experiment=experiment, name=request.POST.get("name", ""), description=request.POST.get("description", "")
        )
    except AnnotationError as exc:
        messages.error(request, f"label not added: {exc}")
    else:
        messages.success(request, f"label {label.name!r} ({label.slug}) added to {experiment.name}")
    return HttpResponseRedirect(back)


@require_POST
@access.permission_required(access.ANNOTATE)
def score_config_add(request: HttpRequest, pk: int) -> HttpResponse:
    """Add a score (numeric or yes/no) to the experiment, then go back to its annotation statistics."""
    experiment = get_object_or_404(Experiment, pk=pk)
    back = _safe_next(request, reverse("review:annotation_stats", args=[experiment.pk]) + "#scores")
    try:
        config = annotation_services.score_config_create(
            experiment=experiment,
            name=request.POST.get("name", ""),
            kind=request.POST.get("kind", ""),
            minimum=request.POST.get("minimum", ""),
            maximum=request.POST.get("maximum", ""),
            description=request.POST.get("description", ""),
        )
    except AnnotationError as exc:
        messages.error(request, f"score not added: {exc}")
    else:
        messages.success(request, f"score {config.name!r} ({config.kind}) added to {experiment.name}")
    return HttpResponseRedirect(back)


# --- statistics ---------------------------------------------------------------


@require_GET
@access.permission_required()
def annotation_stats(request: HttpRequest, pk: int) -> HttpResponse:
    """Label counts per experiment and per candidate, progress per
    annotator and Cohen's kappa per pair of annotators."""
    experiment = get_object_or_404(Experiment, pk=pk)
    trials = _failed_trials(request.user, experiment_id=experiment.pk)
    annotations = _visible_annotations(request.user, experiment_id=experiment.pk)
    labels = list(
        annotation_services.labels_available(experiment=experiment).annotate(
            used=Count("annotations", filter=Q(annotations__in=annotations.values("pk")))
        )
    )

    # Label counts per candidate: candidates with failed trials or annotations.
    failed_per_candidate = {
        row["candidate_id"]: row["n"] for row in trials.values("candidate_id").annotate(n=Count("pk")).order_by()
    }
    counts: dict[int, dict[int, int]] = defaultdict(dict)
    labelled_per_candidate: dict[int, int] = {}
    for row in annotations.values("trial__candidate_id", "label_id").annotate(n=Count("pk")).order_by():
        counts[row["trial__candidate_id"]][row["label_id"]] = row["n"]
    for labelled in annotations.values("trial__candidate_id").annotate(n=Count("trial", distinct=True)).order_by():
        labelled_per_candidate[labelled["trial__candidate_id"]] = labelled["n"]
    candidate_ids = set(failed_per_candidate) | set(counts)
    candidates = (
        Candidate.objects.filter(pk__in=candidate_ids)
        .order_by("round", "pk")
        .only("pk", "label", "round", "state", "origin")
    )
    per_candidate = [
        {
            "candidate": candidate,
            "failed": failed_per_candidate.get(candidate.pk, 0),
            "labelled": labelled_per_candidate.get(candidate.pk, 0),
            "cells": [counts[candidate.pk].get(label.pk, 0) for label in labels],
        }
        for candidate in candidates
    ]

    # Agreement over trials labelled by two or more annotators.
    rows = list(
        annotations.values_list(
            "trial_id", "author__username", "label__slug", "trial__task__external_id", "trial__candidate_id"
        ).order_by("trial_id")
    )
    summary = agreement.pairwise_agreement(agreement.labels_by_item((r[0], r[1], r[2]) for r in rows))
    disagreements = _disagreements(rows)

    context = {
        "experiment": experiment,
        "pairs": [{"pair": pair, "strength": kappa_strength(pair.agreement.kappa)} for pair in summary.pairs],
        "mean_strength": kappa_strength(summary.mean_kappa),
        "labels": labels,
        "label_total": sum(label.used for label in labels),
        "per_candidate": per_candidate,
        "progress": _progress(trials, request.user),
        "summary": summary,
        "disagreements": disagreements[:DISAGREEMENTS_SHOWN],
        "disagreement_count": len(disagreements),
        "scores": _score_agreement(experiment, annotations),
    }
    return render(request, "review/annotations/stats.html", context)


def _score_agreement(experiment: Experiment, annotations: QuerySet[Annotation]) -> list[dict[str, Any]]:
    """Per score config: how many scores, and agreement over the trials scored by two or more annotators
    (yes/no: Cohen's kappa per pair as for labels; numeric: Krippendorff's alpha, interval metric, and the mean
    absolute difference between two annotators' values)."""
    values: dict[int, dict[Any, dict[Any, float]]] = defaultdict(dict)
    counts: dict[int, int] = defaultdict(int)
    scores = AnnotationScore.objects.filter(annotation__in=annotations.values("pk")).values_list(
        "config_id", "annotation__trial_id", "annotation__author__username", "value"
    )
    for config_id, trial_id, author, value in scores:
        values[config_id].setdefault(trial_id, {})[author] = value
        counts[config_id] += 1
    rows: list[dict[str, Any]] = []
    for config in annotation_services.score_configs(experiment=experiment):
        by_trial = values.get(config.pk, {})
        row: dict[str, Any] = {
            "config": config,
            "count": counts.get(config.pk, 0),
            "range": annotation_services.score_range_text(config),
        }
        if config.kind == AnnotationScoreConfig.Kind.BOOLEAN:
            yes_no = {trial: {a: "yes" if v else "no" for a, v in by.items()} for trial, by in by_trial.items()}
            summary = agreement.pairwise_agreement(yes_no)
            row["summary"] = summary
            row["pairs"] = [{"pair": pair, "strength": kappa_strength(pair.agreement.kappa)} for pair in summary.pairs]
            row["mean_strength"] = kappa_strength(summary.mean_kappa)
        else:
            row["numeric"] = agreement.krippendorff_interval(by_trial)
        rows.append(row)
    return rows


def kappa_strength(kappa: float | None) -> str:
    """Landis and Koch's words for a kappa, so the number reads without a table."""
    if kappa is None:
        return ""
    if kappa < 0:
        return "poor (below chance)"
    for bound, word in ((0.2, "slight"), (0.4, "fair"), (0.6, "moderate"), (0.8, "substantial")):
        if kappa <= bound:
            return word
    return "almost perfect"


def _disagreements(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Trials whose annotators chose different labels: the ones to talk about."""
    by_trial: dict[int, dict[str, Any]] = {}
    for trial_id, author, slug, task, candidate_id in rows:
        entry = by_trial.setdefault(
            trial_id, {"trial_id": trial_id, "task": task, "candidate_id": candidate_id, "labels": []}
        )
        entry["labels"].append((author, slug))
    return [entry for entry in by_trial.values() if len({slug for _a, slug in entry["labels"]}) > 1]


# --- exports ------------------------------------------------------------------


def _export_rows(request: HttpRequest, experiment: Experiment) -> Iterator[dict[str, Any]]:
    annotations = (
        _visible_annotations(request.user, experiment_id=experiment.pk)
        .select_related("trial__task", "label", "author", "step")
        .prefetch_related("scores")
        .order_by("trial__candidate_id", "trial_id", "created_at", "pk")
    )
    configs = list(annotation_services.score_configs(experiment=experiment))
    for annotation in annotations.iterator(chunk_size=500):
        trial = annotation.trial
        given = {score.config_id: score.value for score in annotation.scores.all()}
        yield {
            "experiment": experiment.name,
            "candidate_id": trial.candidate_id,
            "trial_id": trial.pk,
            "task": trial.task.external_id,
            "split": trial.split,
            "trial_index": trial.index,
            "outcome": trial.outcome,
            "label_slug": annotation.label.slug,
            "label_name": annotation.label.name,
            "note": annotation.note,
            "step_id": annotation.step.step_id if annotation.step else None,
            "author": annotation.author.get_username(),
            "created_at": annotation.created_at.isoformat(),
            "updated_at": annotation.updated_at.isoformat(),
            "scores": {config.slug: _score_exported(config, given.get(config.pk)) for config in configs},
        }


def _score_exported(config: AnnotationScoreConfig, value: float | None) -> float | bool | None:
    if value is None or config.kind == AnnotationScoreConfig.Kind.NUMERIC:
        return value
    return bool(value)


def csv_cell(value: Any) -> Any:
    """A cell a spreadsheet shows as text: hidden characters written as
    their labels (``<U+202E>``, as the screens show them: a spreadsheet
    would apply a bidirectional control and draw nothing for a zero-width
    space), and strings that would start a formula get a leading
    apostrophe. None becomes an empty cell."""
    if value is None:
        return ""
    if isinstance(value, str):
        value = hidden.reveal_text(value)
        if value.startswith(FORMULA_PREFIXES):
            return "'" + value
    return value


class _Echo:
    """A file-like object whose write returns the line (for streaming csv)."""

    def write(self, value: str) -> str:
        return value


def _csv_lines(rows: Iterable[dict[str, Any]], score_slugs: list[str]) -> Iterator[str]:
    """One column per field, then one per score ("score:<slug>"; yes/no as yes and no, empty when not given)."""
    writer = csv.writer(_Echo())
    yield writer.writerow([*EXPORT_FIELDS, *(f"score:{slug}" for slug in score_slugs)])
    for row in rows:
        scores = [row["scores"].get(slug) for slug in score_slugs]
        yield writer.writerow(
            [csv_cell(row[name]) for name in EXPORT_FIELDS]
            + [("yes" if value else "no") if isinstance(value, bool) else csv_cell(value) for value in scores]
        )


def _jsonl_lines(rows: Iterable[dict[str, Any]]) -> Iterator[str]:
    for row in rows:
        text = json.dumps(row, ensure_ascii=False)
        # Keep the file inert if someone pastes it into an HTML page.
        yield text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026") + "\n"


def _export(request: HttpRequest, pk: int, *, extension: str, content_type: str) -> StreamingHttpResponse:
    experiment = get_object_or_404(Experiment, pk=pk)
    rows = _export_rows(request, experiment)
    slugs = list(annotation_services.score_configs(experiment=experiment).values_list("slug", flat=True))
    lines = _csv_lines(rows, slugs) if extension == "csv" else _jsonl_lines(rows)
    response = StreamingHttpResponse(lines, content_type=content_type)
    filename = f"annotations-{slugify(experiment.name) or experiment.pk}.{extension}"
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@require_GET
@access.permission_required()
def annotations_csv(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """One row per annotation; sealed rows only with the sealed permission."""
    return _export(request, pk, extension="csv", content_type="text/csv; charset=utf-8")


@require_GET
@access.permission_required()
def annotations_jsonl(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """One JSON object per line and annotation; same rows as the CSV."""
    return _export(request, pk, extension="jsonl", content_type="application/x-ndjson; charset=utf-8")


urlpatterns = [
    path("annotate/", annotate_queue, name="annotate_queue"),
    path("trials/<int:pk>/annotations/", trial_annotations, name="trial_annotations"),
    path("annotations/<int:pk>/delete/", annotation_delete, name="annotation_delete"),
    path("experiments/<int:pk>/annotations/", annotation_stats, name="annotation_stats"),
    path("experiments/<int:pk>/annotations.csv", annotations_csv, name="annotations_csv"),
    path("experiments/<int:pk>/annotations.jsonl", annotations_jsonl, name="annotations_jsonl"),
    path("experiments/<int:pk>/labels/", label_add, name="label_add"),
    path("experiments/<int:pk>/scores/", score_config_add, name="score_config_add"),
]
