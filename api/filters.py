"""Query-string filters of the list endpoints.

Each filter is a serializer: it validates the query string (a bad value is a
400 naming the parameter), documents the parameters in the OpenAPI schema
(``extend_schema(parameters=[...])`` accepts a serializer) and maps each
field to an ORM lookup. Sealed rows are removed by the views before any
filter applies, so filtering on ``split=sealed`` cannot reveal them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db.models import QuerySet
from rest_framework import serializers

from evolution.models import Candidate, ComponentKind, Run, SplitName, Trial


class Filter(serializers.Serializer):
    """Base: ``lookups`` maps a field name to the ORM lookup it filters on."""

    lookups: ClassVar[dict[str, str]] = {}

    def apply(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        for name, value in self.validated_data.items():
            if value is None or value == "":
                continue
            queryset = queryset.filter(**{self.lookups.get(name, name): value})
        return queryset


class TaskFilter(Filter):
    benchmark = serializers.IntegerField(required=False, min_value=1, help_text="benchmark id")
    lookups: ClassVar[dict[str, str]] = {"benchmark": "benchmark_id"}


class RunFilter(Filter):
    experiment = serializers.IntegerField(required=False, min_value=1)
    status = serializers.ChoiceField(required=False, choices=Run.Status.choices)
    lookups: ClassVar[dict[str, str]] = {"experiment": "experiment_id"}


class CandidateFilter(Filter):
    experiment = serializers.IntegerField(required=False, min_value=1)
    state = serializers.ChoiceField(required=False, choices=Candidate.State.choices)
    origin = serializers.ChoiceField(required=False, choices=Candidate.Origin.choices)
    round = serializers.IntegerField(required=False, min_value=0)
    lookups: ClassVar[dict[str, str]] = {"experiment": "experiment_id"}


class ResultFilter(Filter):
    experiment = serializers.IntegerField(required=False, min_value=1)
    candidate = serializers.IntegerField(required=False, min_value=1)
    lookups: ClassVar[dict[str, str]] = {"experiment": "experiment_id", "candidate": "candidate_id"}


class TrialFilter(Filter):
    experiment = serializers.IntegerField(required=False, min_value=1)
    candidate = serializers.IntegerField(required=False, min_value=1)
    split = serializers.ChoiceField(required=False, choices=SplitName.choices)
    state = serializers.ChoiceField(required=False, choices=Trial.State.choices)
    outcome = serializers.ChoiceField(required=False, choices=Trial.Outcome.choices)
    lookups: ClassVar[dict[str, str]] = {"experiment": "candidate__experiment_id", "candidate": "candidate_id"}


class LedgerFilter(Filter):
    run = serializers.IntegerField(required=False, min_value=1)
    component = serializers.ChoiceField(required=False, choices=ComponentKind.choices)
    accepted = serializers.BooleanField(required=False, allow_null=True, default=None)
    lookups: ClassVar[dict[str, str]] = {"run": "run_id"}


class FlagFilter(Filter):
    candidate = serializers.IntegerField(required=False, min_value=1)
    rule = serializers.CharField(required=False, max_length=60)
    lookups: ClassVar[dict[str, str]] = {"candidate": "candidate_id"}


class ReviewDecisionFilter(Filter):
    candidate = serializers.IntegerField(required=False, min_value=1)
    lookups: ClassVar[dict[str, str]] = {"candidate": "item__candidate_id"}


class AnnotationFilter(Filter):
    experiment = serializers.IntegerField(required=False, min_value=1)
    # DRF's metaclass takes declared fields off the class; the stubs see Field.label (a str) here.
    label = serializers.SlugField(  # type: ignore[assignment]
        required=False, max_length=60, help_text="label slug"
    )
    author = serializers.CharField(required=False, max_length=150, help_text="author's username")
    trial = serializers.IntegerField(required=False, min_value=1)
    lookups: ClassVar[dict[str, str]] = {
        "experiment": "trial__candidate__experiment_id",
        "label": "label__slug",
        "author": "author__username",
        "trial": "trial_id",
    }


class DiffQuery(serializers.Serializer):
    against = serializers.IntegerField(
        required=False, min_value=1, help_text="candidate id to diff against (default: the parent)"
    )
