"""The loop's state machine on the tiny benchmark, driven in-process."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pytest
from django.db import connection

from evolution import operators
from evolution.loop import lifecycle, load
from evolution.loop import steps as loop_steps
from evolution.models import (
    Candidate,
    CertifiedResult,
    Evaluation,
    GateDecision,
    LeakageFlag,
    LedgerEntry,
    ReviewItem,
    Run,
)
from evolution.recipes import load_preset, parse_recipe, recipe_to_dict
from tests.factories import make_tiny_experiment, seed_id, seed_of
from tests.loop_driver import drive
from tests.operators import tiny_proposer

pytestmark = pytest.mark.django_db

CANARY = "CANARY-SEALED-7f3a"


def tiny_recipe(base: str, **overrides: Any) -> Any:
    data = recipe_to_dict(load_preset(base))
    data.update(rounds=2, candidates_per_round=3)
    data["proposal"] = {"operator": "tiny-test", "params": {}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": 1}
    data["noise"] = {**data["noise"], "repeats": 2} if data["noise"]["enabled"] else data["noise"]
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if isinstance(value, Mapping) else value
    data["edit_budget"] = {**data["edit_budget"], "T": 2}
    return parse_recipe(data, known_operators=operators.known_operators())


def start(base: str, **overrides: Any) -> Run:
    experiment = make_tiny_experiment(tasks=12, k=1)
    return lifecycle.run_create(experiment=experiment, recipe=tiny_recipe(base, **overrides))


def test_unregularized_run_accepts_a_leaky_edit_and_raises_train_only() -> None:
    run = drive(start("unregularized"))
    assert run.status == Run.Status.FINISHED, run.error
    leaky = Candidate.objects.filter(run=run, label__endswith="s0", state=Candidate.State.ACCEPTED)
    assert leaky.exists()
    assert not LeakageFlag.objects.filter(candidate__run=run).exists()
    final = run.state["final"]
    assert final["scores"]["train"] > final["seed_scores"]["train"]
    assert final["scores"]["sealed"] == final["seed_scores"]["sealed"]


def test_rrsi_run_flags_the_leak_before_any_evaluation_and_holds_it_for_review() -> None:
    run = drive(start("rrsi"))
    assert run.status == Run.Status.FINISHED, run.error
    flagged = Candidate.objects.filter(run=run, label__endswith="s0")
    assert flagged.count() == 2
    for candidate in flagged:
        assert candidate.state == Candidate.State.FLAGGED
        assert not Evaluation.objects.filter(candidate=candidate).exists()
        assert ReviewItem.objects.filter(candidate=candidate, state=ReviewItem.State.OPEN).exists()
        assert LeakageFlag.objects.filter(candidate=candidate, rule="task_id").exists()
    assert not LedgerEntry.objects.filter(candidate__in=flagged).exists()


def test_the_seed_is_certified_and_accepted_first_with_a_noise_band() -> None:
    run = drive(start("rrsi"))
    seed = seed_of(run.experiment)
    decision = GateDecision.objects.get(run=run, candidate=seed)
    assert decision.rule == "seed" and decision.round == 0
    assert len(decision.numbers["repeats"]) == 2
    assert run.noise_delta == decision.numbers["delta"]
    assert Evaluation.objects.filter(run=run, candidate=seed, purpose__in=["baseline", "noise"]).count() == 2


def test_every_validly_measured_edit_enters_the_ledger_with_its_candidate_numbers() -> None:
    run = drive(start("rrsi"))
    measured = (
        Candidate.objects.filter(run=run)
        .exclude(origin=Candidate.Origin.SEED)
        .filter(state__in=[Candidate.State.ACCEPTED, Candidate.State.REJECTED_GATE])
    )
    assert measured.exists()
    for candidate in measured:
        entries = LedgerEntry.objects.filter(candidate=candidate)
        decision = GateDecision.objects.get(run=run, candidate=candidate)
        assert entries.count() == candidate.edits.count()
        assert {e.accepted for e in entries} == {decision.accepted}
    not_measured = Candidate.objects.filter(run=run, state=Candidate.State.FLAGGED)
    assert not LedgerEntry.objects.filter(candidate__in=not_measured).exists()


def test_cost_without_gain_is_rejected_by_the_regularized_gate() -> None:
    run = drive(start("rrsi"))
    padded = Candidate.objects.filter(run=run, label__endswith="s2")
    assert padded.exists()
    for candidate in padded:
        decision = GateDecision.objects.get(run=run, candidate=candidate)
        assert decision.accepted is False
        assert decision.numbers["dC"] > 0


def test_each_round_records_its_summary_and_every_evaluation_is_certified() -> None:
    run = drive(start("rrsi"))
    assert sorted(run.state["rounds"], key=int) == ["0", "1", "2"]
    assert run.state["rounds"]["1"]["budget"] == 4
    assert run.state["rounds"]["2"]["budget"] == 3 or run.state["rounds"]["2"]["budget"] == 2
    evaluations = Evaluation.objects.filter(run=run)
    assert set(evaluations.values_list("state", flat=True)) == {Evaluation.State.CERTIFIED}
    assert CertifiedResult.objects.filter(experiment=run.experiment).count() == evaluations.count()
    assert run.state["final"]["scores"].keys() >= {"train", "gate", "sealed"}


def test_the_proposer_never_sees_gate_or_sealed_data() -> None:
    experiment = make_tiny_experiment(tasks=12, k=1)
    sealed = experiment.split_memberships.filter(split="sealed").select_related("task")
    for membership in sealed:
        task = membership.task
        task.instruction += f" {CANARY}"
        task.save(update_fields=["instruction"])
    from evolution.services.experiments import splits_assign

    splits_assign(experiment=experiment, seed=experiment.split_seed, ratios=experiment.split_ratios)
    seen: list[str] = []

    @operators.register("proposal", "canary-watch")
    def watching(view: operators.ProposerView) -> operators.Proposal:
        seen.append(repr(view))
        return tiny_proposer(view)

    run = lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("rrsi", proposal={"operator": "canary-watch"}))
    drive(run)
    assert seen, "the proposer was never called"
    assert not any(CANARY in text for text in seen)
    gate_ids = set(experiment.split_memberships.filter(split="gate").values_list("task__external_id", flat=True))
    assert not any(f"'{task_id}'" in text for text in seen for task_id in gate_ids)


def test_cancel_stops_the_run_and_its_trials() -> None:
    run = start("rrsi")
    loop_steps.run_advance(run_id=run.pk)  # starts the seed's evaluations
    assert lifecycle.run_cancel(run=run)
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert not Evaluation.objects.filter(run=run, state=Evaluation.State.RUNNING).exists()
    assert loop_steps.run_advance(run_id=run.pk) == Run.Status.CANCELLED


def test_pause_holds_the_run_and_resume_finishes_it() -> None:
    run = start("rrsi")
    assert lifecycle.run_pause(run=run)
    assert loop_steps.run_advance(run_id=run.pk) == Run.Status.PAUSED
    assert not Evaluation.objects.filter(run=run).exists()
    assert lifecycle.run_resume(run=run)
    assert drive(run).status == Run.Status.FINISHED


def test_a_token_budget_stops_the_run_cleanly_with_the_reason() -> None:
    run = drive(start("rrsi", limits={"max_tokens": 50}))
    assert run.status == Run.Status.FINISHED
    assert run.stop_reason.startswith("token budget spent")
    assert not Evaluation.objects.filter(run=run, purpose=Evaluation.Purpose.TRANSFER).exists()


def test_one_active_run_per_experiment() -> None:
    run = start("rrsi")
    with pytest.raises(lifecycle.LoopError, match="active run already"):
        lifecycle.run_create(experiment=run.experiment, recipe=tiny_recipe("rrsi"))


def test_a_second_run_of_the_same_experiment_starts_from_the_experiments_best() -> None:
    first = drive(start("rrsi"))
    assert first.status == Run.Status.FINISHED
    experiment = first.experiment
    best = load.best_candidate(experiment)
    assert best is not None and best.state == Candidate.State.ACCEPTED
    second = drive(lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("unregularized")))
    assert second.status == Run.Status.FINISHED, second.error
    start_decision = GateDecision.objects.get(run=second, round=0)
    assert start_decision.candidate_id == second.start_candidate_id == best.pk and start_decision.accepted
    assert Candidate.objects.get(pk=seed_id(experiment)).state == Candidate.State.ACCEPTED
    assert Candidate.objects.filter(run=second).exclude(pk=best.pk).exists()


# An UPDATE filtered across a relation is written by Django as
# 'UPDATE t ... WHERE t.id IN (SELECT U0.id FROM t U0 JOIN ...)'. PostgreSQL
# does not re-check that subquery against a row a concurrent transaction has
# just changed, so a conditional update of this shape (a claim, a
# cancellation) can let two racing callers both win (see trial_claim).
SELF_SUBQUERY_UPDATE = re.compile(r'^UPDATE "(\w+)" SET .* WHERE "\1"\."id" IN \(SELECT', re.DOTALL)


def test_no_update_of_the_loop_goes_through_a_subquery_of_its_own_table() -> None:
    seen: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        finished = drive(start("rrsi"))
        cancelled = start("rrsi")
        loop_steps.run_advance(run_id=cancelled.pk)  # the seed's trials are pending
        assert lifecycle.run_cancel(run=cancelled)
    assert finished.status == Run.Status.FINISHED, finished.error
    updates = [sql for sql in seen if sql.startswith("UPDATE")]
    assert any('"evolution_trial"' in sql for sql in updates)  # the claims and the cancellation were seen
    assert [sql for sql in updates if SELF_SUBQUERY_UPDATE.match(sql)] == []


def test_a_recipe_can_put_the_floor_on_the_gate_split_alone() -> None:
    run = drive(start("rrsi", noise={"floor": "gate"}))
    assert run.status == Run.Status.FINISHED, run.error
    decisions = GateDecision.objects.filter(run=run, round__gte=1)
    assert decisions.exists()
    seed_gate = load_gate_score(seed_of(run.experiment))
    for decision in decisions:
        assert decision.numbers["floor_on"] == "gate"
        assert decision.numbers["S_best_floor"] >= seed_gate  # the best gate score of an accepted harness
        assert decision.numbers["S_floor"] == load_gate_score(decision.candidate)


def load_gate_score(candidate: Candidate) -> float:
    stats = load.candidate_stats(candidate, ["gate"], "pass_at_1")
    assert stats is not None
    return stats.score
