"""Ingest results produced outside the platform: POST /api/v1/candidates/<pk>/external-results/,
and a whole Harbor job: POST /api/v1/harbor-jobs/.

Stored marked external and never certified (evolution.services.external).
"""

from __future__ import annotations

import re

from django.shortcuts import get_object_or_404
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.permissions import requires
from evolution import access
from evolution.models import Candidate
from evolution.services.external import (
    MAX_COUNTS,
    MAX_ERROR_CHARS,
    MAX_INDEX,
    ExternalResultsError,
    external_results_ingest,
)
from evolution.services.harbor_jobs import (
    HarborExperimentRefused,
    HarborJobError,
    HarborJobRefused,
    harbor_job_from_documents,
    harbor_job_store,
)


class ExternalResultInput(serializers.Serializer):
    task = serializers.CharField(help_text="task id of the experiment's benchmark (benchmark/id for held-out tasks)")
    split = serializers.CharField(required=False, help_text="optional; must be the task's split")
    index = serializers.IntegerField(min_value=0, max_value=MAX_INDEX, help_text="trial index of this task (0-based)")
    passed = serializers.BooleanField()
    score = serializers.FloatField(required=False, help_text="in [0, 1]; default 1 for a pass, 0 for a fail")
    tokens = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_COUNTS["tokens"])
    steps = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=MAX_COUNTS["steps"])
    error = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=MAX_ERROR_CHARS,
        help_text="the trial errored (infrastructure, agent crash): stored as an error with no score",
    )


class ExternalResultsInput(serializers.Serializer):
    results = ExternalResultInput(many=True, allow_empty=False)
    # DRF's metaclass takes declared fields off the class; the stubs see Field.source (a str) here.
    source = serializers.DictField(  # type: ignore[assignment]
        required=False, default=dict, help_text="where the results come from (tool, job id, URL, ...)"
    )


class ExternalResultsOutput(serializers.Serializer):
    evaluation = serializers.IntegerField()
    candidate = serializers.IntegerField()
    external = serializers.BooleanField()
    certified = serializers.BooleanField()
    state = serializers.CharField()
    trials = serializers.IntegerField()
    splits = serializers.ListField(child=serializers.CharField())
    source = serializers.DictField()  # type: ignore[assignment]  # as in ExternalResultsInput


def _candidate_id(raw: str) -> int:
    # Matched as a string so that any id (negative, huge) gets the API's JSON 404, not the site's HTML one.
    if not re.fullmatch(r"[0-9]{1,18}", raw):
        raise NotFound("no such candidate")
    return int(raw)


class ExternalResultsView(APIView):
    permission_classes = [requires(access.OPERATE)]

    @extend_schema(
        request=ExternalResultsInput,
        responses={
            201: ExternalResultsOutput,
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="field-level errors; nothing was written"),
            401: OpenApiResponse(OpenApiTypes.OBJECT, description="not authenticated"),
            403: OpenApiResponse(OpenApiTypes.OBJECT, description="needs the operator permission"),
            404: OpenApiResponse(OpenApiTypes.OBJECT, description="no such candidate"),
        },
        parameters=[OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH, description="candidate id")],
        summary="Ingest results produced outside the platform; stored as external, never certified",
    )
    def post(self, request: Request, pk: str) -> Response:
        candidate = get_object_or_404(Candidate, pk=_candidate_id(pk))
        data = ExternalResultsInput(data=request.data)
        # Types here; tasks, splits, duplicates and score ranges in the service (one transaction).
        data.is_valid(raise_exception=True)
        try:
            evaluation = external_results_ingest(
                candidate=candidate,
                results=[
                    {key: value for key, value in item.items() if not (key == "error" and value is None)}
                    for item in data.validated_data["results"]
                ],
                source=data.validated_data["source"],
            )
        except ExternalResultsError as exc:
            raise ValidationError({key: [message] for key, message in exc.errors.items()}) from exc
        body = ExternalResultsOutput(
            {
                "evaluation": evaluation.pk,
                "candidate": candidate.pk,
                "external": evaluation.external,
                "certified": False,
                "state": evaluation.state,
                "trials": evaluation.trials_total,
                "splits": evaluation.splits,
                "source": evaluation.source,
            }
        ).data
        return Response(body, status=status.HTTP_201_CREATED)


class HarborTrialInput(serializers.Serializer):
    result = serializers.DictField(help_text="the trial folder's result.json (Harbor's TrialResult)")
    trajectory = serializers.DictField(
        required=False, allow_null=True, help_text="the trial folder's agent/trajectory.json (ATIF), if any"
    )


class HarborJobInput(serializers.Serializer):
    experiment = serializers.CharField(
        required=False, max_length=200, help_text="experiment name; created when missing; default the job's name"
    )
    config = serializers.DictField(help_text="the job folder's config.json (Harbor's JobConfig)")
    result = serializers.DictField(help_text="the job folder's result.json (Harbor's JobResult)")
    trials = HarborTrialInput(many=True, allow_empty=False)


class HarborJobOutput(serializers.Serializer):
    experiment = serializers.IntegerField()
    candidate = serializers.IntegerField()
    evaluation = serializers.IntegerField(allow_null=True)
    created = serializers.BooleanField()
    trials = serializers.IntegerField()
    notes = serializers.ListField(child=serializers.CharField())


class HarborJobView(APIView):
    permission_classes = [requires(access.OPERATE)]

    @extend_schema(
        request=HarborJobInput,
        responses={
            201: HarborJobOutput,
            200: OpenApiResponse(HarborJobOutput, description="the job was imported before; nothing added"),
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="not a valid Harbor job; nothing was written"),
            409: OpenApiResponse(
                OpenApiTypes.OBJECT,
                description="the experiment named was not made by Harbor job imports; nothing was written",
            ),
            401: OpenApiResponse(OpenApiTypes.OBJECT, description="not authenticated"),
            403: OpenApiResponse(OpenApiTypes.OBJECT, description="needs the operator permission"),
        },
        summary="Import a Harbor job (its config, result and trial results) as external results, never certified",
    )
    def post(self, request: Request) -> Response:
        data = HarborJobInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        try:
            job = harbor_job_from_documents(
                config=values["config"],
                result=values["result"],
                trials=[(trial["result"], trial.get("trajectory")) for trial in values["trials"]],
                label="api upload",
            )
            report = harbor_job_store(job=job, experiment=values.get("experiment"))
        except HarborExperimentRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except (HarborJobError, HarborJobRefused) as exc:
            raise ValidationError({"detail": str(exc)}) from exc
        body = HarborJobOutput(
            {
                "experiment": report.experiment.pk,
                "candidate": report.candidate.pk,
                "evaluation": report.evaluation.pk if report.evaluation else None,
                "created": report.created,
                "trials": report.evaluation.trials_total if report.evaluation else 0,
                "notes": report.notes,
            }
        ).data
        return Response(body, status=status.HTTP_201_CREATED if report.evaluation else status.HTTP_200_OK)


urlpatterns = [
    path("candidates/<str:pk>/external-results/", ExternalResultsView.as_view(), name="external-results"),
    path("harbor-jobs/", HarborJobView.as_view(), name="harbor-jobs"),
]
