"""Django admin for every evolution model.

Protected data (certified records, content-addressed storage, trial results
and trajectories, split memberships, the ledger) is read-only here: it
changes only through services that keep its digests and chains consistent.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from evolution import models
from evolution.recipes import RecipeError, load_preset
from evolution.services import loop


class ReadOnlyAdmin(admin.ModelAdmin):
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


class ReadOnlyInline(admin.options.InlineModelAdmin):
    """An inline that shows rows and never adds, changes or deletes them."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class TreeEntryInline(ReadOnlyInline, admin.TabularInline):
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
class BenchmarkAdmin(admin.ModelAdmin):
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


class SplitMembershipInline(ReadOnlyInline, admin.TabularInline):
    model = models.SplitMembership
    fields = ("task", "split")
    readonly_fields = fields


@admin.register(models.Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("name", "benchmark", "status", "trials_per_task", "chain_length", "created_at")
    list_filter = ("status",)
    search_fields = ("name",)
    fields = ("name", "description", "status")
    readonly_fields = ("status",)

    actions = ("start_rrsi_run",)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Experiments are created by services (splits, seed, digests), not by a bare form.
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return _can_operate(request)

    @admin.action(description="Start a run with the rrsi preset", permissions=["operate"])
    def start_rrsi_run(self, request: HttpRequest, queryset: QuerySet[models.Experiment]) -> None:
        for experiment in queryset.order_by("pk"):
            # The preset's own proposer may not be installed here: keep the one the last run used.
            latest = experiment.runs.select_related("recipe").order_by("-pk").first()
            proposer = latest.recipe.spec.get("proposal", {}).get("operator") if latest else None
            try:
                run = loop.run_create(
                    experiment=experiment, recipe=load_preset("rrsi"), proposer=proposer, user=request.user
                )
            except (RecipeError, loop.LoopError) as exc:
                self.message_user(request, f"{experiment.name}: no run started: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"{experiment.name}: run {run.pk} started (rrsi)", messages.SUCCESS)


@admin.register(models.SplitMembership)
class SplitMembershipAdmin(ReadOnlyAdmin):
    list_display = ("experiment", "task", "split")
    list_filter = ("split", "experiment")


def _can_operate(request: HttpRequest) -> bool:
    return request.user.has_perm("evolution.operate_runs")


@admin.register(models.Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ("pk", "experiment", "recipe", "status", "current_round", "rounds", "created_at")
    list_filter = ("status",)
    actions = ("pause_runs", "resume_runs", "cancel_runs")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return _can_operate(request)

    def _apply(self, request: HttpRequest, queryset: QuerySet[models.Run], verb: str, service: Any) -> None:
        done, refused = [], []
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
        self._apply(request, queryset, "paused", loop.run_pause)

    @admin.action(description="Resume the selected runs", permissions=["operate"])
    def resume_runs(self, request: HttpRequest, queryset: QuerySet[models.Run]) -> None:
        self._apply(request, queryset, "resumed", loop.run_resume)

    @admin.action(description="Cancel the selected runs", permissions=["operate"])
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[models.Run]) -> None:
        reason = f"cancelled by {request.user.get_username()} in the admin"
        self._apply(request, queryset, "cancelled", lambda run: loop.run_cancel(run=run, reason=reason))


class AtomicEditInline(ReadOnlyInline, admin.StackedInline):
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
    list_display = ("run", "round", "component", "delta_score", "delta_cost", "accepted")
    list_filter = ("component", "accepted")


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


@admin.register(models.AnnotationLabel)
class AnnotationLabelAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "experiment")


@admin.register(models.Annotation)
class AnnotationAdmin(admin.ModelAdmin):
    list_display = ("trial", "author", "label", "created_at")
    list_filter = ("label",)
