"""Input and output serializers of /api/v1/.

Output serializers are read-only and name their fields explicitly: a task's
``expected`` answer is never among them, and per-task sealed data is removed
by the views (``evolution.access.hide_sealed``) before it reaches a serializer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import Count
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from evolution.loop import load
from evolution.loop.state import RunState
from evolution.models import (
    Annotation,
    AtomicEdit,
    Benchmark,
    Candidate,
    CertifiedResult,
    Experiment,
    GateDecision,
    LeakageFlag,
    LedgerEntry,
    RecipeComparison,
    ReviewDecision,
    Run,
    SplitMembership,
    Task,
    Trajectory,
    TrajectoryStep,
    Trial,
)
from evolution.recipes import PRESET_NAMES
from evolution.trajectory_formats import STEP_FIELDS

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from evolution.models import Evaluator

# --- Benchmarks and tasks ---------------------------------------------------------


class BenchmarkSerializer(serializers.ModelSerializer):
    task_count = serializers.SerializerMethodField()

    class Meta:
        model = Benchmark
        fields = ("id", "name", "title", "description", "created_at", "task_count")
        read_only_fields = fields

    def get_task_count(self, obj: Benchmark) -> int:
        return obj.tasks.count()


class TaskSerializer(serializers.ModelSerializer):
    """A task without its private ``expected`` data."""

    criteria_ids = serializers.SerializerMethodField()
    public_files = serializers.CharField(source="public_files_id", allow_null=True, read_only=True)

    class Meta:
        model = Task
        fields = ("id", "benchmark", "external_id", "instruction", "metadata", "criteria_ids", "public_files")
        read_only_fields = fields

    def get_criteria_ids(self, obj: Task) -> list[str]:
        return [str(c.get("id")) for c in obj.criteria or [] if isinstance(c, dict) and c.get("id") is not None]


# --- Experiments and runs ---------------------------------------------------------


class ExperimentSerializer(serializers.ModelSerializer):
    benchmark: serializers.SlugRelatedField[Benchmark] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    evaluator: serializers.SlugRelatedField[Evaluator] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    surface = serializers.CharField(source="surface.name", read_only=True)
    recipe = serializers.SerializerMethodField()
    # A plain string here, the enum in the detail: one choice set per schema component.
    status: serializers.Field = serializers.CharField(read_only=True, help_text="see the detail's status values")

    class Meta:
        model = Experiment
        fields: tuple[str, ...] = (
            "id",
            "uid",
            "name",
            "description",
            "status",
            "benchmark",
            "evaluator",
            "surface",
            "recipe",
            "seed_candidate",
            "trials_per_task",
            "created_at",
        )
        read_only_fields: tuple[str, ...] = fields

    def get_recipe(self, obj: Experiment) -> str | None:
        return str(obj.recipe) if obj.recipe_id else None


class ExperimentDetailSerializer(ExperimentSerializer):
    split_sizes = serializers.SerializerMethodField()
    best_candidate = serializers.SerializerMethodField(
        help_text="the best harness so far across runs: the accepted candidate with the highest evolve score, "
        "then the lower cost, then the most recently accepted (the default start of a new run)"
    )
    trials_per_task_used = serializers.SerializerMethodField(
        help_text="k as the experiment's runs used it, by run id (trials_per_task is the experiment's default)"
    )
    heldout_benchmarks: serializers.SlugRelatedField[Benchmark] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    status = serializers.ChoiceField(choices=Experiment.Status.choices, read_only=True)

    class Meta(ExperimentSerializer.Meta):
        fields = (
            *ExperimentSerializer.Meta.fields,
            "split_sizes",
            "best_candidate",
            "trials_per_task_used",
            "split_digests",
            "split_seed",
            "split_ratios",
            "split_stratify_by",
            "heldout_benchmarks",
            "run_settings",
            "chain_length",
            "chain_head",
        )
        read_only_fields = fields

    def get_best_candidate(self, obj: Experiment) -> int | None:
        best = load.best_candidate(obj)
        return best.pk if best is not None else None

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer", "nullable": True}})
    def get_trials_per_task_used(self, obj: Experiment) -> dict[str, int | None]:
        return {str(run.pk): run.trials_per_task for run in obj.runs.select_related("recipe").order_by("pk")}

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_split_sizes(self, obj: Experiment) -> dict[str, int]:
        # Counts per split are aggregates: every viewer may see them, sealed included.
        rows = SplitMembership.objects.filter(experiment=obj).values("split").annotate(n=Count("pk"))
        return {row["split"]: row["n"] for row in rows}


class RunSerializer(serializers.ModelSerializer):
    recipe = serializers.SerializerMethodField()
    started_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(slug_field="username", read_only=True)
    # A plain string here, the enum in the detail: one choice set per schema component.
    status: serializers.Field = serializers.CharField(read_only=True, help_text="see the detail's status values")
    current_round = serializers.IntegerField(
        source="round_shown",
        read_only=True,
        help_text="the round the run is in, or the last it ran once it ended (never past rounds)",
    )
    trials_per_task = serializers.IntegerField(
        read_only=True, allow_null=True, help_text="k as this run used it (its recipe's, with any override)"
    )

    class Meta:
        model = Run
        fields: tuple[str, ...] = (
            "id",
            "experiment",
            "recipe",
            "status",
            "rounds",
            "current_round",
            "trials_per_task",
            "noise_delta",
            "start_candidate",
            "current_candidate",
            "tokens_spent",
            "stop_reason",
            "error",
            "started_by",
            "created_at",
            "started_at",
            "finished_at",
        )
        read_only_fields: tuple[str, ...] = fields

    def get_recipe(self, obj: Run) -> str:
        return str(obj.recipe)


class RunDetailSerializer(RunSerializer):
    recipe_spec = serializers.JSONField(source="recipe.spec", read_only=True)
    status = serializers.ChoiceField(choices=Run.Status.choices, read_only=True)
    noise = serializers.SerializerMethodField(
        help_text="how the noise band was measured; delta null: it could not be estimated and the gate accepts "
        "nothing inside the band (null before the baseline, or for a recipe without a band)"
    )

    class Meta(RunSerializer.Meta):
        fields = (*RunSerializer.Meta.fields, "recipe_spec", "noise")
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "properties": {
                "delta": {"type": "number", "nullable": True},
                "rule": {"type": "string"},
                "evaluations": {"type": "integer"},
                "trials_per_task": {"type": "integer"},
                "note": {"type": "string"},
            },
        }
    )
    def get_noise(self, obj: Run) -> dict[str, Any] | None:
        return dict(RunState.of(obj).noise or {}) or None


class RunStartSerializer(serializers.Serializer):
    """Start a run: a preset name (or ``run-<id>`` for an earlier run's recipe) and overrides."""

    experiment = serializers.PrimaryKeyRelatedField(queryset=Experiment.objects.all())
    recipe = serializers.CharField(max_length=100, help_text=f"a preset ({', '.join(PRESET_NAMES)}) or run-<id>")
    rounds = serializers.IntegerField(required=False, min_value=1, max_value=1000)
    k = serializers.IntegerField(required=False, min_value=1, max_value=20)
    proposer = serializers.CharField(required=False, max_length=100, allow_blank=True)
    candidates_per_round = serializers.IntegerField(required=False, min_value=1, max_value=100)
    start_candidate = serializers.PrimaryKeyRelatedField(
        queryset=Candidate.objects.all(),
        required=False,
        allow_null=True,
        help_text="the seed or an accepted candidate of the experiment; default: the experiment's best",
    )


class RunActionSerializer(serializers.Serializer):
    """Empty body: the action is in the URL."""


class CandidateEvaluateSerializer(serializers.Serializer):
    """Evaluate a candidate: on the splits its gate reads (``gate``) or on every split (``all``)."""

    scope = serializers.ChoiceField(choices=[("gate", "gate"), ("all", "all")], default="gate")


class CandidateEvaluateResultSerializer(serializers.Serializer):
    """What was set in motion: the message, the run whose gate decides it, the evaluations started."""

    detail = serializers.CharField()
    run = serializers.IntegerField(allow_null=True, help_text="the run whose gate decides it (null: decided before)")
    joined = serializers.BooleanField(help_text="true: it joins a live run's next gate")
    evaluations = serializers.ListField(child=serializers.IntegerField())


# --- Candidates -------------------------------------------------------------------


class AtomicEditSerializer(serializers.ModelSerializer):
    class Meta:
        model = AtomicEdit
        fields = ("id", "index", "component", "hypothesis", "paths", "diff")
        read_only_fields = fields


class GateDecisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = GateDecision
        fields = ("id", "run", "round", "current", "accepted", "chosen", "rule", "explanation", "numbers", "created_at")
        read_only_fields = fields


class CandidateSerializer(serializers.ModelSerializer):
    digest = serializers.CharField(source="tree_id", read_only=True)
    # Plain strings here, the enums in the detail: one choice set per schema component.
    state: serializers.Field = serializers.CharField(read_only=True, help_text="see the detail's state values")
    origin: serializers.Field = serializers.CharField(read_only=True, help_text="see the detail's origin values")

    class Meta:
        model = Candidate
        fields: tuple[str, ...] = (
            "id",
            "experiment",
            "run",
            "parent",
            "digest",
            "origin",
            "state",
            "round",
            "label",
            "state_reason",
            "certified_at",
            "created_at",
        )
        read_only_fields: tuple[str, ...] = fields


# dS, its interval and dC, as the candidate detail gives them (at decision, or current).
_ESTIMATE_SCHEMA: dict[str, Any] = {
    "dS": {"type": "number"},
    "low": {"type": "number", "nullable": True},
    "high": {"type": "number", "nullable": True},
    "confidence": {"type": "number", "nullable": True},
    "paired_tasks": {"type": "integer", "nullable": True},
    "dC": {"type": "number", "nullable": True},
}


class CandidateDetailSerializer(CandidateSerializer):
    edits = AtomicEditSerializer(many=True, read_only=True)
    gate_decisions = GateDecisionSerializer(many=True, read_only=True)
    file_count = serializers.IntegerField(source="tree.file_count", read_only=True)
    total_size = serializers.IntegerField(source="tree.total_size", read_only=True)
    state = serializers.ChoiceField(choices=Candidate.State.choices, read_only=True)
    origin = serializers.ChoiceField(choices=Candidate.Origin.choices, read_only=True)
    delta = serializers.SerializerMethodField(
        help_text=(
            "dS against the harness the gate compared it with (else its parent), in the recipe's metric on the "
            "evolve splits, the gate's number, with a paired bootstrap interval over the tasks both were "
            "measured on (null low/high: not enough paired tasks) and dC. For a decided candidate these are the "
            "numbers its gate decision kept (at_decision true; the same as its certified record), and current "
            "holds the estimate on the trials measured now when later measurements moved it (else null). Null "
            "for the seed or without certified trials on both sides"
        )
    )

    class Meta(CandidateSerializer.Meta):
        fields = (*CandidateSerializer.Meta.fields, "file_count", "total_size", "edits", "gate_decisions", "delta")
        read_only_fields = fields

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "properties": {
                "against": {"type": "integer"},
                "gated": {"type": "boolean"},
                "metric": {"type": "string"},
                "splits": {"type": "array", "items": {"type": "string"}},
                **_ESTIMATE_SCHEMA,
                "noise_delta": {"type": "number", "nullable": True},
                "at_decision": {"type": "boolean"},
                "decision": {"type": "integer", "nullable": True},
                "current": {"type": "object", "nullable": True, "properties": _ESTIMATE_SCHEMA},
            },
        }
    )
    def get_delta(self, obj: Candidate) -> dict[str, Any] | None:
        delta = load.candidate_delta(obj)
        if delta is None:
            return None
        e = delta.estimate
        current = {
            "dS": e.delta,
            "low": e.low,
            "high": e.high,
            "confidence": e.confidence,
            "paired_tasks": e.pairs,
            "dC": delta.delta_cost,
        }
        at = delta.at_decision
        shown = (
            current
            if at is None
            else {
                "dS": at.delta,
                "low": at.low,
                "high": at.high,
                "confidence": at.confidence,
                "paired_tasks": at.pairs,
                "dC": at.delta_cost,
            }
        )
        return {
            "against": delta.base_id,
            "gated": delta.gated,
            "metric": e.metric,
            "splits": list(delta.splits),
            **shown,
            "noise_delta": delta.noise_delta,
            "at_decision": at is not None,
            "decision": at.decision_id if at is not None else None,
            "current": current if delta.moved else None,
        }


class TreeEntrySerializer(serializers.Serializer):
    path = serializers.CharField()
    mode = serializers.CharField()
    size = serializers.IntegerField(source="blob.size")
    digest = serializers.CharField(source="blob_id")


# --- Certified results ------------------------------------------------------------


class CertifiedResultSerializer(serializers.ModelSerializer):
    class Meta:
        model = CertifiedResult
        fields: tuple[str, ...] = (
            "id",
            "experiment",
            "seq",
            "evaluation",
            "candidate",
            "prev_digest",
            "record_digest",
            "signature",
            "created_at",
        )
        read_only_fields: tuple[str, ...] = fields


class CertifiedResultDetailSerializer(CertifiedResultSerializer):
    payload = serializers.SerializerMethodField(help_text="what was certified; sealed per-task rows need permission")
    hidden_rows = serializers.SerializerMethodField(help_text="sealed per-task rows left out of this payload")

    class Meta(CertifiedResultSerializer.Meta):
        fields = (*CertifiedResultSerializer.Meta.fields, "payload", "hidden_rows")
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_payload(self, obj: CertifiedResult) -> dict[str, Any]:
        return self.context["visible_payload"](obj)[0]

    def get_hidden_rows(self, obj: CertifiedResult) -> int:
        return self.context["visible_payload"](obj)[1]


# --- Trials and trajectories ------------------------------------------------------


class TrialSerializer(serializers.ModelSerializer):
    experiment = serializers.IntegerField(source="candidate.experiment_id", read_only=True)
    task_external_id = serializers.CharField(source="task.external_id", read_only=True)
    has_trajectory = serializers.SerializerMethodField()
    # Blank until the trial finishes (or when it had no error).
    outcome = serializers.ChoiceField(choices=Trial.Outcome.choices, allow_blank=True, read_only=True)
    error_kind = serializers.ChoiceField(choices=Trial.ErrorKind.choices, allow_blank=True, read_only=True)
    external = serializers.BooleanField(
        source="evaluation.external",
        read_only=True,
        help_text="true for results ingested from outside: not run or certified by rsiweb",
    )
    # DRF's metaclass takes declared fields off the class; the stubs see Field.source (a str) here.
    source = serializers.DictField(  # type: ignore[assignment]
        source="evaluation.source",
        read_only=True,
        help_text="where an external result came from, as its submitter described it; {} for trials rsiweb ran",
    )

    class Meta:
        model = Trial
        fields = (
            "id",
            "experiment",
            "evaluation",
            "external",
            "source",
            "candidate",
            "task",
            "task_external_id",
            "split",
            "index",
            "state",
            "outcome",
            "score",
            "criteria_results",
            "tokens",
            "steps",
            "wall_time",
            "valid_output",
            "submitted",
            "error_kind",
            "error",
            "started_at",
            "finished_at",
            "has_trajectory",
        )
        read_only_fields = fields

    def get_has_trajectory(self, obj: Trial) -> bool:
        return hasattr(obj, "trajectory")


class TrajectorySerializer(serializers.ModelSerializer):
    class Meta:
        model = Trajectory
        fields = (
            "id",
            "trial",
            "schema_version",
            "session_id",
            "agent",
            "final_metrics",
            "notes",
            "extra",
            "step_count",
            "redacted",
        )
        read_only_fields = fields


class TrajectoryStepSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrajectoryStep
        fields = (*STEP_FIELDS, "extra")
        read_only_fields = fields


# --- Ledger, flags, review --------------------------------------------------------


class LedgerEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = LedgerEntry
        fields = (
            "id",
            "run",
            "edit",
            "candidate",
            "round",
            "component",
            "hypothesis",
            "delta_score",
            "delta_cost",
            "accepted",
            "admissible",
            "created_at",
        )
        read_only_fields = fields


class LeakageFlagSerializer(serializers.ModelSerializer):
    """A flag; its task, matched text and evidence only when the task may be seen
    (``evolution.flags.flag_task_visible``: a sealed task needs the sealed permission)."""

    task_visible = serializers.SerializerMethodField()
    task = serializers.SerializerMethodField()
    matched = serializers.SerializerMethodField()
    evidence = serializers.SerializerMethodField()

    class Meta:
        model = LeakageFlag
        fields = ("id", "candidate", "edit", "rule", "path", "line", "task_visible", "task", "matched", "evidence")
        read_only_fields = fields

    def get_task_visible(self, obj: LeakageFlag) -> bool:
        return bool(self.context["flag_visible"](obj))

    def get_task(self, obj: LeakageFlag) -> int | None:
        return obj.task_id if self.get_task_visible(obj) else None

    def get_matched(self, obj: LeakageFlag) -> str | None:
        return obj.matched if self.get_task_visible(obj) else None

    @extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
    def get_evidence(self, obj: LeakageFlag) -> dict[str, Any] | None:
        return obj.evidence if self.get_task_visible(obj) else None


class ReviewDecisionSerializer(serializers.ModelSerializer):
    candidate = serializers.IntegerField(source="item.candidate_id", read_only=True)
    reviewer: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(slug_field="username", read_only=True)
    rejected_edits: serializers.PrimaryKeyRelatedField[AtomicEdit] = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True
    )

    class Meta:
        model = ReviewDecision
        fields = ("id", "item", "candidate", "reviewer", "verdict", "reason", "rejected_edits", "derived_candidate")
        read_only_fields = fields


class ReviewDecideSerializer(serializers.Serializer):
    """Decide a flagged candidate: approve, reject, or reject some of its edits."""

    candidate = serializers.IntegerField(min_value=1, help_text="the flagged candidate")
    verdict = serializers.ChoiceField(choices=ReviewDecision.Verdict.choices)
    reason = serializers.CharField(max_length=5000, allow_blank=True, trim_whitespace=True)
    rejected_edits = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, default=list, max_length=1000
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["verdict"] == ReviewDecision.Verdict.REJECT_EDITS and not attrs["rejected_edits"]:
            raise serializers.ValidationError({"rejected_edits": "select at least one atomic edit to reject"})
        if attrs["verdict"] != ReviewDecision.Verdict.REJECT_EDITS and attrs["rejected_edits"]:
            raise serializers.ValidationError({"rejected_edits": "only the reject_edits verdict takes edits"})
        return attrs


# --- Annotations ------------------------------------------------------------------


class AnnotationSerializer(serializers.ModelSerializer):
    author: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(slug_field="username", read_only=True)
    label_slug = serializers.CharField(source="label.slug", read_only=True)
    step = serializers.IntegerField(source="step.step_id", allow_null=True, read_only=True)

    scores = serializers.SerializerMethodField(
        help_text="score slug -> value: a number, or true/false for a yes/no score; scores not given are left out"
    )

    class Meta:
        model = Annotation
        fields = ("id", "trial", "author", "label", "label_slug", "note", "step", "scores", "created_at", "updated_at")
        read_only_fields = fields

    def get_scores(self, annotation: Annotation) -> dict[str, float | bool]:
        return {
            score.config.slug: bool(score.value) if score.config.kind == "boolean" else score.value
            for score in annotation.scores.all()
        }


class AnnotationWriteSerializer(serializers.Serializer):
    """Create (``trial`` required) or update one's own annotation (``trial`` ignored)."""

    trial = serializers.IntegerField(min_value=1, required=False)
    # DRF's metaclass takes declared fields off the class; the stubs see Field.label (a str) here.
    label = serializers.IntegerField(  # type: ignore[assignment]
        min_value=1, help_text="label id (a default label or the experiment's)"
    )
    note = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    step = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=0)
    scores = serializers.DictField(
        child=serializers.JSONField(allow_null=True),
        required=False,
        default=dict,
        help_text="score config id or slug -> value (a number, or true/false for yes/no; null removes the score)",
    )


class RecipeComparisonSerializer(serializers.ModelSerializer):
    """A stored ``compare_recipes`` comparison; ``result`` is what ``--json`` printed (docs/loop.md). ``status``
    "interrupted" (with the reason in ``error``) when its command stopped before it finished; ``owner`` is that
    command's process (``host:pid:start``) and ``heartbeat_at`` when it last said it was alive."""

    class Meta:
        model = RecipeComparison
        fields: tuple[str, ...] = (
            "id",
            "experiment",
            "status",
            "params",
            "command",
            "result",
            "error",
            "created_at",
            "finished_at",
            "owner",
            "heartbeat_at",
        )
