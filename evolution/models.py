"""The domain of harness evolution: fields, constraints and choices only.

Writes go through ``evolution.services``; reads through ``evolution.selectors``.
See docs/concepts.md for the words used here.

A foreign key that leads a composite index or unique constraint of its table
has ``db_index=False``: the composite one serves its lookups and cascades, and
each index is written on every insert (tests/evolution/test_indexes.py).
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, TypeVar

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import MD5

from evolution.fields import CanonicalJSONField
from evolution.surfaces import COMPONENT_KINDS
from evolution.surfaces import STRUCTURAL_KINDS as STRUCTURAL_KINDS  # the loop and the screens import it from here

# --- Vocabularies -------------------------------------------------------------


# The vocabulary is evolution.surfaces.COMPONENT_KINDS (pure, no Django); the
# choices are made from it so the two cannot differ. Members: PROMPT = "prompt", ...
# (django-stubs types TextChoices' member constructor, not Enum's functional API, hence the ignore.)
ComponentKind: type[models.TextChoices] = models.TextChoices(  # type: ignore[call-overload]  # stubs lack Enum's functional API
    "ComponentKind", [(kind.upper(), kind) for kind in COMPONENT_KINDS]
)


class SplitName(models.TextChoices):
    TRAIN = "train"
    GATE = "gate"
    SEALED = "sealed"
    # Tasks of an extra held-out benchmark attached to the experiment;
    # reported like sealed, never shown to the proposer.
    HELDOUT = "heldout"


EVOLVE_SPLITS = (SplitName.TRAIN, SplitName.GATE)
PROTECTED_SPLITS = (SplitName.GATE, SplitName.SEALED, SplitName.HELDOUT)


# --- Content-addressed harness storage ----------------------------------------


class Blob(models.Model):
    """File content, stored once per SHA-256 digest of the bytes."""

    digest = models.CharField(max_length=64, primary_key=True)
    size = models.PositiveBigIntegerField()
    content = models.BinaryField()

    def __str__(self) -> str:
        return f"blob {self.digest[:12]} ({self.size} B)"


class Tree(models.Model):
    """A snapshot of a file tree; digest is the Merkle hash of its entries
    (see ``evolution.digests.tree_digest``)."""

    digest = models.CharField(max_length=64, primary_key=True)
    file_count = models.PositiveIntegerField(default=0)
    total_size = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"tree {self.digest[:12]} ({self.file_count} files)"


class TreeEntry(models.Model):
    class Mode(models.TextChoices):
        FILE = "100644", "file"
        EXECUTABLE = "100755", "executable"
        SYMLINK = "120000", "symlink"

    tree = models.ForeignKey(Tree, on_delete=models.CASCADE, related_name="entries", db_index=False)
    path = models.CharField(max_length=1024)
    mode = models.CharField(max_length=6, choices=Mode.choices, default=Mode.FILE)
    blob = models.ForeignKey(Blob, on_delete=models.PROTECT, related_name="+")

    class Meta:
        constraints: ClassVar = [models.UniqueConstraint(fields=["tree", "path"], name="tree_entry_unique_path")]
        ordering: ClassVar = ["path"]

    def __str__(self) -> str:
        return f"{self.mode} {self.path}"


# --- Benchmarks, evaluators, surfaces ---------------------------------------


class Benchmark(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    title = models.CharField(max_length=200, blank=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Task(models.Model):
    """One benchmark task. ``expected`` is private: only the verifier sees it."""

    benchmark = models.ForeignKey(Benchmark, on_delete=models.CASCADE, related_name="tasks", db_index=False)
    external_id = models.CharField(max_length=200)
    instruction = models.TextField()
    # Public input files copied into the trial workspace (may be empty).
    public_files = models.ForeignKey(Tree, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    expected = models.JSONField(default=dict, blank=True)
    # Rubric criteria: [{"id": ..., "description": ...}]; empty for pass/fail tasks.
    criteria = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["benchmark", "external_id"], name="task_unique_external_id")
        ]
        ordering: ClassVar = ["benchmark_id", "external_id"]

    def __str__(self) -> str:
        return f"{self.benchmark.name}/{self.external_id}"


class Evaluator(models.Model):
    """How trials run and are graded. Its files (agent runner, verifier) are a
    snapshot stored in the database so any worker machine can materialize
    them; they are never inside a trial workspace or on a surface.

    ``runner_argv`` and ``verifier_argv`` are templates; placeholders:
    {python} {evaluator} {workspace} {harness} {task} {output} {private} {seed}
    {trial_index}.
    """

    name = models.SlugField(max_length=100, unique=True)
    files = models.ForeignKey(Tree, on_delete=models.PROTECT, related_name="+")
    runner_argv = models.JSONField()
    verifier_argv = models.JSONField()
    env_allowlist = models.JSONField(default=list, blank=True)
    timeout_seconds = models.PositiveIntegerField(default=60)
    # {"cpu_seconds", "memory_bytes", "file_bytes", "processes", "output_bytes"}
    limits = models.JSONField(default=dict, blank=True)
    # The agent's command keeps the host's network under bubblewrap (an agent
    # that calls a hosted model); the verifier never has it.
    agent_network = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Surface(models.Model):
    """The paths a method may change; ``spec`` is the YAML document
    (include, exclude, components, protected_keys)."""

    name = models.CharField(max_length=200)
    spec = models.TextField()
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Recipe(models.Model):
    """A declarative, versioned method description (validated in the loop issue)."""

    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    spec = models.JSONField(default=dict)
    digest = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [models.UniqueConstraint(fields=["digest"], name="recipe_unique_digest")]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


# --- Experiments and splits ---------------------------------------------------


class ModelEndpoint(models.Model):
    """A model API that trials call, and how many trials may be in flight
    against it at once, summed over every worker host (a provider's rate or
    concurrency limit). Scheduling only: it changes no result, so no record
    binds it."""

    name = models.CharField(max_length=200, unique=True)
    max_in_flight = models.PositiveIntegerField(validators=[MinValueValidator(1)])

    def __str__(self) -> str:
        return f"{self.name} (at most {self.max_in_flight} in flight)"


class Experiment(models.Model):
    class Status(models.TextChoices):
        DRAFT = "draft"
        READY = "ready"
        RUNNING = "running"
        PAUSED = "paused"
        FINISHED = "finished"
        FAILED = "failed"
        CANCELLED = "cancelled"

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    name = models.CharField(max_length=200, unique=True)
    description = models.TextField(blank=True)
    benchmark = models.ForeignKey(Benchmark, on_delete=models.PROTECT, related_name="experiments")
    heldout_benchmarks = models.ManyToManyField(Benchmark, blank=True, related_name="heldout_in")
    evaluator = models.ForeignKey(Evaluator, on_delete=models.PROTECT, related_name="experiments")
    surface = models.ForeignKey(Surface, on_delete=models.PROTECT, related_name="experiments")
    recipe = models.ForeignKey(Recipe, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    seed_candidate = models.OneToOneField(
        "Candidate", null=True, blank=True, on_delete=models.PROTECT, related_name="seed_of"
    )
    # Split assignment inputs and the frozen digest of each split's task set.
    split_seed = models.BigIntegerField(default=0)
    split_ratios = models.JSONField(default=dict, blank=True)
    # A task metadata key whose every value is cut by the ratios on its own ("" for none): no capability
    # lives in one split only (splits.assign_by_ratio's strata).
    split_stratify_by = models.CharField(max_length=100, blank=True, default="")
    split_digests = models.JSONField(default=dict, blank=True)
    # Model and run settings bound into every certified result.
    run_settings = models.JSONField(default=dict, blank=True)
    trials_per_task = models.PositiveSmallIntegerField(default=2)
    # Scheduling limits (never part of a record): the most trials of this
    # experiment in flight at once (None: no limit of its own), and the model
    # endpoint its agent calls, whose limit all experiments using it share.
    max_trials_in_flight = models.PositiveIntegerField(null=True, blank=True, validators=[MinValueValidator(1)])
    endpoint = models.ForeignKey(
        ModelEndpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="experiments"
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.DRAFT)
    # Head of this experiment's certified-record chain, signed with the
    # records key, so truncating the chain is detected.
    chain_length = models.PositiveIntegerField(default=0)
    chain_head = models.CharField(max_length=64, blank=True)
    chain_head_signature = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The roles (evolution.access) the screens and the API check are made of these.
        permissions: ClassVar = [
            ("view_sealed_details", "Can see per-task sealed results and sealed trajectories"),
            ("review_leakage", "Can claim and decide leakage-flagged candidates"),
            ("operate_runs", "Can start, pause, resume and cancel runs"),
            ("annotate_trials", "Can annotate failed trials and add labels"),
        ]

    def __str__(self) -> str:
        return self.name


class SplitMembership(models.Model):
    experiment = models.ForeignKey(
        Experiment, on_delete=models.CASCADE, related_name="split_memberships", db_index=False
    )
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="split_memberships")
    split = models.CharField(max_length=10, choices=SplitName.choices)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["experiment", "task"], name="split_one_per_task"),
        ]
        indexes: ClassVar = [models.Index(fields=["experiment", "split"])]

    def __str__(self) -> str:
        return f"{self.task_id} in {self.split}"


# --- Runs, candidates, edits --------------------------------------------------


class Run(models.Model):
    """One execution of a recipe on an experiment (driven by the loop)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        PAUSED = "paused"
        FINISHED = "finished"
        FAILED = "failed"
        CANCELLED = "cancelled"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    recipe = models.ForeignKey(Recipe, on_delete=models.PROTECT, related_name="runs")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    rounds = models.PositiveIntegerField(default=0)
    current_round = models.PositiveIntegerField(default=0)
    noise_delta = models.FloatField(null=True, blank=True)
    current_candidate = models.ForeignKey(
        "Candidate", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The harness the run starts from (its baseline, its first parent, what its gains are measured from):
    # the seed or an accepted candidate of an earlier run. Null on runs made before it existed (the seed).
    start_candidate = models.ForeignKey(
        "Candidate", null=True, blank=True, on_delete=models.PROTECT, related_name="started_runs"
    )
    tokens_spent = models.PositiveBigIntegerField(default=0)
    stop_reason = models.CharField(max_length=200, blank=True)
    error = models.TextField(blank=True)
    state = models.JSONField(default=dict, blank=True)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"run {self.pk} of {self.experiment_id}"

    @property
    def round_shown(self) -> int:
        """The round the run is in, or the last one it ran once it ended: the loop moves ``current_round`` past
        ``rounds`` to end the run, so a finished 3-round run reads round 3, not 4. What the admin, the API and the
        screens show."""
        return min(self.current_round, self.rounds) if self.rounds else self.current_round

    @property
    def trials_per_task(self) -> int | None:
        """k as this run used it: its recipe's (with the start form's override); None for an unreadable recipe."""
        spec = self.recipe.spec if isinstance(self.recipe.spec, dict) else {}
        evaluation = spec.get("evaluation")
        k = evaluation.get("trials_per_task") if isinstance(evaluation, dict) else None
        return k if isinstance(k, int) else None


# Run statuses by what they mean, defined once (the loop, the services and the screens use these).
RUN_LIVE = (Run.Status.RUNNING, Run.Status.PAUSED)  # started and not ended
RUN_UNFINISHED = (Run.Status.PENDING, Run.Status.RUNNING, Run.Status.PAUSED)  # not ended
RUN_MOVING = (Run.Status.PENDING, Run.Status.RUNNING)  # may change on its own


class Candidate(models.Model):
    """One version of the harness.

    The state machine (``TRANSITIONS``) only reaches ACCEPTED from CERTIFIED,
    and a check constraint ties ACCEPTED to a certification timestamp, so an
    uncertified or undecided candidate can never be selected as a parent
    (parent selection filters on ACCEPTED).
    """

    class Origin(models.TextChoices):
        SEED = "seed"
        PROPOSED = "proposed"
        DERIVED = "derived"
        IMPORTED = "imported"

    class State(models.TextChoices):
        FROZEN = "frozen"  # files fixed, checks passed, waiting for the critic
        REJECTED_SURFACE = "rejected_surface"
        REJECTED_BUDGET = "rejected_budget"
        FLAGGED = "flagged"  # critic flagged it; held for a reviewer
        REJECTED_CRITIC = "rejected_critic"
        REJECTED_REVIEW = "rejected_review"
        APPROVED = "approved"  # cleared for evaluation
        EVALUATING = "evaluating"
        EVALUATED = "evaluated"  # all trials done, not yet certified
        CERTIFIED = "certified"  # results certified, waiting for the gate
        ACCEPTED = "accepted"
        REJECTED_GATE = "rejected_gate"
        FAILED = "failed"  # infrastructure failure, never a parent
        CANCELLED = "cancelled"

    TRANSITIONS: ClassVar[dict[str, frozenset[str]]] = {
        State.FROZEN: frozenset(
            {
                State.APPROVED,
                State.FLAGGED,
                State.REJECTED_CRITIC,
                State.REJECTED_SURFACE,
                State.REJECTED_BUDGET,
                State.CANCELLED,
            }
        ),
        State.FLAGGED: frozenset({State.APPROVED, State.REJECTED_REVIEW, State.CANCELLED}),
        # REJECTED_REVIEW out of APPROVED and the states after it, and APPROVED out of REJECTED_REVIEW:
        # a reviewer's certified correction of an earlier review decision (``review_correct``).
        State.APPROVED: frozenset({State.EVALUATING, State.CANCELLED, State.REJECTED_REVIEW}),
        State.EVALUATING: frozenset({State.EVALUATED, State.FAILED, State.CANCELLED, State.REJECTED_REVIEW}),
        State.EVALUATED: frozenset({State.CERTIFIED, State.FAILED, State.CANCELLED, State.REJECTED_REVIEW}),
        State.CERTIFIED: frozenset({State.ACCEPTED, State.REJECTED_GATE, State.EVALUATING, State.REJECTED_REVIEW}),
        State.ACCEPTED: frozenset({State.EVALUATING, State.REJECTED_REVIEW}),
        State.REJECTED_GATE: frozenset({State.EVALUATING, State.REJECTED_REVIEW}),
        State.REJECTED_REVIEW: frozenset({State.APPROVED}),
    }

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="candidates", db_index=False)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="candidates")
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    tree = models.ForeignKey(Tree, on_delete=models.PROTECT, related_name="candidates")
    origin = models.CharField(max_length=10, choices=Origin.choices)
    state = models.CharField(max_length=20, choices=State.choices, default=State.FROZEN)
    round = models.PositiveIntegerField(null=True, blank=True)
    label = models.CharField(max_length=200, blank=True)
    state_reason = models.TextField(blank=True)
    certified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            # Duplicate proposals (same content as an existing candidate) are dropped.
            models.UniqueConstraint(fields=["experiment", "tree"], name="candidate_unique_tree"),
            models.CheckConstraint(
                condition=~Q(state="accepted") | Q(certified_at__isnull=False),
                name="candidate_accepted_requires_certification",
            ),
            models.CheckConstraint(
                condition=Q(origin="seed", parent__isnull=True)
                | (~Q(origin="seed") & Q(parent__isnull=False))
                | Q(origin="imported"),
                name="candidate_parent_matches_origin",
            ),
        ]
        indexes: ClassVar = [models.Index(fields=["experiment", "state"])]

    def __str__(self) -> str:
        return f"candidate {self.pk} ({self.tree_id[:12]})"

    @property
    def digest(self) -> str:
        return self.tree_id


# Candidates approved or proposed whose measurement is under way (a run stopping cancels them).
CANDIDATE_IN_FLIGHT = (Candidate.State.APPROVED, Candidate.State.EVALUATING, Candidate.State.EVALUATED)


class AtomicEdit(models.Model):
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="edits", db_index=False)
    index = models.PositiveSmallIntegerField()
    component = models.CharField(max_length=20, choices=ComponentKind.choices)
    hypothesis = models.TextField()
    paths = models.JSONField(default=list)
    diff = models.TextField(blank=True)

    class Meta:
        constraints: ClassVar = [models.UniqueConstraint(fields=["candidate", "index"], name="edit_unique_index")]
        # The review screens look up identical edits (the same diff) decided before, by the diff's MD5.
        indexes: ClassVar = [models.Index(MD5("diff"), name="atomicedit_diff_md5")]
        ordering: ClassVar = ["candidate_id", "index"]

    def __str__(self) -> str:
        return f"{self.component}: {self.hypothesis[:60]}"


# --- Evaluations, trials, trajectories ---------------------------------------


class Evaluation(models.Model):
    """A batch of trials of one candidate on some splits, certified as one record.

    ``trials_finished`` is advanced with F() by each finishing trial; the one
    that makes it equal ``trials_total`` enqueues certification, and the
    certifier claims the evaluation with a conditional update, so
    certification happens exactly once however often messages are delivered.
    """

    class Purpose(models.TextChoices):
        BASELINE = "baseline"  # the seed's first evaluation
        NOISE = "noise"  # repeated seed evaluations that estimate delta
        CANDIDATE = "candidate"
        TRANSFER = "transfer"  # sealed / held-out reporting

    class State(models.TextChoices):
        RUNNING = "running"
        COMPLETE = "complete"  # every trial finished
        CERTIFYING = "certifying"
        CERTIFIED = "certified"
        FAILED = "failed"
        CANCELLED = "cancelled"
        # Ingested results produced outside the platform (e.g. a Harbor job):
        # never certified, so no certifier, reaper or certified view picks them up.
        EXTERNAL = "external"

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="evaluations", db_index=False)
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="evaluations")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="evaluations")
    purpose = models.CharField(max_length=10, choices=Purpose.choices, default=Purpose.CANDIDATE)
    repeat = models.PositiveSmallIntegerField(default=0)
    splits = models.JSONField(default=list)
    k = models.PositiveSmallIntegerField(default=2)
    seed = models.BigIntegerField(default=0)
    state = models.CharField(max_length=12, choices=State.choices, default=State.RUNNING)
    trials_total = models.PositiveIntegerField(default=0)
    trials_finished = models.PositiveIntegerField(default=0)
    # "bwrap+agent-network+verifier-network", or "mixed:" and several of them.
    sandbox_profile = models.CharField(max_length=100, blank=True)
    # The evaluator's configuration (files, commands, limits) when the
    # evaluation started; certification refuses when it differs by then.
    # Blank for evaluations made elsewhere (external, imported).
    evaluator_digest = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    # True for results ingested from outside (state EXTERNAL): shown as external, never as certified by us.
    external = models.BooleanField(default=False)
    # Where external results came from, as the submitter described it (tool, job id, URL, ...).
    source = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes: ClassVar = [models.Index(fields=["experiment", "state"])]
        constraints: ClassVar = [
            # An external evaluation can never move into a certifiable or certified state.
            models.CheckConstraint(
                condition=Q(external=False) | Q(state="external"), name="evaluation_external_never_certified"
            ),
        ]

    def __str__(self) -> str:
        return f"evaluation {self.pk} of candidate {self.candidate_id}"


class Trial(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        ERROR = "error"  # finished with an explicit error: never a pass
        CANCELLED = "cancelled"

    class Outcome(models.TextChoices):
        PASS = "pass"
        FAIL = "fail"
        ERROR = "error"

    class ErrorKind(models.TextChoices):
        AGENT_TIMEOUT = "agent_timeout"
        AGENT_CRASH = "agent_crash"
        AGENT_OUTPUT = "agent_output"  # flooded or malformed output / trajectory
        VERIFIER_TIMEOUT = "verifier_timeout"
        VERIFIER_CRASH = "verifier_crash"
        VERIFIER_OUTPUT = "verifier_output"
        SANDBOX = "sandbox"  # the sandbox could not be set up
        INFRA = "infra"

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="trials", db_index=False)
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="trials", db_index=False)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="trials")
    split = models.CharField(max_length=10, choices=SplitName.choices)
    index = models.PositiveSmallIntegerField()
    seed = models.BigIntegerField(default=0)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveSmallIntegerField(default=0)
    outcome = models.CharField(max_length=5, choices=Outcome.choices, blank=True)
    score = models.FloatField(null=True, blank=True)
    criteria_results = models.JSONField(default=list, blank=True)
    tokens = models.PositiveBigIntegerField(null=True, blank=True)
    steps = models.PositiveIntegerField(null=True, blank=True)
    wall_time = models.FloatField(null=True, blank=True)
    valid_output = models.BooleanField(null=True, blank=True)
    submitted = models.BooleanField(null=True, blank=True)
    error_kind = models.CharField(max_length=20, choices=ErrorKind.choices, blank=True)
    error = models.TextField(blank=True)
    # "bwrap+agent-network+verifier-network", or "mixed:" and several of them.
    sandbox_profile = models.CharField(max_length=100, blank=True)
    # The digest of the task environment's recipe (evolution/environments.py)
    # the trial ran in: "" when it ran on the host's own system directories.
    environment = models.CharField(max_length=64, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["evaluation", "task", "index"], name="trial_unique_slot"),
            models.CheckConstraint(
                condition=Q(score__isnull=True) | (Q(score__gte=0) & Q(score__lte=1)), name="trial_score_in_unit"
            ),
            models.CheckConstraint(condition=~Q(state="error") | ~Q(outcome="pass"), name="trial_error_never_pass"),
        ]
        indexes: ClassVar = [
            models.Index(fields=["evaluation", "state"]),
            models.Index(fields=["state", "lease_expires_at"]),
            models.Index(fields=["candidate", "task"]),
        ]

    def __str__(self) -> str:
        return f"trial {self.pk} ({self.task_id}#{self.index})"


# Evaluations under way: their trials count once they are certified (``evolution.measurements``).
EVALUATION_UNFINISHED = (Evaluation.State.RUNNING, Evaluation.State.COMPLETE, Evaluation.State.CERTIFYING)


class EvaluationSplitStats(models.Model):
    """The totals of one certified evaluation's trials on one split, stored
    at certification (the trials no longer change then), so screens sum a
    few rows per candidate instead of scanning every trial."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="split_stats", db_index=False)
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="+")
    split = models.CharField(max_length=10, choices=SplitName.choices)
    trials = models.PositiveIntegerField()
    passed = models.PositiveIntegerField()
    errors = models.PositiveIntegerField()  # outcome error (no score counted)
    score_sum = models.FloatField()  # over trials whose outcome is not error
    tokens_sum = models.PositiveBigIntegerField()
    tokens_count = models.PositiveIntegerField()  # trials reporting tokens

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["evaluation", "split"], name="split_stats_unique"),
        ]

    def __str__(self) -> str:
        return f"stats of evaluation {self.evaluation_id} on {self.split}"


class Trajectory(models.Model):
    """A trial's trajectory in an ATIF-compatible shape (steps in TrajectoryStep)."""

    trial = models.OneToOneField(Trial, on_delete=models.CASCADE, related_name="trajectory")
    schema_version = models.CharField(max_length=40, blank=True)
    session_id = models.CharField(max_length=200, blank=True)
    agent = models.JSONField(default=dict, blank=True)
    final_metrics = models.JSONField(default=dict, blank=True)
    notes = models.TextField(blank=True)
    extra = models.JSONField(default=dict, blank=True)
    step_count = models.PositiveIntegerField(default=0)
    redacted = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"trajectory of trial {self.trial_id}"


class TrajectoryStep(models.Model):
    trajectory = models.ForeignKey(Trajectory, on_delete=models.CASCADE, related_name="steps", db_index=False)
    step_id = models.PositiveIntegerField()
    timestamp = models.CharField(max_length=64, blank=True)
    source = models.CharField(max_length=20)  # system, user, agent
    model_name = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    reasoning_content = models.TextField(blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    observation = models.JSONField(default=dict, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    extra = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["trajectory", "step_id"], name="trajectory_step_unique")
        ]
        ordering: ClassVar = ["trajectory_id", "step_id"]

    def __str__(self) -> str:
        return f"step {self.step_id}"


class ParityCheck(models.Model):
    """The outcome of ``manage.py parity``: direct runs of an evaluator's
    commands against the same trials through the platform (see
    ``evolution.parity``). Kept per check; the dashboard shows the latest of
    the experiment's evaluator. ``numbers`` is the command's JSON document."""

    class Verdict(models.TextChoices):
        PASS = "pass"
        FAIL = "fail"

    evaluator = models.ForeignKey(Evaluator, on_delete=models.CASCADE, related_name="parity_checks", db_index=False)
    # The evaluator's configuration when checked: a later change makes the check stale.
    evaluator_digest = models.CharField(max_length=64)
    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="parity_checks")
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="parity_checks")
    iterations = models.PositiveSmallIntegerField()
    numbers = models.JSONField(default=dict)
    verdict = models.CharField(max_length=4, choices=Verdict.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes: ClassVar = [models.Index(fields=["evaluator", "-created_at"], name="parity_evaluator_latest")]

    def __str__(self) -> str:
        return f"parity check {self.pk} of {self.evaluator_id}: {self.verdict}"


# --- Certified records --------------------------------------------------------


# Shared by the two append-only record tables (results and decisions).
_Record = TypeVar("_Record", bound=models.Model)


class CertifiedResultQuerySet(models.QuerySet[_Record]):
    def update(self, **kwargs: Any) -> int:
        raise PermissionError("certified results are append-only")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise PermissionError("certified results are append-only")


class CertifiedResult(models.Model):
    """An append-only, hash-chained, HMAC-signed record of one evaluation.

    ``payload`` is what was certified, stored as its RFC 8785 canonical JSON
    text (the bytes that are hashed); ``record_digest`` = SHA-256 of that
    text, whose payload includes ``prev``; ``signature`` = HMAC-SHA-256 of
    the record digest with the records key. A trigger rejects UPDATE (and
    DELETE on PostgreSQL).
    """

    experiment = models.ForeignKey(
        Experiment, on_delete=models.PROTECT, related_name="certified_results", db_index=False
    )
    seq = models.PositiveIntegerField()
    evaluation = models.OneToOneField(Evaluation, on_delete=models.PROTECT, related_name="certified_result")
    candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="certified_results")
    payload = CanonicalJSONField()
    prev_digest = models.CharField(max_length=64)
    record_digest = models.CharField(max_length=64, unique=True)
    signature = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CertifiedResultQuerySet.as_manager()

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["experiment", "seq"], name="certified_result_unique_seq")
        ]
        ordering: ClassVar = ["experiment_id", "seq"]

    def __str__(self) -> str:
        return f"record {self.experiment_id}#{self.seq} {self.record_digest[:12]}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise PermissionError("certified results are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("certified results are append-only")


class CertifiedDecision(models.Model):
    """An append-only, signed record of a decision, in the same chain as the
    evaluations (``CertifiedResult``): one ``seq`` numbering and one signed
    head per experiment cover both tables.

    ``kind`` is ``gate`` (a gate verdict: the rule, the numbers it used and
    the candidate's resulting state and reason), ``review`` (a reviewer's
    verdict) or ``correction`` (a reviewer's later correction of a review
    verdict, naming the record it corrects). The payload also binds the surface and recipe digests the
    decision was made under. Digest, signature and triggers as for
    ``CertifiedResult``.
    """

    class Kind(models.TextChoices):
        GATE = "gate"
        REVIEW = "review"
        CORRECTION = "correction"  # a review decision's correction (it names the record it corrects)

    experiment = models.ForeignKey(
        Experiment, on_delete=models.PROTECT, related_name="certified_decisions", db_index=False
    )
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices)
    candidate = models.ForeignKey(Candidate, on_delete=models.PROTECT, related_name="certified_decisions")
    payload = CanonicalJSONField()
    prev_digest = models.CharField(max_length=64)
    record_digest = models.CharField(max_length=64, unique=True)
    signature = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CertifiedResultQuerySet.as_manager()

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["experiment", "seq"], name="certified_decision_unique_seq")
        ]
        ordering: ClassVar = ["experiment_id", "seq"]

    def __str__(self) -> str:
        return f"{self.kind} decision {self.experiment_id}#{self.seq} {self.record_digest[:12]}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if not self._state.adding:
            raise PermissionError("certified records are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise PermissionError("certified records are append-only")


# --- Loop decisions and human workflow (filled in by later issues) ----------


class GateDecision(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="gate_decisions", db_index=False)
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="gate_decisions")
    current = models.ForeignKey(Candidate, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    round = models.PositiveIntegerField()
    accepted = models.BooleanField()
    chosen = models.BooleanField(default=False)
    rule = models.CharField(max_length=60)
    explanation = models.TextField(blank=True)
    # dS, dC, delta, novelty, guard values... as computed by the gate.
    numbers = models.JSONField(default=dict)
    # The signed record of this decision (null only for a decision made
    # before decisions were certified that the upgrade could not certify).
    record = models.OneToOneField(
        CertifiedDecision, null=True, blank=True, on_delete=models.PROTECT, related_name="gate_decision"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["run", "candidate", "round"], name="gate_decision_once")
        ]

    def __str__(self) -> str:
        return f"gate {self.candidate_id}: {self.rule}"


class LedgerEntry(models.Model):
    """One atomic edit of a validly measured candidate, with the candidate's dS/dC."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="ledger", db_index=False)
    edit = models.OneToOneField(AtomicEdit, on_delete=models.CASCADE, related_name="ledger_entry")
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="ledger_entries")
    round = models.PositiveIntegerField()
    component = models.CharField(max_length=20, choices=ComponentKind.choices)
    hypothesis = models.TextField()
    delta_score = models.FloatField()
    # Relative change in tokens per trial; null when the harness compared with reported no cost (a rise from 0
    # has no finite relative change).
    delta_cost = models.FloatField(null=True, blank=True)
    # Adopted as the next harness (docs/concepts.md, rule B).
    accepted = models.BooleanField()
    # Passed every rule of the gate. True and not accepted: admissible but a sibling with a higher S was chosen,
    # which does not refute the hypothesis; false: a rule rejected it (refuted).
    admissible = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # The dashboard lists a run's ledger by round, 50 entries a page:
        # read in index order instead of sorting every entry of the run.
        indexes: ClassVar = [models.Index(fields=["run", "round", "id"], name="ledger_run_round")]

    def __str__(self) -> str:
        return f"ledger {self.component} dS={self.delta_score:+.3f}"


class LeakageFlag(models.Model):
    candidate = models.ForeignKey(Candidate, on_delete=models.CASCADE, related_name="leakage_flags")
    edit = models.ForeignKey(AtomicEdit, null=True, blank=True, on_delete=models.CASCADE, related_name="flags")
    rule = models.CharField(max_length=60)
    path = models.CharField(max_length=1024, blank=True)
    line = models.TextField(blank=True)
    matched = models.TextField(blank=True)
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    evidence = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"flag {self.rule} on {self.candidate_id}"


class ReviewItem(models.Model):
    """A flagged candidate in the review queue. One decision per item (later corrections name it)."""

    class State(models.TextChoices):
        OPEN = "open"
        CLAIMED = "claimed"
        PENDING = "pending"  # decided, inside the undo window (``ReviewPending``)
        APPROVED = "approved"
        REJECTED = "rejected"
        PARTIAL = "partial"  # some edits rejected, a derived candidate made

    candidate = models.OneToOneField(Candidate, on_delete=models.CASCADE, related_name="review_item")
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN)
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"review of {self.candidate_id} ({self.state})"


class ReviewDecision(models.Model):
    class Verdict(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"
        REJECT_EDITS = "reject_edits"

    item = models.OneToOneField(ReviewItem, on_delete=models.CASCADE, related_name="decision")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=12, choices=Verdict.choices)
    reason = models.TextField(blank=True)
    rejected_edits = models.ManyToManyField(AtomicEdit, blank=True, related_name="+")
    derived_candidate = models.ForeignKey(Candidate, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    record = models.OneToOneField(
        CertifiedDecision, null=True, blank=True, on_delete=models.PROTECT, related_name="review_decision"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.verdict} by {self.reviewer_id}"


class ReviewPending(models.Model):
    """A decision inside its undo window: nothing has happened yet. It takes effect (becomes a
    ``ReviewDecision``) at ``effective_at``, by a task sent with that eta or by the next reader of the
    queue, the item or the candidate (``review_settle``); undoing it deletes it. ``error`` keeps why it
    could not take effect (the item is then the reviewer's again)."""

    item = models.OneToOneField(ReviewItem, on_delete=models.CASCADE, related_name="pending")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=12, choices=ReviewDecision.Verdict.choices)
    reason = models.TextField()
    rejected_edits = models.JSONField(default=list, blank=True)  # AtomicEdit ids, for REJECT_EDITS
    effective_at = models.DateTimeField(null=True, blank=True)  # null once it failed (see ``error``)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"pending {self.verdict} of item {self.item_id}"


class ReviewCorrection(models.Model):
    """A reviewer's later correction of a review decision that took effect: a new certified decision
    (``record``, schema ``rsiweb.review-correction/1``) that names the record it corrects (the decision's
    or an earlier correction's). ``followed`` lists, in words, what the correction set in motion
    (evaluations withdrawn, taken out of the best, evaluated again)."""

    class Verdict(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"

    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="corrections")
    corrects = models.ForeignKey(CertifiedDecision, on_delete=models.PROTECT, related_name="+")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    verdict = models.CharField(max_length=12, choices=Verdict.choices)
    reason = models.TextField()
    followed = models.JSONField(default=list, blank=True)
    record = models.OneToOneField(
        CertifiedDecision, null=True, blank=True, on_delete=models.PROTECT, related_name="review_correction"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # One correction per corrected record: a correction is corrected by a newer one, never forked.
        constraints: ClassVar = [models.UniqueConstraint(fields=["corrects"], name="review_correction_once")]

    def __str__(self) -> str:
        return f"correction {self.verdict} of item {self.item_id}"


class AnnotationLabel(models.Model):
    """A failure label: the default taxonomy (experiment null) or a team's own."""

    experiment = models.ForeignKey(
        Experiment, null=True, blank=True, on_delete=models.CASCADE, related_name="annotation_labels", db_index=False
    )
    slug = models.SlugField(max_length=60)
    name = models.CharField(max_length=120)
    description = models.TextField(blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["experiment", "slug"], name="label_unique_per_experiment"),
            models.UniqueConstraint(fields=["slug"], condition=Q(experiment__isnull=True), name="label_unique_default"),
        ]

    def __str__(self) -> str:
        return self.name


class AnnotationScoreConfig(models.Model):
    """A score annotators give a trial next to its label, as a Langfuse score config: numeric within an optional
    [minimum, maximum], or yes/no. Belongs to one experiment."""

    class Kind(models.TextChoices):
        NUMERIC = "numeric"
        BOOLEAN = "boolean"

    experiment = models.ForeignKey(
        Experiment, on_delete=models.CASCADE, related_name="annotation_score_configs", db_index=False
    )
    slug = models.SlugField(max_length=60)
    name = models.CharField(max_length=120)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    minimum = models.FloatField(null=True, blank=True, help_text="numeric only; empty for no lower bound")
    maximum = models.FloatField(null=True, blank=True, help_text="numeric only; empty for no upper bound")
    description = models.TextField(blank=True)

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["experiment", "slug"], name="score_config_unique_per_experiment"),
            models.CheckConstraint(
                condition=Q(kind="numeric") | (Q(minimum__isnull=True) & Q(maximum__isnull=True)),
                name="score_config_bounds_numeric_only",
            ),
            models.CheckConstraint(
                condition=Q(minimum__isnull=True) | Q(maximum__isnull=True) | Q(minimum__lt=F("maximum")),
                name="score_config_minimum_below_maximum",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Annotation(models.Model):
    """A person's label on a failed trial. Never changes certified results."""

    trial = models.ForeignKey(Trial, on_delete=models.CASCADE, related_name="annotations", db_index=False)
    author = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    label = models.ForeignKey(AnnotationLabel, on_delete=models.PROTECT, related_name="annotations")
    note = models.TextField(blank=True)
    step = models.ForeignKey(TrajectoryStep, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar = [models.UniqueConstraint(fields=["trial", "author"], name="annotation_one_per_author")]

    def __str__(self) -> str:
        return f"{self.label_id} on {self.trial_id}"


class AnnotationScore(models.Model):
    """One score of an annotation (so of one author, trial and, where the annotation points at one, step).
    A yes/no score is stored as 1.0 or 0.0."""

    annotation = models.ForeignKey(Annotation, on_delete=models.CASCADE, related_name="scores", db_index=False)
    config = models.ForeignKey(AnnotationScoreConfig, on_delete=models.PROTECT, related_name="scores")
    value = models.FloatField()

    class Meta:
        constraints: ClassVar = [
            models.UniqueConstraint(fields=["annotation", "config"], name="annotation_score_once_per_config")
        ]

    def __str__(self) -> str:
        return f"{self.config_id}={self.value} on annotation {self.annotation_id}"


class RecipeComparison(models.Model):
    """One ``compare_recipes`` comparison: how it was asked for and what it measured (``evolution.loop.compare``).

    ``params`` holds the options it ran with (recipes, seeds, seed_start, split_seeds, rounds, candidates, k,
    proposer, transfer_seeds, case_recall_similarity, evaluator), ``command`` the command line that reruns it,
    ``result`` the comparison's JSON once it finished (``Comparison.to_json``); ``error`` why it stopped when it
    failed or was interrupted.
    """

    class Status(models.TextChoices):
        RUNNING = "running"
        FINISHED = "finished"
        FAILED = "failed"
        INTERRUPTED = "interrupted"  # its command stopped before it finished (``compare.comparisons_reap``)

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="comparisons")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RUNNING)
    params = models.JSONField(default=dict)
    command = models.TextField(blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The command's process, ``host:pid:start`` (``compare.process_owner``), and when it last said it is alive.
    owner = models.CharField(max_length=300, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"comparison {self.pk} of experiment {self.experiment_id} ({self.status})"
