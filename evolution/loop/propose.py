"""Proposing a round: fill its proposal slots, each in one transaction, and what the proposer may see.

``round_propose`` works slot by slot and skips slots that are done, so a crash anywhere resumes where it
stopped and a duplicate message does nothing. Every random choice is seeded from the recipe seed, the round
and the slot, so a resumed run ends in the same state as one that never stopped.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import IntegrityError, transaction

from evolution import digests, faults, operators
from evolution.loop import load, regularization
from evolution.loop.enqueue import advance_after_commit
from evolution.loop.lifecycle import ACTIVE, LoopError, run_recipe
from evolution.loop.state import RunState
from evolution.loop.steps import transfer_splits
from evolution.models import Candidate, Evaluation, LedgerEntry, Run, SplitName, TrajectoryStep, Trial
from evolution.recipes import Recipe as RecipeSpec
from evolution.services import evaluation as evaluation_services
from evolution.services import proposals
from evolution.services.candidates import candidate_transition
from evolution.services.snapshots import tree_entries
from evolution.surfaces import component_for, parse_surface

__all__ = ["candidate_evaluate", "proposer_view", "round_propose"]

logger = logging.getLogger(__name__)


def round_propose(*, run_id: int, round_number: int) -> int:
    """Fill the round's proposal slots that are not done yet; then hand the
    round to run_advance. Safe to repeat. Returns the number of slots filled."""
    run = Run.objects.select_related("experiment__surface", "current_candidate").get(pk=run_id)
    if run.status not in ACTIVE or run.current_round != round_number or RunState.of(run).phase != "proposing":
        return 0
    recipe = run_recipe(run)
    filled = 0
    critic_index = None
    for slot in range(recipe.candidates_per_round):
        if _slot_done(run, round_number, slot):
            continue
        if critic_index is None and recipe.critique.enabled and recipe.critique.leakage_policy != "off":
            from evolution.critic import build_index

            critic_index = build_index(proposals.evolve_tasks_for_critic(run=run))
        _propose_slot(run, recipe, round_number, slot, critic_index)
        filled += 1
        run.refresh_from_db(fields=["status", "state"])
        if run.status not in ACTIVE:
            return filled
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run_id)
        state = RunState.of(locked)
        if state.phase == "proposing" and locked.current_round == round_number:
            state.phase = "evaluating"
            state.save(locked)
            locked.save(update_fields=["state"])
            advance_after_commit(locked.pk)
    return filled


def _rng(recipe: RecipeSpec, *parts: object) -> random.Random:
    material = digests.sha256_hex("\n".join(str(p) for p in (recipe.seed, *parts)).encode())
    return random.Random(int(material[:16], 16))


def _slot_done(run: Run, round_number: int, slot: int) -> bool:
    label = proposals.slot_label(run=run, round=round_number, slot=slot)
    if Candidate.objects.filter(run=run, round=round_number, label=label).exists():
        return True
    return any(item.get("slot") == slot for item in RunState.of(run).dropped_in(round_number))


def _parents(run: Run, recipe: RecipeSpec) -> list[operators.ParentCandidate]:
    """The run's own lineage: its start and what its gates accepted (a decision of this run, round 0 being the
    start's), never another run's harnesses: a run's gains are measured from its start."""
    accepted = (
        Candidate.objects.filter(state=Candidate.State.ACCEPTED, gate_decisions__run=run, gate_decisions__accepted=True)
        .distinct()
        .order_by("pk")
    )
    splits = list(recipe.evaluation.evolve_splits)
    metric = recipe.evaluation.score_metric
    result = []
    for candidate in accepted:
        stats = load.candidate_stats(candidate, splits, metric)
        if stats is None:
            continue
        task_scores: dict[str, list[float]] = {}
        for task, outcome in Trial.objects.filter(
            candidate=candidate, split__in=splits, evaluation__state=Evaluation.State.CERTIFIED
        ).values_list("task__external_id", "outcome"):
            task_scores.setdefault(task, []).append(1.0 if outcome == Trial.Outcome.PASS else 0.0)
        decision = candidate.gate_decisions.filter(run=run).order_by("round").first()
        result.append(
            operators.ParentCandidate(
                candidate_id=candidate.pk,
                score=stats.score,
                cost=stats.cost,
                children=candidate.children.count(),
                accepted_round=decision.round if decision else 0,
                task_scores={t: sum(v) / len(v) for t, v in task_scores.items()},
            )
        )
    return result


def proposer_view(
    *,
    run: Run,
    recipe: RecipeSpec,
    parent: Candidate,
    round_number: int,
    slot: int,
    budget: int | None,
    stalled: bool,
    explore: Sequence[str],
) -> operators.ProposerView:
    """What the proposer may see: the parent's files, its TRAIN-split trials
    with trajectories, the ledger, the budget and the exploration and pruning
    targets. Gate, sealed and held-out per-task results never enter it."""
    spec = parse_surface(run.experiment.surface.spec)
    files = {entry.path: entry.data for entry in tree_entries(tree=parent.tree)}
    trials = list(
        Trial.objects.filter(
            candidate=parent,
            split=SplitName.TRAIN,
            evaluation__state=Evaluation.State.CERTIFIED,
            evaluation__purpose__in=[Evaluation.Purpose.BASELINE, Evaluation.Purpose.CANDIDATE],
        )
        .select_related("task")
        .order_by("task__external_id", "index", "pk")
    )
    steps: dict[int, list[dict[str, Any]]] = {}
    for step in TrajectoryStep.objects.filter(trajectory__trial__in=[t.pk for t in trials]).values(
        "trajectory__trial_id", "step_id", "source", "message", "tool_calls", "observation"
    ):
        own = {key: value for key, value in step.items() if key != "trajectory__trial_id"}
        steps.setdefault(step["trajectory__trial_id"], []).append(own)
    evidence = [
        operators.TrialEvidence(
            task_id=t.task.external_id,
            instruction=t.task.instruction,
            index=t.index,
            passed=t.outcome == Trial.Outcome.PASS,
            score=t.score or 0.0,
            criteria=t.criteria_results,
            error=t.error_kind,
            trajectory=steps.get(t.pk, []),
            expected=t.task.expected,
        )
        for t in trials
    ]
    ledger = []
    if recipe.ledger.enabled:
        ledger = [
            operators.LedgerView(
                round=e.round,
                component=e.component,
                hypothesis=e.hypothesis,
                delta_score=e.delta_score,
                delta_cost=e.delta_cost,
                accepted=e.accepted,
                admissible=e.admissible,
            )
            for e in LedgerEntry.objects.filter(run=run).order_by("round", "pk")
        ]
    return operators.ProposerView(
        round=round_number,
        slot=slot,
        seed=_rng(recipe, "proposal", round_number, slot).randrange(2**31),
        parent_files=files,
        components={path: kind for path in files if (kind := component_for(spec, path))},
        evidence=evidence,
        ledger=ledger,
        edit_budget=budget,
        stalled=stalled,
        explore_components=list(explore),
        pruning_targets=list(RunState.of(run).pruning_targets) if recipe.pruning.enabled else [],
        params=recipe.proposal.params,
    )


def _propose_slot(run: Run, recipe: RecipeSpec, round_number: int, slot: int, critic_index: Any) -> None:
    parents = _parents(run, recipe)
    if not parents:
        raise LoopError("no accepted candidate to use as a parent")
    select = operators.get("parent_selection", recipe.parent_selection.operator)
    parent_id = select(parents, rng=_rng(recipe, "parent", round_number, slot), params=recipe.parent_selection.params)
    parent = Candidate.objects.select_related("tree").get(pk=parent_id)
    budget = None
    if recipe.edit_budget.enabled:
        budget = regularization.edit_budget(
            round_number - 1, k_max=recipe.edit_budget.k_max, k_min=recipe.edit_budget.k_min, T=recipe.edit_budget.T
        )
    state = RunState.of(run)
    stalled = bool(
        recipe.stall.enabled
        and regularization.is_stalled(state.best_by_round, w=recipe.stall.w, delta=float(run.noise_delta or 0.0))
    )
    explore: list[str] = []
    if stalled and slot < recipe.stall.m_draft:
        explore = regularization.unexplored_kinds(state.measured_components, load.reachable_components(run.experiment))
    view = proposer_view(
        run=run,
        recipe=recipe,
        parent=parent,
        round_number=round_number,
        slot=slot,
        budget=budget,
        stalled=stalled,
        explore=explore,
    )
    proposer = operators.get("proposal", recipe.proposal.operator)
    try:
        proposal = proposer(view)
    except Exception as exc:  # a proposer failure drops the slot, it does not stop the run
        logger.exception("run %s round %s slot %s: proposer failed", run.pk, round_number, slot)
        _drop_slot(
            run, round_number, slot, f"proposer failed: {type(exc).__name__}: {exc}", usage=getattr(exc, "usage", None)
        )
        return
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if _slot_done(locked, round_number, slot) or locked.status not in ACTIVE:
            return
        state = RunState.of(locked)
        _note_proposer_usage(state, round_number, slot, proposal.usage)
        state.round_parents[round_number] = parent.pk
        state.round_budgets[round_number] = budget
        if stalled and round_number not in state.stalled_rounds:
            state.stalled_rounds.append(round_number)
        try:
            with transaction.atomic():
                outcome = proposals.candidate_freeze(
                    run=locked, parent=parent, proposal=proposal, round=round_number, slot=slot, edit_budget=budget
                )
        except (proposals.ProposalRejected, IntegrityError) as exc:
            outcome = proposals.FreezeOutcome(None, "invalid", str(exc))
        if outcome.candidate is None:
            state.dropped.setdefault(round_number, []).append(
                {"slot": slot, "why": outcome.state, "reason": outcome.reason}
            )
            state.save(locked)
            locked.save(update_fields=["state"])
            return
        candidate = outcome.candidate
        if candidate.state == Candidate.State.FROZEN:
            if stalled and explore and not set(candidate.edits.values_list("component", flat=True)) & set(explore):
                candidate_transition(
                    candidate=candidate,
                    to=Candidate.State.REJECTED_BUDGET,
                    reason=f"stalled: this slot had to touch one of {', '.join(explore)}",
                )
            else:
                policy = recipe.critique.leakage_policy if recipe.critique.enabled else "off"
                proposals.candidate_critique(run=locked, candidate=candidate, policy=policy, index=critic_index)
        candidate.refresh_from_db()
        if candidate.state == Candidate.State.APPROVED:
            candidate_evaluate(run=locked, recipe=recipe, candidate=candidate)
        state.save(locked)
        locked.save(update_fields=["state"])
        faults.checkpoint("propose:slot")


def candidate_evaluate(*, run: Run, recipe: RecipeSpec, candidate: Candidate) -> Evaluation:
    """Start the evaluation a recipe asks for (evolve splits; sealed and
    held-out too when the recipe reports them every round)."""
    splits = list(recipe.evaluation.evolve_splits)
    if recipe.evaluation.sealed == "every_round":
        splits += transfer_splits(run)
    return evaluation_services.evaluation_start(
        candidate=candidate,
        splits=splits,
        k=recipe.evaluation.trials_per_task,
        purpose=Evaluation.Purpose.CANDIDATE,
        seed=recipe.seed,
        run=run,
    )


def _note_proposer_usage(state: RunState, round_number: int, slot: int, usage: Mapping[str, Any] | None) -> None:
    """The proposer's own tokens and cost (an LLM operator's), per round and
    slot, kept apart from the policy's tokens (``Run.tokens_spent``)."""
    numbers = {key: value for key, value in (usage or {}).items() if isinstance(value, int | float)}
    if numbers:
        state.proposer_usage.setdefault(round_number, {})[slot] = numbers


def _drop_slot(run: Run, round_number: int, slot: int, reason: str, *, usage: Mapping[str, Any] | None = None) -> None:
    with transaction.atomic():
        locked = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
        if _slot_done(locked, round_number, slot):
            return
        state = RunState.of(locked)
        _note_proposer_usage(state, round_number, slot, usage)
        state.dropped.setdefault(round_number, []).append(
            {"slot": slot, "why": "proposer_error", "reason": reason[:2000]}
        )
        state.save(locked)
        locked.save(update_fields=["state"])
