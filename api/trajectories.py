"""Import a trial's trajectory: POST /api/v1/trials/<pk>/trajectory/.

Body ``{"format": "auto" | "atif" | "mini-swe-agent" | "openai", "document": ...}``.
The document is validated, converted to ATIF, redacted and stored in place
of the trial's trajectory (evolution.services.trajectories). Staff or the
operator permission may import; sealed trials are 404 without the sealed
permission, as on the screens.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.permissions import CanView
from evolution.models import Trial
from evolution.services.trajectories import TrajectoryFormatError, trajectory_import
from evolution.trajectory_formats import FORMATS
from review import access


class CanImportTrajectories(BasePermission):
    """Viewer, and staff or the operator permission."""

    message = f"you need the {access.OPERATE} permission (or staff) to import trajectories"

    def has_permission(self, request: Any, view: Any) -> bool:
        if not CanView().has_permission(request, view):
            return False
        return bool(request.user.is_staff or request.user.has_perm(access.OPERATE))


class ParsedJSONField(serializers.JSONField):
    """A JSON value the request's parser has already built, taken as it is.

    DRF's JSONField serializes the value once more to check it can be, which
    a parser's output always can: 0.7 ms of a 70 KB trajectory, for
    nothing. A form field's JSON text is still parsed (by DRF).
    """

    def to_internal_value(self, data: Any) -> Any:
        if getattr(data, "is_json_string", False):
            return super().to_internal_value(data)
        return data


class TrajectoryImportInput(serializers.Serializer):
    format = serializers.ChoiceField(choices=("auto", *FORMATS), default="auto", required=False)
    document = ParsedJSONField(
        help_text="an ATIF v1.x trajectory, a mini-swe-agent trajectory file, or an OpenAI chat message list"
    )


class TrajectoryImportOutput(serializers.Serializer):
    trial = serializers.IntegerField()
    format = serializers.CharField()
    step_count = serializers.IntegerField()
    redacted = serializers.BooleanField()
    redactions = serializers.DictField(child=serializers.IntegerField(), help_text="secrets removed, by kind")


class TrajectoryImportView(APIView):
    permission_classes = [CanImportTrajectories]

    @extend_schema(
        request=TrajectoryImportInput,
        responses={201: TrajectoryImportOutput},
        summary="Import a trajectory into a trial, replacing its trajectory (secrets are redacted)",
    )
    def post(self, request: Request, pk: int) -> Response:
        trial = get_object_or_404(access.hide_sealed(Trial.objects.all(), request.user), pk=pk)
        data = TrajectoryImportInput(data=request.data)
        data.is_valid(raise_exception=True)
        if data.validated_data.get("document") is None:
            raise ValidationError({"document": ["this field is required"]})
        try:
            trajectory = trajectory_import(
                trial=trial, document=data.validated_data["document"], fmt=data.validated_data.get("format", "auto")
            )
        except TrajectoryFormatError as exc:
            raise ValidationError({"document": exc.errors}) from exc
        body = TrajectoryImportOutput(
            {
                "trial": trial.pk,
                "format": trajectory.extra.get("imported_format", ""),
                "step_count": trajectory.step_count,
                "redacted": trajectory.redacted,
                "redactions": trajectory.extra.get("redactions", {}),
            }
        )
        return Response(body.data, status=status.HTTP_201_CREATED)


urlpatterns = [path("trials/<int:pk>/trajectory/", TrajectoryImportView.as_view(), name="trial-trajectory-import")]
