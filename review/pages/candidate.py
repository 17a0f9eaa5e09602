"""The candidate page (screen 3): why the gate decided what it did, its edits, flags, certified records and
per-split results, with its diff embedded; and the formatting of gate numbers, dS intervals and record checks
that the candidate, diff and record pages share. Reads only."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from django.db.models import Q
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.http import urlencode

from evolution import measurements, pricing, selectors
from evolution.flags import flag_matched, flag_task_visible, with_task_access
from evolution.loop import late, load, regularization
from evolution.loop.review import corrections_of
from evolution.models import (
    EVOLVE_SPLITS,
    STRUCTURAL_KINDS,
    AtomicEdit,
    Candidate,
    CertifiedResult,
    Evaluation,
    Experiment,
    GateDecision,
    LeakageFlag,
    LedgerEntry,
    ReviewCorrection,
    ReviewDecision,
    ReviewItem,
    Run,
    SplitName,
    Task,
)
from evolution.recipes import RecipeError, parse_recipe
from review import diffs, hidden
from review.pages import SPLIT_ORDER, Page, external_source_text
from review.pages.record import Check, record_checks

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
        return cls(
            pk=found.evaluation.pk,
            source=external_source_text(found.source),
            when=found.evaluation.finished_at or found.evaluation.created_at,
            trials=found.trials,
            passed=found.passed,
            mean_score=f"{found.mean_score:.3f}" if found.mean_score is not None else "n/a",
            mean_tokens=f"{found.mean_tokens:,.0f}" if found.mean_tokens is not None else "n/a",
            split_rows=split_rows(found.splits),
        )


def split_rows(splits: Mapping[str, Any]) -> list[SplitRowView]:
    """One row per split, in the splits' reading order (train, gate, sealed, held-out)."""
    order: dict[str, int] = {split: index for index, split in enumerate(SPLIT_ORDER)}
    return [
        SplitRowView.of(split, summary)
        for split, summary in sorted(splits.items(), key=lambda item: order.get(item[0], 99))
    ]


def _evolve_splits(candidate: Candidate) -> tuple[str, ...]:
    run = candidate.run
    if run is None or run.recipe is None:
        return EVOLVE_SPLITS
    try:
        return tuple(parse_recipe(run.recipe.spec).evaluation.evolve_splits)
    except (RecipeError, TypeError, ValueError):
        return EVOLVE_SPLITS


def flag_title(flag: ShownFlag) -> str:
    title = f"leakage flag: rule {flag.rule}"
    if flag.task_visible:
        if flag.task is not None:
            title += f"; task {flag.task.external_id}"
        if flag.evidence_text:
            title += f"; {flag.evidence_text}"
    # A tooltip takes no marker spans: a hidden character shows as its label (<U+202E>).
    return hidden.reveal_text(title)


# --- What the page shows of each row ----------------------------------------------------


@dataclass(frozen=True)
class ShownFlag:
    """A leakage flag as a page shows it: the matched text and the critic's evidence only where its task may be
    seen (``evolution.flags``); ``matched`` says only whether the flag matched any text."""

    pk: int
    rule: str
    path: str
    anchor: str  # the diff's anchor of its file, "" without a path
    edit_id: int | None
    matched: bool
    shown_matched: str  # "" when the task may not be seen
    line_number: int | None
    evidence_text: str
    task: Task | None
    task_id: int | None
    task_visible: bool

    @classmethod
    def of(cls, flag: LeakageFlag, user: Any) -> ShownFlag:
        """``flag`` comes from ``with_task_access``, with its task loaded."""
        evidence = flag.evidence if isinstance(flag.evidence, dict) else None
        return cls(
            pk=flag.pk,
            rule=flag.rule,
            path=flag.path,
            anchor=diffs.file_anchor(flag.path) if flag.path else "",
            edit_id=flag.edit_id,
            matched=bool(flag.matched),
            shown_matched=flag_matched(flag, user) or "",
            line_number=(evidence or {}).get("line_number") if evidence is not None else None,
            evidence_text=(evidence or {}).get("evidence", "") if evidence is not None else "",
            task=flag.task,
            task_id=flag.task_id,
            task_visible=flag_task_visible(flag, user),
        )


def shown_flags(*, candidate: Candidate, user: Any) -> list[ShownFlag]:
    """The candidate's leakage flags, by path, as ``user`` may see them."""
    flags = with_task_access(LeakageFlag.objects.filter(candidate=candidate)).select_related("task", "edit")
    return [ShownFlag.of(flag, user) for flag in flags.order_by("path", "pk")]


@dataclass(frozen=True)
class ShownEdit:
    """An atomic edit with links to its files in the diff, its ledger entry and how many flags name it."""

    pk: int
    index: int
    component: str
    hypothesis: str
    structural: bool
    path_links: list[tuple[str, str]]  # (path, its anchor in the diff)
    ledger: LedgerEntry | None
    flag_count: int


@dataclass(frozen=True)
class ShownDecision:
    """A gate decision with its rule in words, the rule's place in the gate's order and its numbers."""

    pk: int
    run_id: int
    run: Run
    round: int
    accepted: bool
    chosen: bool
    rule: str
    current: Candidate | None
    explanation: str
    words: str
    check_number: int | None
    number_rows: list[NumberRow]
    summary: str

    @classmethod
    def of(cls, decision: GateDecision) -> ShownDecision:
        numbers = decision.numbers if isinstance(decision.numbers, dict) else {}
        rules = regularization.GATE_RULES
        return cls(
            pk=decision.pk,
            run_id=decision.run_id,
            run=decision.run,
            round=decision.round,
            accepted=decision.accepted,
            chosen=decision.chosen,
            rule=decision.rule,
            current=decision.current,
            explanation=decision.explanation,
            words=RULE_WORDS.get(decision.rule, ""),
            check_number=rules.index(decision.rule) + 1 if decision.rule in rules else None,
            number_rows=gate_numbers(numbers),
            summary=gate_summary(numbers),
        )


@dataclass(frozen=True)
class ShownRecord:
    """A certified record of the candidate and what can be checked of it on its own (``record_checks``)."""

    pk: int
    seq: int
    evaluation: Evaluation
    checks: list[Check]
    verified: bool

    @classmethod
    def of(cls, record: CertifiedResult) -> ShownRecord:
        checks = record_checks(record)
        return cls(record.pk, record.seq, record.evaluation, checks, all(check.ok for check in checks))


def _count_by(items: list[Any], attribute: str) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for item in items:
        key = getattr(item, attribute)
        counts[key] = counts.get(key, 0) + 1
    return sorted(counts.items())


class Choice(TypedDict):
    pk: int
    label: str
    state: str
    round: int | None


# The "compare with" select lists at most this many of the other candidates (an experiment may have thousands).
COMPARE_CHOICES = 200


def candidate_choices(cand: Candidate, *, also: Candidate | None = None) -> list[Choice]:
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
    return cast("list[Choice]", sorted([*pinned, *latest], key=lambda choice: choice["pk"]))


# --- The page ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedDiff(Page):
    """The embedded diff's comparison and layout as the URL names them (``?against=&layout=``, what the form
    pushes into the address bar), so a reload or a shared link shows the same diff."""

    candidate: Candidate
    choices: list[Choice]
    against_choice: str  # "" : the parent
    layout_choice: str  # "" : the default layout
    diff_url: str
    embed_url: str


def embedded_diff(*, candidate: Candidate, against: str, layout: str) -> EmbeddedDiff:
    """``against`` and ``layout`` as given; an unknown value falls back to the default."""
    against = against.strip()
    compared = None
    if against.isdigit():
        others = Candidate.objects.filter(experiment_id=candidate.experiment_id).exclude(pk=candidate.pk)
        compared = others.filter(pk=int(against)).first()
    against = str(compared.pk) if compared is not None else ""
    choices = candidate_choices(candidate, also=compared)
    if layout not in ("split", "unified"):
        layout = ""
    diff_url = reverse("review:candidate_diff", args=[candidate.pk])
    chosen = {name: value for name, value in (("against", against), ("layout", layout)) if value}
    embed_query = urlencode({"partial": "1", **chosen})
    return EmbeddedDiff(candidate, choices, against, layout, diff_url, f"{diff_url}?{embed_query}")


def embedded_diff_page(*, pk: int, against: str, layout: str) -> EmbeddedDiff:
    """Only the embedded diff's placeholder (what the "compare with" form gets back)."""
    candidate = get_object_or_404(Candidate.objects.select_related("experiment"), pk=pk)
    return embedded_diff(candidate=candidate, against=against, layout=layout)


@dataclass(frozen=True)
class CandidatePage(Page):
    candidate: Candidate
    experiment: Experiment
    edits: list[ShownEdit]
    flags: list[ShownFlag]
    flag_rules: list[tuple[str, int]]
    decisions: list[ShownDecision]
    certified: list[ShownRecord]
    failing_records: list[ShownRecord]
    metrics: selectors.CandidateMetrics
    split_rows: list[SplitRowView]
    money: pricing.Money  # the counted trials' step tokens at list prices
    external_results: list[ExternalResultView]
    overall: str  # the summed contribution of the splits other than held-out
    evolve_splits: tuple[str, ...]
    delta: load.ComparedDelta | None
    delta_view: DeltaView | None
    children: list[Candidate]
    review_item: ReviewItem | None
    review_decision: ReviewDecision | None
    corrections: list[ReviewCorrection]
    derived_from: Candidate | None  # the candidate a reviewer's partial rejection derived this one from
    evaluable: bool
    embed: EmbeddedDiff


def _edits(candidate: Candidate, flags: list[ShownFlag]) -> list[ShownEdit]:
    flags_per_edit: dict[int, int] = {}
    for flag in flags:
        if flag.edit_id is not None:
            flags_per_edit[flag.edit_id] = flags_per_edit.get(flag.edit_id, 0) + 1
    diff_url = reverse("review:candidate_diff", args=[candidate.pk])
    return [
        ShownEdit(
            pk=edit.pk,
            index=edit.index,
            component=edit.component,
            hypothesis=edit.hypothesis,
            structural=edit.component in STRUCTURAL_KINDS,
            path_links=[(p, f"{diff_url}#{diffs.file_anchor(p)}") for p in (edit.paths or [])],
            ledger=getattr(edit, "ledger_entry", None),  # reverse one-to-one: absent raises AttributeError
            flag_count=flags_per_edit.get(edit.pk, 0),
        )
        for edit in AtomicEdit.objects.filter(candidate=candidate).select_related("ledger_entry").order_by("index")
    ]


def _certified(candidate: Candidate) -> list[ShownRecord]:
    found = CertifiedResult.objects.filter(candidate=candidate).select_related("evaluation", "experiment")
    shown = []
    for record in found.order_by("seq"):
        record.candidate = candidate  # known already: no query per record
        shown.append(ShownRecord.of(record))
    return shown


def candidate_page(*, pk: int, user: Any, against: str, layout: str) -> CandidatePage:
    """Everything screen 3 shows of candidate ``pk`` to ``user``, in a fixed number of queries whatever the
    experiment's size; ``against`` and ``layout`` are the embedded diff's (``embedded_diff``). Reads only: the
    view settles due review decisions first."""
    cand = get_object_or_404(
        Candidate.objects.select_related("experiment", "parent", "run__recipe", "tree", "review_item"), pk=pk
    )
    flags = shown_flags(candidate=cand, user=user)
    edits = _edits(cand, flags)
    decisions = [
        ShownDecision.of(decision)
        for decision in GateDecision.objects.filter(candidate=cand)
        .select_related("current", "run")
        .order_by("run_id", "round")
    ]
    certified = _certified(cand)
    result = selectors.candidate_metrics(candidate=cand)
    shown_splits = split_rows(result.splits)
    overall = sum(row.contribution_value for row in shown_splits if row.split != SplitName.HELDOUT)
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
    return CandidatePage(
        candidate=cand,
        experiment=cand.experiment,
        edits=edits,
        flags=flags,
        flag_rules=_count_by(flags, "rule"),
        decisions=decisions,
        certified=certified,
        failing_records=[record for record in certified if not record.verified],
        metrics=result,
        split_rows=shown_splits,
        money=selectors.step_tokens_money(trials=measurements.counted_trials(candidate_id=cand.pk)),
        external_results=external_results,
        overall=f"{overall * 100:.1f}%",
        evolve_splits=_evolve_splits(cand),
        delta=result.delta,
        delta_view=DeltaView.of(result.delta) if result.delta is not None else None,
        children=children,
        review_item=review_item,
        review_decision=review_decision,
        corrections=corrections,
        derived_from=derived_from.item.candidate if derived_from is not None else None,
        evaluable=cand.state in late.MEASURABLE,
        embed=embedded_diff(candidate=cand, against=against, layout=layout),
    )
