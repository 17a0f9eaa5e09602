"""The evolution loop as a database-driven state machine.

``run_advance`` is the only entry point that moves a run forward. It locks
the run row, looks at what the database says (which evaluations are
certified, which candidates are gated), does at most one step, commits, and
enqueues itself again after commit when there is more to do. Proposing a
round is its own task (``round_propose``) because a proposer may be slow;
it works slot by slot, each slot in one transaction, and skips slots that
are done, so a crash anywhere resumes where it stopped and a duplicate
message does nothing. Every random choice is seeded from the recipe seed,
the round and the slot, so a resumed run ends in the same state as one that
never stopped.

Phases (``run.state["phase"]``): baseline -> propose -> proposing ->
evaluating -> (gate) -> propose ... -> final -> finished.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone

from evolution import digests, faults, metrics, operators, regularization
from evolution.models import (
    STRUCTURAL_KINDS,
    AtomicEdit,
    Candidate,
    Evaluation,
    Experiment,
    GateDecision,
    LedgerEntry,
    Recipe,
    Run,
    SplitName,
    TrajectoryStep,
    Trial,
)
from evolution.recipes import Recipe as RecipeSpec
from evolution.recipes import gate_params, parse_recipe, recipe_digest, recipe_to_dict
from evolution.services import evaluation as evaluation_services
from evolution.services import proposals
from evolution.services.candidates import candidate_accept, candidate_transition
from evolution.services.records import gate_decision_certify
from evolution.services.snapshots import tree_entries
from evolution.surfaces import component_for, parse_surface

logger = logging.getLogger(__name__)

ACTIVE = (Run.Status.RUNNING,)
IN_FLIGHT = (Candidate.State.APPROVED, Candidate.State.EVALUATING, Candidate.State.EVALUATED)


class LoopError(ValueError):
    pass


# --- Enqueueing (after commit) --------------------------------------------------


def _enqueue_advance(run_id: int) -> None:
    from evolution.tasks import run_advance

    faults.checkpoint("publish:run_advance")
    run_advance.delay(run_id)


def _enqueue_propose(run_id: int, round_number: int) -> None:
    from evolution.tasks import round_propose

    round_propose.delay(run_id, round_number)


def _advance_after_commit(run_id: int) -> None:
    transaction.on_commit(lambda: _enqueue_advance(run_id))


# --- Recipes and runs -----------------------------------------------------------


def recipe_store(*, recipe: RecipeSpec) -> Recipe:
    """The recipe row for this exact recipe (one per digest)."""
    digest = recipe_digest(recipe)
    row, _ = Recipe.objects.get_or_create(
        digest=digest, defaults={"name": recipe.name, "version": recipe.version, "spec": recipe_to_dict(recipe)}
    )
    return row


def _load_operators() -> None:
    """Import the modules that register proposal operators."""
    import importlib

    for module in ("evolution.proposers", "evolution.llm_operators", *settings.RSI_OPERATOR_MODULES):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def run_recipe(run: Run) -> RecipeSpec:
    _load_operators()
    return parse_recipe(run.recipe.spec, known_operators=operators.known_operators())


def _check_llm_endpoints(recipe: RecipeSpec) -> None:
    """A run whose proposer or critic is an ``llm`` operator needs its
    endpoint configured now, not a round later."""
    from evolution.llm import LLMConfigError, config_from

    stages = (("proposal", recipe.proposal), ("critique", recipe.critique))
    for stage, spec in stages:
        if spec.operator == "llm" and (stage != "critique" or recipe.critique.enabled):
            try:
                config_from(spec.params)
            except LLMConfigError as exc:
                # Both ways forward, so nobody has to look them up.
                offline = (
                    "run an offline proposer instead (--proposer example on the bundled example, "
                    "the proposer field on the dashboard)"
                    if stage == "proposal"
                    else "use the rules critic instead (critique operator: rules)"
                )
                raise LoopError(
                    f"the llm {stage} operator is not configured ({exc}): configure its endpoint "
                    f"(RSI_LLM_BASE_URL and RSI_LLM_MODEL, or the recipe's {stage} params; docs/llm.md), "
                    f"or {offline}"
                ) from exc


def run_create(
    *,
    experiment: Experiment,
    recipe: RecipeSpec,
    rounds: int | None = None,
    k: int | None = None,
    proposer: str | None = None,
    user: Any = None,
) -> Run:
    """Create a run of ``recipe`` (with ``rounds``, ``k`` and ``proposer``
    overriding the recipe's) and start it after commit. One active run per
    experiment."""
    _load_operators()
    overrides: dict[str, Any] = {}
    if proposer is not None:
        overrides["proposal"] = {"operator": proposer}
    if rounds is not None:
        overrides["rounds"] = rounds
    if k is not None:
        overrides.setdefault("evaluation", {})["trials_per_task"] = k
    if overrides:
        data = recipe_to_dict(recipe)
        for key, value in overrides.items():
            if isinstance(value, dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        if rounds is not None and recipe.rounds == recipe.edit_budget.T:
            data["edit_budget"] = {**data["edit_budget"], "T": rounds}
        recipe = parse_recipe(data, known_operators=operators.known_operators())
    else:
        parse_recipe(recipe_to_dict(recipe), known_operators=operators.known_operators())
    _check_llm_endpoints(recipe)
    with transaction.atomic():
        locked = Experiment.objects.select_for_update().get(pk=experiment.pk)
        if Run.objects.filter(
            experiment=locked, status__in=[Run.Status.PENDING, Run.Status.RUNNING, Run.Status.PAUSED]
        ).exists():
            raise LoopError(f"experiment {locked.name!r} has an active run already")
        if locked.seed_candidate_id is None:
            raise LoopError("the experiment has no seed candidate")
        run = Run.objects.create(
            experiment=locked,
            recipe=recipe_store(recipe=recipe),
            status=Run.Status.RUNNING,
            rounds=recipe.rounds,
            started_by=user,
            started_at=timezone.now(),
            state={"phase": "baseline", "events": [], "rounds": {}},
        )
        Experiment.objects.filter(pk=locked.pk).update(status=Experiment.Status.RUNNING)
        Experiment.objects.filter(pk=locked.pk, recipe__isnull=True).update(recipe=run.recipe)
        _advance_after_commit(run.pk)
    return run


def run_pause(*, run: Run) -> bool:
    updated = Run.objects.filter(pk=run.pk, status=Run.Status.RUNNING).update(status=Run.Status.PAUSED)
    if updated:
        Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.PAUSED)
    return bool(updated)


def run_resume(*, run: Run) -> bool:
    with transaction.atomic():
        updated = Run.objects.filter(pk=run.pk, status=Run.Status.PAUSED).update(status=Run.Status.RUNNING)
        if updated:
            Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.RUNNING)
            _resend_proposals(run.pk)
            _advance_after_commit(run.pk)
    return bool(updated)


def _resend_proposals(run_id: int) -> None:
    """A run paused while proposing: round_propose stopped between slots and
    nothing sends it again before the lease (run_advance's _step_proposing),
    so resuming sends it now. Filling slots is idempotent; a round_propose
    still finishing its slot keeps or drops that slot under the run's lock."""
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.state.get("phase") == "proposing":
        _send_propose(run)


def run_cancel(*, run: Run, reason: str = "cancelled") -> bool:
    """Stop a run: its unfinished evaluations are cancelled (their trials are
    never claimed again) and in-flight candidates are marked cancelled."""
    with transaction.atomic():
        updated = Run.objects.filter(
            pk=run.pk, status__in=[Run.Status.PENDING, Run.Status.RUNNING, Run.Status.PAUSED]
        ).update(status=Run.Status.CANCELLED, stop_reason=reason, finished_at=timezone.now())
        if updated:
            _stop_in_flight(run.pk)
            Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.CANCELLED)
    return bool(updated)


def _stop_in_flight(run_id: int) -> None:
    Evaluation.objects.filter(run_id=run_id, state=Evaluation.State.RUNNING).update(state=Evaluation.State.CANCELLED)
    # The state checked on the trial's own row (no join: see trial_claim), so a
    # trial finished meanwhile is not overwritten as cancelled.
    in_run = Evaluation.objects.filter(run_id=run_id).values("pk")
    Trial.objects.filter(evaluation_id__in=in_run, state__in=[Trial.State.PENDING, Trial.State.RUNNING]).update(
        state=Trial.State.CANCELLED
    )
    Candidate.objects.filter(run_id=run_id, state__in=IN_FLIGHT + (Candidate.State.FROZEN,)).update(
        state=Candidate.State.CANCELLED, state_reason="run stopped"
    )


# --- Measurements -----------------------------------------------------------------


def _stats(candidate: Candidate, splits: Sequence[str], recipe: RecipeSpec) -> regularization.CandidateStats | None:
    """Aggregate over all certified evaluations of ``candidate`` on ``splits``."""
    rows = list(
        Trial.objects.filter(
            candidate=candidate,
            split__in=splits,
            evaluation__state=Evaluation.State.CERTIFIED,
            evaluation__purpose__in=[
                Evaluation.Purpose.BASELINE,
                Evaluation.Purpose.NOISE,
                Evaluation.Purpose.CANDIDATE,
            ],
        ).values_list("outcome", "score", "tokens", "valid_output", "submitted")
    )
    if not rows:
        return None
    if recipe.evaluation.score_metric == "mean_score":
        score = sum((s or 0.0) if o != Trial.Outcome.ERROR else 0.0 for o, s, *_ in rows) / len(rows)
    else:
        score = sum(1 for o, *_ in rows if o == Trial.Outcome.PASS) / len(rows)
    tokens = [t for _, _, t, _, _ in rows if t is not None]
    return regularization.CandidateStats(
        candidate_id=candidate.pk,
        score=score,
        cost=sum(tokens) / len(tokens) if tokens else 0.0,
        valid_rate=sum(1 for *_, v, _ in rows if v) / len(rows),
        no_submission_rate=sum(1 for *_, s in rows if not s) / len(rows),
        components=frozenset(candidate.edits.values_list("component", flat=True)),
    )


def split_scores(*, candidate: Candidate) -> dict[str, float]:
    """pass@1 per split over every certified evaluation of the candidate."""
    scores: dict[str, list[int]] = {}
    for split, outcome in Trial.objects.filter(
        candidate=candidate, evaluation__state=Evaluation.State.CERTIFIED
    ).values_list("split", "outcome"):
        scores.setdefault(split, []).append(1 if outcome == Trial.Outcome.PASS else 0)
    return {split: sum(v) / len(v) for split, v in sorted(scores.items())}


def _mean_tokens(candidate: Candidate, splits: Sequence[str]) -> float | None:
    total = Trial.objects.filter(
        candidate=candidate, split__in=splits, evaluation__state=Evaluation.State.CERTIFIED
    ).aggregate(tokens=Sum("tokens"))["tokens"]
    count = Trial.objects.filter(
        candidate=candidate, split__in=splits, evaluation__state=Evaluation.State.CERTIFIED, tokens__isnull=False
    ).count()
    return total / count if count else None


def _rng(recipe: RecipeSpec, *parts: object) -> random.Random:
    material = digests.sha256_hex("\n".join(str(p) for p in (recipe.seed, *parts)).encode())
    return random.Random(int(material[:16], 16))


def _event(run: Run, kind: str, text: str, **data: Any) -> None:
    run.state.setdefault("events", []).append({"round": run.current_round, "kind": kind, "text": text, **data})


def _save_state(run: Run, *fields: str) -> None:
    run.save(update_fields=["state", *fields])


def _evolve_splits(recipe: RecipeSpec) -> list[str]:
    return list(recipe.evaluation.evolve_splits)


def _transfer_splits(run: Run) -> list[str]:
    return [s for s in (SplitName.SEALED, SplitName.HELDOUT) if s in run.experiment.split_digests]


# --- The state machine ------------------------------------------------------------


def run_advance(*, run_id: int) -> str:
    """Do the next step of a run, if any. Safe to call any number of times,
    from any number of processes. Returns the phase after the step."""
    with transaction.atomic():
        run = Run.objects.select_for_update().select_related("experiment", "recipe").get(pk=run_id)
        if run.status not in ACTIVE:
            return str(run.status)
        recipe = run_recipe(run)
        phase = run.state.get("phase", "baseline")
        stop = _limit_reached(run, recipe)
        if stop and phase not in {"final", "finished"}:
            run.stop_reason = stop
            _event(run, "stop", stop)
            run.state["phase"] = "final"
            run.state["stopped_by_limit"] = True
            _save_state(run, "stop_reason")
            _stop_in_flight(run.pk)
            _advance_after_commit(run.pk)
            return "final"
        steps: dict[str, Callable[[Run, RecipeSpec], str]] = {
            "baseline": _step_baseline,
            "propose": _step_propose,
            "proposing": _step_proposing,
            "evaluating": _step_evaluating,
            "final": _step_final,
        }
        step = steps.get(phase)
        if step is None:
            return str(phase)
        return step(run, recipe)


def _limit_reached(run: Run, recipe: RecipeSpec) -> str:
    spent = Trial.objects.filter(evaluation__run=run).aggregate(tokens=Sum("tokens"))["tokens"] or 0
    if spent != run.tokens_spent:
        run.tokens_spent = spent
        run.save(update_fields=["tokens_spent"])
    if recipe.limits.max_tokens is not None and spent >= recipe.limits.max_tokens:
        return f"token budget spent: {spent} of {recipe.limits.max_tokens} policy tokens"
    if recipe.limits.max_wall_seconds is not None and run.started_at is not None:
        elapsed = (timezone.now() - run.started_at).total_seconds()
        if elapsed >= recipe.limits.max_wall_seconds:
            return f"wall-time budget spent: {elapsed:.0f} of {recipe.limits.max_wall_seconds} s"
    return ""


def _step_baseline(run: Run, recipe: RecipeSpec) -> str:
    seed = run.experiment.seed_candidate
    if seed is None:
        return _fail(run, f"experiment {run.experiment.name!r} has no seed candidate")
    repeats = recipe.noise.repeats if recipe.needs_noise_estimate else 1
    existing = {e.repeat: e for e in Evaluation.objects.filter(run=run, candidate=seed)}
    if len(existing) < repeats:
        splits = _evolve_splits(recipe)
        for repeat in range(repeats):
            if repeat in existing:
                continue
            evaluation_services.evaluation_start(
                candidate=seed,
                splits=splits,
                k=recipe.evaluation.trials_per_task,
                purpose=Evaluation.Purpose.BASELINE if repeat == 0 else Evaluation.Purpose.NOISE,
                repeat=repeat,
                seed=recipe.seed,
                run=run,
            )
        _event(run, "baseline", f"evaluating the seed {repeats} time(s) to estimate the noise band")
        _save_state(run)
        return "baseline"
    states = {e.state for e in existing.values()}
    if Evaluation.State.FAILED in states:
        return _fail(run, "the seed's evaluation failed: " + "; ".join(e.error for e in existing.values() if e.error))
    if states != {Evaluation.State.CERTIFIED}:
        return "baseline"

    scores = []
    for evaluation in sorted(existing.values(), key=lambda e: e.repeat):
        rows = Trial.objects.filter(evaluation=evaluation).values_list("outcome", "score")
        if recipe.evaluation.score_metric == "mean_score":
            scores.append(sum((s or 0.0) for _, s in rows) / len(rows))
        else:
            scores.append(sum(1 for o, _ in rows if o == Trial.Outcome.PASS) / len(rows))
    if recipe.needs_noise_estimate and len(scores) >= 2:
        delta = regularization.noise_delta(scores, rule=recipe.noise.rule, fixed=recipe.noise.fixed)
    else:
        delta = recipe.noise.fixed or 0.0
    seed.refresh_from_db()
    # A later run of the same experiment finds the seed accepted by the first
    # (accepted implies certified: a database constraint); it stays the parent.
    if seed.state != Candidate.State.ACCEPTED and not candidate_accept(candidate=seed, reason="seed: the first parent"):
        return _fail(run, f"the seed could not be accepted (state {seed.state})")
    stats = _stats(seed, _evolve_splits(recipe), recipe)
    assert stats is not None  # the seed's certified evaluations have trials
    decision, _ = GateDecision.objects.get_or_create(
        run=run,
        candidate=seed,
        round=0,
        defaults={
            "accepted": True,
            "chosen": True,
            "rule": "seed",
            "explanation": "The seed is evaluated first and is the first parent.",
            "numbers": {"S": stats.score, "C": stats.cost, "repeats": scores, "delta": delta},
        },
    )
    gate_decision_certify(decision=decision)
    run.noise_delta = delta
    run.current_candidate = seed
    run.current_round = 1
    run.state.update(
        phase="propose",
        best_by_round=[stats.score],
        best_score=stats.score,
        accepted_structural=[],
        measured_components=[],
        pruning_targets=[],
    )
    run.state.setdefault("rounds", {})["0"] = _round_summary(run, recipe, 0, parent=None, budget=None)
    _event(run, "baseline", f"seed S={stats.score:.3f} over {len(scores)} repeat(s), noise band delta={delta:.3f}")
    _save_state(run, "noise_delta", "current_candidate", "current_round")
    _advance_after_commit(run.pk)
    return "propose"


def _fail(run: Run, message: str) -> str:
    run.status = Run.Status.FAILED
    run.error = message
    run.finished_at = timezone.now()
    run.state["phase"] = "failed"
    _event(run, "error", message)
    _save_state(run, "status", "error", "finished_at")
    Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.FAILED)
    return "failed"


def _step_propose(run: Run, recipe: RecipeSpec) -> str:
    if run.current_round > run.rounds:
        run.state["phase"] = "final"
        _save_state(run)
        _advance_after_commit(run.pk)
        return "final"
    run.state["phase"] = "proposing"
    _send_propose(run)
    return "proposing"


def _send_propose(run: Run) -> None:
    """Stamp when the round's proposals were asked for and send round_propose after commit."""
    run.state["proposing_since"] = timezone.now().isoformat()
    _save_state(run)
    round_number = run.current_round
    transaction.on_commit(lambda: _enqueue_propose(run.pk, round_number))


def _step_proposing(run: Run, recipe: RecipeSpec) -> str:
    """Waiting for round_propose; send it again if it seems lost (its work is idempotent)."""
    since = run.state.get("proposing_since")
    lease = timedelta(seconds=settings.RSI_TRIAL_LEASE_SECONDS)
    if since and timezone.now() - datetime.fromisoformat(since) > lease:
        _send_propose(run)
    return "proposing"


def _step_evaluating(run: Run, recipe: RecipeSpec) -> str:
    candidates = Candidate.objects.filter(run=run)
    if candidates.filter(state__in=IN_FLIGHT).exists():
        return "evaluating"
    ungated = list(candidates.filter(state=Candidate.State.CERTIFIED).exclude(gate_decisions__run=run).order_by("pk"))
    _gate(run, recipe, ungated)
    run.current_round += 1
    run.state["phase"] = "propose"
    _save_state(run, "current_round", "current_candidate")
    _advance_after_commit(run.pk)
    return "propose"


def _gate(run: Run, recipe: RecipeSpec, ungated: list[Candidate]) -> None:
    """Decide the round: gate verdicts, the choice, the ledger, pruning."""
    round_number = run.current_round
    current = run.current_candidate
    assert current is not None  # set by the baseline step, before any round
    splits = _evolve_splits(recipe)
    current_stats = _stats(current, splits, recipe)
    assert current_stats is not None  # the current harness was measured before it was accepted
    best_score = float(run.state.get("best_score", current_stats.score))
    delta = float(run.noise_delta or 0.0)
    stats = [s for c in ungated if (s := _stats(c, splits, recipe)) is not None]
    accepted_structural = set(run.state.get("accepted_structural", []))
    chosen_id = None
    if stats:
        evolve_trials = (
            run.experiment.split_memberships.filter(split__in=splits).count() * recipe.evaluation.trials_per_task
        )
        params = gate_params(recipe, evolve_trials=evolve_trials)
        gate = operators.get("gate", recipe.gate.operator)
        verdicts = gate(
            current_stats,
            stats,
            best_score=best_score,
            delta=delta,
            params=params,
            accepted_structural_kinds=accepted_structural,
        )
        chosen_id = regularization.choose(verdicts, stats)
        by_id = {s.candidate_id: s for s in stats}
        for verdict in verdicts:
            candidate = next(c for c in ungated if c.pk == verdict.candidate_id)
            chosen = verdict.candidate_id == chosen_id
            keep = chosen or (verdict.admissible and recipe.gate.accept == "admissible")
            if keep:
                candidate_accept(candidate=candidate, reason=verdict.explanation)
            else:
                reason = (
                    verdict.explanation
                    if not verdict.admissible
                    else ("admissible, but another candidate of the round scored higher")
                )
                candidate_transition(candidate=candidate, to=Candidate.State.REJECTED_GATE, reason=reason)
            decision, _ = GateDecision.objects.get_or_create(
                run=run,
                candidate=candidate,
                round=round_number,
                defaults={
                    "current": current,
                    "accepted": keep,
                    "chosen": chosen,
                    "rule": verdict.rule,
                    "explanation": verdict.explanation,
                    "numbers": verdict.numbers,
                },
            )
            gate_decision_certify(decision=decision)
            s = by_id[verdict.candidate_id]
            d_score = s.score - current_stats.score
            d_cost = metrics.relative_cost_change(s.cost, current_stats.cost)
            for edit in AtomicEdit.objects.filter(candidate=candidate):
                LedgerEntry.objects.get_or_create(
                    edit=edit,
                    defaults={
                        "run": run,
                        "candidate": candidate,
                        "round": round_number,
                        "component": edit.component,
                        "hypothesis": edit.hypothesis,
                        "delta_score": d_score,
                        "delta_cost": d_cost if d_cost is not None else 1e9,
                        "accepted": keep,
                    },
                )
            if keep:
                accepted_structural.update(set(s.components) & set(STRUCTURAL_KINDS))
    if chosen_id is not None:
        run.current_candidate = next(c for c in ungated if c.pk == chosen_id)
        best_score = max(best_score, next(s.score for s in stats if s.candidate_id == chosen_id))
    run.state["best_score"] = best_score
    run.state.setdefault("best_by_round", []).append(best_score)
    run.state["accepted_structural"] = sorted(accepted_structural)
    ledger = LedgerEntry.objects.filter(run=run)
    run.state["measured_components"] = sorted(set(ledger.values_list("component", flat=True)))
    if recipe.pruning.enabled:
        points = [
            regularization.LedgerPoint(round=r, component=c, dS=d)
            for r, c, d in ledger.values_list("round", "component", "delta_score")
        ]
        run.state["pruning_targets"] = regularization.pruning_targets(
            points, current_round=round_number, window=recipe.pruning.window, threshold=recipe.pruning.threshold
        )
    run.state.setdefault("rounds", {})[str(round_number)] = _round_summary(
        run,
        recipe,
        round_number,
        parent=run.state.get("round_parents", {}).get(str(round_number)),
        budget=run.state.get("round_budgets", {}).get(str(round_number)),
    )
    _event(
        run,
        "gate",
        f"round {round_number}: {len(stats)} candidate(s) gated, "
        + (f"candidate {chosen_id} becomes the current harness" if chosen_id else "the current harness stays"),
    )


def _round_summary(
    run: Run, recipe: RecipeSpec, round_number: int, *, parent: int | None, budget: int | None
) -> dict[str, Any]:
    in_round = Candidate.objects.filter(run=run, round=round_number).exclude(origin=Candidate.Origin.SEED)
    current = run.current_candidate
    scores = split_scores(candidate=current) if current else {}
    return {
        "round": round_number,
        "parent": parent,
        "budget": budget,
        "proposed": in_round.count(),
        "flagged": in_round.filter(leakage_flags__isnull=False).distinct().count(),
        "rejected_surface": in_round.filter(state=Candidate.State.REJECTED_SURFACE).count(),
        "rejected_budget": in_round.filter(state=Candidate.State.REJECTED_BUDGET).count(),
        "evaluated": in_round.filter(evaluations__state=Evaluation.State.CERTIFIED).distinct().count(),
        "accepted": in_round.filter(state=Candidate.State.ACCEPTED).count(),
        "current": current.pk if current else None,
        "scores": scores,
        "tokens_per_trial": _mean_tokens(current, _evolve_splits(recipe)) if current else None,
        "dropped": run.state.get("dropped", {}).get(str(round_number), []),
    }


def _step_final(run: Run, recipe: RecipeSpec) -> str:
    """Report transfer: evaluate the final harness (and the seed) on sealed
    and held-out splits, then finish."""
    transfer = _transfer_splits(run)
    # After a budget stop nothing more is spent, transfer reports included.
    spend = not run.state.get("stopped_by_limit")
    if recipe.evaluation.sealed != "never" and transfer and spend:
        targets = {pk for pk in (run.experiment.seed_candidate_id, run.current_candidate_id) if pk is not None}
        waiting = False
        for candidate in Candidate.objects.filter(pk__in=targets).order_by("pk"):
            evaluation = Evaluation.objects.filter(
                run=run, candidate=candidate, purpose=Evaluation.Purpose.TRANSFER
            ).first()
            if evaluation is None:
                evaluation_services.evaluation_start(
                    candidate=candidate,
                    splits=transfer,
                    k=recipe.evaluation.trials_per_task,
                    purpose=Evaluation.Purpose.TRANSFER,
                    seed=recipe.seed,
                    run=run,
                )
                waiting = True
            elif evaluation.state in {Evaluation.State.RUNNING, Evaluation.State.COMPLETE, Evaluation.State.CERTIFYING}:
                waiting = True
        if waiting:
            _save_state(run)
            return "final"
    final_scores = split_scores(candidate=run.current_candidate) if run.current_candidate else {}
    seed = run.experiment.seed_candidate
    seed_scores = split_scores(candidate=seed) if seed is not None else {}
    run.state["final"] = {
        "current": run.current_candidate_id,
        "scores": final_scores,
        "seed_scores": seed_scores,
        "divergence": divergence(seed_scores, final_scores, recipe),
    }
    if run.state["final"]["divergence"]:
        _event(run, "divergence", run.state["final"]["divergence"])
    run.state["phase"] = "finished"
    run.status = Run.Status.FINISHED
    run.finished_at = timezone.now()
    run.stop_reason = run.stop_reason or f"{run.rounds} round(s) done"
    _save_state(run, "status", "finished_at", "stop_reason")
    Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.FINISHED)
    return "finished"


def divergence(seed: dict[str, float], final: dict[str, float], recipe: RecipeSpec) -> str:
    """A warning when the evolve score rose while sealed or held-out fell."""
    evolve = [s for s in recipe.evaluation.evolve_splits if s in seed and s in final]
    if not evolve:
        return ""
    evolve_gain = sum(final[s] - seed[s] for s in evolve) / len(evolve)
    falling = [s for s in ("sealed", "heldout") if s in seed and s in final and final[s] < seed[s]]
    if evolve_gain > 0 and falling:
        parts = ", ".join(f"{s} {seed[s]:.3f} -> {final[s]:.3f}" for s in falling)
        return f"evolve score rose by {evolve_gain:+.3f} while {parts}: the run may be overfitting its evolve set"
    return ""


# --- Proposing a round ------------------------------------------------------------


def round_propose(*, run_id: int, round_number: int) -> int:
    """Fill the round's proposal slots that are not done yet; then hand the
    round to run_advance. Safe to repeat. Returns the number of slots filled."""
    run = Run.objects.select_related("experiment__surface", "current_candidate").get(pk=run_id)
    if run.status not in ACTIVE or run.current_round != round_number or run.state.get("phase") != "proposing":
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
        locked = Run.objects.select_for_update().get(pk=run_id)
        if locked.state.get("phase") == "proposing" and locked.current_round == round_number:
            locked.state["phase"] = "evaluating"
            locked.save(update_fields=["state"])
            _advance_after_commit(locked.pk)
    return filled


def _slot_done(run: Run, round_number: int, slot: int) -> bool:
    label = f"r{round_number}s{slot}"
    if Candidate.objects.filter(run=run, round=round_number, label=label).exists():
        return True
    dropped = run.state.get("dropped", {}).get(str(round_number), [])
    return any(item.get("slot") == slot for item in dropped)


def _parents(run: Run, recipe: RecipeSpec) -> list[operators.ParentCandidate]:
    accepted = Candidate.objects.filter(experiment=run.experiment, state=Candidate.State.ACCEPTED).order_by("pk")
    splits = _evolve_splits(recipe)
    result = []
    for candidate in accepted:
        stats = _stats(candidate, splits, recipe)
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
        pruning_targets=list(run.state.get("pruning_targets", [])) if recipe.pruning.enabled else [],
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
    best = [float(x) for x in run.state.get("best_by_round", [])]
    stalled = bool(
        recipe.stall.enabled and regularization.is_stalled(best, w=recipe.stall.w, delta=float(run.noise_delta or 0.0))
    )
    explore: list[str] = []
    if stalled and slot < recipe.stall.m_draft:
        explore = regularization.unexplored_kinds(run.state.get("measured_components", []))
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
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if _slot_done(locked, round_number, slot) or locked.status not in ACTIVE:
            return
        _note_proposer_usage(locked, round_number, slot, proposal.usage)
        locked.state.setdefault("round_parents", {})[str(round_number)] = parent.pk
        locked.state.setdefault("round_budgets", {})[str(round_number)] = budget
        if stalled:
            locked.state.setdefault("stalled_rounds", [])
            if round_number not in locked.state["stalled_rounds"]:
                locked.state["stalled_rounds"].append(round_number)
        try:
            with transaction.atomic():
                outcome = proposals.candidate_freeze(
                    run=locked, parent=parent, proposal=proposal, round=round_number, slot=slot, edit_budget=budget
                )
        except (proposals.ProposalRejected, IntegrityError) as exc:
            outcome = proposals.FreezeOutcome(None, "invalid", str(exc))
        if outcome.candidate is None:
            locked.state.setdefault("dropped", {}).setdefault(str(round_number), []).append(
                {"slot": slot, "why": outcome.state, "reason": outcome.reason}
            )
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
        locked.save(update_fields=["state"])
        faults.checkpoint("propose:slot")


def candidate_evaluate(*, run: Run, recipe: RecipeSpec, candidate: Candidate) -> Evaluation:
    """Start the evaluation a recipe asks for (evolve splits; sealed and
    held-out too when the recipe reports them every round)."""
    splits = _evolve_splits(recipe)
    if recipe.evaluation.sealed == "every_round":
        splits += _transfer_splits(run)
    return evaluation_services.evaluation_start(
        candidate=candidate,
        splits=splits,
        k=recipe.evaluation.trials_per_task,
        purpose=Evaluation.Purpose.CANDIDATE,
        seed=recipe.seed,
        run=run,
    )


def _note_proposer_usage(run: Run, round_number: int, slot: int, usage: Mapping[str, Any] | None) -> None:
    """The proposer's own tokens and cost (an LLM operator's), per round and
    slot, kept apart from the policy's tokens (``Run.tokens_spent``)."""
    numbers = {key: value for key, value in (usage or {}).items() if isinstance(value, int | float)}
    if numbers:
        run.state.setdefault("proposer_usage", {}).setdefault(str(round_number), {})[str(slot)] = numbers


def _drop_slot(run: Run, round_number: int, slot: int, reason: str, *, usage: Mapping[str, Any] | None = None) -> None:
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if _slot_done(locked, round_number, slot):
            return
        _note_proposer_usage(locked, round_number, slot, usage)
        locked.state.setdefault("dropped", {}).setdefault(str(round_number), []).append(
            {"slot": slot, "why": "proposer_error", "reason": reason[:2000]}
        )
        locked.save(update_fields=["state"])


def runs_to_nudge() -> list[int]:
    """Active runs, for the reaper: a lost run_advance message costs one reaper interval."""
    return list(Run.objects.filter(status=Run.Status.RUNNING).values_list("pk", flat=True))
