"""From a proposer's answer to a frozen, checked candidate.

The platform never trusts a proposer: it recomputes the real diff between the
parent and the proposed files, checks it against the surface, checks that
every changed path is declared by an atomic edit, checks the edit count
against the round's budget, and drops duplicates, before anything runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import transaction

from evolution import hidden_chars, operators
from evolution.models import Candidate, LeakageFlag, ReviewItem, Run, SplitMembership, SplitName, Tree
from evolution.services.candidates import CandidateError, EditInput, candidate_create, candidate_transition
from evolution.services.snapshots import tree_entries, tree_store
from evolution.surfaces import check_diff, component_for, parse_surface
from evolution.trees import (
    FileEntry,
    SnapshotError,
    decodable_text,
    diff_entries,
    normalize_path,
    validate_entries,
)

if TYPE_CHECKING:
    from evolution.critic import CriticTask, TaskIndex

logger = logging.getLogger(__name__)


class ProposalRejected(ValueError):
    """A proposal that cannot even become a candidate (no tree to record)."""


@dataclass(frozen=True)
class FreezeOutcome:
    candidate: Candidate | None
    state: str  # the candidate state, or "duplicate" / "invalid"
    reason: str


def _text(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def proposal_tree(*, parent: Candidate, proposal: operators.Proposal) -> tuple[Tree, list[FileEntry], list[FileEntry]]:
    """Store the proposed files as a tree, keeping the parent's file modes."""
    old = tree_entries(tree=parent.tree)
    modes = {entry.path: entry.mode for entry in old}
    try:
        new = validate_entries(
            FileEntry(path=normalize_path(path), mode=modes.get(path, "100644"), data=data)
            for path, data in proposal.files.items()
        )
    except SnapshotError as exc:
        raise ProposalRejected(f"the proposed files are not a valid tree: {exc}") from exc
    return tree_store(entries=new), old, new


def _changed_paths(old: Sequence[FileEntry], new: Sequence[FileEntry]) -> set[str]:
    before = {e.path: (e.mode, e.data) for e in old}
    after = {e.path: (e.mode, e.data) for e in new}
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def _edit_diff(old: Sequence[FileEntry], new: Sequence[FileEntry], paths: Sequence[str]) -> str:
    wanted = set(paths)
    return diff_entries([e for e in old if e.path in wanted], [e for e in new if e.path in wanted])


def slot_label(*, run: Run, round: int, slot: int) -> str:
    """A proposal slot's label, unique within the experiment: "r<round>s<slot>" in its first run, prefixed
    with the run's number in the experiment ("run2-r1s0") in later runs, so labels never repeat across runs."""
    number = Run.objects.filter(experiment_id=run.experiment_id, pk__lt=run.pk).count() + 1
    own = f"r{round}s{slot}"
    return own if number == 1 else f"run{number}-{own}"


def candidate_freeze(
    *,
    run: Run,
    parent: Candidate,
    proposal: operators.Proposal,
    round: int,
    slot: int,
    edit_budget: int | None,
    origin: str = Candidate.Origin.PROPOSED,
    label: str | None = None,
) -> FreezeOutcome:
    """Check a proposal and record it as a candidate in its resulting state.

    The candidate gets ``origin`` and ``label`` (by default ``slot_label``'s).

    States: FROZEN (all checks passed; the critic comes next),
    REJECTED_SURFACE (real diff leaves the surface, or changes something no
    edit declares), REJECTED_BUDGET (more atomic edits than the round
    allows). A duplicate of an existing candidate, or an empty change, is
    dropped without a candidate. Writes nothing on ``ProposalRejected``.
    """
    tree, old, new = proposal_tree(parent=parent, proposal=proposal)
    changed = _changed_paths(old, new)
    if not changed:
        return FreezeOutcome(None, "invalid", "the proposal changes nothing")
    if Candidate.objects.filter(experiment_id=parent.experiment_id, tree=tree).exists():
        return FreezeOutcome(None, "duplicate", f"same content as an existing candidate ({tree.digest[:12]})")

    spec = parse_surface(run.experiment.surface.spec)
    # The decodable text of a file that is not UTF-8 is diffed too, so one NUL
    # or stray byte cannot hide hidden characters from refuse_hidden_characters.
    diff_text = diff_entries(old, new, binary_as_text=True)
    verdict = check_diff(
        spec, diff_text, old_files={e.path: e.data for e in old}, new_files={e.path: e.data for e in new}
    )

    declared = {normalize_path(p) for edit in proposal.edits for p in edit.paths}
    undeclared = sorted(changed - declared)
    reasons: list[str] = [f"{v.path}: {v.reason}" for v in verdict.violations]
    if undeclared:
        reasons.append("changed but declared by no atomic edit: " + ", ".join(undeclared))
    edits = [
        EditInput(
            component=edit.component,
            hypothesis=edit.hypothesis,
            paths=[normalize_path(p) for p in edit.paths],
            diff=_edit_diff(old, new, [normalize_path(p) for p in edit.paths]),
        )
        for edit in proposal.edits
    ]
    # The component an edit declares must be what the surface says its paths are.
    for edit in edits:
        kinds = {kind for path in edit.paths if path in changed and (kind := component_for(spec, path)) is not None}
        if kinds and kinds != {edit.component}:
            reasons.append(
                f"edit declared as {edit.component!r} changes {', '.join(sorted(kinds))} paths "
                f"({', '.join(edit.paths)})"
            )

    with transaction.atomic():
        try:
            candidate = candidate_create(
                parent=parent,
                tree=tree,
                edits=edits,
                origin=origin,
                run=run,
                round=round,
                label=slot_label(run=run, round=round, slot=slot) if label is None else label,
            )
        except CandidateError as exc:
            raise ProposalRejected(str(exc)) from exc
        if reasons:
            candidate_transition(
                candidate=candidate, to=Candidate.State.REJECTED_SURFACE, reason="; ".join(reasons)[:4000]
            )
            return FreezeOutcome(candidate, candidate.state, candidate.state_reason)
        if edit_budget is not None and len(edits) > edit_budget:
            reason = f"{len(edits)} atomic edits, the budget of round {round} is {edit_budget}"
            candidate_transition(candidate=candidate, to=Candidate.State.REJECTED_BUDGET, reason=reason)
            return FreezeOutcome(candidate, candidate.state, reason)
    return FreezeOutcome(candidate, Candidate.State.FROZEN, "")


def evolve_tasks_for_critic(*, run: Run) -> list[CriticTask]:
    """The evolve-set tasks (train and gate), the critic's reference set."""
    from evolution.critic import CriticTask

    memberships = (
        SplitMembership.objects.filter(experiment_id=run.experiment_id, split__in=[SplitName.TRAIN, SplitName.GATE])
        .select_related("task")
        .order_by("task__external_id")
    )
    tasks = []
    for membership in memberships:
        task = membership.task
        files: dict[str, str] = {}
        if task.public_files is not None:
            for entry in tree_entries(tree=task.public_files):
                text = _text(entry.data)
                if text is not None:
                    files[entry.path] = text
        tasks.append(CriticTask(id=task.external_id, instruction=task.instruction, expected=task.expected, files=files))
    return tasks


def _critic_flags(
    run: Run, diff_text: str, task_index: Sequence[CriticTask] | TaskIndex, parent_text: dict[str, str]
) -> list[Any]:
    """The flags of the recipe's critique operator (``rules`` unless it names
    another, e.g. ``llm``). A critic that cannot answer (an endpoint down)
    never passes a candidate as clean: its failure is one flag, so the
    policy holds the candidate for a person or rejects it. Whatever the
    operator, an edit adding hidden characters gets the rules critic's
    ``hidden_unicode`` flags: a model reading the diff cannot be relied on
    to notice a character that is not shown. ``diff_text`` is a diff of
    decodable text (it may hold NULs and surrogate escapes); another
    operator reads it made ``storable``."""
    from evolution import operators
    from evolution.critic import Flag, critique, hidden_flags
    from evolution.gitdiff import parse_git_diff
    from evolution.recipes import run_recipe

    spec = run_recipe(run).critique
    if spec.operator in ("rules", "none", ""):
        return critique(diff_text, task_index, parent_text=parent_text)
    hidden = hidden_flags(parse_git_diff(diff_text))
    function = operators.get("critique", spec.operator)
    try:
        readable = hidden_chars.storable(diff_text)
        return list(function(readable, task_index, parent_text=parent_text, params=spec.params)) + hidden
    except Exception as exc:
        logger.warning("critic %s failed on run %s: %s", spec.operator, run.pk, exc)
        failed = Flag("critic_unavailable", "", None, "", "", None, f"the {spec.operator} critic failed: {exc}")
        return [failed, *hidden]


def candidate_critique(*, run: Run, candidate: Candidate, policy: str, index: TaskIndex | None = None) -> str:
    """Run the leakage critic on a frozen candidate and apply the policy.

    ``policy``: "reject" (flagged -> REJECTED_CRITIC), "review" (flagged ->
    FLAGGED with a review item; the round goes on without it), "off" (no
    critic). Unflagged candidates become APPROVED. Safe to repeat: only a
    FROZEN candidate is critiqued.
    """
    from evolution.critic import build_index

    if policy == "off":
        candidate_transition(candidate=candidate, to=Candidate.State.APPROVED, reason="critic off")
        return candidate.state
    parent = candidate.parent
    assert parent is not None  # only the seed has no parent, and it is never critiqued
    parent_entries = tree_entries(tree=parent.tree)
    old = {e.path: decodable_text(e.data) for e in parent_entries}
    # Every changed file as text, binary or not: one NUL or byte that is not
    # UTF-8 must not switch the critic off (that byte is itself flagged).
    diff_text = diff_entries(parent_entries, tree_entries(tree=candidate.tree), binary_as_text=True)
    task_index = index if index is not None else build_index(evolve_tasks_for_critic(run=run))
    flags = _critic_flags(run, diff_text, task_index, old)
    with transaction.atomic():
        locked = Candidate.objects.select_for_update(no_key=True).get(pk=candidate.pk)
        if locked.state != Candidate.State.FROZEN:
            return locked.state
        if not flags:
            candidate_transition(candidate=locked, to=Candidate.State.APPROVED, reason="critic: clean")
            return locked.state
        edits = list(locked.edits.all())
        tasks = {
            t.external_id: t.pk
            for t in locked.experiment.benchmark.tasks.filter(external_id__in={f.task_id for f in flags if f.task_id})
        }
        LeakageFlag.objects.bulk_create(
            LeakageFlag(
                candidate=locked,
                edit=next((e for e in edits if flag.path in e.paths), None),
                rule=flag.rule,
                path=flag.path,
                # A flag on a file that is not UTF-8 may hold NULs and surrogate escapes.
                line=hidden_chars.storable(flag.line[:2000]),
                matched=hidden_chars.storable(flag.matched[:2000]),
                task_id=tasks.get(flag.task_id) if flag.task_id else None,
                evidence={"line_number": flag.line_number, "evidence": flag.evidence, "task": flag.task_id},
            )
            for flag in flags
        )
        summary = f"critic: {len(flags)} flag(s): " + ", ".join(sorted({f.rule for f in flags}))
        if policy == "reject":
            candidate_transition(candidate=locked, to=Candidate.State.REJECTED_CRITIC, reason=summary)
        else:
            candidate_transition(candidate=locked, to=Candidate.State.FLAGGED, reason=summary)
            ReviewItem.objects.get_or_create(candidate=locked)
        return locked.state


def components_of(*, spec_text: str, paths: Mapping[str, bytes]) -> dict[str, str]:
    spec = parse_surface(spec_text)
    return {path: kind for path in paths if (kind := component_for(spec, path)) is not None}
