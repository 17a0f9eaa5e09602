"""Django admin for every evolution model.

Protected data (certified records, content-addressed storage, trial results
and trajectories, split memberships, the ledger) is read-only here: it
changes only through services that keep its digests and chains consistent.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from evolution import models, operators
from evolution.loop import lifecycle
from evolution.recipes import PRESET_NAMES
from evolution.selectors import OWN_RECIPE


class ReadOnlyAdmin(admin.ModelAdmin[Any]):  # Any: one base for every model's admin
    """Viewable, never editable, added or deleted from the admin."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(models.Blob)
class BlobAdmin(ReadOnlyAdmin):
    list_display = ("digest", "size")
    search_fields = ("digest",)
    exclude = ("content",)


class ReadOnlyInline(admin.options.InlineModelAdmin[Any, Any]):  # Any: one base for every inline
    """An inline that shows rows and never adds, changes or deletes them."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TreeEntryInline(ReadOnlyInline, admin.TabularInline[models.TreeEntry, models.Tree]):
    model = models.TreeEntry
    fields = ("path", "mode", "blob")
    readonly_fields = fields


@admin.register(models.Tree)
class TreeAdmin(ReadOnlyAdmin):
    list_display = ("digest", "file_count", "total_size", "created_at")
    search_fields = ("digest",)
    inlines = (TreeEntryInline,)


@admin.register(models.TreeEntry)
class TreeEntryAdmin(ReadOnlyAdmin):
    list_display = ("tree", "path", "mode", "blob")
    search_fields = ("path", "tree__digest")


@admin.register(models.Benchmark)
class BenchmarkAdmin(admin.ModelAdmin[models.Benchmark]):
    list_display = ("name", "title", "created_at")
    search_fields = ("name", "title")


@admin.register(models.Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("external_id", "benchmark")
    list_filter = ("benchmark",)
    search_fields = ("external_id", "instruction")
    # Expected answers are private to the evaluator; the admin never shows them.
    exclude = ("expected",)


@admin.register(models.Evaluator)
class EvaluatorAdmin(ReadOnlyAdmin):
    list_display = ("name", "files", "timeout_seconds", "created_at")


@admin.register(models.Surface)
class SurfaceAdmin(ReadOnlyAdmin):
    list_display = ("name", "digest", "created_at")


@admin.register(models.Recipe)
class RecipeAdmin(ReadOnlyAdmin):
    list_display = ("name", "version", "digest", "created_at")


class SplitMembershipInline(ReadOnlyInline, admin.TabularInline[models.SplitMembership, models.Experiment]):
    model = models.SplitMembership
    fields = ("task", "split")
    readonly_fields = fields


class RunStartAdminForm(forms.Form):
    """The admin's start action: a recipe (a preset or the experiment's own),
    the rounds and the proposer, for every selected experiment."""

    recipe = forms.ChoiceField(label="recipe")
    rounds = forms.IntegerField(
        required=False, min_value=1, max_value=500, label="rounds", help_text="blank: the recipe's own"
    )
    proposer = forms.ChoiceField(required=False, label="proposer")
    start_from = forms.IntegerField(
        required=False,
        min_value=1,
        label="start from candidate",
        help_text="blank: the experiment's best accepted candidate (the seed before any)",
    )

    def __init__(self, *args: Any, experiments: list[models.Experiment], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [(name, f"preset: {name}") for name in PRESET_NAMES]
        if any(experiment.recipe_id for experiment in experiments):
            choices.insert(0, (OWN_RECIPE, "the experiment's own recipe"))
        recipe_field = self.fields["recipe"]
        assert isinstance(recipe_field, forms.ChoiceField)
        recipe_field.choices = choices
        recipe_field.initial = choices[0][0]
        proposers = sorted(operators.known_operators().get("proposal", set()))
        # The preset's own proposer may not be installed here (the llm one needs an endpoint).
        proposer_field = self.fields["proposer"]
        assert isinstance(proposer_field, forms.ChoiceField)
        proposer_field.choices = [
            ("", "the last run's, else the recipe's own"),
            *((name, name) for name in proposers),
        ]


@admin.register(models.ModelEndpoint)
class ModelEndpointAdmin(admin.ModelAdmin[models.ModelEndpoint]):
    """Editable: a team sets its provider's limit here (docs/deployment.md)."""

    list_display = ("name", "max_in_flight")
    search_fields = ("name",)


@admin.register(models.Experiment)
class ExperimentAdmin(admin.ModelAdmin[models.Experiment]):
    list_display = ("name", "benchmark", "status", "trials_per_task", "chain_length", "created_at")
    list_filter = ("status",)
    search_fields = ("name",)
    # The trial limits are scheduling, not results: editable at any time.
    fields = ("name", "description", "status", "max_trials_in_flight", "endpoint")
    readonly_fields = ("status",)

    actions = ("start_run",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Experiments are created by services (splits, seed, digests), not by a bare form.
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return _can_operate(request)

    @admin.action(description="Start a run (choose the recipe and rounds)", permissions=["operate"])
    def start_run(self, request: HttpRequest, queryset: QuerySet[models.Experiment]) -> TemplateResponse | None:
        """First a page to choose the recipe, rounds and proposer; its submit
        (``start``) starts one run per selected experiment. A refusal is a
        message per experiment; an invalid form shows the page again and
        starts nothing."""
        experiments = list(queryset.select_related("recipe").order_by("pk"))
        form = RunStartAdminForm(request.POST if "start" in request.POST else None, experiments=experiments)
        if form.is_bound and form.is_valid():
            for experiment in experiments:
                self._start_one(request, experiment, form.cleaned_data)
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Start a run",
            "opts": self.model._meta,
            "experiments": experiments,
            "form": form,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/evolution/experiment/start_run.html", context)

    def _start_one(self, request: HttpRequest, experiment: models.Experiment, data: dict[str, Any]) -> None:
        proposer = data["proposer"] or None
        if proposer is None:
            # Keep the proposer that worked last time, whichever recipe is chosen.
            latest = experiment.runs.select_related("recipe").order_by("-pk").first()
            proposer = latest.recipe.spec.get("proposal", {}).get("operator") if latest else None
        try:
            run = lifecycle.run_start(
                experiment=experiment,
                recipe=data["recipe"],
                rounds=data["rounds"],
                proposer=proposer,
                start=data.get("start_from"),
                user=request.user,
            )
        except lifecycle.LoopError as exc:
            self.message_user(request, f"{experiment.name}: no run started: {exc}", messages.ERROR)
            return
        spec = run.recipe.spec
        self.message_user(
            request,
            f"{experiment.name}: run {run.pk} started ({run.recipe.name}, {run.rounds} round(s), "
            f"proposer {spec['proposal']['operator']}, from candidate {run.start_candidate_id})",
            messages.SUCCESS,
        )


@admin.register(models.SplitMembership)
class SplitMembershipAdmin(ReadOnlyAdmin):
    list_display = ("experiment", "task", "split")
    list_filter = ("split", "experiment")


def _can_operate(request: HttpRequest) -> bool:
    return request.user.has_perm("evolution.operate_runs")


@admin.register(models.Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("pk", "experiment", "recipe", "status", "round_shown", "rounds", "created_at")
    list_filter = ("status",)
    actions = ("pause_runs", "resume_runs", "cancel_runs")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return _can_operate(request)

    def _apply(self, request: HttpRequest, queryset: QuerySet[models.Run], verb: str, service: Any) -> None:
        done: list[models.Run] = []
        refused: list[models.Run] = []
        for run in queryset.order_by("pk"):
            (done if service(run=run) else refused).append(run)
        if done:
            self.message_user(
                request, f"{verb.capitalize()}: " + ", ".join(f"run {r.pk}" for r in done), messages.SUCCESS
            )
        if refused:
            self.message_user(
                request,
                f"Not {verb}: " + ", ".join(f"run {r.pk} ({r.status})" for r in refused),
                messages.ERROR,
            )

    @admin.action(description="Pause the selected runs", permissions=["operate"])
    def pause_runs(self, request: HttpRequest, queryset: QuerySet[models.Run]) -> None:
        self._apply(request, queryset, "paused", lifecycle.run_pause)

    @admin.action(description="Resume the selected runs", permissions=["operate"])
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[models.Run]) -> None:
        self._apply(request, queryset, "resumed", lifecycle.run_resume)

    @admin.action(description="Cancel the selected runs", permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[models.Run]) -> None:
        reason = f"cancelled by {request.user.get_username()} in the admin"
        self._apply(request, queryset, "cancelled", lambda run: lifecycle.run_cancel(run=run, reason=reason))


class AtomicEditInline(ReadOnlyInline, admin.StackedInline[models.AtomicEdit, models.Candidate]):
    model = models.AtomicEdit
    fields = ("index", "component", "hypothesis", "paths", "diff")
    readonly_fields = fields


@admin.register(models.Candidate)
class CandidateAdmin(ReadOnlyAdmin):
    list_display = ("pk", "experiment", "origin", "state", "round", "tree", "created_at")
    list_filter = ("state", "origin", "experiment")
    search_fields = ("tree__digest", "label")
    inlines = (AtomicEditInline,)


@admin.register(models.AtomicEdit)
class AtomicEditAdmin(ReadOnlyAdmin):
    list_display = ("candidate", "index", "component", "hypothesis")
    list_filter = ("component",)


@admin.register(models.Evaluation)
class EvaluationAdmin(ReadOnlyAdmin):
    list_display = ("pk", "experiment", "candidate", "purpose", "state", "trials_finished", "trials_total")
    list_filter = ("state", "purpose")


@admin.register(models.EvaluationSplitStats)
class EvaluationSplitStatsAdmin(ReadOnlyAdmin):
    list_display = ("pk", "evaluation", "candidate", "split", "trials", "passed", "errors", "score_sum")
    list_filter = ("split",)


@admin.register(models.Trial)
class TrialAdmin(ReadOnlyAdmin):
    list_display = ("pk", "candidate", "task", "split", "index", "state", "outcome", "score", "tokens", "error_kind")
    list_filter = ("state", "outcome", "split", "error_kind")
    list_select_related = ("candidate", "task__benchmark")


@admin.register(models.Trajectory)
class TrajectoryAdmin(ReadOnlyAdmin):
    list_display = ("trial", "schema_version", "step_count", "redacted")


@admin.register(models.TrajectoryStep)
class TrajectoryStepAdmin(ReadOnlyAdmin):
    list_display = ("trajectory", "step_id", "source", "timestamp")


@admin.register(models.CertifiedResult)
class CertifiedResultAdmin(ReadOnlyAdmin):
    list_display = ("experiment", "seq", "candidate", "record_digest", "created_at")
    list_filter = ("experiment",)
    search_fields = ("record_digest",)
    exclude = ("payload",)
    readonly_fields = ("canonical_payload",)

    @admin.display(description="payload (the canonical JSON that is hashed)")
    def canonical_payload(self, obj: models.CertifiedResult) -> str:
        return models.CertifiedResult._meta.get_field("payload").value_to_string(obj)


@admin.register(models.CertifiedDecision)
class CertifiedDecisionAdmin(ReadOnlyAdmin):
    list_display = ("experiment", "seq", "kind", "candidate", "record_digest", "created_at")
    list_filter = ("experiment", "kind")
    search_fields = ("record_digest",)
    exclude = ("payload",)
    readonly_fields = ("canonical_payload",)

    @admin.display(description="payload (the canonical JSON that is hashed)")
    def canonical_payload(self, obj: models.CertifiedDecision) -> str:
        return models.CertifiedDecision._meta.get_field("payload").value_to_string(obj)


@admin.register(models.GateDecision)
class GateDecisionAdmin(ReadOnlyAdmin):
    list_display = ("run", "round", "candidate", "accepted", "chosen", "rule")


@admin.register(models.LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    list_display = ("run", "round", "component", "delta_score", "delta_cost", "accepted", "admissible")
    list_filter = ("component", "accepted", "admissible")


@admin.register(models.ParityCheck)
class ParityCheckAdmin(ReadOnlyAdmin):
    list_display = ("evaluator", "experiment", "candidate", "iterations", "verdict", "created_at")
    list_filter = ("verdict",)


@admin.register(models.LeakageFlag)
class LeakageFlagAdmin(ReadOnlyAdmin):
    list_display = ("candidate", "rule", "path", "matched")
    list_filter = ("rule",)


@admin.register(models.ReviewItem)
class ReviewItemAdmin(ReadOnlyAdmin):
    list_display = ("candidate", "state", "claimed_by", "created_at")
    list_filter = ("state",)


@admin.register(models.ReviewDecision)
class ReviewDecisionAdmin(ReadOnlyAdmin):
    list_display = ("item", "reviewer", "verdict", "created_at")


@admin.register(models.ReviewPending)
class ReviewPendingAdmin(ReadOnlyAdmin):
    list_display = ("item", "reviewer", "verdict", "effective_at", "error", "created_at")


@admin.register(models.ReviewCorrection)
class ReviewCorrectionAdmin(ReadOnlyAdmin):
    list_display = ("item", "reviewer", "verdict", "corrects", "record", "created_at")


@admin.register(models.AnnotationLabel)
class AnnotationLabelAdmin(admin.ModelAdmin[models.AnnotationLabel]):
    list_display = ("slug", "name", "experiment")


class AnnotationScoreInline(admin.TabularInline[models.AnnotationScore, models.Annotation]):
    model = models.AnnotationScore
    extra = 0


@admin.register(models.Annotation)
class AnnotationAdmin(admin.ModelAdmin[models.Annotation]):
    list_display = ("trial", "author", "label", "created_at")
    list_filter = ("label",)
    inlines = (AnnotationScoreInline,)


@admin.register(models.AnnotationScoreConfig)
class AnnotationScoreConfigAdmin(admin.ModelAdmin[models.AnnotationScoreConfig]):
    list_display = ("name", "slug", "kind", "minimum", "maximum", "experiment")
    list_filter = ("kind",)


@admin.register(models.AnnotationScore)
class AnnotationScoreAdmin(admin.ModelAdmin[models.AnnotationScore]):
    list_display = ("annotation", "config", "value")


@admin.register(models.RecipeComparison)
class RecipeComparisonAdmin(ReadOnlyAdmin):
    list_display = ("pk", "experiment", "status", "command", "created_at", "finished_at")
    list_filter = ("status",)
