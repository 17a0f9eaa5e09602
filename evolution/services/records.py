"""Certification of evaluations and verification of the record chain."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Min, Q, QuerySet, Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from evolution import digests, faults, records
from evolution.fields import json_or_text, json_value
from evolution.models import (
    EVALUATION_UNFINISHED,
    Candidate,
    CertifiedDecision,
    CertifiedResult,
    Evaluation,
    EvaluationSplitStats,
    Evaluator,
    Experiment,
    GateDecision,
    LeakageFlag,
    Recipe,
    ReviewCorrection,
    ReviewDecision,
    ReviewItem,
    Run,
    SplitMembership,
    SplitName,
    Trial,
)
from evolution.recipes import INFRA_ERROR_KINDS, EvaluationSpec, parse_recipe
from evolution.services.candidates import candidates_transition
from evolution.services.experiments import split_digests_compute
from evolution.services.snapshots import tree_verify

logger = logging.getLogger(__name__)


def evaluation_sandbox_profile(profiles: set[str]) -> str:
    """One profile for an evaluation; trials run by differently equipped
    workers are recorded as mixed so nobody reads them as fully isolated."""
    if not profiles:
        return "none"
    if len(profiles) == 1:
        return next(iter(profiles))
    return "mixed:" + ",".join(sorted(profiles))


def evaluator_config_digest(evaluator: Evaluator) -> str:
    """The evaluator's files, commands, environment, timeout and limits,
    without a sandbox profile (known only once trials ran)."""
    return _evaluator_digest(evaluator, "")


def evaluator_digest_for(evaluation: Evaluation, sandbox_profile: str) -> str:
    return _evaluator_digest(evaluation.experiment.evaluator, sandbox_profile)


def _evaluator_digest(evaluator: Evaluator, sandbox_profile: str) -> str:
    return digests.evaluator_digest(
        files_tree=evaluator.files_id,
        runner_argv=evaluator.runner_argv,
        verifier_argv=evaluator.verifier_argv,
        env_allowlist=evaluator.env_allowlist,
        timeout_seconds=evaluator.timeout_seconds,
        limits=evaluator.limits,
        sandbox_profile=sandbox_profile,
        agent_network=evaluator.agent_network,
    )


TRIAL_ORDER = ("split", "task__external_id", "index")


# Record key -> Trial field, in the order a record lists them.
TRIAL_ROW_FIELDS = {
    "task": "task__external_id",
    "split": "split",
    "index": "index",
    "seed": "seed",
    "outcome": "outcome",
    "score": "score",
    "criteria": "criteria_results",
    "tokens": "tokens",
    "steps": "steps",
    "valid_output": "valid_output",
    "submitted": "submitted",
    "error_kind": "error_kind",
}


def trial_row(trial: Trial, task_external_id: str) -> dict[str, Any]:
    """The facts a record binds of one trial (``task_external_id`` is its task's)."""
    return {key: task_external_id if key == "task" else getattr(trial, name) for key, name in TRIAL_ROW_FIELDS.items()}


def trial_rows(evaluation: Evaluation) -> list[dict[str, Any]]:
    """The per-trial facts a record binds, in a stable order.

    Wall time is left out on purpose: it is noise, and leaving it out lets a
    resumed run produce byte-identical records to an uninterrupted one.
    """
    return trial_rows_by_evaluation([evaluation.pk]).get(evaluation.pk, [])


def trial_rows_by_evaluation(evaluation_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """``trial_rows`` of several evaluations in one query, by evaluation id."""
    keys = list(TRIAL_ROW_FIELDS)
    rows: dict[int, list[dict[str, Any]]] = {}
    values = (
        Trial.objects.filter(evaluation_id__in=evaluation_ids)
        .order_by("evaluation_id", *TRIAL_ORDER)
        .values_list("evaluation_id", *TRIAL_ROW_FIELDS.values())
    )
    for evaluation_id, *fields in values:
        rows.setdefault(evaluation_id, []).append(dict(zip(keys, fields, strict=True)))
    return rows


def _payload(evaluation: Evaluation, *, seq: int, prev: str, task_sets: dict[str, str]) -> dict[str, Any]:
    facts = Trial.objects.filter(evaluation=evaluation).values_list("sandbox_profile", "environment").distinct()
    profiles = {profile for profile, _ in facts}
    return payload_build(
        evaluation,
        seq=seq,
        prev=prev,
        task_sets=task_sets,
        profile=evaluation_sandbox_profile(profiles),
        trials=trial_rows(evaluation),
        environments=sorted({environment for _, environment in facts if environment}),
    )


def payload_build(
    evaluation: Evaluation,
    *,
    seq: int,
    prev: str,
    task_sets: dict[str, str],
    profile: str,
    trials: list[dict[str, Any]],
    environments: list[str] | None = None,
) -> dict[str, Any]:
    """The payload certifying ``evaluation`` from its trial rows (``trial_row``,
    in ``TRIAL_ORDER``) and sandbox profile. No queries when the evaluation's
    experiment, evaluator, recipe, candidate and parent are loaded.
    ``environments``: the digests of the Debian-built task environments its
    trials ran in (evolution/environments.py); bound as
    ``evaluator.environments`` only when there are some, so records of
    trials on the host's system are what they were before environments."""
    experiment = evaluation.experiment
    candidate = evaluation.candidate
    built = {"environments": environments} if environments else {}
    return {
        "schema": records.SCHEMA,
        "experiment": str(experiment.uid),
        "seq": seq,
        "prev": prev,
        "evaluation": {
            "purpose": evaluation.purpose,
            "repeat": evaluation.repeat,
            "splits": sorted(evaluation.splits),
            "k": evaluation.k,
            "seed": evaluation.seed,
        },
        "candidate": {
            "tree": candidate.tree_id,
            "parent_tree": candidate.parent.tree_id if candidate.parent is not None else None,
            "origin": candidate.origin,
        },
        "evaluator": {
            "name": experiment.evaluator.name,
            "files": experiment.evaluator.files_id,
            "sandbox_profile": profile,
            "digest": evaluator_digest_for(evaluation, profile),
            **built,
        },
        "task_sets": {split: task_sets[split] for split in sorted(evaluation.splits)},
        "recipe": experiment.recipe.digest if experiment.recipe is not None else None,
        "surface": experiment.surface.digest,
        "run_settings": experiment.run_settings,
        "k": evaluation.k,
        "trials": trials,
    }


def split_totals() -> dict[str, Any]:
    """The totals of a split's trials as ``EvaluationSplitStats`` stores
    them, as aggregates for ``annotate`` (stored by ``split_stats_store``,
    recomputed by ``scores_verify``)."""
    return {
        "n": Count("pk"),
        "passed": Count("pk", filter=Q(outcome=Trial.Outcome.PASS)),
        "errors": Count("pk", filter=Q(outcome=Trial.Outcome.ERROR)),
        "score_sum": Sum("score", filter=~Q(outcome=Trial.Outcome.ERROR), default=0.0),
        "tokens_sum": Sum("tokens", default=0),
        "tokens_count": Count("tokens"),
    }


def split_stats_store(*, evaluations: QuerySet[Evaluation]) -> int:
    """Store per-split trial totals of ``evaluations`` (certified ones: their
    trials no longer change) in one aggregate query and one insert. Safe to
    repeat: existing rows are kept. Returns the rows written or kept."""
    rows: Iterable[Mapping[str, Any]] = (
        Trial.objects.filter(evaluation__in=evaluations)
        .values("evaluation_id", "candidate_id", "split")
        .annotate(**split_totals())
        .order_by()
    )
    stats = [
        EvaluationSplitStats(
            evaluation_id=row["evaluation_id"],
            candidate_id=row["candidate_id"],
            split=row["split"],
            trials=row["n"],
            passed=row["passed"],
            errors=row["errors"],
            score_sum=row["score_sum"] or 0.0,
            tokens_sum=row["tokens_sum"] or 0,
            tokens_count=row["tokens_count"],
        )
        for row in rows
    ]
    EvaluationSplitStats.objects.bulk_create(stats, batch_size=2000, ignore_conflicts=True)
    return len(stats)


def _infra_errors(evaluation: Evaluation) -> str:
    """Why the evaluation is not a score, when more of its trials than its recipe allows
    (``evaluation.max_infra_error_rate``) ended in infrastructure errors: the counts by kind. Empty otherwise."""
    spec = evaluation.run.recipe.spec if evaluation.run_id and evaluation.run else None
    if spec is None and evaluation.experiment.recipe is not None:
        spec = evaluation.experiment.recipe.spec
    limit = parse_recipe(spec).evaluation.max_infra_error_rate if spec else EvaluationSpec.max_infra_error_rate
    total = Trial.objects.filter(evaluation=evaluation).count()
    kinds = dict(
        Trial.objects.filter(evaluation=evaluation, outcome=Trial.Outcome.ERROR, error_kind__in=INFRA_ERROR_KINDS)
        .values_list("error_kind")
        .annotate(n=Count("pk"))
        .order_by("-n", "error_kind")
    )
    failed = sum(kinds.values())
    if not total or failed / total <= limit + 1e-12:
        return ""
    counts = ", ".join(f"{kind} {n}" for kind, n in kinds.items())
    return (
        f"not a score: {failed} of {total} trials ({failed / total:.0%}) ended in infrastructure errors ({counts}), "
        f"more than the {limit:.0%} the recipe allows (evaluation.max_infra_error_rate)"
    )


@dataclass(frozen=True)
class Certification:
    """What ``evaluation_certify`` did, for its caller to act on (the loop pauses or advances the run).

    ``record``: the evaluation's record, new or existing (None when nothing is certified). ``run_id``: the
    evaluation's run when this call changed the evaluation (certified or refused it), else None. ``refused``: why
    certification was refused now ("" otherwise); ``infra_errors``: the same reason when it was that more trials
    than the recipe allows ended in infrastructure errors (a team fixes its sandbox or grader, then resumes).
    """

    record: CertifiedResult | None
    run_id: int | None = None
    candidate_id: int | None = None
    purpose: str = ""
    refused: str = ""
    infra_errors: str = ""


def result_certify(*, evaluation_id: int) -> CertifiedResult | None:
    """``evaluation_certify``'s record. Touches no run: a run's evaluations are certified by
    ``evolution.loop.certify.result_certify`` (the task's), which also pauses or advances the run."""
    return evaluation_certify(evaluation_id=evaluation_id).record


def evaluation_certify(*, evaluation_id: int) -> Certification:
    """Certify a complete evaluation: append a signed record to the
    experiment's chain and mark the candidate certified.

    Safe to repeat and to run concurrently: the evaluation row is locked and
    only a COMPLETE evaluation is certified, in one transaction with the
    record and the new chain head, so a crash anywhere leaves either nothing
    or everything. The record (existing or new) is None when the
    evaluation is not complete or certification was refused (the evaluation
    is then FAILED with the reason, which the answer carries). Sends nothing
    and never pauses a run: the caller decides what the answer means for the
    evaluation's run; calling inside the caller's transaction makes both one.
    """
    with transaction.atomic():
        evaluation = (
            # Lock only the evaluation row: the nullable joins (recipe, parent)
            # cannot be locked on PostgreSQL and need not be.
            Evaluation.objects.select_for_update(no_key=True, of=("self",))
            .select_related("experiment__evaluator", "experiment__recipe", "candidate__parent")
            .get(pk=evaluation_id)
        )
        if evaluation.state == Evaluation.State.CERTIFIED:
            return Certification(evaluation.certified_result)
        if evaluation.state != Evaluation.State.COMPLETE:
            return Certification(None)
        # The lock on the experiment row serializes appends to its chain.
        experiment = Experiment.objects.select_for_update(no_key=True).get(pk=evaluation.experiment_id)
        evaluation.experiment = experiment

        problems = tree_verify(tree_digest=experiment.evaluator.files_id)
        if evaluation.evaluator_digest and evaluation.evaluator_digest != evaluator_config_digest(experiment.evaluator):
            problems.append("the evaluator (its files, commands or limits) changed since the evaluation started")
        problems += tree_verify(tree_digest=evaluation.candidate.tree_id)
        task_sets = split_digests_compute(experiment=experiment)
        for split in evaluation.splits:
            if task_sets.get(split) != experiment.split_digests.get(split):
                problems.append(f"task set of split {split!r} changed since the splits were frozen")
        infra = _infra_errors(evaluation)
        if problems or infra:
            reason = "certification refused: " + "; ".join(problems) if problems else infra
            logger.error("evaluation %s: %s", evaluation.pk, reason)
            Evaluation.objects.filter(pk=evaluation.pk).update(state=Evaluation.State.FAILED, error=reason)
            candidates_transition(
                candidates=Candidate.objects.filter(pk=evaluation.candidate_id, state=Candidate.State.EVALUATED),
                to=Candidate.State.FAILED,
                reason=reason,
            )
            return Certification(
                None,
                run_id=evaluation.run_id,
                candidate_id=evaluation.candidate_id,
                purpose=evaluation.purpose,
                refused=reason,
                infra_errors=infra,
            )

        seq = experiment.chain_length + 1
        prev = experiment.chain_head or records.GENESIS
        payload = _payload(evaluation, seq=seq, prev=prev, task_sets=task_sets)
        digest = records.record_digest(payload)
        key = settings.RSI_RECORDS_KEY
        uid = str(experiment.uid)
        record = CertifiedResult.objects.create(
            experiment=experiment,
            seq=seq,
            evaluation=evaluation,
            candidate_id=evaluation.candidate_id,
            payload=payload,
            prev_digest=prev,
            record_digest=digest,
            signature=records.record_signature(key, experiment_uid=uid, seq=seq, digest=digest),
        )
        faults.checkpoint("certify:after_record")
        Experiment.objects.filter(pk=experiment.pk).update(
            chain_length=seq,
            chain_head=digest,
            chain_head_signature=records.head_signature(key, experiment_uid=uid, length=seq, head=digest),
        )
        now = timezone.now()
        Evaluation.objects.filter(pk=evaluation.pk).update(
            state=Evaluation.State.CERTIFIED, sandbox_profile=payload["evaluator"]["sandbox_profile"]
        )
        split_stats_store(evaluations=Evaluation.objects.filter(pk=evaluation.pk))
        Candidate.objects.select_for_update(no_key=True).filter(pk=evaluation.candidate_id).first()
        unfinished = Evaluation.objects.filter(
            candidate_id=evaluation.candidate_id,
            state__in=EVALUATION_UNFINISHED,
        )
        if not unfinished.exists():
            candidates_transition(
                candidates=Candidate.objects.filter(pk=evaluation.candidate_id),
                to=Candidate.State.CERTIFIED,
                certified_at=now,
            )
        faults.checkpoint("certify:before_commit")
        return Certification(
            record, run_id=evaluation.run_id, candidate_id=evaluation.candidate_id, purpose=evaluation.purpose
        )


# --- Decisions in the chain ---------------------------------------------------------------


def _decision_append(
    *, experiment_id: int, candidate_id: int, kind: str, build: Callable[[Experiment, int, str], dict[str, Any]]
) -> CertifiedDecision:
    """Append one decision record to the experiment's chain and move the
    signed head, under the experiment's row lock (the lock result_certify
    takes: appends are serialized). Inside the caller's transaction."""
    experiment = Experiment.objects.select_for_update(no_key=True).get(pk=experiment_id)
    seq = experiment.chain_length + 1
    prev = experiment.chain_head or records.GENESIS
    payload = build(experiment, seq, prev)
    digest = records.record_digest(payload)
    key = settings.RSI_RECORDS_KEY
    uid = str(experiment.uid)
    record = CertifiedDecision.objects.create(
        experiment=experiment,
        seq=seq,
        kind=kind,
        candidate_id=candidate_id,
        payload=payload,
        prev_digest=prev,
        record_digest=digest,
        signature=records.record_signature(key, experiment_uid=uid, seq=seq, digest=digest),
    )
    Experiment.objects.filter(pk=experiment.pk).update(
        chain_length=seq,
        chain_head=digest,
        chain_head_signature=records.head_signature(key, experiment_uid=uid, length=seq, head=digest),
    )
    return record


def _surface_digest(experiment: Experiment) -> str:
    return str(experiment.surface.digest)


FLAG_FIELDS = ("rule", "path", "line", "matched")


def critic_outcome_of(*, candidate_id: int) -> records.CriticOutcome:
    """The critic's flags of one candidate as a gate record binds them. Read-only."""
    return records.critic_outcome(LeakageFlag.objects.filter(candidate_id=candidate_id).values_list(*FLAG_FIELDS))


def review_standing(*, candidate_id: int) -> tuple[str, CertifiedDecision] | None:
    """The review verdict that stands for a candidate, with its certified record: the latest correction's,
    else the decision's (None when no certified review decided it). Read-only."""
    correction = (
        ReviewCorrection.objects.filter(item__candidate_id=candidate_id, record__isnull=False)
        .select_related("record")
        .order_by("-record__seq")
        .first()
    )
    if correction is not None and correction.record is not None:
        return correction.verdict, correction.record
    decision = (
        ReviewDecision.objects.filter(item__candidate_id=candidate_id, record__isnull=False)
        .select_related("record")
        .first()
    )
    if decision is not None and decision.record is not None:
        return decision.verdict, decision.record
    return None


def review_approval_of(*, candidate_id: int) -> records.ReviewBasis | None:
    """The certified review decision (or correction) approving the candidate that stands, if any. Read-only."""
    standing = review_standing(candidate_id=candidate_id)
    if standing is None or standing[0] != ReviewDecision.Verdict.APPROVE:
        return None
    return records.ReviewBasis(standing[1].seq, standing[1].record_digest)


def review_missing(*, candidate_id: int) -> str:
    """Why a candidate may not be measured for a gate: the critic flagged it
    (or held it for a reviewer) and no certified review decision approved
    it. Empty when nothing is missing. Read-only."""
    flags = LeakageFlag.objects.filter(candidate_id=candidate_id).count()
    held = ReviewItem.objects.filter(candidate_id=candidate_id).exists()
    if (flags or held) and review_approval_of(candidate_id=candidate_id) is None:
        return f"it has {flags} critic flag(s) and no certified review decision approving it"
    return ""


def gate_decision_certify(*, decision: GateDecision) -> CertifiedDecision:
    """Certify a gate decision: a signed record in the experiment's chain of
    the verdict, the rule, the numbers it used, the candidate's state and
    reason as the gate left them, the recipe (the run's) and surface
    digests, the critic's flags of the candidate and the certified review
    decision that approved it (``records.gate_payload``, version 2). Call it
    in the gate's transaction, after the candidate's transition. Safe to
    repeat: a certified decision returns its record."""
    with transaction.atomic():
        locked = GateDecision.objects.select_for_update(no_key=True).get(pk=decision.pk)
        if locked.record_id is not None:
            decision.record_id = locked.record_id
            return CertifiedDecision.objects.get(pk=locked.record_id)
        candidate = Candidate.objects.get(pk=locked.candidate_id)
        run = Run.objects.select_related("recipe").get(pk=locked.run_id)
        current = (
            Candidate.objects.filter(pk=locked.current_id).values_list("tree_id", flat=True).first()
            if locked.current_id is not None
            else None
        )

        def build(experiment: Experiment, seq: int, prev: str) -> dict[str, Any]:
            return records.gate_payload(
                experiment_uid=str(experiment.uid),
                seq=seq,
                prev=prev,
                candidate_tree=candidate.tree_id,
                current_tree=current,
                round=locked.round,
                accepted=locked.accepted,
                chosen=locked.chosen,
                rule=locked.rule,
                explanation=locked.explanation,
                numbers=locked.numbers,
                state=candidate.state,
                reason=candidate.state_reason,
                recipe=run.recipe.digest,
                surface=_surface_digest(experiment),
                critic=critic,
                review=approval,
            )

        critic = critic_outcome_of(candidate_id=candidate.pk)
        approval = review_approval_of(candidate_id=candidate.pk)
        record = _decision_append(
            experiment_id=candidate.experiment_id,
            candidate_id=candidate.pk,
            kind=CertifiedDecision.Kind.GATE,
            build=build,
        )
        GateDecision.objects.filter(pk=locked.pk).update(record=record)
        decision.record = record
        return record


def review_decision_certify(*, decision: ReviewDecision) -> CertifiedDecision:
    """Certify a review decision: verdict, reason, reviewer, the rejected
    atomic edits (by index), the derived candidate's tree, the reviewed
    candidate's state and reason after the decision, and the recipe and
    surface digests. Call it in the review's transaction, once the rejected
    edits are set. Safe to repeat."""
    with transaction.atomic():
        locked = ReviewDecision.objects.select_for_update(no_key=True).get(pk=decision.pk)
        if locked.record_id is not None:
            decision.record_id = locked.record_id
            return CertifiedDecision.objects.get(pk=locked.record_id)
        candidate = Candidate.objects.get(review_item__pk=locked.item_id)
        recipe = (
            Run.objects.filter(pk=candidate.run_id).values_list("recipe__digest", flat=True).first()
            if candidate.run_id
            else None
        )
        rejected = list(locked.rejected_edits.values_list("index", flat=True))
        derived = (
            Candidate.objects.filter(pk=locked.derived_candidate_id).values_list("tree_id", flat=True).first()
            if locked.derived_candidate_id is not None
            else None
        )

        def build(experiment: Experiment, seq: int, prev: str) -> dict[str, Any]:
            return records.review_payload(
                experiment_uid=str(experiment.uid),
                seq=seq,
                prev=prev,
                candidate_tree=candidate.tree_id,
                verdict=locked.verdict,
                reason=locked.reason,
                reviewer=locked.reviewer.get_username(),
                rejected_edits=rejected,
                derived_tree=derived,
                state=candidate.state,
                state_reason=candidate.state_reason,
                recipe=recipe or (experiment.recipe.digest if experiment.recipe is not None else None),
                surface=_surface_digest(experiment),
            )

        record = _decision_append(
            experiment_id=candidate.experiment_id,
            candidate_id=candidate.pk,
            kind=CertifiedDecision.Kind.REVIEW,
            build=build,
        )
        ReviewDecision.objects.filter(pk=locked.pk).update(record=record)
        decision.record = record
        return record


def review_correction_certify(*, correction: ReviewCorrection, withdrawn: Candidate | None = None) -> CertifiedDecision:
    """Certify a correction of a review decision (``records.correction_payload``), a record of kind
    ``correction``: the record it corrects and the verdict that record certified, verdict, reason, reviewer,
    the candidate's state and reason after it, and ``withdrawn``, the candidate a corrected partial decision
    derived, with its state and reason after the correction withdrew it. Call it in the correction's
    transaction, after the candidates' transitions. Safe to repeat."""
    with transaction.atomic():
        locked = ReviewCorrection.objects.select_for_update(no_key=True).get(pk=correction.pk)
        if locked.record_id is not None:
            correction.record_id = locked.record_id
            return CertifiedDecision.objects.get(pk=locked.record_id)
        candidate = Candidate.objects.get(review_item__pk=locked.item_id)
        corrected = CertifiedDecision.objects.get(pk=locked.corrects_id)
        corrected_review = corrected.payload.get("review") if isinstance(corrected.payload, dict) else None
        recipe = (
            Run.objects.filter(pk=candidate.run_id).values_list("recipe__digest", flat=True).first()
            if candidate.run_id
            else None
        )

        def build(experiment: Experiment, seq: int, prev: str) -> dict[str, Any]:
            return records.correction_payload(
                experiment_uid=str(experiment.uid),
                seq=seq,
                prev=prev,
                candidate_tree=candidate.tree_id,
                corrects_seq=corrected.seq,
                corrects_record=corrected.record_digest,
                corrects_verdict=str((corrected_review or {}).get("verdict")),
                withdrawn=None
                if withdrawn is None
                else {"tree": withdrawn.tree_id, "state": withdrawn.state, "reason": withdrawn.state_reason},
                verdict=locked.verdict,
                reason=locked.reason,
                reviewer=locked.reviewer.get_username(),
                state=candidate.state,
                state_reason=candidate.state_reason,
                recipe=recipe or (experiment.recipe.digest if experiment.recipe is not None else None),
                surface=_surface_digest(experiment),
            )

        record = _decision_append(
            experiment_id=candidate.experiment_id,
            candidate_id=candidate.pk,
            kind=CertifiedDecision.Kind.CORRECTION,
            build=build,
        )
        ReviewCorrection.objects.filter(pk=locked.pk).update(record=record)
        correction.record = record
        return record


@dataclass
class VerifyReport:
    checked: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# Records read per round trip by records_verify (their trials: four times as many rows).
VERIFY_BATCH = 2000


def records_verify(*, experiment: Experiment | None = None) -> VerifyReport:
    """Recompute every digest behind the certified records and the chains.

    Checks, per experiment: the chain (links, digests, signatures, signed
    head); every candidate tree and the evaluator's files against their
    blobs; the evaluator digest; each split's task set against the frozen
    digest and the records; each record's trials against the trial rows;
    and the decision records (``decisions_verify``): gate and review
    decisions, candidate states, surface and recipes. Read-only; safe to run
    at any time. The records and their trial rows are streamed (two queries
    in seq order, read side by side), so memory stays bounded however long
    the chain; decision records (one per gated or reviewed candidate) are
    read whole and fed into the chain in seq order.
    """
    # In a transaction, PostgreSQL's server-side cursors are not WITH HOLD:
    # rows are produced as they are fetched instead of the whole result being
    # materialized when the cursor is declared (in autocommit).
    with transaction.atomic():
        return _records_verify(experiment)


def _records_verify(experiment: Experiment | None) -> VerifyReport:
    report = VerifyReport()
    key = settings.RSI_RECORDS_KEY
    experiments = [experiment] if experiment else list(Experiment.objects.order_by("pk"))
    for exp in experiments:
        exp = Experiment.objects.select_related("evaluator", "recipe", "surface").get(pk=exp.pk)
        label = f"experiment {exp.pk} {exp.name!r}"
        uid = str(exp.uid)
        chain = records.ChainChecker(key=key, experiment_uid=uid)
        task_sets = split_digests_compute(experiment=exp)
        record_problems: list[str] = []
        trees_checked: set[str] = set()
        trial_count = 0
        # Plain values and the payload's stored canonical text (the bytes the
        # digest is over: hashed as stored, parsed once for the checks), no
        # model instances. The records and their trial rows are two streams
        # in seq order, walked side by side.
        rows = streamed_rows(
            CertifiedResult.objects.filter(experiment=exp)
            .order_by("seq")
            .annotate(payload_text=Cast("payload", output_field=TextField()))
            .values_list(
                "seq",
                "prev_digest",
                "record_digest",
                "signature",
                "evaluation_id",
                "evaluation__experiment_id",
                "evaluation__candidate__tree_id",
                "payload_text",
                "evaluation__purpose",
                "evaluation__repeat",
                Cast("evaluation__splits", TextField()),
                "evaluation__k",
                "evaluation__seed",
                "evaluation__candidate__parent__tree_id",
                "evaluation__candidate__origin",
            ),
            VERIFY_BATCH,
        )
        recipe_digest = exp.recipe.digest if exp.recipe is not None else None
        run_settings = settings_bound(exp.run_settings)
        trials = trial_rows_by_seq(exp)
        next_trials = next(trials, None)
        # (evaluation, split) -> the totals of its trials, for every evaluation a record binds (for
        # ``scores_verify``). Flat, of tuples of plain values: the garbage collector stops tracking
        # such tuples once it has seen them, where a dict of lists a record stayed tracked and made
        # each full collection walk the whole chain's totals again (a fifth of the CPU at 20,000 records).
        recomputed: dict[tuple[int, str], tuple[Any, ...]] = {}
        decisions = _decision_rows(exp)
        fed = 0
        recipes_named: set[str] = set()
        surface_digest, experiment_id = exp.surface.digest, exp.pk
        here = f"{label} record #"
        # A record equal to the one the database implies (``_implied_payload``)
        # passes every check below by construction: its canonical bytes are
        # compared instead of parsing it and checking field by field, which
        # was most of the work (issue 44). Any other record is checked field
        # by field, and that check alone reports problems.
        implied = _ImpliedPayloads(exp, task_sets=task_sets, recipe=recipe_digest)
        for (
            seq,
            prev_digest,
            digest,
            signature,
            evaluation_id,
            evaluation_experiment,
            tree,
            text,
            *evaluation_fields,
            parent_tree,
            origin,
        ) in rows:
            while fed < len(decisions) and decisions[fed].seq < seq:  # the decisions before it, in seq order
                chain.add(decisions[fed], canonical=decisions[fed].canonical)
                fed += 1
            while next_trials is not None and next_trials.seq < seq:  # cannot happen: both streams follow seq
                next_trials = next(trials, None)
            stored = EMPTY_TRIALS
            if next_trials is not None and next_trials.seq == seq:
                stored = next_trials
                next_trials = next(trials, None)
            for split, totals in stored.totals.items():
                recomputed[evaluation_id, split] = totals
            canonical = text.encode()
            if tree not in trees_checked:
                trees_checked.add(tree)
                record_problems += [f"{here}{seq}: candidate tree: {p}" for p in tree_verify(tree_digest=tree)]
            if evaluation_experiment == experiment_id:
                payload = implied.payload(
                    seq, prev_digest, tree, evaluation_fields, parent_tree, origin, stored, canonical
                )
                if payload is not None:
                    chain.add_named(
                        records.StreamedRecord(seq, prev_digest, digest, signature, payload), canonical=canonical
                    )
                    trial_count += len(stored.rows)
                    if recipe_digest:
                        recipes_named.add(recipe_digest)
                    continue
            payload = json_or_text(text)
            chain.add(records.StreamedRecord(seq, prev_digest, digest, signature, payload), canonical=canonical)
            if not isinstance(payload, dict):  # reported by the chain check
                payload = {}
            if payload.get("recipe"):
                recipes_named.add(str(payload["recipe"]))
            if "surface" in payload and payload["surface"] != surface_digest:
                record_problems.append(f"{here}{seq}: surface changed since this record (its digest differs)")
            if payload.get("candidate", {}).get("tree") != tree:
                record_problems.append(f"{here}{seq}: candidate tree differs from the certified one")
            differ = _bound_differences(
                payload,
                evaluation_fields,
                parent_tree=parent_tree,
                origin=origin,
                recipe=recipe_digest,
                run_settings=run_settings,
            )
            if differ:
                record_problems.append(f"{here}{seq}: {', '.join(differ)} differ(s) from the certified one")
            certified_evaluator = payload.get("evaluator", {})
            profile = certified_evaluator.get("sandbox_profile", "")
            if evaluation_experiment != experiment_id:  # a record pointing into another experiment
                evaluation = Evaluation.objects.select_related("experiment__evaluator").get(pk=evaluation_id)
                current_digest = evaluator_digest_for(evaluation, profile)
            else:
                current_digest = implied.evaluator_digest(profile)
                implied.profile = (
                    profile if isinstance(profile, str) else None
                )  # the next record most likely names the same
            if certified_evaluator.get("digest") != current_digest:
                record_problems.append(f"{here}{seq}: evaluator (commands, files, environment or limits) changed")
            if certified_evaluator.get("environments", []) != stored.environments:
                record_problems.append(
                    f"{here}{seq}: the trials' Debian-built environments differ from the certified ones"
                )
            certified_sets = payload.get("task_sets", {})
            if certified_sets != task_sets:  # a record of some of the splits, or a task set changed
                for split, split_digest in certified_sets.items():
                    if task_sets.get(split) != split_digest:
                        record_problems.append(f"{here}{seq}: task set of split {split!r} changed")
            certified = payload.get("trials", [])
            trial_count += len(certified) if isinstance(certified, list) else 1
            changed = trial_rows_differing(stored.rows, certified)
            if changed:
                record_problems.append(f"{here}{seq}: {changed} trial row(s) differ from the certified results")

        for decision in decisions[fed:]:
            chain.add(decision, canonical=decision.canonical)

        head = records.ChainHead(exp.chain_length, exp.chain_head, exp.chain_head_signature)
        report.problems += [f"{label}: {p}" for p in chain.finish(head)]
        report.checked.append(f"{label}: chain of {chain.count} record(s), links, digests and signatures")
        decision_problems, checked = decisions_verify(exp, decisions, recipes_named=recipes_named)
        report.problems += [f"{label}: {p}" for p in decision_problems]
        report.checked.append(f"{label}: {checked}")

        evaluator_problems = tree_verify(tree_digest=exp.evaluator.files_id)
        report.problems += [f"{label}: evaluator files: {p}" for p in evaluator_problems]
        report.checked.append(f"{label}: evaluator {exp.evaluator.name!r} files {exp.evaluator.files_id[:12]}")

        heldout = set(exp.heldout_benchmarks.filter(tasks__isnull=False).values_list("name", flat=True))
        in_split = set(
            SplitMembership.objects.filter(experiment=exp, split=SplitName.HELDOUT).values_list(
                "task__benchmark__name", flat=True
            )
        )
        if heldout != in_split:  # the held-out split's digest (bound by the records) names the benchmarks
            report.problems.append(f"{label}: held-out benchmarks differ from the tasks of the held-out split")
        for split, digest in sorted(exp.split_digests.items()):
            if task_sets.get(split) != digest:
                report.problems.append(f"{label}: task set of split {split!r} no longer matches its frozen digest")
        report.checked.append(f"{label}: task sets {', '.join(sorted(exp.split_digests)) or '(none)'}")

        report.problems += record_problems
        report.checked.append(f"{label}: {len(trees_checked)} candidate tree(s), {trial_count} trial(s)")
        score_problems, checked = scores_verify(exp, recomputed=recomputed)
        report.problems += [f"{label}: {p}" for p in score_problems]
        report.checked.append(f"{label}: {checked}")
    return report


class _ImpliedPayloads:
    """The payload ``payload_build`` writes for a record of ``experiment``,
    made from what the database holds now (its rows, the evaluator digest,
    the task sets, the trial rows), for ``_records_verify``'s fast path.

    A record whose stored canonical text is exactly this payload's passes
    every check ``_records_verify`` makes of it field by field (each compares
    a payload field with the same database value), so it is compared as
    bytes. The payload is serialized with orjson, built with every object's
    keys in sorted order (the trial rows as ``trial_rows_by_seq`` makes them,
    criteria results and run settings re-read key-sorted), so orjson need
    not sort them: for the values made here (text, 64-bit integers, integral floats written as
    integers, finite floats, booleans, null) those are the canonical bytes,
    and the text parses back to the payload; a value that orjson would not
    write faithfully (a float that is not finite) gives None, and so does a
    payload whose bytes differ in any way: that record is checked field by
    field."""

    def __init__(self, experiment: Experiment, *, task_sets: dict[str, str], recipe: str | None) -> None:
        self.experiment, self.task_sets, self.recipe = experiment, task_sets, recipe
        self.uid = str(experiment.uid)
        # The sandbox profile the last record checked field by field named (the first record always is).
        self.profile: str | None = None
        self.digests: dict[str, str] = {}
        self.splits: dict[str, tuple[list[str], dict[str, str]] | None] = {}
        run_settings = _as_written(experiment.run_settings)
        self.settings_faithful = run_settings is not _UNFAITHFUL
        # Read once: the same for every record.
        self.evaluator, self.surface, self.run_settings = (
            experiment.evaluator,
            experiment.surface.digest,
            run_settings,
        )
        # Sandbox profile -> the evaluator as a record of it binds it (without environments).
        self.evaluators: dict[str, dict[str, Any]] = {}

    def evaluator_digest(self, profile: str) -> str:
        """The evaluator's digest under ``profile``, as certification computes it (once a profile)."""
        digest = self.digests.get(profile)
        if digest is None:
            digest = self.digests[profile] = _evaluator_digest(self.evaluator, profile)
        return digest

    def payload(
        self,
        seq: int,
        prev: str,
        tree: str,
        evaluation_fields: list[Any],
        parent_tree: str | None,
        origin: str,
        stored: StoredTrials,
        canonical: bytes,
    ) -> dict[str, Any] | None:
        """The record's payload when ``canonical`` is exactly the payload the
        database implies for it (its evaluation's fields, its candidate,
        ``stored``: its trial rows); None otherwise. Pure but for caches."""
        purpose, repeat, splits_text, k, seed = evaluation_fields
        if splits_text not in self.splits:
            if len(self.splits) >= CRITERIA_PARSED_KEPT:
                self.splits.clear()
            self.splits[splits_text] = self._splits(splits_text)
        splits = self.splits[splits_text]
        if splits is None or self.profile is None or not self.settings_faithful or not stored.faithful:
            return None
        sorted_splits, task_sets = splits
        certified_evaluator = self.evaluators.get(self.profile)
        if certified_evaluator is None:
            certified_evaluator = self.evaluators[self.profile] = {
                "digest": self.evaluator_digest(self.profile),
                "files": self.evaluator.files_id,
                "name": self.evaluator.name,
                "sandbox_profile": self.profile,
            }
        if stored.environments:
            certified_evaluator = {
                "digest": certified_evaluator["digest"],
                "environments": stored.environments,
                **certified_evaluator,
            }
        # Every object's keys in sorted order (the rows' too), so orjson need not sort them.
        payload = {
            "candidate": {"origin": origin, "parent_tree": parent_tree, "tree": tree},
            "evaluation": {"k": k, "purpose": purpose, "repeat": repeat, "seed": seed, "splits": sorted_splits},
            "evaluator": certified_evaluator,
            "experiment": self.uid,
            "k": k,
            "prev": prev,
            "recipe": self.recipe,
            "run_settings": self.run_settings,
            "schema": records.SCHEMA,
            "seq": seq,
            "surface": self.surface,
            "task_sets": task_sets,
            "trials": stored.rows,  # already as a record writes them
        }
        try:
            written = orjson.dumps(payload)
        except orjson.JSONEncodeError:  # a value orjson does not write (a huge integer, a lone surrogate)
            return None
        return payload if written == canonical else None

    def _splits(self, splits_text: str) -> tuple[list[str], dict[str, str]] | None:
        """An evaluation's splits sorted, and the task sets a record of them binds (None: not texts of known splits)."""
        splits = json_or_text(splits_text)
        if not isinstance(splits, list) or not all(isinstance(split, str) for split in splits):
            return None
        if any(split not in self.task_sets for split in splits):
            return None
        splits = sorted(splits)
        return splits, {split: self.task_sets[split] for split in splits}


_BOOLEANS = {0: False, 1: True}


def _as_written(value: Any) -> Any:
    """``value`` as orjson writes it key-sorted and parses it back: equal to
    it, each object's keys in sorted order; ``_UNFAITHFUL`` when that is not
    equal to ``value`` (a float that is not finite, written as null) or
    orjson does not write it."""
    try:
        written = orjson.loads(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
    except (orjson.JSONEncodeError, orjson.JSONDecodeError):
        return _UNFAITHFUL
    return written if written == value else _UNFAITHFUL


_UNFAITHFUL = object()


# The evaluation fields a record binds (``payload["evaluation"]``), in the order records_verify reads them.
EVALUATION_FIELDS = ("purpose", "repeat", "splits", "k", "seed")


def settings_bound(run_settings: Any) -> Any:
    """The run settings as verification compares them: what a workspace or
    Harbor import adds as it grows (``imported_from``) is left out, but
    whether the experiment was imported is kept."""
    if not isinstance(run_settings, dict) or "imported_from" not in run_settings:
        return run_settings
    return {**{k: v for k, v in run_settings.items() if k != "imported_from"}, "imported_from": True}


@functools.lru_cache(maxsize=64)
def _splits_sorted(splits_text: str) -> Any:
    """An evaluation's stored splits (JSON text) as a record binds them,
    sorted. The same few texts repeat over a whole chain, so each is parsed
    once: read the value, do not change it."""
    splits = json_value(splits_text)
    with contextlib.suppress(TypeError):  # a list of texts, unless forged: then compared as it is
        splits = sorted(splits)
    return splits


def _bound_differences(
    payload: dict[str, Any],
    evaluation_fields: list[Any],
    *,
    parent_tree: str | None,
    origin: str,
    recipe: str | None,
    run_settings: Any,
) -> list[str]:
    """The fields of an evaluation record that differ from the database: the
    evaluation's purpose, repeat, splits, k and seed, the candidate's parent
    and origin, the experiment's recipe (a record made before the first run
    names none) and run settings. Pure."""
    purpose, repeat, splits_text, k, seed = evaluation_fields
    splits = _splits_sorted(splits_text)
    stored = {"purpose": purpose, "repeat": repeat, "splits": splits, "k": k, "seed": seed}
    certified = payload.get("evaluation")
    if not isinstance(certified, dict):
        certified = {}
    differ = [f"evaluation {name}" for name in EVALUATION_FIELDS if certified.get(name) != stored[name]]
    if "k" in payload and payload["k"] != k:
        differ.append("k")
    candidate = payload.get("candidate")
    if not isinstance(candidate, dict):
        candidate = {}
    if candidate.get("parent_tree") != parent_tree:
        differ.append("candidate parent")
    if candidate.get("origin") != origin:
        differ.append("candidate origin")
    if payload.get("recipe") is not None and payload.get("recipe") != recipe:
        differ.append("experiment recipe")
    if "run_settings" in payload and settings_bound(payload["run_settings"]) != run_settings:
        differ.append("run settings")
    return differ


def scores_verify(
    experiment: Experiment, *, recomputed: Mapping[tuple[int, str], Sequence[Any]]
) -> tuple[list[str], str]:
    """What the screens read as scores, against what the records bind: every
    certified evaluation of ``experiment`` has a record, and the stored
    per-split totals (``EvaluationSplitStats``, what screens and the default
    start candidate read) equal the totals of the trial rows, which
    ``records_verify`` checks against the records, and exist only for
    certified evaluations. ``recomputed``: (evaluation, split) -> the totals
    of its trials, for the evaluations the chain's records bind, as
    ``trial_rows_by_seq`` counts them while verification reads the trials;
    a stored total of any other (evaluation, split) is compared with its
    trials totalled here in SQL (``split_totals``). Returns the problems and
    a line saying what was checked. Read-only."""
    problems: list[str] = []
    unbound = Evaluation.objects.filter(
        experiment=experiment, state=Evaluation.State.CERTIFIED, certified_result__isnull=True
    ).values_list("pk", flat=True)
    problems += [f"evaluation {pk} is certified, but no record binds it" for pk in unbound]
    # Read as the driver returns them (``streamed_rows``): one row a split of
    # every evaluation, where the ORM's per-row work took a quarter of a whole
    # verification (issue 44). A sum over a 64-bit column may come back as a
    # Decimal, which compares equal to the same int.
    stored = EvaluationSplitStats.objects.filter(evaluation__experiment=experiment).values_list(
        "evaluation_id",
        "split",
        "evaluation__state",
        "candidate_id",
        "trials",
        "passed",
        "errors",
        "score_sum",
        "tokens_sum",
        "tokens_count",
    )
    certified = Evaluation.State.CERTIFIED.value
    differ: list[tuple[int, str]] = []
    # Certified, but not counted as the chain was read (no record of this chain binds it, or no trial of its split).
    unstreamed: list[tuple[int, str, tuple[Any, ...]]] = []
    count = 0
    for row in streamed_rows(stored.order_by(), 4 * VERIFY_BATCH):
        count += 1
        evaluation_id, split, state = row[:3]
        if state != certified:
            problems.append(
                f"evaluation {evaluation_id}, split {split!r}: stored totals of an evaluation that is not certified "
                f"({state})"
            )
        elif (expected := recomputed.get((evaluation_id, split))) is None:
            unstreamed.append((evaluation_id, split, row[3:]))
        elif row[3:] != expected and not _totals_equal(row[3:], expected):  # the first test settles nearly all
            differ.append((evaluation_id, split))
    if unstreamed:
        totalled = _split_totals_of(sorted({evaluation_id for evaluation_id, _, _ in unstreamed}))
        differ += [(e, split) for e, split, totals in unstreamed if not _totals_equal(totals, totalled.get((e, split)))]
    problems += [
        f"evaluation {evaluation_id}, split {split!r}: stored totals differ from its certified trials"
        for evaluation_id, split in sorted(differ)
    ]
    checked = f"{count} stored split total(s) recomputed from the trials; certified evaluations bound by records"
    return problems, checked


def _totals_equal(stored: Sequence[Any], expected: Sequence[Any] | None) -> bool:
    """Stored per-split totals (candidate, trials, passed, errors, score sum,
    token sum, token count) against the trials' (None: no trial on that
    split). The score sum is compared with a tolerance: a sum in another row
    order may differ in its last bits."""
    if expected is None:
        return False
    if stored == expected:  # the usual case, exactly equal (a Decimal token sum equals its int)
        return True
    return (
        tuple(stored[:4]) == tuple(expected[:4])
        and tuple(stored[5:]) == tuple(expected[5:])
        and math.isclose(float(stored[4]), float(expected[4]), rel_tol=1e-9, abs_tol=1e-9)
    )


def _split_totals_of(evaluation_ids: list[int]) -> dict[tuple[int, str], tuple[Any, ...]]:
    """The totals of each split's trials of ``evaluation_ids`` in SQL
    (``split_totals``), by (evaluation, split), in batches of ids."""
    totalled: dict[tuple[int, str], tuple[Any, ...]] = {}
    for start in range(0, len(evaluation_ids), VERIFY_BATCH):
        rows = (
            Trial.objects.filter(evaluation_id__in=evaluation_ids[start : start + VERIFY_BATCH])
            .values("evaluation_id", "split")
            .annotate(first_candidate=Min("candidate_id"), **split_totals())
            .values_list(
                "evaluation_id",
                "split",
                "first_candidate",
                "n",
                "passed",
                "errors",
                "score_sum",
                "tokens_sum",
                "tokens_count",
            )
            .order_by()
        )
        totalled.update(((evaluation_id, split), tuple(totals)) for evaluation_id, split, *totals in rows)
    return totalled


@dataclass(frozen=True)
class DecisionRow:
    """A stored decision record as verification reads it (a ``records.RecordLike``)."""

    pk: int
    seq: int
    prev_digest: str
    record_digest: str
    signature: str
    kind: str
    tree: str
    payload: Any
    canonical: bytes


def _decision_rows(experiment: Experiment) -> list[DecisionRow]:
    rows = (
        CertifiedDecision.objects.filter(experiment=experiment)
        .order_by("seq")
        .annotate(payload_text=Cast("payload", output_field=TextField()))
        .values_list(
            "pk", "seq", "prev_digest", "record_digest", "signature", "kind", "candidate__tree_id", "payload_text"
        )
    )
    return [DecisionRow(*row[:7], json_or_text(row[7]), row[7].encode()) for row in rows]


# What a decision row must equal in its record, by payload section.
GATE_FIELDS = ("round", "current", "accepted", "chosen", "rule", "explanation", "numbers")
REVIEW_FIELDS = ("verdict", "reason", "reviewer", "rejected_edits", "derived")


def decisions_verify(
    experiment: Experiment, decisions: list[DecisionRow], *, recipes_named: set[str]
) -> tuple[list[str], str]:
    """The decision records of ``experiment`` against the database: every
    gate and review decision certified and equal to its record, every
    candidate's state and reason as its decisions certified them
    (``records.candidate_state_problems``), the surface spec against its
    digest and the digest the records bind, and every recipe a record names
    (``recipes_named`` adds the evaluation records' ones) present and
    matching its digest. Returns the problems and a line saying what was
    checked. Read-only."""
    problems: list[str] = []
    surface = experiment.surface
    if digests.sha256_hex(surface.spec.encode()) != surface.digest:
        problems.append(f"surface {surface.name!r}: spec does not match its digest")

    gate_rows: dict[int, dict[str, Any]] = {}
    # The recipe each decision record must name: the gate's run's, the reviewed candidate's run's.
    recipes_of = dict(
        GateDecision.objects.filter(candidate__experiment=experiment, record__isnull=False).values_list(
            "record_id", "run__recipe__digest"
        )
    )
    recipes_of.update(
        ReviewDecision.objects.filter(
            item__candidate__experiment=experiment, record__isnull=False, item__candidate__run__isnull=False
        ).values_list("record_id", "item__candidate__run__recipe__digest")
    )
    recipes_of.update(
        ReviewCorrection.objects.filter(
            item__candidate__experiment=experiment, record__isnull=False, item__candidate__run__isnull=False
        ).values_list("record_id", "item__candidate__run__recipe__digest")
    )
    gates = GateDecision.objects.filter(candidate__experiment=experiment).order_by("pk")
    for pk, record_id, tree, round_number, *values in gates.values_list(
        "pk",
        "record_id",
        "candidate__tree_id",
        "round",
        "current__tree_id",
        "accepted",
        "chosen",
        "rule",
        "explanation",
        "numbers",
    ):
        if record_id is None:
            problems.append(f"gate decision {pk} (candidate {tree[:12]}, round {round_number}) is not certified")
        else:
            gate_rows[record_id] = dict(zip(GATE_FIELDS, [round_number, *values], strict=True))
    review_rows: dict[int, dict[str, Any]] = {}
    reviews = ReviewDecision.objects.filter(item__candidate__experiment=experiment).order_by("pk")
    rejected: dict[int, list[int]] = {}
    through = ReviewDecision.rejected_edits.through.objects.filter(reviewdecision__in=reviews)
    for decision_id, index in through.values_list("reviewdecision_id", "atomicedit__index"):
        rejected.setdefault(decision_id, []).append(index)
    for pk, record_id, tree, verdict, reason, reviewer, derived in reviews.values_list(
        "pk",
        "record_id",
        "item__candidate__tree_id",
        "verdict",
        "reason",
        "reviewer__username",
        "derived_candidate__tree_id",
    ):
        if record_id is None:
            problems.append(f"review decision {pk} (candidate {tree[:12]}) is not certified")
        else:
            review_rows[record_id] = dict(
                zip(REVIEW_FIELDS, [verdict, reason, reviewer, sorted(rejected.get(pk, [])), derived], strict=True)
            )
    corrections = ReviewCorrection.objects.filter(item__candidate__experiment=experiment).order_by("pk")
    correction_rows: dict[int, int] = {}  # correction record id -> the corrected record's id
    for pk, record_id, tree, verdict, reason, reviewer, corrects in corrections.values_list(
        "pk",
        "record_id",
        "item__candidate__tree_id",
        "verdict",
        "reason",
        "reviewer__username",
        "corrects_id",
    ):
        if record_id is None:
            problems.append(f"review correction {pk} (candidate {tree[:12]}) is not certified")
        else:
            review_rows[record_id] = dict(zip(REVIEW_FIELDS, [verdict, reason, reviewer, [], None], strict=True))
            correction_rows[record_id] = corrects
    named = {
        pk: {"seq": seq, "record": digest}
        for pk, seq, digest in CertifiedDecision.objects.filter(pk__in=correction_rows.values()).values_list(
            "pk", "seq", "record_digest"
        )
    }

    for decision in decisions:
        where = f"record #{decision.seq}"
        payload = decision.payload if isinstance(decision.payload, dict) else {}  # else the chain check said so
        if records.kind_problem(payload, decision.kind):
            problems.append(f"{where}: {records.kind_problem(payload, decision.kind)}")
        if (payload.get("candidate") or {}).get("tree") != decision.tree:
            problems.append(f"{where}: names another candidate than the stored one")
        if payload.get("surface") != surface.digest:
            problems.append(f"{where}: surface changed since this decision (its digest differs)")
        if payload.get("recipe"):
            recipes_named.add(str(payload["recipe"]))
        if decision.pk in recipes_of and payload.get("recipe") != recipes_of[decision.pk]:
            problems.append(f"{where}: the recipe of its run differs from the certified one")
        if decision.pk in correction_rows:
            said = payload.get("corrects")
            said = said if isinstance(said, dict) else {}
            if {"seq": said.get("seq"), "record": said.get("record")} != named.get(correction_rows[decision.pk]):
                problems.append(f"{where}: the correction names another record than the stored one")
        elif payload.get("schema") == records.CORRECTION_SCHEMA:
            problems.append(f"{where}: a correction record with no stored correction")
        gate = decision.kind == CertifiedDecision.Kind.GATE
        stored = (gate_rows if gate else review_rows).get(decision.pk)
        certified = payload.get("gate" if gate else "review") or {}
        if stored is not None and isinstance(certified, dict):
            differ = [name for name, value in stored.items() if certified.get(name) != value]
            if differ:
                problems.append(f"{where}: {decision.kind} decision differs from its record in {', '.join(differ)}")

    candidates = Candidate.objects.filter(experiment=experiment).values_list(
        "tree_id", "state", "state_reason", "origin"
    )
    problems += records.candidate_state_problems(
        (records.CandidateState(*row) for row in candidates),
        ((d.seq, d.payload) for d in decisions),
        known_states=Candidate.State.values,
    )

    problems += _candidate_origin_problems(experiment, decisions)
    problems += records.correction_problems((d.seq, d.record_digest, d.payload) for d in decisions)

    flags: dict[str, list[tuple[str, str, str, str]]] = {}
    for tree, *flag in LeakageFlag.objects.filter(candidate__experiment=experiment).values_list(
        "candidate__tree_id", *FLAG_FIELDS
    ):
        flags.setdefault(tree, []).append(tuple(flag))
    held = ReviewItem.objects.filter(candidate__experiment=experiment).values_list("candidate__tree_id", flat=True)
    problems += records.review_basis_problems(
        ((d.seq, d.record_digest, d.payload) for d in decisions),
        {tree: records.critic_outcome(rows) for tree, rows in flags.items()},
        held=list(held),
    )

    found = dict(Recipe.objects.filter(digest__in=recipes_named).values_list("digest", "spec"))
    for digest in sorted(recipes_named):
        if digest not in found:
            problems.append(f"recipe {digest[:12]} named by the records is missing")
        elif digests.json_digest(found[digest]) != digest:
            problems.append(f"recipe {digest[:12]}: spec does not match its digest")
    checked = (
        f"{len(decisions)} decision record(s) against {len(gate_rows)} gate and {len(review_rows)} review "
        f"decision(s), candidate states, surface {surface.name!r} and {len(recipes_named)} recipe(s)"
    )
    return problems, checked


# States a candidate held for a reviewer reaches only through a review decision approving it.
CLEARED_STATES = (
    Candidate.State.APPROVED,
    Candidate.State.EVALUATING,
    Candidate.State.EVALUATED,
    Candidate.State.CERTIFIED,
    Candidate.State.ACCEPTED,
    Candidate.State.REJECTED_GATE,
)


def _candidate_origin_problems(experiment: Experiment, decisions: list[DecisionRow]) -> list[str]:
    """Candidates whose state or origin no record explains: one the critic
    flagged (or held for review) that went on without a certified review
    decision approving it, and an imported one in an experiment that was
    not imported (only workspace and Harbor imports make them). Read-only."""
    approved = {
        d.tree
        for d in decisions
        if isinstance(d.payload, dict)
        and d.payload.get("schema") in records.REVIEW_SCHEMAS
        and (d.payload.get("review") or {}).get("verdict") == ReviewDecision.Verdict.APPROVE
    }
    problems = []
    held = Candidate.objects.filter(experiment=experiment, state__in=CLEARED_STATES).filter(
        Q(leakage_flags__isnull=False) | Q(review_item__isnull=False)
    )
    for tree, state in held.distinct().values_list("tree_id", "state"):
        if tree not in approved:
            problems.append(
                f"candidate {tree[:12]}: state {state!r}, but the critic held it for review "
                "and no certified review decision approved it"
            )
    imported = isinstance(experiment.run_settings, dict) and "imported_from" in experiment.run_settings
    if not imported:
        for tree in Candidate.objects.filter(experiment=experiment, origin=Candidate.Origin.IMPORTED).values_list(
            "tree_id", flat=True
        ):
            problems.append(f"candidate {tree[:12]}: origin 'imported' in an experiment that was not imported")
    return problems


def streamed_rows(queryset: QuerySet[Any], size: int) -> Iterator[tuple[Any, ...]]:
    """The rows of a ``values_list`` query as the database driver returns
    them, read ``size`` a round trip (through a server-side cursor on
    PostgreSQL, as ``QuerySet.iterator`` reads): the ORM writes the query,
    and its per-row work (an iterator's bookkeeping and each backend's
    converters) is skipped. Verification reads text, numbers and booleans
    this way, which the drivers return as the ORM would, except that SQLite
    gives a boolean as 0 or 1 (equal to False and True, and a stored 2 is
    not equal to either, where the ORM would have read it as True)."""
    sql, params = queryset.query.sql_with_params()
    with connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(size):
            yield from rows


# A trial row's keys: ``TRIAL_ROW_FIELDS``' with the criteria last (as ``trial_rows_by_seq`` reads them).
TRIAL_ROW_KEYS = (*(key for key in TRIAL_ROW_FIELDS if key != "criteria"), "criteria")


def trial_rows_differing(stored: list[dict[str, Any]], certified: Any) -> int:
    """How many of a record's trials (``certified``, as its payload holds
    them) differ from the stored rows (``StoredTrials.rows``): a trial equals
    a row only with exactly the same keys and equal values; trials that are
    no list equal no row."""
    if not isinstance(certified, list):
        certified = [None]
    if stored == certified:
        return 0
    changed = sum(1 for a, b in zip(stored, certified, strict=False) if a != b)
    return changed + abs(len(stored) - len(certified))


# Distinct criteria texts kept parsed while trial rows are read: a task's
# criteria results repeat from trial to trial, so each text is parsed once.
CRITERIA_PARSED_KEPT = 4096


class StoredTrials(NamedTuple):
    """The trial rows of one record as stored, with what verification
    derives from them in the same pass (``trial_rows_by_seq``)."""

    seq: int
    # Each trial as a record writes it (``trial_row``'s keys, sorted), its values
    # equal to the stored ones: an integral score as an integer, a boolean from SQLite's 0 or 1.
    rows: list[dict[str, Any]]
    # Split -> (first candidate, trials, passed, errors, score sum, token sum, token count): the
    # ``split_totals`` aggregates (with ``Min("candidate_id")``), in ``EvaluationSplitStats``' order.
    totals: dict[str, tuple[Any, ...]]
    # The distinct environment digests the trials ran in, sorted (as ``payload_build`` binds them).
    environments: list[str]
    # Whether orjson writes every row back faithfully (False: a score or criteria value that is not finite).
    faithful: bool


def trial_rows_by_seq(experiment: Experiment) -> Iterator[StoredTrials]:
    """The trial rows of every record of ``experiment`` in seq order: one
    streamed query, read alongside the records. Each row is made once, as a
    record writes it (``StoredTrials.rows``), and the same pass totals each
    split as ``split_totals`` does in SQL (``scores_verify`` compares them
    with the stored totals) and collects the environments, so the trials are
    read once. Rows with the same criteria results share one parsed value:
    read them, do not change them."""
    values = streamed_rows(
        Trial.objects.filter(evaluation__certified_result__experiment=experiment)
        .order_by("evaluation__certified_result__seq", *TRIAL_ORDER)
        .values_list(
            "evaluation__certified_result__seq",
            "candidate_id",
            "environment",
            *(TRIAL_ROW_FIELDS[key] for key in TRIAL_ROW_KEYS[:-1]),
            Cast(TRIAL_ROW_FIELDS["criteria"], TextField()),
        ),
        4 * VERIFY_BATCH,
    )
    passed, error = Trial.Outcome.PASS.value, Trial.Outcome.ERROR.value
    integer_booleans = connection.vendor == "sqlite"
    # Criteria text -> its value, for the texts orjson writes back faithfully (the others are parsed each time).
    parsed: dict[str, Any] = {}
    current: int | None = None
    rows: list[dict[str, Any]] = []
    by_split: dict[str, tuple[Any, ...]] = {}
    environments: set[str] = set()
    faithful = True
    # The totals of the split being read (the rows of a record come split by split).
    split_now: str | None = None
    first = n = n_passed = errors = tokens_sum = tokens_count = 0
    score_sum = 0.0

    for (
        seq,
        candidate,
        environment,
        task,
        split,
        index,
        seed,
        outcome,
        score,
        tokens,
        steps,
        valid_output,
        submitted,
        error_kind,
        text,
    ) in values:
        if seq != current or split != split_now:
            if split_now is not None:
                _split_totals_add(
                    by_split, split_now, (first, n, n_passed, errors, score_sum, tokens_sum, tokens_count)
                )
            if seq != current:
                if current is not None:
                    yield StoredTrials(current, rows, by_split, sorted(environments), faithful)
                current, rows, by_split, environments, faithful = seq, [], {}, set(), True
            split_now, first, n, n_passed, errors, score_sum, tokens_sum, tokens_count = (
                split,
                candidate,
                0,
                0,
                0,
                0.0,
                0,
                0,
            )
        elif candidate < first:
            first = candidate
        n += 1
        if outcome == error:
            errors += 1
        else:
            if outcome == passed:
                n_passed += 1
            if score is not None:
                score_sum += score
        if tokens is not None:
            tokens_sum += tokens
            tokens_count += 1
        if environment:
            environments.add(environment)
        criteria = parsed.get(text, _UNPARSED)
        if criteria is _UNPARSED:
            criteria = _as_written(json_value(text))
            if criteria is _UNFAITHFUL:
                criteria = json_value(text)
                faithful = False
            else:
                if len(parsed) >= CRITERIA_PARSED_KEPT:
                    parsed.clear()
                parsed[text] = criteria
        if score.__class__ is float:
            if score.is_integer():
                score = int(score)  # as RFC 8785 writes it (and equal to the stored value)
            elif not math.isfinite(score):
                faithful = False
        if integer_booleans:  # 0 or 1 from SQLite (equal to False and True); anything else stays as it is
            valid_output = _BOOLEANS.get(valid_output, valid_output)
            submitted = _BOOLEANS.get(submitted, submitted)
        rows.append(  # the keys sorted (``_ImpliedPayloads.payload`` writes them in this order)
            {
                "criteria": criteria,
                "error_kind": error_kind,
                "index": index,
                "outcome": outcome,
                "score": score,
                "seed": seed,
                "split": split,
                "steps": steps,
                "submitted": submitted,
                "task": task,
                "tokens": tokens,
                "valid_output": valid_output,
            }
        )
    if current is not None:
        _split_totals_add(by_split, split_now, (first, n, n_passed, errors, score_sum, tokens_sum, tokens_count))
        yield StoredTrials(current, rows, by_split, sorted(environments), faithful)


_UNPARSED = object()


def _split_totals_add(by_split: dict[str, tuple[Any, ...]], split: Any, totals: tuple[Any, ...]) -> None:
    """Add the totals of a split's consecutive trial rows (their first
    candidate, then the ``split_totals`` counts) to ``by_split``."""
    earlier = by_split.get(split)
    if earlier is None:
        by_split[split] = totals
    else:  # cannot happen: a record's rows come in split order
        by_split[split] = (min(earlier[0], totals[0]), *(a + b for a, b in zip(earlier[1:], totals[1:], strict=True)))


# What a record whose evaluation has no trial row is compared with (read only).
EMPTY_TRIALS = StoredTrials(0, [], {}, [], True)
