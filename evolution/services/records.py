"""Certification of evaluations and verification of the record chain."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, QuerySet, Sum, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from evolution import digests, faults, records
from evolution.fields import json_or_text
from evolution.models import (
    Candidate,
    CertifiedResult,
    Evaluation,
    EvaluationSplitStats,
    Evaluator,
    Experiment,
    Trial,
)
from evolution.services.experiments import split_digests_compute
from evolution.services.snapshots import tree_verify

logger = logging.getLogger(__name__)


def _enqueue_run_advance(run_id: int) -> None:
    from evolution.tasks import run_advance

    run_advance.delay(run_id)


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
    profiles = set(Trial.objects.filter(evaluation=evaluation).values_list("sandbox_profile", flat=True).distinct())
    return payload_build(
        evaluation,
        seq=seq,
        prev=prev,
        task_sets=task_sets,
        profile=evaluation_sandbox_profile(profiles),
        trials=trial_rows(evaluation),
    )


def payload_build(
    evaluation: Evaluation,
    *,
    seq: int,
    prev: str,
    task_sets: dict[str, str],
    profile: str,
    trials: list[dict[str, Any]],
) -> dict[str, Any]:
    """The payload certifying ``evaluation`` from its trial rows (``trial_row``,
    in ``TRIAL_ORDER``) and sandbox profile. No queries when the evaluation's
    experiment, evaluator, recipe, candidate and parent are loaded."""
    experiment = evaluation.experiment
    candidate = evaluation.candidate
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
        },
        "task_sets": {split: task_sets[split] for split in sorted(evaluation.splits)},
        "recipe": experiment.recipe.digest if experiment.recipe is not None else None,
        "run_settings": experiment.run_settings,
        "k": evaluation.k,
        "trials": trials,
    }


def split_stats_store(*, evaluations: QuerySet[Evaluation]) -> int:
    """Store per-split trial totals of ``evaluations`` (certified ones: their
    trials no longer change) in one aggregate query and one insert. Safe to
    repeat: existing rows are kept. Returns the rows written or kept."""
    rows = (
        Trial.objects.filter(evaluation__in=evaluations)
        .values("evaluation_id", "candidate_id", "split")
        .annotate(
            n=Count("pk"),
            passed=Count("pk", filter=Q(outcome=Trial.Outcome.PASS)),
            errors=Count("pk", filter=Q(outcome=Trial.Outcome.ERROR)),
            score_sum=Sum("score", filter=~Q(outcome=Trial.Outcome.ERROR), default=0.0),
            tokens_sum=Sum("tokens", default=0),
            tokens_count=Count("tokens"),
        )
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


def result_certify(*, evaluation_id: int) -> CertifiedResult | None:
    """Certify a complete evaluation: append a signed record to the
    experiment's chain and mark the candidate certified.

    Safe to repeat and to run concurrently: the evaluation row is locked and
    only a COMPLETE evaluation is certified, in one transaction with the
    record and the new chain head, so a crash anywhere leaves either nothing
    or everything. Returns the record (existing or new), or None when the
    evaluation is not complete or certification was refused (the evaluation
    is then FAILED with the reason).
    """
    with transaction.atomic():
        evaluation = (
            # Lock only the evaluation row: the nullable joins (recipe, parent)
            # cannot be locked on PostgreSQL and need not be.
            Evaluation.objects.select_for_update(of=("self",))
            .select_related("experiment__evaluator", "experiment__recipe", "candidate__parent")
            .get(pk=evaluation_id)
        )
        if evaluation.state == Evaluation.State.CERTIFIED:
            return evaluation.certified_result
        if evaluation.state != Evaluation.State.COMPLETE:
            return None
        # The lock on the experiment row serializes appends to its chain.
        experiment = Experiment.objects.select_for_update().get(pk=evaluation.experiment_id)
        evaluation.experiment = experiment

        problems = tree_verify(tree_digest=experiment.evaluator.files_id)
        if evaluation.evaluator_digest and evaluation.evaluator_digest != evaluator_config_digest(experiment.evaluator):
            problems.append("the evaluator (its files, commands or limits) changed since the evaluation started")
        problems += tree_verify(tree_digest=evaluation.candidate.tree_id)
        task_sets = split_digests_compute(experiment=experiment)
        for split in evaluation.splits:
            if task_sets.get(split) != experiment.split_digests.get(split):
                problems.append(f"task set of split {split!r} changed since the splits were frozen")
        if problems:
            reason = "certification refused: " + "; ".join(problems)
            logger.error("evaluation %s: %s", evaluation.pk, reason)
            Evaluation.objects.filter(pk=evaluation.pk).update(state=Evaluation.State.FAILED, error=reason)
            Candidate.objects.filter(pk=evaluation.candidate_id, state=Candidate.State.EVALUATED).update(
                state=Candidate.State.FAILED, state_reason=reason
            )
            return None

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
        Candidate.objects.select_for_update().filter(pk=evaluation.candidate_id).first()
        unfinished = Evaluation.objects.filter(
            candidate_id=evaluation.candidate_id,
            state__in=[Evaluation.State.RUNNING, Evaluation.State.COMPLETE, Evaluation.State.CERTIFYING],
        )
        if not unfinished.exists():
            Candidate.objects.filter(pk=evaluation.candidate_id, state=Candidate.State.EVALUATED).update(
                state=Candidate.State.CERTIFIED, certified_at=now
            )
        faults.checkpoint("certify:before_commit")
        if evaluation.run_id:
            run_id = evaluation.run_id
            transaction.on_commit(lambda: _enqueue_run_advance(run_id))
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
    digest and the records; and each record's trials against the trial rows.
    Read-only; safe to run at any time. The records and their trial rows are
    streamed (two queries in seq order, read side by side), so memory stays
    bounded however long the chain.
    """
    report = VerifyReport()
    key = settings.RSI_RECORDS_KEY
    experiments = [experiment] if experiment else list(Experiment.objects.order_by("pk"))
    for exp in experiments:
        exp = Experiment.objects.select_related("evaluator", "recipe").get(pk=exp.pk)
        label = f"experiment {exp.pk} {exp.name!r}"
        uid = str(exp.uid)
        chain = records.ChainChecker(key=key, experiment_uid=uid)
        task_sets = split_digests_compute(experiment=exp)
        record_problems: list[str] = []
        trees_checked: set[str] = set()
        evaluator_digests: dict[str, str] = {}
        trial_count = 0
        # Plain values and the payload's stored canonical text (the bytes the
        # digest is over: hashed as stored, parsed once for the checks), no
        # model instances. The records and their trial rows are two streams
        # in seq order, walked side by side.
        rows = (
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
            )
            .iterator(chunk_size=VERIFY_BATCH)
        )
        trials = trial_rows_by_seq(exp)
        next_trials: tuple[int, list[dict[str, Any]]] | None = next(trials, None)
        for seq, prev_digest, digest, signature, evaluation_id, evaluation_experiment, tree, text in rows:
            payload = json_or_text(text)
            chain.add(records.ChainRecord(seq, prev_digest, digest, signature, payload), canonical=text.encode())
            if not isinstance(payload, dict):  # reported by the chain check
                payload = {}
            where = f"{label} record #{seq}"
            if payload.get("candidate", {}).get("tree") != tree:
                record_problems.append(f"{where}: candidate tree differs from the certified one")
            if tree not in trees_checked:
                trees_checked.add(tree)
                record_problems += [f"{where}: candidate tree: {p}" for p in tree_verify(tree_digest=tree)]
            certified_evaluator = payload.get("evaluator", {})
            profile = certified_evaluator.get("sandbox_profile", "")
            if evaluation_experiment != exp.pk:  # a record pointing into another experiment
                evaluation = Evaluation.objects.select_related("experiment__evaluator").get(pk=evaluation_id)
                current_digest = evaluator_digest_for(evaluation, profile)
            else:
                if profile not in evaluator_digests:
                    evaluator_digests[profile] = _evaluator_digest(exp.evaluator, profile)
                current_digest = evaluator_digests[profile]
            if certified_evaluator.get("digest") != current_digest:
                record_problems.append(f"{where}: evaluator (commands, files, environment or limits) changed")
            for split, split_digest in payload.get("task_sets", {}).items():
                if task_sets.get(split) != split_digest:
                    record_problems.append(f"{where}: task set of split {split!r} changed")
            while next_trials is not None and next_trials[0] < seq:  # cannot happen: both streams follow seq
                next_trials = next(trials, None)
            current: list[dict[str, Any]] = []
            if next_trials is not None and next_trials[0] == seq:
                current = next_trials[1]
                next_trials = next(trials, None)
            certified = payload.get("trials", [])
            trial_count += len(certified)
            if current != certified:
                changed = sum(1 for a, b in zip(current, certified, strict=False) if a != b)
                changed += abs(len(current) - len(certified))
                record_problems.append(f"{where}: {changed} trial row(s) differ from the certified results")

        head = records.ChainHead(exp.chain_length, exp.chain_head, exp.chain_head_signature)
        report.problems += [f"{label}: {p}" for p in chain.finish(head)]
        report.checked.append(f"{label}: chain of {chain.count} record(s), links, digests and signatures")

        evaluator_problems = tree_verify(tree_digest=exp.evaluator.files_id)
        report.problems += [f"{label}: evaluator files: {p}" for p in evaluator_problems]
        report.checked.append(f"{label}: evaluator {exp.evaluator.name!r} files {exp.evaluator.files_id[:12]}")

        for split, digest in sorted(exp.split_digests.items()):
            if task_sets.get(split) != digest:
                report.problems.append(f"{label}: task set of split {split!r} no longer matches its frozen digest")
        report.checked.append(f"{label}: task sets {', '.join(sorted(exp.split_digests)) or '(none)'}")

        report.problems += record_problems
        report.checked.append(f"{label}: {len(trees_checked)} candidate tree(s), {trial_count} trial(s)")
    return report


# Distinct criteria texts kept parsed while trial rows are read: a task's
# criteria results repeat from trial to trial, so each text is parsed once.
CRITERIA_PARSED_KEPT = 4096


def trial_rows_by_seq(experiment: Experiment) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """``trial_rows`` of every record of ``experiment``, as (seq, rows) in
    seq order: one streamed query, read alongside the records. Rows with the
    same criteria results share one parsed value: read them, do not change
    them."""
    keys = list(TRIAL_ROW_FIELDS)
    criteria_at = keys.index("criteria")
    columns = [Cast(name, TextField()) if key == "criteria" else name for key, name in TRIAL_ROW_FIELDS.items()]
    values = (
        Trial.objects.filter(evaluation__certified_result__experiment=experiment)
        .order_by("evaluation__certified_result__seq", *TRIAL_ORDER)
        .values_list("evaluation__certified_result__seq", *columns)
        .iterator(chunk_size=4 * VERIFY_BATCH)
    )
    parsed: dict[str, Any] = {}
    for seq, group in groupby(values, key=itemgetter(0)):
        rows = []
        for row in group:
            fields = list(row[1:])
            text = fields[criteria_at]
            if text not in parsed:
                if len(parsed) >= CRITERIA_PARSED_KEPT:
                    parsed.clear()
                parsed[text] = json.loads(text)
            fields[criteria_at] = parsed[text]
            rows.append(dict(zip(keys, fields, strict=True)))
        yield seq, rows
