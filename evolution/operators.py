"""Operators: swappable implementations of the loop's stages, by name.

Pure contracts and registry, no ORM. The loop builds the inputs from the
database, calls the operator a recipe names, and checks what comes back
(surface, budget, duplicates) itself: an operator is never trusted.

Adding an operator is registering a function; the loop does not change:

    @register("parent_selection", "best")
    def best(candidates, *, rng, params): ...
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STAGES = ("parent_selection", "proposal", "critique", "gate", "pruning")

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {stage: {} for stage in STAGES}


class OperatorError(LookupError):
    pass


def register(stage: str, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    if stage not in _REGISTRY:
        raise OperatorError(f"unknown stage {stage!r}")

    def decorator(function: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[stage][name] = function
        return function

    return decorator


def get(stage: str, name: str) -> Callable[..., Any]:
    try:
        return _REGISTRY[stage][name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY.get(stage, {}))) or "(none)"
        raise OperatorError(f"no {stage} operator named {name!r} (known: {known})") from None


def known_operators() -> dict[str, set[str]]:
    """Stage -> operator names, for recipe validation."""
    return {stage: set(names) for stage, names in _REGISTRY.items()}


def operators_load() -> None:
    """Import the modules that register operators: the bundled proposers, the LLM operators and
    ``settings.RSI_OPERATOR_MODULES`` (a module that is not installed is skipped; an import error inside one is
    raised). ``EvolutionConfig.ready()`` calls it, once per process: whatever ran ``django.setup()`` (the web
    server, a Celery worker, a management command, the tests) has every operator, so nothing else calls it."""
    import importlib

    from django.conf import settings

    for module in ("evolution.proposers", "evolution.llm_operators", *settings.RSI_OPERATOR_MODULES):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


# --- Proposal -----------------------------------------------------------------


@dataclass(frozen=True)
class TrialEvidence:
    """One train-split trial of the parent, as the proposer may see it.

    Only train tasks ever become evidence: gate, sealed and held-out per-task
    results are protected and never reach a proposer.
    """

    task_id: str
    instruction: str
    index: int
    passed: bool
    score: float
    criteria: Sequence[Mapping[str, Any]]
    error: str
    trajectory: Sequence[Mapping[str, Any]]  # ATIF steps
    # The train task's expected data: train is the training set, and a
    # proposer that copies it into the harness is exactly what the critic
    # and the gate exist to catch. Never set for any other split.
    expected: Any = None


@dataclass(frozen=True)
class LedgerView:
    round: int
    component: str
    hypothesis: str
    delta_score: float
    delta_cost: float | None  # None: the harness compared with reported no cost
    accepted: bool  # adopted as the next harness
    admissible: bool = False  # passed the gate; admissible and not accepted: a sibling scored higher, not refuted

    @property
    def refuted(self) -> bool:
        """A rule of the gate rejected it: the hypothesis is not to be proposed again."""
        return not self.admissible and not self.accepted

    @property
    def verdict(self) -> str:
        return "accepted" if self.accepted else ("admissible, not chosen" if self.admissible else "rejected")


def cost_change_text(delta_cost: float | None) -> str:
    """A ledger row's dC for a proposer's prompt: signed, or why there is none."""
    return "n/a (no earlier cost)" if delta_cost is None else f"{delta_cost:+.4f}"


@dataclass(frozen=True)
class ProposerView:
    """Everything a proposer gets for one proposal slot, and nothing more."""

    round: int
    slot: int
    seed: int
    parent_files: Mapping[str, bytes]
    components: Mapping[str, str]  # path -> component kind, from the surface
    evidence: Sequence[TrialEvidence]
    ledger: Sequence[LedgerView]
    edit_budget: int | None  # None: no budget
    stalled: bool
    explore_components: Sequence[str]  # kinds never edited and measured; must be touched when stalled
    pruning_targets: Sequence[str]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EditDeclaration:
    component: str
    hypothesis: str
    paths: Sequence[str]


@dataclass(frozen=True)
class Proposal:
    """A proposer's answer: the complete new file set and its declared edits.

    ``files`` maps every path of the new harness to its content (a path the
    parent had and ``files`` lacks is deleted). The platform recomputes the
    real diff and checks every changed path is declared in some edit.
    """

    files: Mapping[str, bytes]
    edits: Sequence[EditDeclaration]
    note: str = ""
    usage: Mapping[str, int] = field(default_factory=dict)  # the proposer's own tokens, not the policy's


# --- Parent selection ---------------------------------------------------------


@dataclass(frozen=True)
class ParentCandidate:
    """An accepted candidate as parent selection sees it."""

    candidate_id: int
    score: float
    cost: float
    children: int
    accepted_round: int
    task_scores: Mapping[str, float]  # evolve-split per-task mean scores (for Pareto)


@register("parent_selection", "best")
def select_best(candidates: Sequence[ParentCandidate], *, rng: random.Random, params: Mapping[str, Any]) -> int:
    """The highest score; ties by lower cost, then the latest."""
    return min(candidates, key=lambda c: (-c.score, c.cost, -c.accepted_round, -c.candidate_id)).candidate_id


@register("parent_selection", "latest_accepted")
def select_latest(candidates: Sequence[ParentCandidate], *, rng: random.Random, params: Mapping[str, Any]) -> int:
    return max(candidates, key=lambda c: (c.accepted_round, c.candidate_id)).candidate_id


@register("parent_selection", "pareto")
def select_pareto(candidates: Sequence[ParentCandidate], *, rng: random.Random, params: Mapping[str, Any]) -> int:
    """Uniformly among candidates that are best on at least one task."""
    front = pareto_front(candidates)
    return rng.choice(sorted(front))


@register("parent_selection", "archive")
def select_archive(candidates: Sequence[ParentCandidate], *, rng: random.Random, params: Mapping[str, Any]) -> int:
    """Sampled by score and number of children: weight = (score + eps) / (1 + children),
    so good candidates are tried more and over-explored ones less."""
    epsilon = float(params.get("epsilon", 0.05))
    ordered = sorted(candidates, key=lambda c: c.candidate_id)
    weights = [(c.score + epsilon) / (1 + c.children) for c in ordered]
    return rng.choices([c.candidate_id for c in ordered], weights=weights, k=1)[0]


def pareto_front(candidates: Sequence[ParentCandidate]) -> set[int]:
    """Ids of the candidates that reach the best score on at least one task."""
    tasks = {task for c in candidates for task in c.task_scores}
    front: set[int] = set()
    for task in tasks:
        best = max(c.task_scores.get(task, 0.0) for c in candidates)
        if best <= 0:
            continue
        front.update(c.candidate_id for c in candidates if c.task_scores.get(task, 0.0) == best)
    return front or {c.candidate_id for c in candidates}


# --- Gate, critique and pruning -------------------------------------------------
# Registered here so recipes can name them; the implementations are the pure
# modules' functions.


def _register_builtin() -> None:
    from evolution import critic
    from evolution.loop import regularization

    register("gate", "regularized")(regularization.regularized_gate)
    register("gate", "unregularized")(regularization.unregularized_gate)
    register("critique", "rules")(critic.critique)
    register("pruning", "window")(regularization.pruning_targets)


_register_builtin()
