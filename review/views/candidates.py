"""Candidate page, side-by-side diff, raw files and certified records.

Views parse the request, call selectors and the pure diff module
(``review.diffs``), and render. Nothing here writes evolution state; the
only write is the reviewer's own "viewed" mark (``review.models.ViewedFile``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, cast

from django.conf import settings
from django.contrib import messages
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path, reverse
from django.utils.cache import patch_vary_headers
from django.utils.http import content_disposition_header, url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_POST

from evolution import access, hidden_chars, records, selectors
from evolution.flags import flag_matched, flag_task_visible, with_task_access
from evolution.loop import late, load, regularization
from evolution.loop.review import corrections_of, review_settle_due
from evolution.models import (
    EVOLVE_SPLITS,
    STRUCTURAL_KINDS,
    AtomicEdit,
    Candidate,
    CertifiedDecision,
    CertifiedResult,
    GateDecision,
    LeakageFlag,
    ReviewDecision,
    SplitName,
    TreeEntry,
)
from evolution.recipes import RecipeError, parse_recipe
from evolution.services.records import records_verify
from evolution.services.snapshots import tree_entries
from evolution.trees import FileEntry
from review import diffs, hidden
from review import selectors as review_selectors
from review.http import AuthenticatedHttpRequest, HtmxHttpRequest
from review.models import ViewedFile
from review.views.results import external_source_text

if TYPE_CHECKING:
    from review.display import ShownDecision, ShownEdit, ShownFlag, ShownRecord

SPLIT_ORDER = (SplitName.TRAIN, SplitName.GATE, SplitName.SEALED, SplitName.HELDOUT)
DIGEST_RE = re.compile(r"^(?:[0-9a-f]{64})?$")
DIFF_CACHE_SECONDS = 3600
# Bump when the rendered rows change shape, so stale cache entries are ignored.
DIFF_CACHE_VERSION = 4

# --- Gate decisions in words ------------------------------------------------------

RULE_WORDS: dict[str, str] = {
    "seed": "The seed is evaluated first and becomes the first parent.",
    "floor": "Floor (E): S fell below S_best - delta, so the candidate is out whatever else it does.",
    "guard_valid_output": "Domain guard (F): the valid-output rate fell by more than allowed.",
    "guard_no_submission": "Domain guard (F): the no-submission rate rose by more than allowed.",
    "admissible_above_noise": "Above the noise band (F): dS > delta and the cost rise dC is within c0 + c1 x dS.",
    "cost_too_high": "Above the noise band (F), but the cost rise dC exceeds the allowance c0 + c1 x dS.",
    "inside_noise_gain": "Inside the noise band (F): the objective lambda_S dS - lambda_C dC + lambda_N N_new is "
    "positive (a cost cut or a new structural mechanism).",
    "inside_noise_no_gain": "Inside the noise band (F): the objective lambda_S dS - lambda_C dC + lambda_N N_new is "
    "not positive; a score rise inside the noise earns nothing by itself.",
    "below_current": "Below the current harness by more than the noise band.",
    "passes_floor": "Admissibility (F) is off: at or above the floor is enough.",
    "unfiltered": "Neither the floor (E) nor admissibility (F) is on: everything is admissible.",
    "unregularized_beats_best": "Unregularized baseline: S beats the best score so far.",
    "unregularized_not_better": "Unregularized baseline: S does not beat the best score so far.",
}

# (key, meaning, format) in display order; keys not listed are shown raw after these.
NUMBER_LABELS: tuple[tuple[str, str, str], ...] = (
    ("S", "S: score of this candidate on the evolve set", "score"),
    ("S_current", "S of the current harness it was compared with", "score"),
    ("S_best", "S_best: best accepted score so far", "score"),
    ("dS", "dS = S - S_current", "signed_score"),
    ("dS_best", "S - S_best", "signed_score"),
    ("dS_low", "lower end of dS's paired bootstrap interval, at decision", "signed_score"),
    ("dS_high", "upper end of that interval", "signed_score"),
    ("confidence", "confidence of the interval", "percent"),
    ("paired_tasks", "tasks measured on both sides (the interval's pairs)", "int"),
    ("trials_digest", "digest of the two sets of trials the interval was computed on", "text"),
    ("delta", "delta: noise band used by the gate", "score"),
    ("delta_estimated", "delta estimated from repeated seed runs", "score"),
    ("floor", "floor = S_best - delta", "score"),
    ("repeats", "seed scores of the repeated runs", "list"),
    ("C", "C: mean policy tokens per trial", "tokens"),
    ("C_current", "C of the current harness", "tokens"),
    ("dC", "dC: relative change in tokens per trial", "signed_percent"),
    ("score_unit", "one score unit (e.g. one passing trial) in S", "score"),
    ("dS_units", "dS in score units", "number"),
    ("c0", "c0: cost allowance at dS = 0", "number"),
    ("c1", "c1: extra cost allowed per score unit", "number"),
    ("c_limit", "allowed dC = c0 + c1 x dS units", "signed_percent"),
    ("lambda_S", "lambda_S: weight of dS inside the noise band", "number"),
    ("lambda_C", "lambda_C: weight of dC", "number"),
    ("lambda_N", "lambda_N: weight of each new structural kind", "number"),
    ("N_new", "N_new (novelty): structural kinds no accepted edit touched before", "int"),
    ("new_structural_kinds", "those kinds", "list"),
    ("objective", "lambda_S dS - lambda_C dC + lambda_N N_new", "number"),
    ("valid_drop", "drop in the valid-output rate", "signed_percent"),
    ("valid_drop_limit", "largest drop allowed", "percent"),
    ("no_submission_rise", "rise in the no-submission rate", "signed_percent"),
    ("no_submission_rise_limit", "largest rise allowed", "percent"),
)


def _format_number(value: Any, kind: str) -> str:
    if value is None:
        return "n/a (infinite or undefined)" if kind in ("signed_percent", "number") else "n/a"
    if kind == "list":
        return ", ".join(str(item) for item in value) if isinstance(value, list | tuple) else str(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if kind == "score":
        return f"{value:.3f} ({value * 100:.2f} points)"
    if kind == "signed_score":
        return f"{value:+.3f} ({value * 100:+.2f} points)"
    if kind == "percent":
        return f"{value * 100:.1f}%"
    if kind == "signed_percent":
        return f"{value * 100:+.1f}%"
    if kind == "tokens":
        return f"{value:,.0f}"
    if kind == "int":
        return f"{value:,}" if isinstance(value, int) else f"{value:g}"
    return f"{value:.4g}"


@dataclass(frozen=True)
class NumberRow:
    key: str
    meaning: str
    value: str


def gate_numbers(numbers: dict[str, Any]) -> list[NumberRow]:
    """A gate decision's numbers, each with what it means, in reading order."""
    rows = [
        NumberRow(key, meaning, _format_number(numbers[key], kind))
        for key, meaning, kind in NUMBER_LABELS
        if key in numbers
    ]
    known = {key for key, _, _ in NUMBER_LABELS}
    rows += [NumberRow(key, "", _format_number(value, "number")) for key, value in numbers.items() if key not in known]
    return rows


def delta_text(delta: load.ComparedDelta) -> str:
    """The current estimate: dS with its interval and how many paired tasks it rests on, or why there is no
    interval."""
    e = delta.estimate
    text = interval_text(e.delta, e.low, e.high, e.pairs, e.confidence)
    if delta.noise_delta is not None:
        text += f"; noise band δ = {delta.noise_delta:.3f}"
    return text


def interval_text(
    d_score: float, low: float | None, high: float | None, pairs: int | None, confidence: float | None
) -> str:
    text = f"dS = {d_score:+.3f}"
    if low is not None and high is not None and confidence is not None:
        text += f" ({confidence:.0%} CI {low:+.3f} .. {high:+.3f} over {pairs} paired tasks)"
    elif pairs is None:
        text += " (the decision kept no interval)"
    else:
        text += f" (not enough data for an interval: {pairs} paired task{'s' if pairs != 1 else ''})"
    return text


def cost_text(delta_cost: float | None) -> str:
    return "" if delta_cost is None else f"dC = {delta_cost * 100:+.1f}%"


@dataclass(frozen=True)
class DeltaView:
    """What the candidate page says of dS and dC: the decision's numbers ("at decision") when a gate decided
    the candidate, and the current estimate when there is no decision or later measurements moved it."""

    decided_text: str  # "" when no gate decided it
    decided_cost: str
    current_text: str  # "" when the decision's numbers are still the current ones
    current_cost: str

    @classmethod
    def of(cls, delta: load.ComparedDelta) -> DeltaView:
        at = delta.at_decision
        current, current_cost = delta_text(delta), cost_text(delta.delta_cost)
        if at is None:
            return cls("", "", current, current_cost)
        decided = interval_text(at.delta, at.low, at.high, at.pairs, at.confidence)
        if delta.noise_delta is not None:
            decided += f"; noise band δ = {delta.noise_delta:.3f}"
        if not delta.moved:
            return cls(decided, cost_text(at.delta_cost), "", "")
        return cls(decided, cost_text(at.delta_cost), current, current_cost)


def gate_summary(numbers: dict[str, Any]) -> str:
    """The headline numbers of a decision in one line."""
    parts = []
    for key, label, kind in (
        ("dS", "dS", "signed_score"),
        ("dC", "dC", "signed_percent"),
        ("delta", "delta", "score"),
        ("N_new", "novelty N_new", "int"),
    ):
        if key in numbers:
            parts.append(f"{label} = {_format_number(numbers[key], kind)}")
    return " · ".join(parts)


# --- Certified records --------------------------------------------------------------


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


def _trial_counts(payload: dict[str, Any]) -> list[TrialCount]:
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
class SplitRowView:
    """One split's aggregates, formatted: rate and contribution are
    different numbers and are labelled apart on the page."""

    split: str
    tasks: int
    trials: int
    passed: int
    rate: str
    contribution: str
    pass_at_k: str
    pass_hat_k: str
    tokens: str
    steps: str
    contribution_value: float

    @classmethod
    def of(cls, split: str, summary: Any) -> SplitRowView:
        return cls(
            split=split,
            tasks=summary.tasks,
            trials=summary.trials,
            passed=round(summary.rate * summary.trials),
            rate=f"{summary.rate * 100:.1f}%",
            contribution=f"{summary.contribution * 100:.1f}%",
            pass_at_k=f"{summary.pass_at_k * 100:.1f}%",
            pass_hat_k=f"{summary.pass_hat_k * 100:.1f}%",
            tokens=f"{summary.mean_tokens:,.0f}" if summary.mean_tokens is not None else "n/a",
            steps=f"{summary.mean_steps:.1f}" if summary.mean_steps is not None else "n/a",
            contribution_value=summary.contribution,
        )


@dataclass
class ExternalResultView:
    """One external submission as the candidate page shows it: aggregates
    only (per split, never per task), always labelled external."""

    pk: int
    source: str
    when: Any
    trials: int
    passed: int
    mean_score: str
    mean_tokens: str
    split_rows: list[SplitRowView]

    @classmethod
    def of(cls, found: selectors.ExternalResult) -> ExternalResultView:
        order: dict[str, int] = {split: index for index, split in enumerate(SPLIT_ORDER)}
        return cls(
            pk=found.evaluation.pk,
            source=external_source_text(found.source),
            when=found.evaluation.finished_at or found.evaluation.created_at,
            trials=found.trials,
            passed=found.passed,
            mean_score=f"{found.mean_score:.3f}" if found.mean_score is not None else "n/a",
            mean_tokens=f"{found.mean_tokens:,.0f}" if found.mean_tokens is not None else "n/a",
            split_rows=[
                SplitRowView.of(split, summary)
                for split, summary in sorted(found.splits.items(), key=lambda item: order.get(item[0], 99))
            ],
        )


def _evolve_splits(candidate: Candidate) -> tuple[str, ...]:
    run = candidate.run
    if run is None or run.recipe is None:
        return EVOLVE_SPLITS
    try:
        return tuple(parse_recipe(run.recipe.spec).evaluation.evolve_splits)
    except (RecipeError, TypeError, ValueError):
        return EVOLVE_SPLITS


def _flags(candidate: Candidate, user: Any) -> list[ShownFlag]:
    """The candidate's leakage flags; each gets ``task_visible``: its task's
    name and the critic's evidence may be shown (``evolution.flags``)."""
    flags = cast(
        "list[ShownFlag]",
        list(
            with_task_access(LeakageFlag.objects.filter(candidate=candidate))
            .select_related("task", "edit")
            .order_by("path", "pk")
        ),
    )
    for flag in flags:
        flag.anchor = diffs.file_anchor(flag.path) if flag.path else ""
        flag.task_visible = flag_task_visible(flag, user)
        flag.shown_matched = flag_matched(flag, user) or ""
        flag.line_number = (flag.evidence or {}).get("line_number") if isinstance(flag.evidence, dict) else None
        flag.evidence_text = (flag.evidence or {}).get("evidence", "") if isinstance(flag.evidence, dict) else ""
    return flags


def _flag_title(flag: ShownFlag) -> str:
    title = f"leakage flag: rule {flag.rule}"
    if flag.task_visible:
        if flag.task is not None:
            title += f"; task {flag.task.external_id}"
        if flag.evidence_text:
            title += f"; {flag.evidence_text}"
    # A tooltip takes no marker spans: a hidden character shows as its label (<U+202E>).
    return hidden.reveal_text(title)


def _embedded_diff(cand: Candidate, query: Any) -> dict[str, Any]:
    """The embedded diff's comparison and layout as the URL names them
    (``?against=&layout=``, what the form pushes into the address bar), so a
    reload or a shared link shows the same diff; unknown values fall back."""
    against = query.get("against", "").strip()
    compared = None
    if against.isdigit():
        others = Candidate.objects.filter(experiment_id=cand.experiment_id).exclude(pk=cand.pk)
        compared = others.filter(pk=int(against)).first()
    against = str(compared.pk) if compared is not None else ""
    choices = _candidate_choices(cand, also=compared)
    layout = query.get("layout", "")
    if layout not in ("split", "unified"):
        layout = ""
    diff_url = reverse("review:candidate_diff", args=[cand.pk])
    chosen = {name: value for name, value in (("against", against), ("layout", layout)) if value}
    embed_query = urlencode({"partial": "1", **chosen})
    return {
        "candidate": cand,
        "choices": choices,
        "against_choice": against,
        "layout_choice": layout,
        "diff_url": diff_url,
        "embed_url": f"{diff_url}?{embed_query}",
    }


@require_GET
@access.permission_required()
def candidate(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Screen 3: one candidate, why the gate decided what it did, its edits,
    flags and per-split results (aggregates only), with its diff embedded.

    The diff's "compare with" and layout choices are in the URL; the form
    that changes them (htmx) gets only the embedded diff's placeholder back
    and pushes the URL, so a reload keeps them."""
    if request.htmx and request.htmx.target == "diff-embed" and not request.htmx.history_restore_request:
        cand = get_object_or_404(Candidate.objects.select_related("experiment"), pk=pk)
        response = render(request, "review/candidates/candidate.html#diff-embed", _embedded_diff(cand, request.GET))
        patch_vary_headers(response, ["HX-Request", "HX-Target"])
        return response
    review_settle_due(candidate_id=pk)  # a review decision whose undo window passed takes effect first
    cand = get_object_or_404(
        Candidate.objects.select_related("experiment", "parent", "run__recipe", "tree", "review_item"), pk=pk
    )
    edits = cast(
        "list[ShownEdit]",
        list(AtomicEdit.objects.filter(candidate=cand).select_related("ledger_entry").order_by("index")),
    )
    flags = _flags(cand, request.user)
    flags_per_edit: dict[int, int] = {}
    for flag in flags:
        if flag.edit_id is not None:
            flags_per_edit[flag.edit_id] = flags_per_edit.get(flag.edit_id, 0) + 1
    diff_url = reverse("review:candidate_diff", args=[cand.pk])
    for edit in edits:
        edit.structural = edit.component in STRUCTURAL_KINDS
        edit.flag_count = flags_per_edit.get(edit.pk, 0)
        edit.path_links = [(p, f"{diff_url}#{diffs.file_anchor(p)}") for p in (edit.paths or [])]
        edit.ledger = getattr(edit, "ledger_entry", None)

    decisions = cast(
        "list[ShownDecision]",
        list(GateDecision.objects.filter(candidate=cand).select_related("current", "run").order_by("run_id", "round")),
    )
    for decision in decisions:
        decision.words = RULE_WORDS.get(decision.rule, "")
        decision.check_number = (
            regularization.GATE_RULES.index(decision.rule) + 1 if decision.rule in regularization.GATE_RULES else None
        )
        numbers = decision.numbers if isinstance(decision.numbers, dict) else {}
        decision.number_rows = gate_numbers(numbers)
        decision.summary = gate_summary(numbers)

    certified = cast(
        "list[ShownRecord]",
        list(CertifiedResult.objects.filter(candidate=cand).select_related("evaluation", "experiment").order_by("seq")),
    )
    for record in certified:
        record.candidate = cand  # known already: no query per record
        record.checks = record_checks(record)
        record.verified = all(check.ok for check in record.checks)

    evolve = _evolve_splits(cand)
    result = selectors.candidate_metrics(candidate=cand)
    order: dict[str, int] = {split: index for index, split in enumerate(SPLIT_ORDER)}
    split_rows = [
        SplitRowView.of(split, summary)
        for split, summary in sorted(result.splits.items(), key=lambda item: order.get(item[0], 99))
    ]
    overall = sum(row.contribution_value for row in split_rows if row.split != SplitName.HELDOUT)
    delta = result.delta
    delta_view = DeltaView.of(delta) if delta is not None else None

    # Kept apart from the certified numbers above, which never count them.
    external_results = [ExternalResultView.of(found) for found in selectors.candidate_external_results(candidate=cand)]

    children = list(Candidate.objects.filter(parent=cand).order_by("pk").only("pk", "label", "state", "round"))
    review_item = getattr(cand, "review_item", None)  # reverse one-to-one: absent raises AttributeError
    review_decision = (
        ReviewDecision.objects.filter(item=review_item).select_related("reviewer").first() if review_item else None
    )
    corrections = corrections_of(item_ids=[review_item.pk]).get(review_item.pk, []) if review_item else []
    derived_from = (
        ReviewDecision.objects.filter(derived_candidate=cand).select_related("item__candidate").first()
        if cand.origin == Candidate.Origin.DERIVED
        else None
    )
    response = render(
        request,
        "review/candidates/candidate.html",
        {
            "candidate": cand,
            "experiment": cand.experiment,
            "edits": edits,
            "flags": flags,
            "flag_rules": _count_by(flags, "rule"),
            "decisions": decisions,
            "certified": certified,
            "failing_records": [record for record in certified if not record.verified],
            "metrics": result,
            "split_rows": split_rows,
            "external_results": external_results,
            "overall": f"{overall * 100:.1f}%",
            "evolve_splits": evolve,
            "delta": delta,
            "delta_view": delta_view,
            "children": children,
            "review_item": review_item,
            "review_decision": review_decision,
            "corrections": corrections,
            "derived_from": derived_from.item.candidate if derived_from is not None else None,
            "evaluable": cand.state in late.MEASURABLE,
            **_embedded_diff(cand, request.GET),
        },
    )
    patch_vary_headers(response, ["HX-Request", "HX-Target"])
    return response


@require_POST
@access.permission_required(access.OPERATE)
def candidate_evaluate(request: HttpRequest, pk: int) -> HttpResponse:
    """Evaluate a candidate on the gate's splits or on every split (``evolution.loop.late``): an approved one
    left behind by its run is evaluated and gated; a decided one is measured where it has no trials yet. A
    refusal is a message and changes nothing."""
    cand = get_object_or_404(Candidate.objects.all(), pk=pk)
    scope = request.POST.get("scope", "gate")
    try:
        outcome = late.candidate_evaluate_late(candidate_id=cand.pk, scope=scope)
    except late.LateError as exc:
        messages.error(request, f"Not evaluated: {exc}.")
    else:
        messages.success(request, f"{outcome.message[:1].upper()}{outcome.message[1:]}.")
    return redirect("review:candidate", pk=cand.pk)


def _count_by(items: list[Any], attribute: str) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for item in items:
        key = getattr(item, attribute)
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items())


class _Choice(TypedDict):
    pk: int
    label: str
    state: str
    round: int | None


# The "compare with" select lists at most this many of the other candidates (an experiment may have thousands).
COMPARE_CHOICES = 200


def _candidate_choices(cand: Candidate, *, also: Candidate | None = None) -> list[_Choice]:
    """The candidates of the "compare with" select, by number: the seed, the parent and ``also`` (the one
    compared with now), then the latest (by number) ``COMPARE_CHOICES`` of its children, its siblings and the
    experiment's accepted candidates. Two queries however large the experiment; any other candidate is
    compared with by its number (``?against=``)."""
    others = Candidate.objects.filter(experiment_id=cand.experiment_id).exclude(pk=cand.pk)
    first = {
        pk for pk in (cand.experiment.seed_candidate_id, cand.parent_id, also.pk if also else None) if pk is not None
    }
    fields = ("pk", "label", "state", "round")
    pinned = list(others.filter(pk__in=first).values(*fields))
    related = Q(parent_id=cand.pk) | Q(state=Candidate.State.ACCEPTED)
    if cand.parent_id is not None:
        related |= Q(parent_id=cand.parent_id)
    latest = list(others.filter(related).exclude(pk__in=first).order_by("-pk").values(*fields)[:COMPARE_CHOICES])
    return cast("list[_Choice]", sorted([*pinned, *latest], key=lambda choice: choice["pk"]))


# --- Diff ---------------------------------------------------------------------------


class BadInput(Exception):
    """A query parameter the user can fix; shown as a 400 with the message."""


@dataclass
class DiffRequest:
    candidate: Candidate
    against: Candidate | None  # None: the empty tree (the seed has no parent)
    layout: str
    against_is_parent: bool


def _parse_diff_request(request: HttpRequest, pk: int) -> DiffRequest:
    cand = get_object_or_404(Candidate.objects.select_related("experiment", "parent"), pk=pk)
    layout = request.GET.get("layout") or diffs.DEFAULT_LAYOUT
    if layout not in diffs.LAYOUTS:
        raise BadInput(f"layout must be one of {', '.join(diffs.LAYOUTS)}, not {layout[:40]!r}")
    raw = request.GET.get("against", "").strip()
    if not raw:
        return DiffRequest(cand, cand.parent, layout, True)
    if not raw.isdigit():
        raise BadInput(f"against must be a candidate number, not {raw[:40]!r}")
    against = Candidate.objects.filter(pk=int(raw), experiment_id=cand.experiment_id).first()
    if against is None:
        raise BadInput(f"candidate {raw} is not a candidate of experiment {cand.experiment.name!r}")
    return DiffRequest(cand, against, layout, against.pk == cand.parent_id)


def _leak_marks(cand: Candidate, user: Any) -> tuple[list[ShownFlag], dict[str, list[diffs.LeakMark]]]:
    flags = _flags(cand, user)
    marks: dict[str, list[diffs.LeakMark]] = {}
    for flag in flags:
        if flag.path and flag.shown_matched:
            marks.setdefault(flag.path, []).append(diffs.LeakMark(flag.path, flag.shown_matched, _flag_title(flag)))
    return flags, marks


def _render_cached(
    fd: diffs.FileDiff, layout: str, old: dict[str, FileEntry], new: dict[str, FileEntry], marks: list[diffs.LeakMark]
) -> None:
    """Render one file, reusing the rows of an identical earlier rendering:
    the key holds both blob digests, both paths (the lexer), the layout and
    the leak marks, so a changed file can never get stale rows."""
    mark_key = hashlib.sha256(
        json.dumps([[m.matched, m.title] for m in marks], ensure_ascii=False).encode()
    ).hexdigest()[:16]
    raw_key = "|".join(
        (fd.old_digest, fd.new_digest, fd.old_path or "", fd.path, layout, mark_key, str(DIFF_CACHE_VERSION))
    )
    key = "review-diff:" + hashlib.sha256(raw_key.encode("utf-8", "surrogateescape")).hexdigest()
    hit = cache.get(key)
    if hit is not None:
        fd.rows, fd.language, fd.body_html = hit
        return
    old_entry = old.get(fd.old_path) if fd.old_path is not None else None
    new_entry = new.get(fd.path) if fd.new is not None else None
    diffs.render_file(
        fd,
        layout=layout,
        old_data=old_entry.data if old_entry else None,
        new_data=new_entry.data if new_entry else None,
        marks=marks,
    )
    cache.set(key, (fd.rows, fd.language, fd.body_html), DIFF_CACHE_SECONDS)


class _ParseMemo:
    """Parsed file diffs in the cache, keyed by content (``diffs.ParsedMemo``)."""

    def get_many(self, keys: list[str]) -> dict[str, Any]:
        return cache.get_many(keys)

    def set_many(self, data: dict[str, Any]) -> None:
        cache.set_many(data, DIFF_CACHE_SECONDS)


def _diff_entries(req: DiffRequest) -> tuple[list[FileEntry], list[FileEntry]]:
    """The two trees of the diff: the base (empty for a seed) and the candidate."""
    old_entries = tree_entries(tree=req.against.tree) if req.against is not None else []
    return old_entries, tree_entries(tree=req.candidate.tree)


def _planned_files(old_entries: list[FileEntry], new_entries: list[FileEntry]) -> list[diffs.FileDiff]:
    """The files of the whole diff, collapsed as planned: only the files the
    plan may render are diffed (through the cache), the others wait for the
    counts request. The same plan on every request for the same trees."""
    files = diffs.list_file_diffs(old_entries, new_entries)
    memo = _ParseMemo()

    def count(fd: diffs.FileDiff) -> None:
        diffs.count_file_diffs([fd], old_entries, new_entries, memo=memo)

    diffs.plan_collapse(files, count=count)
    return files


def _diff_files(
    request: AuthenticatedHttpRequest, req: DiffRequest, *, only_path: str | None = None, count_all: bool = False
) -> tuple[list[diffs.FileDiff], list[ShownFlag]]:
    """The files of the diff, collapsed as planned and rendered where not;
    with ``count_all``, the collapsed files are counted too."""
    old_entries, new_entries = _diff_entries(req)
    if only_path is not None:
        files = diffs.build_file_diffs(old_entries, new_entries, only_path=only_path, memo=_ParseMemo())
        files = [fd for fd in files if only_path in (fd.path, fd.old_path)]
        if not files:
            raise Http404("this file is not part of the diff")
    else:
        files = _planned_files(old_entries, new_entries)
        if count_all:
            diffs.count_file_diffs(files, old_entries, new_entries, memo=_ParseMemo())
    viewed = set(
        ViewedFile.objects.filter(user=request.user, path__in=[fd.path for fd in files]).values_list(
            "path", "old_digest", "new_digest"
        )
    )
    flags, marks = _leak_marks(req.candidate, request.user)
    old_map = {entry.path: entry for entry in old_entries}
    new_map = {entry.path: entry for entry in new_entries}
    for fd in files:
        fd.viewed = (fd.path, fd.old_digest, fd.new_digest) in viewed
        if fd.collapsed is None and fd.hunks:
            _render_cached(fd, req.layout, old_map, new_map, marks.get(fd.path, []) if fd.new else [])
    return files, flags


def _diff_context(request: HttpRequest, req: DiffRequest, files: list[diffs.FileDiff], flags: list[ShownFlag]):
    cand = req.candidate
    query = {"layout": req.layout}
    if req.against is not None and not req.against_is_parent:
        query["against"] = str(req.against.pk)
    counts_url = reverse("review:candidate_diff", args=[cand.pk]) + "?" + urlencode({**query, "counts": "1"})
    return {
        "candidate": cand,
        "experiment": cand.experiment,
        "against": req.against,
        "against_is_parent": req.against_is_parent,
        "layout": req.layout,
        "layouts": diffs.LAYOUTS,
        "files": files,
        "tree": diffs.file_tree(files),
        "summary": diffs.DiffSummary(files),
        "flags": flags,
        "marked_flags": sum(1 for flag in flags if flag.path and flag.shown_matched),
        "collapse_lines": diffs.COLLAPSE_LINES,
        "page_budget": diffs.PAGE_BUDGET,
        "against_param": query.get("against", ""),
        "counts_url": counts_url,
        "here": request.get_full_path(),
    }


@require_GET
@access.permission_required()
def candidate_diff(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Screen 4: the diff against the parent (or ``?against=``), split or
    unified (``?layout=``); ``?partial=1`` gives only the diff body.

    The first response diffs only the files it renders. ``?counts=1`` counts
    the lines of the collapsed files too: an htmx request (the page sends it
    once loaded) gets only the counts, swapped into their placeholders; a
    plain request the whole page with every count."""
    try:
        req = _parse_diff_request(request, pk)
    except BadInput as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    counts = bool(request.GET.get("counts"))
    if counts and request.htmx:
        old_entries, new_entries = _diff_entries(req)
        files = _planned_files(old_entries, new_entries)
        late = [fd for fd in files if not fd.counted]
        diffs.count_file_diffs(late, old_entries, new_entries, memo=_ParseMemo())
        context = _diff_context(request, req, files, [])
        context["late"] = late
        return render(request, "review/candidates/diff.html#diff-counts", context)
    files, flags = _diff_files(request, req, count_all=counts)
    context = _diff_context(request, req, files, flags)
    if request.GET.get("partial"):
        return render(request, "review/candidates/diff.html#diff-body", context)
    context["choices"] = _candidate_choices(req.candidate, also=req.against)
    return render(request, "review/candidates/diff.html", context)


@require_GET
@access.permission_required()
def diff_file(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """One file of a diff in full (what a collapsed file's "Load diff" fetches)."""
    try:
        req = _parse_diff_request(request, pk)
    except BadInput as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    wanted = request.GET.get("path", "")
    if not wanted:
        return HttpResponseBadRequest("path is required", content_type="text/plain; charset=utf-8")
    files, flags = _diff_files(request, req, only_path=wanted)
    context = _diff_context(request, req, files, flags)
    if request.htmx:
        # The file's body, and its counts wherever the page still waits for them.
        context["f"] = files[0]
        return render(request, "review/candidates/diff.html#file-load", context)
    context["single"] = True
    context["choices"] = _candidate_choices(req.candidate, also=req.against)
    return render(request, "review/candidates/diff.html", context)


# An expansion shows at most this many lines (a whole file's context is one click, not unbounded work).
CONTEXT_MAX_LINES = 5000


@require_GET
@access.permission_required()
def diff_context(request: HttpRequest, pk: int) -> HttpResponse:
    """Unchanged lines of one file of the candidate, read from its stored
    tree, as diff rows (``?path=&layout=&first=&last=&shift=``): what the
    "expand" buttons of a diff fetch. ``shift`` numbers the old side."""
    cand = get_object_or_404(Candidate, pk=pk)
    file_path = request.GET.get("path", "")
    layout = request.GET.get("layout") or diffs.DEFAULT_LAYOUT
    try:
        first, last, shift = (int(request.GET.get(name, "")) for name in ("first", "last", "shift"))
    except ValueError:
        return HttpResponseBadRequest(
            "first, last and shift must be integers", content_type="text/plain; charset=utf-8"
        )
    if not file_path or layout not in diffs.LAYOUTS or first < 1 or last < first or last - first >= CONTEXT_MAX_LINES:
        return HttpResponseBadRequest(
            f"path, a layout and 1 <= first <= last (at most {CONTEXT_MAX_LINES} lines) are required",
            content_type="text/plain; charset=utf-8",
        )
    data = review_selectors.tree_file(candidate=cand, path=file_path)
    if data is None:
        raise Http404("no such file in this candidate")
    _flags_shown, marks = _leak_marks(cand, request.user)
    rows = diffs.context_rows(
        new_data=data,
        path=file_path,
        layout=layout,
        first=first,
        last=last,
        shift=shift,
        anchor=diffs.file_anchor(file_path),
        marks=marks.get(file_path, []),
    )
    return HttpResponse(rows, content_type="text/html; charset=utf-8")


@require_POST
@access.permission_required()
def diff_viewed(request: HtmxHttpRequest) -> HttpResponse:
    """Mark one file of a diff viewed or not viewed for the signed-in user.

    The mark is keyed by the blob digests of both sides, so it stops
    applying as soon as either side of the file changes. ``viewed`` = 1/0
    sets the state; without it the mark is toggled. Safe to repeat with
    ``viewed``; concurrent duplicates are absorbed by the unique constraint.
    """
    file_path = request.POST.get("path", "")
    old_digest = request.POST.get("old_digest", "")
    new_digest = request.POST.get("new_digest", "")
    if not file_path or len(file_path) > 1024:
        return HttpResponseBadRequest("path must be 1 to 1024 characters", content_type="text/plain; charset=utf-8")
    if not DIGEST_RE.match(old_digest) or not DIGEST_RE.match(new_digest) or not (old_digest or new_digest):
        return HttpResponseBadRequest(
            "old_digest and new_digest must be SHA-256 hex digests (one may be empty)",
            content_type="text/plain; charset=utf-8",
        )
    keys: dict[str, Any] = {"user": request.user, "path": file_path, "old_digest": old_digest, "new_digest": new_digest}
    wanted = request.POST.get("viewed")
    with transaction.atomic():
        existing = ViewedFile.objects.filter(**keys)
        target = (wanted in ("1", "on", "true")) if wanted is not None else not existing.exists()
        if target:
            try:
                with transaction.atomic():
                    ViewedFile.objects.get_or_create(**keys)
            except IntegrityError:
                pass  # a concurrent request marked it first: the state we want
        else:
            existing.delete()
    if request.htmx:
        state = {
            "path": file_path,
            "old_digest": old_digest,
            "new_digest": new_digest,
            "viewed": target,
            "anchor": diffs.file_anchor(file_path),
        }
        here = request.POST.get("next", "").split("#")[0]
        return render(request, "review/candidates/diff.html#viewed-form", {"f": state, "here": here})
    next_url = request.POST.get("next", "")
    if next_url and url_has_allowed_host_and_scheme(next_url, {request.get_host()}, request.is_secure()):
        return redirect(next_url)
    return redirect("review:home")


@require_GET
@access.permission_required()
def candidate_raw(request: HttpRequest, pk: int, path: str) -> HttpResponse:
    """One file of the candidate's tree as plain text, never interpreted.

    The bytes are exact, so a file holding hidden characters (bidi controls,
    zero-width...) is sent as a download, never shown inline: a browser
    would apply them. The diff shows them as markers."""
    cand = get_object_or_404(Candidate, pk=pk)
    entry = TreeEntry.objects.filter(tree_id=cand.tree_id, path=path).select_related("blob").first()
    if entry is None:
        raise Http404("no such file in this candidate")
    data = bytes(entry.blob.content)
    response = HttpResponse(data, content_type="text/plain; charset=utf-8")
    hidden = bool(hidden_chars.bytes_hidden(data))
    disposition = content_disposition_header(hidden, path.rsplit("/", 1)[-1])
    if disposition is not None:  # None only for an empty name, which no tree entry has
        response.headers["Content-Disposition"] = disposition
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


# --- Record page --------------------------------------------------------------------


@require_GET
@access.permission_required()
def record(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A certified record: what it binds, whether it checks out on its own,
    and its payload (sealed per-task rows only with the permission).

    ``?verify=1`` also runs the full verification of the record's experiment
    (chain, trees, evaluator, task sets, trial rows). It is read-only but its
    work grows with the experiment, so it runs on request only; an htmx
    request gets just the report."""
    rec = get_object_or_404(CertifiedResult.objects.select_related("experiment", "candidate", "evaluation"), pk=pk)
    if rec.seq > 1:
        # The record before it may be a decision: both tables share the chain.
        previous = (
            CertifiedResult.objects.filter(experiment_id=rec.experiment_id, seq=rec.seq - 1)
            .values_list("record_digest", flat=True)
            .first()
        ) or (
            CertifiedDecision.objects.filter(experiment_id=rec.experiment_id, seq=rec.seq - 1)
            .values_list("record_digest", flat=True)
            .first()
        )
        previous_digest = previous if previous is not None else "(missing)"
    else:
        previous_digest = records.GENESIS
    checks = record_checks(rec, previous_digest=previous_digest)
    report = records_verify(experiment=rec.experiment) if request.GET.get("verify") else None
    if report is not None and request.htmx:
        return render(request, "review/candidates/record.html#verify-report", {"report": report, "record": rec})
    sealed = access.can_see_sealed(request.user)
    payload, hidden = access.record_payload_visible(
        rec.payload, sealed=sealed, sealed_tasks=None if sealed else access.sealed_task_names(rec.experiment_id)
    )
    certified = rec.payload if isinstance(rec.payload, dict) else {}  # else the checks say it is not
    evaluation = certified.get("evaluation") or {}
    return render(
        request,
        "review/candidates/record.html",
        {
            "record": rec,
            "experiment": rec.experiment,
            "checks": checks,
            "verified": all(check.ok for check in checks),
            "counts": _trial_counts(certified),
            "hidden_rows": hidden,
            "payload_json": json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False),
            "evaluation_info": evaluation if isinstance(evaluation, dict) else {},
            "candidate_info": certified.get("candidate") or {},
            "evaluator_info": certified.get("evaluator") or {},
            "task_sets": sorted((certified.get("task_sets") or {}).items()),
            "report": report,
            "run_settings": json.dumps(certified.get("run_settings"), sort_keys=True, ensure_ascii=False),
        },
    )


urlpatterns = [
    path("candidates/<int:pk>/", candidate, name="candidate"),
    path("candidates/<int:pk>/evaluate/", candidate_evaluate, name="candidate_evaluate"),
    path("candidates/<int:pk>/diff/", candidate_diff, name="candidate_diff"),
    path("candidates/<int:pk>/diff/file/", diff_file, name="diff_file"),
    path("candidates/<int:pk>/diff/context/", diff_context, name="diff_context"),
    path("candidates/<int:pk>/raw/<path:path>", candidate_raw, name="candidate_raw"),
    path("diff/viewed/", diff_viewed, name="diff_viewed"),
    path("records/<int:pk>/", record, name="record"),
]
