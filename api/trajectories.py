"""Import trajectories: POST /api/v1/trials/<pk>/trajectory/ for one trial,
POST /api/v1/trajectories/ for a batch.

One: ``{"format": "auto" | one of ``FORMATS``, "document": ...,
"files": {name: document, ...}, "lenient": false}``: ``files`` holds the
trajectory's other files by name (ATIF continuations named by
``continued_trajectory_ref``, subagent trajectories named by a step's
``subagent_trajectory_ref``); ``lenient`` keeps off-spec steps' text and
records each deviation. A document that is a list of trajectories is a 400
naming the count and pointing to the batch endpoint.
A batch: ``{"trajectories": [{"trial": <pk>, "format": ..., "document": ...}, ...]}``,
up to ``BATCH_MAX`` of them, all or nothing: one invalid item (its position
names it) and nothing is written. Each document is validated, converted to
ATIF, redacted and stored in place of its trial's trajectory
(evolution.services.trajectories); a batch in one transaction, which spares
each file a request, a commit and its own inserts. Staff or the operator
permission may import; sealed trials are 404 without the sealed
permission, as on the screens (in a batch: "no trial", the same words as
for one that does not exist).
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.generics import get_object_or_404
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import parsers
from api.permissions import CanView
from evolution import access, limits
from evolution.models import Trial
from evolution.services.trajectories import (
    TrajectoryBatchError,
    TrajectoryFormatError,
    TrajectoryListError,
    trajectories_import,
    trajectory_import,
)
from evolution.trajectory_formats import FORMATS


class CanImportTrajectories(BasePermission):
    """Viewer, and staff or the operator permission."""

    message = f"you need the {access.OPERATE} permission (or staff) to import trajectories"

    def has_permission(self, request: Any, view: Any) -> bool:
        if not CanView().has_permission(request, view):
            return False
        return bool(request.user.is_staff or request.user.has_perm(access.OPERATE))


class ParsedJSONField(serializers.JSONField):
    """A JSON value the request's parser has already built, taken as it is.

    DRF's JSONField serializes the value once more to check it can be:
    0.7 ms of a 70 KB trajectory. What that dump refused, a number out of
    range, ``api.parsers.LimitedJSONParser`` refuses as it reads. A form
    field's JSON text is parsed here, with the same checks and limits.
    """

    def to_internal_value(self, data: Any) -> Any:
        if getattr(data, "is_json_string", False):
            try:
                return parsers.loads(data, what="the document")
            except limits.InputLimitError as exc:
                raise ValidationError([str(exc)]) from exc
            except ValueError:
                self.fail("invalid")
        return data


class TrajectoryImportInput(serializers.Serializer):
    format = serializers.ChoiceField(choices=("auto", *FORMATS), default="auto", required=False)
    document = ParsedJSONField(
        help_text="an ATIF v1.0-v1.7 trajectory, a mini-swe-agent 1.x/2.x trajectory file or message list, "
        "a SWE-agent 0.x/1.x .traj, an OpenHands event list or evaluation instance (one line of output.jsonl), "
        "one tau2-bench simulation, a Claude Code or Codex CLI session (its lines as a list), OpenAI Responses "
        "API items or one NeMo Gym rollout, an OpenAI chat message list, or a tau-bench run"
    )
    files = serializers.DictField(
        child=ParsedJSONField(),
        required=False,
        default=dict,
        help_text="the trajectory's other files by name: ATIF continuations and subagent trajectories",
    )
    lenient = serializers.BooleanField(
        required=False, default=False, help_text="keep off-spec steps' text and record each deviation"
    )


class TrajectoryImportOutput(serializers.Serializer):
    trial = serializers.IntegerField()
    format = serializers.CharField()
    step_count = serializers.IntegerField()
    redacted = serializers.BooleanField()
    redactions = serializers.DictField(child=serializers.IntegerField(), help_text="secrets removed, by kind")
    deviations = serializers.ListField(child=serializers.CharField(), help_text="off-spec points kept (lenient)")
    continuation_files = serializers.ListField(child=serializers.CharField(), help_text="continuations joined")
    subagent_trajectories = serializers.IntegerField(help_text="subagent trajectories linked")


def _summary(trajectory: Any) -> dict[str, Any]:
    return {
        "trial": trajectory.trial_id,
        "format": trajectory.extra.get("imported_format", ""),
        "step_count": trajectory.step_count,
        "redacted": trajectory.redacted,
        "redactions": trajectory.extra.get("redactions", {}),
        "deviations": trajectory.extra.get("deviations", []),
        "continuation_files": trajectory.extra.get("continuation_files", []),
        "subagent_trajectories": len(trajectory.extra.get("subagent_trajectories", [])),
    }


class TrajectoryImportView(APIView):
    permission_classes = [CanImportTrajectories]

    @extend_schema(
        request=TrajectoryImportInput,
        responses={201: TrajectoryImportOutput},
        summary="Import a trajectory into a trial, replacing its trajectory (secrets are redacted)",
    )
    def post(self, request: Request, pk: str) -> Response:
        # DRF's get_object_or_404: an id that is not a number is a 404, not a 500.
        trial = get_object_or_404(access.hide_sealed(Trial.objects.all(), request.user), pk=pk)
        data = TrajectoryImportInput(data=request.data)
        data.is_valid(raise_exception=True)
        if data.validated_data.get("document") is None:
            raise ValidationError({"document": ["this field is required"]})
        try:
            trajectory = trajectory_import(
                trial=trial,
                document=data.validated_data["document"],
                fmt=data.validated_data.get("format", "auto"),
                lenient=data.validated_data.get("lenient", False),
                files=data.validated_data.get("files") or {},
            )
        except TrajectoryListError as exc:
            raise ValidationError(
                {
                    "document": [
                        f"this is a list of {exc.count} {exc.kind}, not one trajectory; import them with "
                        f"POST /api/v1/trajectories/ ({exc.count} items, one trial each)"
                    ]
                }
            ) from exc
        except TrajectoryFormatError as exc:
            refusal: dict[str, list[str]] = {"document": exc.errors}
            if exc.lenient_imports and not data.validated_data["lenient"]:
                refusal["lenient"] = [
                    '"lenient": true imports it, keeping each off-spec step\'s text and listing the deviations'
                ]
            raise ValidationError(refusal) from exc
        body = TrajectoryImportOutput(_summary(trajectory))
        return Response(body.data, status=status.HTTP_201_CREATED)


# Items a batch may hold; the request body's size limit (RSI_MAX_BODY_BYTES) applies too.
BATCH_MAX = 200


class TrajectoryBatchItem(serializers.Serializer):
    trial = serializers.IntegerField(min_value=1)
    format = serializers.ChoiceField(choices=("auto", *FORMATS), default="auto", required=False)
    document = ParsedJSONField(help_text="as for one trial")


class TrajectoryBatchInput(serializers.Serializer):
    trajectories = serializers.ListField(child=TrajectoryBatchItem(), min_length=1, max_length=BATCH_MAX)
    lenient = serializers.BooleanField(
        required=False, default=False, help_text="keep off-spec steps' text and record each deviation"
    )


class TrajectoryBatchOutput(serializers.Serializer):
    imported = TrajectoryImportOutput(many=True)


class TrajectoryBatchImportView(APIView):
    permission_classes = [CanImportTrajectories]

    @extend_schema(
        request=TrajectoryBatchInput,
        responses={201: TrajectoryBatchOutput},
        summary="Import several trials' trajectories at once, all or nothing (secrets are redacted)",
    )
    def post(self, request: Request) -> Response:
        data = TrajectoryBatchInput(data=request.data)
        data.is_valid(raise_exception=True)
        items = data.validated_data["trajectories"]
        problems: dict[int, dict[str, list[str]]] = {}
        seen: set[int] = set()
        for index, item in enumerate(items):
            if item.get("document") is None:
                problems[index] = {"document": ["this field is required"]}
            if item["trial"] in seen:
                problems.setdefault(index, {})["trial"] = [f"trial {item['trial']} is already in this batch"]
            seen.add(item["trial"])
        visible = access.hide_sealed(Trial.objects.all(), request.user).in_bulk(list(seen))
        for index, item in enumerate(items):
            if item["trial"] not in visible:
                problems.setdefault(index, {})["trial"] = [f"no trial {item['trial']}"]
        if problems:
            # JSON object keys are text: the item's index as a string, as the response shows it.
            raise ValidationError({"trajectories": {str(index): found for index, found in problems.items()}})
        try:
            trajectories = trajectories_import(
                [(visible[item["trial"]], item["document"], item.get("format", "auto")) for item in items],
                lenient=data.validated_data.get("lenient", False),
            )
        except TrajectoryBatchError as exc:
            raise ValidationError(
                {"trajectories": {str(index): {"document": errors} for index, errors in exc.errors.items()}}
            ) from exc
        body = TrajectoryBatchOutput({"imported": [_summary(trajectory) for trajectory in trajectories]})
        return Response(body.data, status=status.HTTP_201_CREATED)


urlpatterns = [
    path("trials/<int:pk>/trajectory/", TrajectoryImportView.as_view(), name="trial-trajectory-import"),
    path("trajectories/", TrajectoryBatchImportView.as_view(), name="trajectory-batch-import"),
]
