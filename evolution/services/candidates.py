"""Candidate creation and state transitions.

The state machine is ``Candidate.TRANSITIONS``; every change goes through
``candidates_transition`` (``candidate_transition`` for one), a conditional UPDATE that only succeeds from an
allowed state, so two processes can never both move the same candidate.
Only an ACCEPTED candidate can be a parent, and ACCEPTED is reachable only
from CERTIFIED.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import QuerySet

from evolution.models import AtomicEdit, Candidate, ComponentKind, Run, Tree


class CandidateError(ValueError):
    pass


@dataclass(frozen=True)
class EditInput:
    component: str
    hypothesis: str
    paths: Sequence[str] = field(default_factory=tuple)
    diff: str = ""


class IllegalTransition(ValueError):
    """A transition ``Candidate.TRANSITIONS`` does not have: a programming error, never a lost race."""


def candidates_transition(*, candidates: QuerySet[Candidate], to: str, reason: str | None = None, **fields: Any) -> int:
    """Move every candidate of ``candidates`` that is in a state allowed to reach ``to`` (by
    ``Candidate.TRANSITIONS``) to ``to``, in one conditional UPDATE; the others are left as they are (a lost
    race or a repeated message). ``reason`` (when given) is kept as the state's reason; ``fields`` are set
    with the state (e.g. ``certified_at``). Returns how many moved. The one place a candidate's state
    changes, apart from the seed's and imported candidates' own rules below.

    Raises ``IllegalTransition`` when no state may reach ``to``.
    """
    allowed_from = [state for state, targets in Candidate.TRANSITIONS.items() if to in targets]
    if not allowed_from:
        raise IllegalTransition(f"no candidate state may move to {to!r}")
    values: dict[str, Any] = {"state": to, **fields}
    if reason is not None:
        values["state_reason"] = reason
    return candidates.filter(state__in=allowed_from).update(**values)


def candidate_transition(*, candidate: Candidate, to: str, reason: str = "") -> bool:
    """Move ``candidate`` to state ``to`` if allowed from its current state.

    Returns False (and changes nothing) when the candidate is not in a state
    that may move to ``to``: a lost race or a repeated message. Use
    ``candidate_accept`` for ACCEPTED, which also needs a certification.
    """
    updated = candidates_transition(candidates=Candidate.objects.filter(pk=candidate.pk), to=to, reason=reason)
    if updated:
        candidate.state = to
        candidate.state_reason = reason
    return bool(updated)


def candidate_accept(*, candidate: Candidate, reason: str = "") -> bool:
    """Accept a certified candidate (the gate's decision). False when it is
    not certified: an uncertified candidate is never accepted."""
    updated = candidates_transition(
        candidates=Candidate.objects.filter(
            pk=candidate.pk, state=Candidate.State.CERTIFIED, certified_at__isnull=False
        ),
        to=Candidate.State.ACCEPTED,
        reason=reason,
    )
    if updated:
        candidate.state = Candidate.State.ACCEPTED
    return bool(updated)


def candidate_create(
    *,
    parent: Candidate,
    tree: Tree,
    edits: Sequence[EditInput],
    origin: str = Candidate.Origin.PROPOSED,
    run: Run | None = None,
    round: int | None = None,
    label: str = "",
) -> Candidate:
    """Freeze a new candidate with its atomic edits under an accepted parent.

    Refuses a parent that is not ACCEPTED (still evaluating, awaiting the
    gate, rejected, flagged...), an unknown component kind, and a tree that
    duplicates an existing candidate of the experiment. Writes nothing when
    it refuses.
    """
    kinds = set(ComponentKind.values)
    for edit in edits:
        if edit.component not in kinds:
            raise CandidateError(f"unknown component kind {edit.component!r}")
        if not edit.hypothesis.strip():
            raise CandidateError("every atomic edit needs a hypothesis")
    with transaction.atomic():
        locked_parent = Candidate.objects.select_for_update(no_key=True).get(pk=parent.pk)
        if locked_parent.state != Candidate.State.ACCEPTED:
            raise CandidateError(
                f"candidate {locked_parent.pk} is {locked_parent.state}: only a certified, accepted candidate "
                "can be a parent"
            )
        if Candidate.objects.filter(experiment_id=locked_parent.experiment_id, tree=tree).exists():
            raise CandidateError(f"a candidate with tree {tree.digest[:12]} exists already (duplicate)")
        try:
            with transaction.atomic():
                candidate = Candidate.objects.create(
                    experiment_id=locked_parent.experiment_id,
                    run=run,
                    parent=locked_parent,
                    tree=tree,
                    origin=origin,
                    state=Candidate.State.FROZEN,
                    round=round,
                    label=label,
                )
        except IntegrityError as exc:  # a concurrent proposal of the same tree won
            raise CandidateError(f"a candidate with tree {tree.digest[:12]} exists already (duplicate)") from exc
        AtomicEdit.objects.bulk_create(
            AtomicEdit(
                candidate=candidate,
                index=index,
                component=edit.component,
                hypothesis=edit.hypothesis.strip(),
                paths=list(edit.paths),
                diff=edit.diff,
            )
            for index, edit in enumerate(edits)
        )
    return candidate
