"""The round's decision, pure: from the round's measured candidates to what the loop writes.

``round_decide`` takes what the database holds at the end of a round (the current harness and the round's
candidates as measured, S_best, the noise band, the recipe's gate parameters, the structural kinds accepted so
far, the ledger so far) and returns a ``RoundDecision``: per candidate the gate's verdict and the rule that
fired, whether it is accepted, which one becomes the current harness, the ledger rows, the new S_best, the
measured component kinds and the pruning targets. ``evolution.loop.steps`` only loads its inputs and writes its
output, so every rule of the gate and of pruning is testable with numbers written by hand
(tests/evolution/test_decision.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from evolution.loop import regularization
from evolution.loop.regularization import CandidateId, CandidateStats, GateParams, GateVerdict, LedgerPoint
from evolution.metrics import relative_cost_change
from evolution.surfaces import STRUCTURAL_KINDS

__all__ = ["CandidateDecision", "Edit", "Gate", "LedgerRow", "Pruning", "RoundDecision", "round_decide"]

Gate = Callable[..., list[GateVerdict]]  # regularization.regularized_gate or unregularized_gate (or a registered one)

NOT_CHOSEN = "admissible, but another candidate of the round scored higher"


@dataclass(frozen=True)
class Edit:
    """One atomic edit of a candidate, as the ledger records it."""

    edit_id: int
    component: str
    hypothesis: str


@dataclass(frozen=True)
class Pruning:
    """Switch G of a recipe: advise deleting components whose best dS over the last ``window`` rounds is not
    above ``threshold``."""

    window: int
    threshold: float


@dataclass(frozen=True)
class CandidateDecision:
    """The gate's verdict on one candidate and what follows from it.

    ``accepted``: the candidate becomes an accepted harness (the chosen one, or any admissible one when the
    recipe accepts every admissible candidate). ``reason`` is the text kept with its new state.
    """

    candidate_id: CandidateId
    admissible: bool
    accepted: bool
    chosen: bool
    rule: str
    explanation: str
    reason: str
    numbers: dict[str, object]


@dataclass(frozen=True)
class LedgerRow:
    """One ledger row: an atomic edit and the measured dS and dC of its candidate against the current harness.
    ``delta_cost`` is None when the current harness reported no cost (a rise from 0 has no relative change)."""

    edit_id: int
    candidate_id: CandidateId
    component: str
    hypothesis: str
    delta_score: float
    delta_cost: float | None
    accepted: bool
    admissible: bool  # True and not accepted: admissible but not chosen, which refutes nothing


@dataclass(frozen=True)
class RoundDecision:
    round: int
    candidates: tuple[CandidateDecision, ...]  # in the order the candidates were given
    chosen: CandidateId | None  # the new current harness; None: the current harness stays
    ledger: tuple[LedgerRow, ...]
    best_score: float  # S_best after the round
    accepted_structural: tuple[str, ...]  # structural kinds touched by accepted edits so far, sorted
    measured_components: tuple[str, ...]  # component kinds with a ledger row so far, sorted
    pruning_targets: tuple[str, ...] | None  # None when pruning is off

    def of(self, candidate_id: CandidateId) -> CandidateDecision:
        return next(d for d in self.candidates if d.candidate_id == candidate_id)


def round_decide(
    *,
    round_number: int,
    current: CandidateStats,
    candidates: Sequence[CandidateStats],
    edits: dict[CandidateId, Sequence[Edit]],
    best_score: float,
    delta: float | None,
    gate: Gate,
    params: GateParams,
    accept: str = "chosen",
    accepted_structural: Iterable[str] = (),
    ledger_so_far: Sequence[LedgerPoint] = (),
    pruning: Pruning | None = None,
    best_floor_score: float | None = None,
) -> RoundDecision:
    """Decide round ``round_number``.

    ``current`` is the harness the candidates are compared with and ``best_score`` S_best before the round;
    ``candidates`` the round's measured candidates, each with the component kinds its edits touch, and
    ``edits`` each candidate's atomic edits (for the ledger). ``gate`` gives one verdict per candidate (the
    regularized gate of rules E and F in docs/concepts.md, or the unregularized baseline) and
    ``regularization.choose`` picks among the admissible ones: highest S, then lower cost, then lower id.
    ``accept`` is the recipe's ``gate.accept``: "chosen" accepts only the chosen candidate, "admissible" every
    admissible one.
    ``ledger_so_far`` holds the ledger of earlier rounds (for pruning and the measured kinds).
    ``best_floor_score`` is the best gate-split S so far when the recipe puts the floor on the gate split
    alone (passed to the gate only then, so a registered gate need not know it).

    Raises ``ValueError`` as the gate does (duplicate ids, a negative band) and on an unknown ``accept``.
    """
    if accept not in {"chosen", "admissible"}:
        raise ValueError(f"accept must be 'chosen' or 'admissible', got {accept!r}")
    structural = set(accepted_structural)
    floor = {} if best_floor_score is None else {"best_floor_score": best_floor_score}
    verdicts = (
        gate(
            current,
            list(candidates),
            best_score=best_score,
            delta=delta,
            params=params,
            accepted_structural_kinds=frozenset(structural),
            **floor,
        )
        if candidates
        else []
    )
    chosen = regularization.choose(verdicts, candidates) if verdicts else None
    by_id = {c.candidate_id: c for c in candidates}
    decisions: list[CandidateDecision] = []
    ledger: list[LedgerRow] = []
    for verdict in verdicts:
        stats = by_id[verdict.candidate_id]
        is_chosen = verdict.candidate_id == chosen
        keep = is_chosen or (verdict.admissible and accept == "admissible")
        reason = verdict.explanation if keep or not verdict.admissible else NOT_CHOSEN
        decisions.append(
            CandidateDecision(
                candidate_id=verdict.candidate_id,
                admissible=verdict.admissible,
                accepted=keep,
                chosen=is_chosen,
                rule=verdict.rule,
                explanation=verdict.explanation,
                reason=reason,
                numbers=dict(verdict.numbers),
            )
        )
        d_score = stats.score - current.score
        d_cost = relative_cost_change(stats.cost, current.cost)
        for edit in edits.get(verdict.candidate_id, ()):
            ledger.append(
                LedgerRow(
                    edit.edit_id,
                    verdict.candidate_id,
                    edit.component,
                    edit.hypothesis,
                    d_score,
                    d_cost,
                    keep,
                    verdict.admissible,
                )
            )
        if keep:
            structural |= set(stats.components) & STRUCTURAL_KINDS
    new_best = max(best_score, by_id[chosen].score) if chosen is not None else best_score
    points = [
        *ledger_so_far,
        *(LedgerPoint(round=round_number, component=r.component, dS=r.delta_score) for r in ledger),
    ]
    targets = None
    if pruning is not None:
        targets = tuple(
            regularization.pruning_targets(
                points, current_round=round_number, window=pruning.window, threshold=pruning.threshold
            )
        )
    return RoundDecision(
        round=round_number,
        candidates=tuple(decisions),
        chosen=chosen,
        ledger=tuple(ledger),
        best_score=new_best,
        accepted_structural=tuple(sorted(structural)),
        measured_components=tuple(sorted({p.component for p in points})),
        pruning_targets=targets,
    )
