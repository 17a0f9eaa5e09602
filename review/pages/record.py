"""The record page: a certified record, what it binds, whether it checks out on its own (``record_checks``,
which the candidate page shows too) and its payload, sealed per-task rows only for who may see them. Reads
only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.shortcuts import get_object_or_404

from evolution import access, records
from evolution.models import CertifiedDecision, CertifiedResult, Experiment
from evolution.services.records import VerifyReport
from review.pages import SPLIT_ORDER, Page


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def record_checks(record: CertifiedResult, *, previous_digest: str | None = None) -> list[Check]:
    """What can be checked of one record on its own, one row per check:
    ``evolution.records.verify_record`` (payload names this record and its
    predecessor, digest, signature; with ``previous_digest``, the stored
    digest of record seq - 1, also the link to it), plus that the payload
    names the candidate's tree. The whole chain, trees and trial rows are
    checked by ``evolution.services.records.records_verify``. Read-only."""
    payload = record.payload if isinstance(record.payload, dict) else {}  # else the checks say it is not
    uid = str(record.experiment.uid)
    failed: dict[str, list[str]] = {}
    for problem in records.verify_record(
        record, key=settings.RSI_RECORDS_KEY, experiment_uid=uid, prev=previous_digest
    ):
        failed.setdefault(problem.check, []).append(problem.detail)
    tree = str((payload.get("candidate") or {}).get("tree"))
    # What each check compared, shown when it passes; a failure shows what differs.
    described = [
        (records.RecordCheck.DIGEST, f"SHA-256 of the canonical payload is the stored {record.record_digest[:16]}…"),
        (records.RecordCheck.SIGNATURE, "HMAC of the digest with the records key"),
        (
            records.RecordCheck.NAMES_RECORD,
            f"payload seq {payload.get('seq')!r} of experiment {str(payload.get('experiment'))[:8]}…",
        ),
        (records.RecordCheck.NAMES_PREDECESSOR, f"payload prev {str(payload.get('prev'))[:16]}…"),
    ]
    if previous_digest is not None:
        described.append(
            (
                records.RecordCheck.LINKS,
                f"record #{record.seq - 1} has digest {previous_digest[:16]}…"
                if record.seq > 1
                else "first record: links to the genesis digest",
            )
        )
    checks = [Check(name, name not in failed, "; ".join(failed.get(name, [])) or words) for name, words in described]
    checks.append(Check("names the candidate's files", tree == record.candidate.tree_id, f"tree {tree[:16]}…"))
    return checks


@dataclass(frozen=True)
class TrialCount:
    split: str
    trials: int
    passed: int
    tasks: int
    tokens: int


def trial_counts(payload: dict[str, Any]) -> list[TrialCount]:
    """Aggregates of a record's trial rows per split (fine for every user)."""
    by_split: dict[str, dict[str, Any]] = {}
    for row in payload.get("trials") or []:
        if not isinstance(row, dict):
            continue
        entry = by_split.setdefault(str(row.get("split")), {"trials": 0, "passed": 0, "tasks": set(), "tokens": 0})
        entry["trials"] += 1
        entry["passed"] += row.get("outcome") == "pass"
        entry["tasks"].add(row.get("task"))
        entry["tokens"] += row.get("tokens") or 0
    order: dict[str, int] = {split: index for index, split in enumerate(SPLIT_ORDER)}
    return [
        TrialCount(split, e["trials"], e["passed"], len(e["tasks"]), e["tokens"])
        for split, e in sorted(by_split.items(), key=lambda item: (order.get(item[0], 99), item[0]))
    ]


# --- Candidate page -----------------------------------------------------------------


@dataclass(frozen=True)
class RecordPage(Page):
    record: CertifiedResult
    experiment: Experiment
    checks: list[Check]
    verified: bool
    counts: list[TrialCount]
    hidden_rows: int  # the sealed per-task rows left out of the payload shown
    payload_json: str
    evaluation_info: dict[str, Any]
    candidate_info: dict[str, Any]
    evaluator_info: dict[str, Any]
    task_sets: list[tuple[str, Any]]
    report: VerifyReport | None
    run_settings: str


def _previous_digest(record: CertifiedResult) -> str:
    """The stored digest of record seq - 1 (the genesis digest for the first), or "(missing)"."""
    if record.seq <= 1:
        return records.GENESIS
    # The record before it may be a decision: both tables share the chain.
    previous = (
        CertifiedResult.objects.filter(experiment_id=record.experiment_id, seq=record.seq - 1)
        .values_list("record_digest", flat=True)
        .first()
    ) or (
        CertifiedDecision.objects.filter(experiment_id=record.experiment_id, seq=record.seq - 1)
        .values_list("record_digest", flat=True)
        .first()
    )
    return previous if previous is not None else "(missing)"


def certified_record(*, pk: int) -> CertifiedResult:
    return get_object_or_404(CertifiedResult.objects.select_related("experiment", "candidate", "evaluation"), pk=pk)


def record_page(*, record: CertifiedResult, user: Any, report: VerifyReport | None) -> RecordPage:
    """Everything the record page shows of ``record`` to ``user``, with ``report``, the full verification of its
    experiment when the request asked for it (``records_verify``)."""
    checks = record_checks(record, previous_digest=_previous_digest(record))
    sealed = access.can_see_sealed(user)
    payload, hidden = access.record_payload_visible(
        record.payload, sealed=sealed, sealed_tasks=None if sealed else access.sealed_task_names(record.experiment_id)
    )
    certified = record.payload if isinstance(record.payload, dict) else {}  # else the checks say it is not
    evaluation = certified.get("evaluation") or {}
    return RecordPage(
        record=record,
        experiment=record.experiment,
        checks=checks,
        verified=all(check.ok for check in checks),
        counts=trial_counts(certified),
        hidden_rows=hidden,
        payload_json=json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False),
        evaluation_info=evaluation if isinstance(evaluation, dict) else {},
        candidate_info=certified.get("candidate") or {},
        evaluator_info=certified.get("evaluator") or {},
        task_sets=sorted((certified.get("task_sets") or {}).items()),
        report=report,
        run_settings=json.dumps(certified.get("run_settings"), sort_keys=True, ensure_ascii=False),
    )
