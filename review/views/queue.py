"""Screen 7: the leakage review queue and a review item.

The queue answers "what is waiting for a human, and how good is the critic";
an item page answers "does this edit leak": the candidate's atomic edits with
their hypotheses, the critic's evidence line by line with the matched text
marked and the task it came from (when the reader may see that task), the
diff, and the decision. Decisions are written only through
``evolution.loop.review`` (the review service, then the evaluation of what
was approved); one decision per item whoever acts first.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.core.paginator import Page, Paginator
from django.db.models import Count, Exists, F, OuterRef, Q
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import path
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_GET, require_POST

from evolution import access
from evolution.flags import flag_matched, with_task_access
from evolution.loop.review import (
    corrections_of,
    review_correct,
    review_settle_due,
    review_submit,
    review_undo,
)
from evolution.models import (
    CANDIDATE_IN_FLIGHT,
    AtomicEdit,
    Candidate,
    Experiment,
    LeakageFlag,
    ReviewDecision,
    ReviewItem,
    ReviewPending,
)
from evolution.selectors import EarlierVerdict, earlier_verdicts, identical_waiting, same_verdict
from evolution.services.review import LIVE_RUNS, ReviewConflict, ReviewError, review_claim, review_release
from review.hidden import marked_spans, reveal_html
from review.pages.review_item import EvidenceFlag, evidence_flags

PAGE_SIZE = 25
WAITING = (ReviewItem.State.OPEN, ReviewItem.State.CLAIMED, ReviewItem.State.PENDING)
DECIDED_STATES = (ReviewItem.State.APPROVED, ReviewItem.State.REJECTED, ReviewItem.State.PARTIAL)
# Lines of one edit's own diff shown inline; the rest is in the diff screen.
EDIT_DIFF_LINES = 200
MATCHED_PREVIEW = 3

VERDICT_WORDS: dict[str, str] = {
    ReviewDecision.Verdict.APPROVE: "the edits are generic",
    ReviewDecision.Verdict.REJECT: "it leaks",
    ReviewDecision.Verdict.REJECT_EDITS: "some edits leak; the rest were kept in a derived candidate",
}
VERDICT_SHORT: dict[str, str] = {
    ReviewDecision.Verdict.APPROVE: "approved",
    ReviewDecision.Verdict.REJECT: "rejected",
    ReviewDecision.Verdict.REJECT_EDITS: "partly rejected",
}


def derived_outcome(candidate: Candidate) -> str:
    """What became of a derived candidate, in words."""
    if candidate.state == Candidate.State.FLAGGED:
        return "the critic flagged it again: it waits for its own review"
    if candidate.state == Candidate.State.REJECTED_CRITIC:
        return "the critic rejected it"
    if candidate.state in {Candidate.State.REJECTED_SURFACE, Candidate.State.REJECTED_BUDGET}:
        return f"it failed the checks: {candidate.state_reason}"
    if candidate.state in CANDIDATE_IN_FLIGHT:
        live = candidate.run is not None and candidate.run.status in LIVE_RUNS
        if live:
            return "the critic found it clean: it is evaluated and joins its run's next gate"
        return "the critic found it clean: its run is over, so it is evaluated and gated against its parent"
    if candidate.state == Candidate.State.CERTIFIED:
        return "it is evaluated and certified, and waits for its gate"
    return f"it is {candidate.get_state_display().lower()}"


# --- Marking matched text (untrusted: built with escape/format_html only) -----------


def _spans(text: str, needles: Iterable[str]) -> list[tuple[int, int]]:
    """Every case-insensitive occurrence of each needle, overlaps merged."""
    lowered = text.lower()
    found: list[tuple[int, int]] = []
    for needle in {n.lower() for n in needles if n}:
        found += [(m.start(), m.end()) for m in re.finditer(re.escape(needle), lowered)]
    merged: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def mark_matches(text: str, needles: Iterable[str]) -> SafeString:
    """``text`` escaped, with each occurrence of a needle in ``<mark>`` and
    hidden characters (found in the whole text) shown as markers."""
    return marked_spans(text, _spans(text, needles))


# --- Reads -------------------------------------------------------------------------


def _experiment_filter(request: HttpRequest) -> tuple[int | None, str]:
    raw = request.GET.get("experiment", "").strip()
    if not raw:
        return None, ""
    if not raw.isdigit():
        return None, f"experiment must be an experiment id, not {raw[:40]!r}"
    return int(raw), ""


def _page(request: HttpRequest, queryset: Any) -> Page:
    paginator = Paginator(queryset, PAGE_SIZE)
    return paginator.get_page(request.GET.get("page"))


def waiting_items(*, experiment_id: int | None) -> Any:
    """Flagged candidates waiting for a decision, oldest first, with flag counts."""
    items = (
        ReviewItem.objects.filter(state__in=WAITING)
        .select_related("candidate__experiment", "candidate__run", "candidate__parent", "claimed_by")
        .annotate(flag_count=Count("candidate__leakage_flags", distinct=True))
        .annotate(edit_count=Count("candidate__edits", distinct=True))
        .order_by("created_at", "pk")
    )
    if experiment_id is not None:
        items = items.filter(candidate__experiment_id=experiment_id)
    return items


def decided_items(*, experiment_id: int | None) -> Any:
    decisions = (
        ReviewDecision.objects.select_related("item__candidate__experiment", "reviewer", "derived_candidate")
        .annotate(rejected_count=Count("rejected_edits", distinct=True))
        .annotate(edit_count=Count("item__candidate__edits", distinct=True))
        .order_by("-created_at", "-pk")
    )
    if experiment_id is not None:
        decisions = decisions.filter(item__candidate__experiment_id=experiment_id)
    return decisions


@dataclass
class RuleRecord:
    rule: str
    confirmed: int = 0  # the reviewer rejected the flagged edit: a true leak
    overruled: int = 0  # the reviewer kept the flagged edit: a false positive
    pending: int = 0

    @property
    def reviewed(self) -> int:
        return self.confirmed + self.overruled

    @property
    def precision(self) -> float | None:
        return self.confirmed / self.reviewed if self.reviewed else None


@dataclass
class TrackRecord:
    decided: int = 0
    approved: int = 0
    rejected: int = 0
    partial: int = 0
    rules: list[RuleRecord] = field(default_factory=list)
    flags: RuleRecord = field(default_factory=lambda: RuleRecord("all rules"))

    @property
    def partial_share(self) -> float | None:
        return self.partial / self.decided if self.decided else None

    @property
    def false_positive_share(self) -> float | None:
        return self.approved / self.decided if self.decided else None


def track_record(*, experiment_id: int | None) -> TrackRecord:
    """The critic's record against human decisions (two queries).

    Per item: approved (a false positive), rejected (a true leak), partly
    rejected. Per flag: confirmed when its item was rejected or its edit was
    among the rejected edits of a partial decision; overruled when its item
    was approved or its edit was kept.
    """
    decisions = ReviewDecision.objects.all()
    flags = LeakageFlag.objects.filter(candidate__review_item__isnull=False)
    if experiment_id is not None:
        decisions = decisions.filter(item__candidate__experiment_id=experiment_id)
        flags = flags.filter(candidate__experiment_id=experiment_id)
    record = TrackRecord()
    for verdict, count in decisions.values_list("verdict").annotate(n=Count("pk")).values_list("verdict", "n"):
        record.decided += count
        if verdict == ReviewDecision.Verdict.APPROVE:
            record.approved += count
        elif verdict == ReviewDecision.Verdict.REJECT:
            record.rejected += count
        else:
            record.partial += count
    rejected_edit = ReviewDecision.rejected_edits.through.objects.filter(
        reviewdecision_id=OuterRef("candidate__review_item__decision__id"), atomicedit_id=OuterRef("edit_id")
    )
    rows = (
        flags.annotate(verdict=F("candidate__review_item__decision__verdict"), edit_rejected=Exists(rejected_edit))
        .values("rule", "verdict", "edit_rejected")
        .annotate(n=Count("pk"))
        .order_by()
    )
    by_rule: dict[str, RuleRecord] = {}
    for row in rows:
        rule = by_rule.setdefault(row["rule"], RuleRecord(row["rule"]))
        verdict, count = row["verdict"], row["n"]
        if verdict is None:
            rule.pending += count
        elif verdict == ReviewDecision.Verdict.REJECT or (
            verdict == ReviewDecision.Verdict.REJECT_EDITS and row["edit_rejected"]
        ):
            rule.confirmed += count
        else:
            rule.overruled += count
    record.rules = sorted(by_rule.values(), key=lambda r: (-r.reviewed, -r.pending, r.rule))
    for rule in record.rules:
        record.flags.confirmed += rule.confirmed
        record.flags.overruled += rule.overruled
        record.flags.pending += rule.pending
    return record


def _flag_summaries(candidate_ids: list[int], user: Any) -> dict[int, dict[str, Any]]:
    """Per candidate: flag count by rule and a few matched strings the user
    may see (``evolution.flags``), in one query."""
    summary: dict[int, dict[str, Any]] = defaultdict(lambda: {"rules": Counter(), "matched": []})
    flags = (
        with_task_access(LeakageFlag.objects.filter(candidate_id__in=candidate_ids))
        .order_by("candidate_id", "pk")
        .only("candidate_id", "rule", "matched", "task_id", "evidence")
    )
    for flag in flags:
        entry = summary[flag.candidate_id]
        entry["rules"][flag.rule] += 1
        text = (flag_matched(flag, user) or "").strip()
        if text and text not in entry["matched"]:
            entry["matched"].append(text)
    for entry in summary.values():
        entry["rules"] = sorted(entry["rules"].items(), key=lambda kv: (-kv[1], kv[0]))
        entry["more_matched"] = max(0, len(entry["matched"]) - MATCHED_PREVIEW)
        entry["matched"] = [text[:80] for text in entry["matched"][:MATCHED_PREVIEW]]
    return summary


def _with_history(items: list[Any]) -> list[Any]:
    """The page's waiting items with, per item, the verdicts of identical edits decided before (``earlier``:
    (edit index, EarlierVerdict)) and the other waiting items holding an identical edit (``same_as``); items
    with identical edits follow the oldest of them (``group_size`` on it, ``in_group`` on the others)."""
    edits = list(AtomicEdit.objects.filter(candidate_id__in=[item.candidate_id for item in items]).order_by("index"))
    earlier = earlier_verdicts(edits=edits)
    by_candidate: dict[int, list[AtomicEdit]] = defaultdict(list)
    for edit in edits:
        by_candidate[edit.candidate_id].append(edit)
    same = identical_waiting(item_ids=[item.pk for item in items], waiting_states=WAITING)
    on_page = {item.pk: item for item in items}
    for item in items:
        item.earlier = [(e.index, earlier[e.pk]) for e in by_candidate[item.candidate_id] if e.pk in earlier]
        item.same_as = same.get(item.pk, [])
        item.group_size, item.in_group = 0, False
    ordered: list[Any] = []
    placed: set[int] = set()
    for item in items:
        if item.pk in placed:
            continue
        group = [on_page[pk] for pk in item.same_as if pk in on_page and pk not in placed]
        item.group_size = len(group) + 1 if group else 0
        ordered.append(item)
        placed.add(item.pk)
        for member in group:
            member.in_group = True
            ordered.append(member)
            placed.add(member.pk)
    return ordered


@require_GET
@access.permission_required()
def queue(request: HttpRequest) -> HttpResponse:
    """Waiting items (oldest first) or recent decisions, across experiments,
    with the critic's track record."""
    experiment_id, problem = _experiment_filter(request)
    if problem:
        return HttpResponseBadRequest(problem)
    review_settle_due()  # decisions whose undo window passed take effect before the queue is read
    tab = request.GET.get("tab", "open")
    if tab not in {"open", "decided"}:
        return HttpResponseBadRequest("tab must be open or decided")
    experiments = list(
        Experiment.objects.annotate(
            waiting=Count("candidates__review_item", filter=Q(candidates__review_item__state__in=WAITING))
        )
        .order_by("name")
        .values("pk", "name", "waiting")
    )
    chosen = next((e for e in experiments if e["pk"] == experiment_id), None)
    if experiment_id is not None and chosen is None:
        return HttpResponseBadRequest(f"there is no experiment {experiment_id}")
    waiting = waiting_items(experiment_id=experiment_id)
    decided = decided_items(experiment_id=experiment_id)
    if tab == "open":
        page = _page(request, waiting)
        summaries = _flag_summaries([item.candidate_id for item in page], request.user)
        for item in page:
            item.flags = summaries.get(item.candidate_id, {"rules": [], "matched": [], "more_matched": 0})
        rows = _with_history(list(page))
        open_count, decided_count = page.paginator.count, decided.count()
    else:
        page = _page(request, decided)
        rows = list(page)
        open_count, decided_count = waiting.count(), page.paginator.count
    context = {
        "tab": tab,
        "page": page,
        "rows": rows,
        "experiments": experiments,
        "experiment": chosen,
        "open_count": open_count,
        "decided_count": decided_count,
        "record": track_record(experiment_id=experiment_id),
        "verdict_short": VERDICT_SHORT,
        "filter_query": f"experiment={experiment_id}&" if experiment_id is not None else "",
    }
    return render(request, "review/queue/queue.html", context)


@dataclass
class EvidenceLine:
    """The flags of one added line, with every matched text marked in it."""

    path: str
    line_number: int | None
    line: str
    flags: list[EvidenceFlag]

    @property
    def marked(self) -> SafeString:
        return mark_matches(self.line, [flag.shown_matched for flag in self.flags])


def _evidence_lines(flags: list[EvidenceFlag]) -> list[EvidenceLine]:
    lines: dict[tuple[str, int | None, str], EvidenceLine] = {}
    for flag in flags:
        key = (flag.path, flag.line_number, flag.line)
        if key not in lines:
            lines[key] = EvidenceLine(flag.path, flag.line_number, flag.line, [])
        lines[key].flags.append(flag)
    return list(lines.values())


# Evidence lines shown open for each rule; the rest of the rule's lines wait behind "more".
RULE_EXAMPLES = 3


@dataclass
class RuleGroup:
    """The flags of one rule: how many, on how many lines, the first lines
    as examples and the rest folded (an item may hold hundreds of flags)."""

    rule: str
    flag_count: int
    examples: list[EvidenceLine]
    more: list[EvidenceLine]

    @property
    def line_count(self) -> int:
        return len(self.examples) + len(self.more)


def _rule_groups(flags: list[EvidenceFlag]) -> list[RuleGroup]:
    """Flags grouped by rule, the largest group first."""
    by_rule: dict[str, list[EvidenceFlag]] = defaultdict(list)
    for flag in flags:
        by_rule[flag.rule].append(flag)
    groups = []
    for rule, own in sorted(by_rule.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines = _evidence_lines(own)
        groups.append(RuleGroup(rule, len(own), lines[:RULE_EXAMPLES], lines[RULE_EXAMPLES:]))
    return groups


@dataclass
class EditView:
    edit: AtomicEdit
    lines: list[EvidenceLine]
    flag_count: int
    diff_lines: list[SafeString]
    hidden_diff_lines: int
    groups: list[RuleGroup]
    earlier: EarlierVerdict | None = None  # an identical edit decided before


def _edit_diff(edit: AtomicEdit, flags: list[EvidenceFlag]) -> tuple[list[SafeString], int]:
    """The edit's own diff, added lines with the flagged text marked; long
    diffs are cut at EDIT_DIFF_LINES and the page says how much is left."""
    needles = [flag.shown_matched for flag in flags]
    shown = []
    # Lines end at LF alone, as git ends them: splitlines() would also cut at
    # U+2028 or a form feed and hide that character.
    lines = edit.diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for line in lines[:EDIT_DIFF_LINES]:
        if line.startswith(("+++", "---", "diff ", "index ")):
            shown.append(format_html('<span class="meta">{}</span>', reveal_html(line)))
        elif line.startswith("+"):
            shown.append(format_html('<span class="add">{}</span>', mark_matches(line, needles)))
        elif line.startswith("-"):
            shown.append(format_html('<span class="del">{}</span>', reveal_html(line)))
        elif line.startswith("@@"):
            shown.append(format_html('<span class="hunk">{}</span>', reveal_html(line)))
        else:
            shown.append(reveal_html(line))
    return shown, max(0, len(lines) - EDIT_DIFF_LINES)


def _item_context(request: HttpRequest, item: ReviewItem) -> dict[str, Any]:
    candidate = item.candidate
    pending = ReviewPending.objects.filter(item=item).select_related("reviewer").first()
    decision = (
        ReviewDecision.objects.filter(item=item)
        .select_related("reviewer", "derived_candidate__run")
        .prefetch_related("rejected_edits")
        .first()
    )
    edits = list(AtomicEdit.objects.filter(candidate=candidate).order_by("index"))
    flags = evidence_flags(candidate=candidate, user=request.user)
    by_edit: dict[int | None, list[EvidenceFlag]] = defaultdict(list)
    for flag in flags:
        by_edit[flag.edit_id].append(flag)
    edit_views = []
    for edit in edits:
        own = by_edit.get(edit.pk, [])
        diff_lines, hidden = _edit_diff(edit, own)
        edit_views.append(EditView(edit, _evidence_lines(own), len(own), diff_lines, hidden, _rule_groups(own)))
    rejected_ids = {edit.pk for edit in decision.rejected_edits.all()} if decision else set()
    derived_item = None
    if decision and decision.derived_candidate_id:
        derived_item = ReviewItem.objects.filter(candidate_id=decision.derived_candidate_id).first()
    derived_from = (
        ReviewDecision.objects.filter(derived_candidate=candidate).select_related("item", "reviewer").first()
        if candidate.origin == Candidate.Origin.DERIVED
        else None
    )
    next_item = (
        ReviewItem.objects.filter(state__in=WAITING)
        .exclude(pk=item.pk)
        .order_by("created_at", "pk")
        .values_list("pk", flat=True)
        .first()
    )
    user = request.user
    mine = item.state == ReviewItem.State.CLAIMED and item.claimed_by_id == user.pk
    earlier = earlier_verdicts(edits=edits)
    for view in edit_views:
        view.earlier = earlier.get(view.edit.pk)
    same = same_verdict(edits=edits, earlier=earlier)
    corrections = corrections_of(item_ids=[item.pk]).get(item.pk, [])
    return {
        "item": item,
        "candidate": candidate,
        "decision": decision,
        "decision_words": VERDICT_WORDS.get(decision.verdict, "") if decision else "",
        "decision_short": VERDICT_SHORT.get(decision.verdict, "") if decision else "",
        "derived_note": derived_outcome(decision.derived_candidate) if decision and decision.derived_candidate else "",
        "edit_views": edit_views,
        "orphan_lines": _evidence_lines(by_edit.get(None, [])),
        "orphan_groups": _rule_groups(by_edit.get(None, [])),
        "flag_count": len(flags),
        "rule_counts": sorted(Counter(flag.rule for flag in flags).items(), key=lambda kv: (-kv[1], kv[0])),
        "rejected_ids": rejected_ids,
        "derived_item": derived_item,
        "derived_from": derived_from,
        "next_item": next_item,
        "waiting": item.state in WAITING,
        "claimed_by_me": mine,
        "may_decide": mine and user.has_perm(access.REVIEW),
        "form": {"reason": "", "edits": set(), "verdict": ""},
        "error": "",
        "pending": pending if item.state == ReviewItem.State.PENDING else None,
        "pending_error": pending.error if pending is not None and item.state == ReviewItem.State.CLAIMED else "",
        "pending_mine": pending is not None and pending.reviewer_id == user.pk,
        "pending_words": VERDICT_SHORT.get(pending.verdict, "") if pending is not None else "",
        "corrections": corrections,
        "standing": corrections[-1] if corrections else None,
        "may_correct": item.state in DECIDED_STATES and user.has_perm(access.REVIEW),
        # The verdicts a correction may give: the other one, or either after a partial decision.
        "correct_to": _correct_to(corrections[-1].verdict if corrections else decision.verdict if decision else ""),
        "same": _same_offer(same, earlier, edits),
    }


def _correct_to(standing: str) -> list[str]:
    if standing == ReviewDecision.Verdict.REJECT_EDITS:
        return ["reject", "approve"]
    return ["approve"] if standing == ReviewDecision.Verdict.REJECT else ["reject"]


@dataclass
class SameOffer:
    """The decision that repeats the verdicts of identical edits decided before, ready to submit."""

    verdict: str
    edit_ids: list[int]
    reason: str
    words: str


def _same_offer(
    same: tuple[str, list[int]] | None, earlier: dict[int, EarlierVerdict], edits: list[AtomicEdit]
) -> SameOffer | None:
    if same is None:
        return None
    verdict, edit_ids = same
    sources = sorted({(v.item_id, v.reviewer, v.at) for v in (earlier[e.pk] for e in edits)}, key=lambda s: s[0])
    named = ", ".join(f"review #{item_id} by {who} on {at:%Y-%m-%d %H:%M}" for item_id, who, at in sources)
    words = {"approve": "approve", "reject": "reject", "reject_edits": "reject the edits rejected before"}[verdict]
    reason = f"Same verdict as the identical edit{'s' if len(edits) > 1 else ''} decided before ({named})."
    return SameOffer(verdict, edit_ids, reason, words)


def _load_item(pk: int) -> ReviewItem:
    return get_object_or_404(
        ReviewItem.objects.select_related("candidate__experiment", "candidate__parent", "candidate__run", "claimed_by"),
        pk=pk,
    )


@require_GET
@access.permission_required()
def review_item(request: HttpRequest, pk: int) -> HttpResponse:
    """One flagged candidate: edits, the critic's evidence, the diff, the decision. A pending decision whose
    undo window has passed takes effect first (the reader does what a lost task would have)."""
    review_settle_due(item_ids=[pk])
    item = _load_item(pk)
    return render(request, "review/queue/item.html", _item_context(request, item))


def _render_problem(
    request: HttpRequest, pk: int, message: str, status: int, form: dict[str, Any] | None = None
) -> HttpResponse:
    """The item as it is now, with what went wrong and the reviewer's input kept."""
    context = _item_context(request, _load_item(pk))
    context["error"] = message
    if form is not None:
        context["form"] = form
    return render(request, "review/queue/item.html", context, status=status)


def _claim_change(
    request: HttpRequest, pk: int, change: Callable[..., Any], *, refused: str, done: str
) -> HttpResponse:
    """Claim or release the item through ``change`` (a review service); on a
    conflict the item again with why (409), else back to it with ``done``."""
    item = get_object_or_404(ReviewItem, pk=pk)
    try:
        change(item=item, user=request.user)
    except ReviewConflict as exc:
        return _render_problem(request, pk, f"{refused}: {exc}.", 409)
    messages.success(request, done)
    return redirect("review:review_item", pk=pk)


@require_POST
@access.permission_required(access.REVIEW)
def claim(request: HttpRequest, pk: int) -> HttpResponse:
    return _claim_change(
        request, pk, review_claim, refused="Not claimed", done="Claimed by you: the others see you are on it."
    )


@require_POST
@access.permission_required(access.REVIEW)
def release(request: HttpRequest, pk: int) -> HttpResponse:
    return _claim_change(
        request, pk, review_release, refused="Not released", done="Released: the item is open for any reviewer again."
    )


@require_POST
@access.permission_required(access.REVIEW)
def decide(request: HttpRequest, pk: int) -> HttpResponse:
    """Approve, reject, or reject the selected edits and keep the rest: held for the undo window
    (``review_submit``), then it takes effect."""
    item = get_object_or_404(ReviewItem, pk=pk)
    verdict = request.POST.get("verdict", "")
    reason = request.POST.get("reason", "")
    selected = request.POST.getlist("edits")
    form = {"reason": reason, "edits": {int(value) for value in selected if value.isdigit()}, "verdict": verdict}
    try:
        if verdict not in ReviewDecision.Verdict.values:
            raise ReviewError("choose approve, reject, or reject the selected edits")
        outcome = review_submit(item=item, user=request.user, verdict=verdict, reason=reason, rejected_edits=selected)
    except ReviewConflict as exc:
        return _render_problem(request, pk, f"Nothing changed: {exc}.", 409, form)
    except ReviewError as exc:
        return _render_problem(request, pk, f"Nothing changed: {exc}.", 400, form)
    if isinstance(outcome, ReviewPending):
        messages.info(
            request,
            f"{VERDICT_SHORT[outcome.verdict].capitalize()}: it takes effect in a few seconds; Undo takes it back.",
        )
    elif outcome.derived_candidate_id:
        derived = Candidate.objects.select_related("run").get(pk=outcome.derived_candidate_id)
        messages.success(
            request,
            f"Recorded: {VERDICT_SHORT[outcome.verdict]} ({VERDICT_WORDS[outcome.verdict]}). "
            f"Derived candidate {derived.pk}: {derived_outcome(derived)}.",
        )
    else:
        messages.success(request, f"Recorded: {VERDICT_SHORT[outcome.verdict]} ({VERDICT_WORDS[outcome.verdict]}).")
    return redirect("review:review_item", pk=pk)


@require_POST
@access.permission_required(access.REVIEW)
def undo(request: HttpRequest, pk: int) -> HttpResponse:
    """Take back one's own decision inside its undo window."""
    item = get_object_or_404(ReviewItem, pk=pk)
    try:
        review_undo(item=item, user=request.user)
    except ReviewConflict as exc:
        return _render_problem(request, pk, f"Not undone: {exc}.", 409)
    messages.success(request, "Undone: nothing was recorded; the item is still yours to decide.")
    return redirect("review:review_item", pk=pk)


@require_POST
@access.permission_required(access.REVIEW)
def correct(request: HttpRequest, pk: int) -> HttpResponse:
    """Correct the decision that stands on a decided item (``review_correct``)."""
    item = get_object_or_404(ReviewItem, pk=pk)
    verdict = request.POST.get("verdict", "")
    reason = request.POST.get("reason", "")
    form = {"reason": reason, "edits": set(), "verdict": verdict}
    try:
        if verdict not in {"approve", "reject"}:
            raise ReviewError("choose approve or reject")
        correction = review_correct(item=item, user=request.user, approve=verdict == "approve", reason=reason)
    except ReviewConflict as exc:
        return _render_problem(request, pk, f"Not corrected: {exc}.", 409, form)
    except ReviewError as exc:
        return _render_problem(request, pk, f"Not corrected: {exc}.", 400, form)
    followed = "; ".join(correction.followed)
    messages.success(
        request,
        f"Corrected: {'approved' if verdict == 'approve' else 'rejected'}." + (f" {followed}." if followed else ""),
    )
    return redirect("review:review_item", pk=pk)


urlpatterns = [
    path("review/", queue, name="queue"),
    path("review/<int:pk>/", review_item, name="review_item"),
    path("review/<int:pk>/claim/", claim, name="review_claim"),
    path("review/<int:pk>/release/", release, name="review_release"),
    path("review/<int:pk>/decide/", decide, name="review_decide"),
    path("review/<int:pk>/undo/", undo, name="review_undo"),
    path("review/<int:pk>/correct/", correct, name="review_correct"),
]
