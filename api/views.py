"""The /api/v1/ endpoints: parse, call an ``evolution`` service, render.

Reads have the screens' rules: every role reads, per-task sealed rows
(trials, trajectories, sealed rows of a record's payload, the task behind a
flag) only with ``view_sealed_details`` — the querysets start from
``evolution.access.hide_sealed`` so lists, filters and detail (404) agree.
Writes need the screens' permissions and go through the same services as
the screens; each service writes in one transaction, so a refused request
leaves nothing behind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django.db.models import QuerySet
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.generics import get_object_or_404  # DRF's: an id "abc" is a 404, not a ValueError (500)
from rest_framework.request import Request
from rest_framework.response import Response

from api import filters
from api import serializers as out
from api.pagination import Cursor
from api.permissions import requires
from evolution import access
from evolution.flags import flag_task_visible, with_task_access
from evolution.loop import late, lifecycle
from evolution.loop import review as loop_review
from evolution.loop.compare import comparisons_reap
from evolution.models import (
    Annotation,
    Benchmark,
    Candidate,
    CertifiedResult,
    Experiment,
    LeakageFlag,
    LedgerEntry,
    RecipeComparison,
    ReviewDecision,
    ReviewItem,
    Run,
    Task,
    Trajectory,
    TreeEntry,
    Trial,
)
from evolution.services import annotations as annotation_services
from evolution.services import review as review_services
from evolution.services.snapshots import tree_diff

ERROR = OpenApiResponse(OpenApiTypes.OBJECT, description="field-level messages, or {'detail': ...}")
TEXT = {(200, "text/plain"): OpenApiTypes.STR}


if TYPE_CHECKING:  # what the mixin is mixed into, for the type checker
    _ViewSet = viewsets.GenericViewSet
else:
    _ViewSet = object


class FilteredMixin(_ViewSet):
    """Lists validate their query string with ``filter_class`` (400 naming the parameter)."""

    filter_class: type[filters.Filter] | None = None

    def filter_queryset(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.filter_class is None or self.action != "list":
            return queryset
        query = self.filter_class(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return query.apply(queryset)


def _list(filter_class: type[filters.Filter]) -> Any:
    return extend_schema(parameters=[filter_class])


# --- Benchmarks and tasks ---------------------------------------------------------


class BenchmarkViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Benchmark.objects.all()
    serializer_class = out.BenchmarkSerializer


@extend_schema_view(list=_list(filters.TaskFilter))
class TaskViewSet(FilteredMixin, viewsets.ReadOnlyModelViewSet):
    """Tasks with their instruction, metadata and criteria ids; never their expected answer."""

    queryset = Task.objects.all()
    serializer_class = out.TaskSerializer
    filter_class = filters.TaskFilter

    def get_queryset(self) -> QuerySet[Task]:
        # A task sealed in any experiment is sealed data: its instruction and
        # metadata are withheld (not found) without the permission.
        return access.hide_sealed_tasks(super().get_queryset(), self.request.user)


# --- Experiments and runs ---------------------------------------------------------


class ExperimentViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = Experiment.objects.select_related("benchmark", "evaluator", "surface", "recipe")

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return out.ExperimentDetailSerializer if self.action == "retrieve" else out.ExperimentSerializer


class RecipeComparisonViewSet(viewsets.ReadOnlyModelViewSet):
    """Recipe comparisons (``compare_recipes``): how each was asked for and its JSON result."""

    queryset = RecipeComparison.objects.order_by("-pk")
    serializer_class = out.RecipeComparisonSerializer

    def get_queryset(self) -> QuerySet[RecipeComparison]:
        comparisons_reap()  # a comparison whose command stopped shows as interrupted, not running for ever
        return super().get_queryset()


def _run_state_error(run: Run, done: str) -> Response:
    run.refresh_from_db(fields=["status"])
    return Response({"detail": f"run {run.pk} was not {done}: it is {run.status}"}, status=status.HTTP_409_CONFLICT)


@extend_schema_view(list=_list(filters.RunFilter))
class RunViewSet(FilteredMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Runs; starting, pausing, resuming and cancelling need the operator permission."""

    queryset = Run.objects.select_related("recipe", "started_by")
    permission_classes = (requires(access.OPERATE),)
    filter_class = filters.RunFilter

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return out.RunSerializer if self.action == "list" else out.RunDetailSerializer

    @extend_schema(request=out.RunStartSerializer, responses={201: out.RunDetailSerializer, 400: ERROR})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Start a run of a preset recipe (or ``run-<id>``: an earlier run's; ``own``: the experiment's) with
        overrides, through ``lifecycle.run_start``; a refusal is a 400 with its ``detail``."""
        form = out.RunStartSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        try:
            run = lifecycle.run_start(
                experiment=data["experiment"],
                recipe=data["recipe"],
                rounds=data.get("rounds"),
                k=data.get("k"),
                candidates_per_round=data.get("candidates_per_round"),
                proposer=data.get("proposer") or None,
                start=data.get("start_candidate"),
                user=request.user,
            )
        except lifecycle.LoopError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        return Response(out.RunDetailSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: out.RunDetailSerializer, 409: ERROR})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        if not lifecycle.run_pause(run=run):
            return _run_state_error(run, "paused")
        return Response(out.RunDetailSerializer(self.get_object()).data)

    @extend_schema(request=None, responses={200: out.RunDetailSerializer, 409: ERROR})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        if not lifecycle.run_resume(run=run):
            return _run_state_error(run, "resumed")
        return Response(out.RunDetailSerializer(self.get_object()).data)

    @extend_schema(request=None, responses={200: out.RunDetailSerializer, 409: ERROR})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        if not lifecycle.run_cancel(run=run, reason=f"cancelled by {request.user.get_username()} (API)"):
            return _run_state_error(run, "cancelled")
        return Response(out.RunDetailSerializer(self.get_object()).data)


# --- Candidates -------------------------------------------------------------------


def _text(body: str | bytes) -> HttpResponse:
    response = HttpResponse(body, content_type="text/plain; charset=utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@extend_schema_view(list=_list(filters.CandidateFilter))
class CandidateViewSet(FilteredMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Candidate.objects.all()
    filter_class = filters.CandidateFilter

    def get_queryset(self) -> QuerySet[Candidate]:
        if self.action == "retrieve":
            return Candidate.objects.select_related("tree").prefetch_related("edits", "gate_decisions")
        return Candidate.objects.all()

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        if self.action == "tree":
            return out.TreeEntrySerializer
        return out.CandidateDetailSerializer if self.action == "retrieve" else out.CandidateSerializer

    @extend_schema(
        request=out.CandidateEvaluateSerializer, responses={202: out.CandidateEvaluateResultSerializer, 409: ERROR}
    )
    @action(detail=True, methods=["post"], permission_classes=[requires(access.OPERATE)])
    def evaluate(self, request: Request, pk: str) -> Response:
        """Evaluate the candidate on the gate's splits (``scope`` gate) or on every split (all): an approved
        candidate left behind by its run is evaluated and gated; a decided one is measured where it has no
        trials yet. 409 with the reason when it cannot be (it waits for a reviewer, nothing is missing...)."""
        candidate = get_object_or_404(Candidate, pk=pk)
        form = out.CandidateEvaluateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            outcome = late.candidate_evaluate_late(candidate_id=candidate.pk, scope=form.validated_data["scope"])
        except late.LateError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        body = {
            "detail": outcome.message,
            "run": outcome.run_id,
            "joined": outcome.joined,
            "evaluations": outcome.evaluations,
        }
        return Response(out.CandidateEvaluateResultSerializer(body).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(parameters=[filters.DiffQuery], responses={**TEXT, 400: ERROR})
    @action(detail=True, methods=["get"])
    def diff(self, request: Request, pk: str) -> HttpResponse:
        """Unified (git-style) diff from the parent, or from ``?against=<candidate id>``."""
        candidate = get_object_or_404(Candidate.objects.select_related("tree", "parent__tree"), pk=pk)
        query = filters.DiffQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        against_id = query.validated_data.get("against")
        if against_id is None:
            old = candidate.parent.tree if candidate.parent is not None else None
        else:
            other = Candidate.objects.select_related("tree").filter(pk=against_id).first()
            if other is None:
                raise ValidationError({"against": [f"no candidate {against_id}"]})
            old = other.tree
        return _text(tree_diff(old=old, new=candidate.tree))

    @extend_schema(responses=out.TreeEntrySerializer(many=True))
    @action(detail=True, methods=["get"])
    def tree(self, request: Request, pk: str) -> Response:
        """The candidate's files: path, mode, size and blob digest (paginated)."""
        candidate = get_object_or_404(Candidate, pk=pk)
        entries = TreeEntry.objects.filter(tree_id=candidate.tree_id).select_related("blob").defer("blob__content")
        page = self.paginate_queryset(entries)
        return self.get_paginated_response(out.TreeEntrySerializer(page, many=True).data)

    @extend_schema(
        parameters=[OpenApiParameter("path", OpenApiTypes.STR, OpenApiParameter.PATH, description="file path")],
        responses=TEXT,
    )
    # Routed in api/v1.py: a router would append a slash to the file's path.
    def files(self, request: Request, pk: str, path: str) -> HttpResponse:
        """One file of the candidate, as stored (never interpreted)."""
        candidate = get_object_or_404(Candidate, pk=pk)
        entry = TreeEntry.objects.filter(tree_id=candidate.tree_id, path=path).select_related("blob").first()
        if entry is None:
            raise NotFound("no such file in this candidate")
        return _text(bytes(entry.blob.content))


# --- Certified results ------------------------------------------------------------


@extend_schema_view(list=_list(filters.ResultFilter))
class CertifiedResultViewSet(FilteredMixin, viewsets.ReadOnlyModelViewSet):
    """Certified records; a record's sealed per-task rows need the sealed permission."""

    queryset = CertifiedResult.objects.all()
    filter_class = filters.ResultFilter

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        return out.CertifiedResultDetailSerializer if self.action == "retrieve" else out.CertifiedResultSerializer

    def get_serializer_context(self) -> dict[str, Any]:
        sealed = access.can_see_sealed(self.request.user)
        names: dict[int, frozenset[str]] = {}  # per experiment: its tasks sealed anywhere

        def shown(record: CertifiedResult) -> tuple[dict[str, Any], int]:
            if not sealed and record.experiment_id not in names:
                names[record.experiment_id] = access.sealed_task_names(record.experiment_id)
            return access.record_payload_visible(
                record.payload, sealed=sealed, sealed_tasks=names.get(record.experiment_id)
            )

        return {**super().get_serializer_context(), "visible_payload": shown}


# --- Trials and trajectories ------------------------------------------------------


class StepPage(Cursor):
    ordering = "step_id"


class TrajectoryPageSerializer(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    trajectory = out.TrajectorySerializer()
    results = out.TrajectoryStepSerializer(many=True)


class TrialListFilter(filters.TrialFilter):
    external = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="true: only results ingested from outside; false: only trials rsiweb ran",
    )
    lookups: ClassVar[dict[str, str]] = {**filters.TrialFilter.lookups, "external": "evaluation__external"}


@extend_schema_view(list=_list(TrialListFilter))
class TrialViewSet(FilteredMixin, viewsets.ReadOnlyModelViewSet):
    """Trials; sealed trials only with the sealed permission (else absent, and 404).
    ``external`` marks results ingested from outside, which rsiweb neither ran nor certified."""

    serializer_class = out.TrialSerializer
    filter_class = TrialListFilter

    def get_queryset(self) -> QuerySet[Trial]:
        trials = Trial.objects.select_related("task", "candidate", "trajectory", "evaluation")
        return access.hide_sealed(trials, self.request.user)

    @extend_schema(
        parameters=[
            OpenApiParameter("cursor", OpenApiTypes.STR, description="page cursor"),
            OpenApiParameter("page_size", OpenApiTypes.INT, description="steps per page (at most 500)"),
        ],
        responses=TrajectoryPageSerializer,
    )
    @action(detail=True, methods=["get"])
    def trajectory(self, request: Request, pk: str) -> Response:
        """The trial's trajectory and a page of its steps."""
        trial = self.get_object()
        found = Trajectory.objects.filter(trial=trial).first()
        if found is None:
            raise NotFound("this trial has no trajectory")
        paginator = StepPage()
        steps = paginator.paginate_queryset(found.steps.all(), request, view=self)
        return Response(
            {
                "next": paginator.get_next_link(),
                "previous": paginator.get_previous_link(),
                "trajectory": out.TrajectorySerializer(found).data,
                "results": out.TrajectoryStepSerializer(steps, many=True).data,
            }
        )


# --- Ledger, flags, review --------------------------------------------------------


@extend_schema_view(list=_list(filters.LedgerFilter))
class LedgerViewSet(FilteredMixin, viewsets.ReadOnlyModelViewSet):
    queryset = LedgerEntry.objects.all()
    serializer_class = out.LedgerEntrySerializer
    filter_class = filters.LedgerFilter


@extend_schema_view(list=_list(filters.FlagFilter))
class LeakageFlagViewSet(FilteredMixin, viewsets.ReadOnlyModelViewSet):
    """Leakage flags; the task behind a flag (and the critic's evidence) only if it may be seen."""

    serializer_class = out.LeakageFlagSerializer
    filter_class = filters.FlagFilter

    def get_queryset(self) -> QuerySet[LeakageFlag]:
        return with_task_access(LeakageFlag.objects.all())

    def get_serializer_context(self) -> dict[str, Any]:
        user = self.request.user
        return {**super().get_serializer_context(), "flag_visible": lambda flag: flag_task_visible(flag, user)}


def _review_field(message: str) -> str:
    lowered = message.lower()
    if "reason" in lowered:
        return "reason"
    if "edit" in lowered:
        return "rejected_edits"
    return "non_field_errors"


@extend_schema_view(list=_list(filters.ReviewDecisionFilter))
class ReviewDecisionViewSet(FilteredMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Review decisions; deciding needs the reviewer permission."""

    queryset = ReviewDecision.objects.select_related("item", "reviewer").prefetch_related("rejected_edits")
    serializer_class = out.ReviewDecisionSerializer
    permission_classes = (requires(access.REVIEW),)
    filter_class = filters.ReviewDecisionFilter

    @extend_schema(
        request=out.ReviewDecideSerializer, responses={201: out.ReviewDecisionSerializer, 400: ERROR, 409: ERROR}
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Decide a flagged candidate (``reject_edits``: reject the listed edits, keep the rest)."""
        form = out.ReviewDecideSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        item = ReviewItem.objects.filter(candidate_id=data["candidate"]).first()
        if item is None:
            raise ValidationError({"candidate": [f"candidate {data['candidate']} is not in the review queue"]})
        verdict = data["verdict"]
        try:
            if verdict == ReviewDecision.Verdict.REJECT_EDITS:
                decision = loop_review.review_decide_partial(
                    item=item, user=request.user, rejected_edits=data["rejected_edits"], reason=data["reason"]
                )
            else:
                decision = loop_review.review_decide(
                    item=item,
                    user=request.user,
                    approve=verdict == ReviewDecision.Verdict.APPROVE,
                    reason=data["reason"],
                )
        except review_services.ReviewConflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except review_services.ReviewError as exc:
            raise ValidationError({_review_field(str(exc)): [str(exc)]}) from exc
        return Response(out.ReviewDecisionSerializer(decision).data, status=status.HTTP_201_CREATED)


# --- Annotations ------------------------------------------------------------------


def _annotation_field(message: str) -> str:
    lowered = message.lower()
    if "score" in lowered:
        return "scores"
    for field in ("label", "step", "note"):
        if field in lowered:
            return field
    return "trial"


@extend_schema_view(list=_list(filters.AnnotationFilter))
class AnnotationViewSet(FilteredMixin, viewsets.ModelViewSet):
    """Failure annotations; writing needs the annotator permission, and only
    one's own annotations can be changed or deleted."""

    serializer_class = out.AnnotationSerializer
    permission_classes = (requires(access.ANNOTATE),)
    filter_class = filters.AnnotationFilter

    def get_queryset(self) -> QuerySet[Annotation]:
        annotations = Annotation.objects.select_related("author", "label", "step").prefetch_related("scores__config")
        return access.hide_sealed(annotations, self.request.user, split_field="trial__split")

    @extend_schema(request=out.AnnotationWriteSerializer, responses={201: out.AnnotationSerializer, 400: ERROR})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        form = out.AnnotationWriteSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        if "trial" not in data:
            raise ValidationError({"trial": ["This field is required."]})
        trial = access.hide_sealed(Trial.objects.all(), request.user).filter(pk=data["trial"]).first()
        if trial is None:
            raise ValidationError({"trial": [f"no trial {data['trial']}"]})
        try:
            annotation = annotation_services.annotation_create(
                trial=trial,
                author=request.user,
                label=data["label"],
                note=data["note"],
                step=data["step"],
                scores=data["scores"],
            )
        except annotation_services.AnnotationError as exc:
            raise ValidationError({_annotation_field(str(exc)): [str(exc)]}) from exc
        return Response(out.AnnotationSerializer(annotation).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=out.AnnotationWriteSerializer, responses={200: out.AnnotationSerializer, 400: ERROR})
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        annotation = self.get_object()
        partial = kwargs.get("partial", False)
        form = out.AnnotationWriteSerializer(data=request.data, partial=partial)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        current_step = annotation.step.step_id if annotation.step_id else None
        try:
            updated = annotation_services.annotation_update(
                annotation=annotation,
                author=request.user,
                label=data.get("label", annotation.label_id),
                note=data.get("note", annotation.note) if partial else data["note"],
                step=data.get("step", current_step) if partial else data["step"],
                scores=data.get("scores", {}),
            )
        except annotation_services.AnnotationNotYours as exc:
            raise PermissionDenied(str(exc)) from exc
        except annotation_services.AnnotationError as exc:
            raise ValidationError({_annotation_field(str(exc)): [str(exc)]}) from exc
        return Response(out.AnnotationSerializer(updated).data)

    @extend_schema(request=out.AnnotationWriteSerializer, responses={200: out.AnnotationSerializer, 400: ERROR})
    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.update(request, *args, partial=True, **kwargs)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        annotation = self.get_object()
        try:
            annotation_services.annotation_delete(annotation=annotation, author=request.user)
        except annotation_services.AnnotationNotYours as exc:
            raise PermissionDenied(str(exc)) from exc
        return Response(status=status.HTTP_204_NO_CONTENT)
