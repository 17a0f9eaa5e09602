"""The evolution loop as a database-driven state machine.

``run_advance`` is the only entry point that moves a run forward. It locks the run row, looks at what the
database says (which evaluations are certified, which candidates are gated), does at most one step, commits,
and enqueues itself again after commit when there is more to do. Each step locks, loads, calls the pure code
(``measure``, ``decision``, ``regularization``) and writes. Proposing a round is its own task
(``evolution.loop.propose.round_propose``) because a proposer may be slow.

Phases (``RunState.phase``): baseline -> propose -> proposing -> evaluating -> (gate) -> propose ... -> final
-> finished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from evolution import measurements, operators
from evolution.loop import decision as decisions
from evolution.loop import load, regularization
from evolution.loop.enqueue import advance_after_commit, propose_send
from evolution.loop.lifecycle import ACTIVE, IN_FLIGHT, LoopError, run_candidates, run_recipe, stop_in_flight
from evolution.loop.state import RoundSummary, RunState
from evolution.models import (
    EVALUATION_UNFINISHED,
    AtomicEdit,
    Candidate,
    Evaluation,
    Experiment,
    GateDecision,
    LedgerEntry,
    Run,
    SplitName,
    Trial,
)
from evolution.recipes import Recipe as RecipeSpec
from evolution.recipes import gate_params
from evolution.services import evaluation as evaluation_services
from evolution.services.candidates import candidate_accept, candidate_transition
from evolution.services.records import gate_decision_certify

__all__ = [
    "divergence",
    "gate_decide",
    "late_gate",
    "late_waiting",
    "run_advance",
    "runs_to_nudge",
    "start_of",
    "transfer_splits",
]

Step = Callable[[Run, RunState, RecipeSpec], str]


def run_advance(*, run_id: int) -> str:
    """Do the next step of a run, if any. Safe to call any number of times,
    from any number of processes. Returns the phase after the step."""
    with transaction.atomic():
        run = Run.objects.select_for_update(no_key=True).select_related("experiment", "recipe").get(pk=run_id)
        if run.status not in ACTIVE:
            if run.status != Run.Status.PAUSED:
                late_gate(run)
            return str(run.status)
        recipe = run_recipe(run)
        state = RunState.of(run)
        stop = _limit_reached(run, recipe)
        if stop and state.phase not in {"final", "finished"}:
            run.stop_reason = stop
            state.event(run.current_round, "stop", stop)
            state.phase = "final"
            state.stopped_by_limit = True
            _save(run, state, "stop_reason")
            stop_in_flight(run.pk)
            advance_after_commit(run.pk)
            return "final"
        steps: dict[str, Step] = {
            "baseline": _step_baseline,
            "propose": _step_propose,
            "proposing": _step_proposing,
            "evaluating": _step_evaluating,
            "final": _step_final,
        }
        step = steps.get(state.phase)
        if step is None:
            return state.phase
        phase = step(run, state, recipe)
        if run.status not in ACTIVE and run.status != Run.Status.PAUSED:
            late_gate(run)  # what was evaluated for the run but missed its last gate
        return phase


def runs_to_nudge() -> list[int]:
    """Active runs, for the reaper: a lost run_advance message costs one reaper interval."""
    return list(Run.objects.filter(status=Run.Status.RUNNING).values_list("pk", flat=True))


def _save(run: Run, state: RunState, *fields: str) -> None:
    state.save(run)
    run.save(update_fields=["state", *fields])


def transfer_splits(run: Run) -> list[str]:
    """The report-only splits the experiment has (sealed, held-out)."""
    return [s for s in (SplitName.SEALED, SplitName.HELDOUT) if s in run.experiment.split_digests]


def start_of(run: Run) -> Candidate | None:
    """The candidate the run starts from (runs made before ``Run.start_candidate`` started from the seed)."""
    return run.start_candidate if run.start_candidate_id is not None else run.experiment.seed_candidate


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


def _fail(run: Run, state: RunState, message: str) -> str:
    run.status = Run.Status.FAILED
    run.error = message
    run.finished_at = timezone.now()
    state.phase = "failed"
    state.event(run.current_round, "error", message)
    _save(run, state, "status", "error", "finished_at")
    Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.FAILED)
    return "failed"


# --- Baseline: the seed, measured once per noise repeat ------------------------------


def _step_baseline(run: Run, state: RunState, recipe: RecipeSpec) -> str:
    """Measure the run's start (the seed, or the accepted candidate the run starts from) noise-repeats times: the
    noise band, S_best's first value and the first parent. Everything the run reports is measured from it."""
    seed = start_of(run)
    if seed is None:
        return _fail(run, state, f"experiment {run.experiment.name!r} has no seed candidate")
    repeats = recipe.baseline_repeats
    existing = {e.repeat: e for e in Evaluation.objects.filter(run=run, candidate=seed)}
    splits = list(recipe.evaluation.evolve_splits)
    metric = recipe.evaluation.score_metric
    if len(existing) < repeats:
        for repeat in range(repeats):
            if repeat in existing:
                continue
            evaluation_services.evaluation_start(
                candidate=seed,
                splits=splits,
                k=recipe.evaluation.trials_per_task if repeat == 0 else recipe.noise_k,
                purpose=Evaluation.Purpose.BASELINE if repeat == 0 else Evaluation.Purpose.NOISE,
                repeat=repeat,
                seed=recipe.seed,
                run=run,
            )
        state.event(run.current_round, "baseline", f"evaluating the seed {repeats} time(s) to estimate the noise band")
        _save(run, state)
        return "baseline"
    states = {e.state for e in existing.values()}
    if Evaluation.State.FAILED in states:
        problems = "; ".join(e.error for e in existing.values() if e.error)
        return _fail(run, state, "the seed's evaluation failed: " + problems)
    if states != {Evaluation.State.CERTIFIED}:
        return "baseline"

    ordered = sorted(existing.values(), key=lambda e: e.repeat)
    scores = [load.evaluation_score(e, metric) for e in ordered]
    repeat_scores = [s for s in scores if s is not None]
    delta: float | None = recipe.noise.fixed or 0.0
    if recipe.needs_noise_estimate:
        estimate = regularization.noise_estimate(
            [load.evaluation_task_values(e, metric) for e in ordered],
            rule=recipe.noise.rule,
            fixed=recipe.noise.fixed,
            seed=recipe.seed,
            k=recipe.evaluation.trials_per_task,
        )
        delta = estimate.delta
        state.noise = {
            "delta": estimate.delta,
            "rule": estimate.rule,
            "evaluations": estimate.evaluations,
            "trials_per_task": estimate.trials_per_task,
            "note": estimate.note,
        }
    seed.refresh_from_db()
    # A later run finds its start accepted already (the seed by the first run, another by a gate; accepted
    # implies certified: a database constraint); it stays the first parent.
    if seed.state != Candidate.State.ACCEPTED and not candidate_accept(candidate=seed, reason="seed: the first parent"):
        return _fail(run, state, f"the seed could not be accepted (state {seed.state})")
    is_seed = seed.pk == run.experiment.seed_candidate_id
    stats = load.candidate_stats(seed, splits, metric)
    assert stats is not None  # the seed's certified evaluations have trials
    decision, _ = GateDecision.objects.get_or_create(
        run=run,
        candidate=seed,
        round=0,
        defaults={
            "accepted": True,
            "chosen": True,
            "rule": "seed" if is_seed else "start",
            "explanation": (
                "The seed is evaluated first and is the first parent."
                if is_seed
                else f"The run starts from candidate {seed.pk}: it is evaluated first and is the first parent."
            ),
            "numbers": {"S": stats.score, "C": stats.cost, "repeats": repeat_scores, "delta": delta},
        },
    )
    gate_decision_certify(decision=decision)
    run.noise_delta = delta
    run.current_candidate = seed
    run.current_round = 1
    state.phase = "propose"
    state.best_by_round = [stats.score]
    state.best_score = stats.score
    state.accepted_structural = load.structural_kinds_had(run.experiment)
    state.measured_components = []
    state.pruning_targets = []
    state.rounds[0] = _round_summary(run, state, recipe, 0)
    what = "seed" if is_seed else f"start (candidate {seed.pk})"
    band = f"noise band delta={delta:.3f}" if delta is not None else "noise band not estimable"
    state.event(0, "baseline", f"{what} S={stats.score:.3f} over {len(repeat_scores)} repeat(s), {band}")
    if delta is None and state.noise is not None:
        state.event(
            0,
            "error",
            f"the noise band could not be estimated ({state.noise.get('note')}): the gate accepts "
            "nothing inside the band, a candidate must beat the current harness",
        )
    _save(run, state, "noise_delta", "current_candidate", "current_round")
    advance_after_commit(run.pk)
    return "propose"


# --- A round: propose, evaluate, gate ---------------------------------------------------


def _step_propose(run: Run, state: RunState, recipe: RecipeSpec) -> str:
    if run.current_round > run.rounds:
        state.phase = "final"
        _save(run, state)
        advance_after_commit(run.pk)
        return "final"
    state.phase = "proposing"
    propose_send(run, state)
    return "proposing"


def _step_proposing(run: Run, state: RunState, recipe: RecipeSpec) -> str:
    """Waiting for round_propose; send it again if it seems lost (its work is idempotent)."""
    lease = timedelta(seconds=settings.RSI_TRIAL_LEASE_SECONDS)
    if state.proposing_since and timezone.now() - state.proposing_since > lease:
        propose_send(run, state)
    return "proposing"


def _step_evaluating(run: Run, state: RunState, recipe: RecipeSpec) -> str:
    candidates = run_candidates(run.pk)
    if candidates.filter(state__in=IN_FLIGHT).exists():
        return "evaluating"
    ungated = list(candidates.filter(state=Candidate.State.CERTIFIED).exclude(gate_decisions__run=run).order_by("pk"))
    _gate(run, state, recipe, ungated)
    run.current_round += 1
    state.phase = "propose"
    _save(run, state, "current_round", "current_candidate")
    advance_after_commit(run.pk)
    return "propose"


def _gate(run: Run, state: RunState, recipe: RecipeSpec, ungated: list[Candidate]) -> None:
    """The round's gate: ``gate_decide`` against the current harness, then the run's own state."""
    round_number = run.current_round
    current = run.current_candidate
    assert current is not None  # set by the baseline step, before any round
    decided, measured = gate_decide(
        run=run,
        recipe=recipe,
        state=state,
        current=current,
        round_number=round_number,
        candidates=ungated,
        best_score=state.best_score,
        accepted_structural=state.accepted_structural,
    )
    if decided.chosen is not None:
        run.current_candidate = measured[decided.chosen]
    state.best_score = decided.best_score
    state.best_by_round.append(decided.best_score)
    state.accepted_structural = list(decided.accepted_structural)
    state.measured_components = list(decided.measured_components)
    if decided.pruning_targets is not None:
        state.pruning_targets = list(decided.pruning_targets)
    state.rounds[round_number] = _round_summary(run, state, recipe, round_number)
    state.event(
        round_number,
        "gate",
        f"round {round_number}: {len(decided.candidates)} candidate(s) gated, "
        + (
            f"candidate {decided.chosen} becomes the current harness"
            if decided.chosen is not None
            else "the current harness stays"
        ),
    )


def gate_decide(
    *,
    run: Run,
    recipe: RecipeSpec,
    state: RunState,
    current: Candidate,
    round_number: int,
    candidates: Sequence[Candidate],
    best_score: float | None,
    accepted_structural: Sequence[str],
    prune: bool = True,
) -> tuple[decisions.RoundDecision, dict[regularization.CandidateId, Candidate]]:
    """Gate ``candidates`` against ``current``: load what they measured, decide (``decision.round_decide``,
    pure) and write the decision (states, certified gate decisions, ledger). The one gate: the loop's round
    gate and a late decision after the run ended (``late_gate``) both call it. Returns the decision and the
    measured candidates by id. ``prune`` False skips the pruning targets (a late decision advises no next round).
    Inside the caller's transaction; safe to repeat (rows are get-or-create and the state changes conditional)."""
    splits = list(recipe.evaluation.evolve_splits)
    metric = recipe.evaluation.score_metric
    current_stats = load.candidate_stats(current, splits, metric)
    if current_stats is None:
        raise LoopError(f"candidate {current.pk}, the harness to compare with, has no certified trials")
    measured = {
        s.candidate_id: (c, s) for c in candidates if (s := load.candidate_stats(c, splits, metric)) is not None
    }
    best_floor = None
    if recipe.noise.floor == "gate" and measured:
        measured = {pk: (c, _with_gate_score(c, s, metric)) for pk, (c, s) in measured.items()}
        best_floor = _best_gate_score(run, metric)
    evolve_trials = (
        run.experiment.split_memberships.filter(split__in=splits).count() * recipe.evaluation.trials_per_task
    )
    ledger = LedgerEntry.objects.filter(run=run)
    edits: dict[regularization.CandidateId, list[decisions.Edit]] = {}
    for edit_id, candidate_id, component, hypothesis in AtomicEdit.objects.filter(
        candidate_id__in=list(measured)
    ).values_list("pk", "candidate_id", "component", "hypothesis"):
        edits.setdefault(candidate_id, []).append(decisions.Edit(edit_id, component, hypothesis))
    decided = decisions.round_decide(
        round_number=round_number,
        current=current_stats,
        candidates=[stats for _, stats in measured.values()],
        edits={key: sorted(value, key=lambda e: e.edit_id) for key, value in edits.items()},
        best_score=best_score if best_score is not None else current_stats.score,
        delta=run_delta(run, state),
        gate=operators.get("gate", recipe.gate.operator),
        params=gate_params(recipe, evolve_trials=evolve_trials) if measured else _NO_PARAMS,
        accept=recipe.gate.accept,
        accepted_structural=list(accepted_structural),
        ledger_so_far=[
            regularization.LedgerPoint(round=r, component=c, dS=d)
            for r, c, d in ledger.values_list("round", "component", "delta_score")
        ],
        pruning=(
            decisions.Pruning(recipe.pruning.window, recipe.pruning.threshold)
            if recipe.pruning.enabled and prune
            else None
        ),
        best_floor_score=best_floor,
    )
    by_id = {pk: c for pk, (c, _) in measured.items()}
    _write_decision(run, current, decided, by_id, splits=splits, metric=metric)
    return decided, by_id


# --- Late decisions: what a run evaluated after it ended ----------------------------------


def late_waiting(run: Run) -> list[Candidate]:
    """Certified candidates no gate has decided whose latest candidate evaluation belongs to ``run``, an ended
    run (approved by a reviewer after the run's last gate, or evaluated from the candidate page)."""
    waiting = list(
        run_candidates(run.pk).filter(state=Candidate.State.CERTIFIED, gate_decisions__isnull=True).order_by("pk")
    )
    # The last (by id) candidate evaluation of each wins.
    latest = dict(
        Evaluation.objects.filter(candidate__in=waiting, purpose=Evaluation.Purpose.CANDIDATE)
        .order_by("candidate_id", "pk")
        .values_list("candidate_id", "run_id")
    )
    return [c for c in waiting if latest.get(c.pk, c.run_id) == run.pk]


def late_gate(run: Run) -> int:
    """Gate, each against its parent, the candidates ``run`` evaluated after it ended (``late_waiting``), with
    the loop's own gate (``gate_decide``): the run's recipe, noise band and ledger, S_best as it stood when the
    candidate's round began, the structural kinds accepted by now. The run's current harness and final report
    stay as the run left them; an accepted candidate can start the next run. Inside ``run_advance``'s lock;
    safe to repeat. Returns how many were decided."""
    waiting = late_waiting(run)
    if not waiting:
        return 0
    recipe = run_recipe(run)
    state = RunState.of(run)
    decided_count = 0
    for candidate in waiting:
        locked = Candidate.objects.select_for_update(no_key=True).get(pk=candidate.pk)
        parent = Candidate.objects.filter(pk=locked.parent_id).first() if locked.parent_id is not None else None
        if locked.state != Candidate.State.CERTIFIED or locked.gate_decisions.exists() or parent is None:
            continue
        if Evaluation.objects.filter(
            candidate=locked, purpose__in=measurements.COUNTED_PURPOSES, state__in=EVALUATION_UNFINISHED
        ).exists():
            continue  # more of what the gate reads is being measured; its certification sends run_advance
        round_number = locked.round or max(run.current_round, 1)
        before = state.best_by_round[round_number - 1] if round_number <= len(state.best_by_round) else None
        try:
            decided, _ = gate_decide(
                run=run,
                recipe=recipe,
                state=state,
                current=parent,
                round_number=round_number,
                candidates=[locked],
                best_score=before if before is not None else state.best_score,
                accepted_structural=load.structural_kinds_had(run.experiment),
                prune=False,
            )
        except LoopError as exc:
            state.event(round_number, "error", f"candidate {locked.pk} could not be gated late: {exc}")
            continue
        if not decided.candidates:
            # Certified, but not on the splits the gate reads: measure it there; the gate follows certification.
            evaluation_services.evaluation_start(
                candidate=locked,
                splits=list(recipe.evaluation.evolve_splits),
                k=recipe.evaluation.trials_per_task,
                purpose=Evaluation.Purpose.CANDIDATE,
                seed=recipe.seed,
                run=run,
            )
            continue
        verdict = decided.candidates[0]
        decided_count += 1
        state.event(
            round_number,
            "gate",
            f"late decision (after the run ended): candidate {locked.pk} gated against its parent {parent.pk}: "
            + ("accepted" if verdict.accepted else f"rejected ({verdict.rule})"),
        )
    _save(run, state)
    return decided_count


def _with_gate_score(
    candidate: Candidate, stats: regularization.CandidateStats, metric: str
) -> regularization.CandidateStats:
    """``stats`` with S on the gate split, for a floor on the gate split alone (``noise.floor: gate``)."""
    gate = load.candidate_stats(candidate, [SplitName.GATE], metric)
    return dataclasses.replace(stats, floor_score=gate.score if gate is not None else 0.0)


def _best_gate_score(run: Run, metric: str) -> float:
    """The best gate-split S of a harness this run accepted (the seed's decision included)."""
    accepted = Candidate.objects.filter(gate_decisions__run=run, gate_decisions__accepted=True).distinct()
    scores = [s.score for c in accepted if (s := load.candidate_stats(c, [SplitName.GATE], metric)) is not None]
    return max(scores, default=0.0)


def run_delta(run: Run, state: RunState) -> float | None:
    """The noise band the gate uses: None when the baseline measured it and could not estimate it (the gate
    then accepts nothing inside the band); 0 when the recipe uses no band."""
    if run.noise_delta is None and state.noise_unknown:
        return None
    return float(run.noise_delta or 0.0)


# Gate parameters for a round with nothing measured (the gate is not called then).
_NO_PARAMS = regularization.GateParams(score_unit=1.0)


def _write_decision(
    run: Run,
    current: Candidate,
    decided: decisions.RoundDecision,
    candidates: dict[regularization.CandidateId, Candidate],
    *,
    splits: Sequence[str],
    metric: str,
) -> None:
    """The decision's rows: each candidate's new state, its certified gate decision, the ledger. The decision
    keeps, beside the gate's numbers, the paired bootstrap interval of its dS (``load.comparison``) as the
    trials stood when it was made: the candidate page and the API show it as the numbers "at decision"."""
    for item in decided.candidates:
        candidate = candidates[item.candidate_id]
        compared = load.comparison(current.pk, candidate.pk, splits, metric)
        numbers = {**item.numbers, **(compared.numbers() if compared is not None else {})}
        if item.accepted:
            candidate_accept(candidate=candidate, reason=item.reason)
        else:
            candidate_transition(candidate=candidate, to=Candidate.State.REJECTED_GATE, reason=item.reason)
        row, _ = GateDecision.objects.get_or_create(
            run=run,
            candidate=candidate,
            round=decided.round,
            defaults={
                "current": current,
                "accepted": item.accepted,
                "chosen": item.chosen,
                "rule": item.rule,
                "explanation": item.explanation,
                "numbers": numbers,
            },
        )
        gate_decision_certify(decision=row)
    for entry in decided.ledger:
        LedgerEntry.objects.get_or_create(
            edit_id=entry.edit_id,
            defaults={
                "run": run,
                "candidate": candidates[entry.candidate_id],
                "round": decided.round,
                "component": entry.component,
                "hypothesis": entry.hypothesis,
                "delta_score": entry.delta_score,
                "delta_cost": entry.delta_cost,
                "accepted": entry.accepted,
                "admissible": entry.admissible,
            },
        )


def _round_summary(run: Run, state: RunState, recipe: RecipeSpec, round_number: int) -> RoundSummary:
    counts = measurements.round_counts(run_id=run.pk, rounds=[round_number]).get(
        round_number, measurements.RoundCounts()
    )
    current = run.current_candidate
    metric = recipe.evaluation.score_metric
    return {
        "round": round_number,
        "parent": state.round_parents.get(round_number) if round_number else None,
        "budget": state.round_budgets.get(round_number) if round_number else None,
        "proposed": counts.proposed,
        "flagged": counts.flagged,
        "rejected_surface": counts.rejected_surface,
        "rejected_budget": counts.rejected_budget,
        "evaluated": counts.evaluated,
        "accepted": counts.accepted,
        "current": current.pk if current else None,
        "scores": measurements.split_scores(candidate_id=current.pk, metric=metric) if current else {},
        "tokens_per_trial": load.mean_tokens(current, recipe.evaluation.evolve_splits) if current else None,
        "dropped": state.dropped_in(round_number),
    }


# --- The final report -------------------------------------------------------------------


def _step_final(run: Run, state: RunState, recipe: RecipeSpec) -> str:
    """Report transfer: evaluate the final harness (and the run's start) on sealed
    and held-out splits, then finish."""
    transfer = transfer_splits(run)
    # After a budget stop nothing more is spent, transfer reports included.
    if recipe.evaluation.sealed != "never" and transfer and not state.stopped_by_limit:
        start = start_of(run)
        targets = {pk for pk in (start.pk if start else None, run.current_candidate_id) if pk is not None}
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
            elif evaluation.state in EVALUATION_UNFINISHED:
                waiting = True
        if waiting:
            _save(run, state)
            return "final"
    metric = recipe.evaluation.score_metric
    final = run.current_candidate
    final_scores = measurements.split_scores(candidate_id=final.pk, metric=metric) if final is not None else {}
    start = start_of(run)
    start_scores = measurements.split_scores(candidate_id=start.pk, metric=metric) if start is not None else {}
    warning = divergence(start_scores, final_scores, recipe.evaluation.evolve_splits)
    state.final = {
        "current": run.current_candidate_id,
        "scores": final_scores,
        "start": start.pk if start is not None else None,
        "start_scores": start_scores,
        "divergence": warning,
    }
    if start is not None and start.pk == run.experiment.seed_candidate_id:
        state.final["seed_scores"] = start_scores  # the key readers of runs before start_scores know
    if warning:
        state.event(run.current_round, "divergence", warning)
    state.phase = "finished"
    run.status = Run.Status.FINISHED
    run.finished_at = timezone.now()
    run.stop_reason = run.stop_reason or f"{run.rounds} round(s) done"
    _save(run, state, "status", "finished_at", "stop_reason")
    Experiment.objects.filter(pk=run.experiment_id).update(status=Experiment.Status.FINISHED)
    return "finished"


def divergence(seed: dict[str, float], final: dict[str, float], evolve_splits: Sequence[str]) -> str:
    """A warning when the evolve score rose while sealed or held-out fell."""
    evolve = [s for s in evolve_splits if s in seed and s in final]
    if not evolve:
        return ""
    evolve_gain = sum(final[s] - seed[s] for s in evolve) / len(evolve)
    falling = [s for s in ("sealed", "heldout") if s in seed and s in final and final[s] < seed[s]]
    if evolve_gain > 0 and falling:
        parts = ", ".join(f"{s} {seed[s]:.3f} -> {final[s]:.3f}" for s in falling)
        return f"evolve score rose by {evolve_gain:+.3f} while {parts}: the run may be overfitting its evolve set"
    return ""
