"""The round's decision (evolution.loop.decision), pure: every rule of the gate, the choice, the ledger, S_best,
the structural kinds and pruning, with numbers worked out by hand. No database.

The common setting: the current harness has S = 0.50 and C = 1000 tokens per trial, S_best = 0.55, the noise
band delta = 0.05 (so the floor is 0.50), and one unit of dS is one trial of a 20-trial evolve set (0.05).
The published coding settings: c0 = 0, c1 = 0.25, lambda_S = 0, lambda_C = 1, lambda_N = 0.25, guards 3 points
of valid output and 2 points of no submission.
"""

from __future__ import annotations

import pytest

from evolution.loop.decision import NOT_CHOSEN, Edit, Pruning, RoundDecision, round_decide
from evolution.loop.regularization import (
    CandidateStats,
    GateParams,
    LedgerPoint,
    regularized_gate,
    unregularized_gate,
)

CURRENT = CandidateStats(candidate_id=1, score=0.50, cost=1000.0)
PARAMS = GateParams(score_unit=0.05)


def stats(pk: int, score: float, cost: float = 1000.0, **extra: object) -> CandidateStats:
    return CandidateStats(candidate_id=pk, score=score, cost=cost, **extra)  # type: ignore[arg-type]


def decide(*candidates: CandidateStats, **overrides: object) -> RoundDecision:
    arguments: dict[str, object] = {
        "round_number": 3,
        "current": CURRENT,
        "candidates": list(candidates),
        "edits": {
            c.candidate_id: [Edit(int(c.candidate_id) * 10, "prompt", f"edit of {c.candidate_id}")] for c in candidates
        },
        "best_score": 0.55,
        "delta": 0.05,
        "gate": regularized_gate,
        "params": PARAMS,
    }
    arguments.update(overrides)
    return round_decide(**arguments)  # type: ignore[arg-type]


def rule(candidate: CandidateStats, **overrides: object) -> tuple[str, bool]:
    decided = decide(candidate, **overrides).candidates[0]
    return decided.rule, decided.admissible


# --- Each rule of the gate -------------------------------------------------------------


def test_floor_rejects_a_score_below_the_best_minus_the_band() -> None:
    # 0.45 < 0.55 - 0.05 = 0.50.
    assert rule(stats(2, 0.45)) == ("floor", False)
    # Exactly at the floor is not below it (permissive at a threshold): dS = 0 is inside the band, and
    # 0 x 0 - 1 x 0 + 0.25 x 0 = 0 is not positive.
    assert rule(stats(2, 0.50)) == ("inside_noise_no_gain", False)


def test_guards_reject_a_fall_in_valid_output_or_a_rise_in_no_submission() -> None:
    # Valid output 100% -> 95%: a fall of 5 points, more than 3.
    assert rule(stats(2, 0.60, valid_rate=0.95)) == ("guard_valid_output", False)
    # 97% is a fall of exactly 3 points: allowed; S = 0.60 then passes as above the noise.
    assert rule(stats(2, 0.60, valid_rate=0.97)) == ("admissible_above_noise", True)
    # No submission 0% -> 3%: a rise of 3 points, more than 2.
    assert rule(stats(2, 0.60, no_submission_rate=0.03)) == ("guard_no_submission", False)


def test_above_the_band_the_cost_may_rise_by_c1_per_unit_of_gain() -> None:
    # dS = 0.10 = 2 units of 0.05; allowance c0 + c1 x 2 = 0.50 (50% more tokens).
    assert rule(stats(2, 0.60, cost=1400.0)) == ("admissible_above_noise", True)  # dC = +40%
    assert rule(stats(2, 0.60, cost=1500.0)) == ("admissible_above_noise", True)  # dC = +50%, at the limit
    assert rule(stats(2, 0.60, cost=1600.0)) == ("cost_too_high", False)  # dC = +60%
    numbers = decide(stats(2, 0.60, cost=1400.0)).candidates[0].numbers
    assert numbers["dS_units"] == pytest.approx(2.0)
    assert numbers["c_limit"] == pytest.approx(0.5)
    assert numbers["dC"] == pytest.approx(0.4)


def test_inside_the_band_the_objective_decides() -> None:
    # dS = 0.02 is inside the band 0.05. Objective 0 x 0.02 - 1 x dC + 0.25 x N_new.
    assert rule(stats(2, 0.52, cost=900.0)) == ("inside_noise_gain", True)  # -1 x (-0.10) = +0.10
    assert rule(stats(2, 0.52, cost=1100.0)) == ("inside_noise_no_gain", False)  # -0.10
    # A first structural kind: -0.10 + 0.25 x 1 = +0.15.
    tool = stats(2, 0.52, cost=1100.0, components=frozenset({"client_tool"}))
    assert rule(tool) == ("inside_noise_gain", True)
    assert decide(tool).candidates[0].numbers["N_new"] == 1
    # The same kind accepted before is not new: back to -0.10.
    assert rule(tool, accepted_structural=["client_tool"]) == ("inside_noise_no_gain", False)
    # A kind that is not structural never counts: prompt edits give N_new = 0.
    assert rule(stats(2, 0.52, cost=1100.0, components=frozenset({"prompt"}))) == ("inside_noise_no_gain", False)


def test_below_the_current_harness_by_more_than_the_band() -> None:
    # Reachable with the noise band off (band 0, no floor): 0.48 < 0.50.
    assert rule(stats(2, 0.48), params=GateParams(score_unit=0.05, noise_band=False)) == ("below_current", False)


def test_with_switches_off_only_the_floor_or_nothing_applies() -> None:
    no_f = GateParams(score_unit=0.05, admissibility=False)
    assert rule(stats(2, 0.50, cost=5000.0), params=no_f) == ("passes_floor", True)
    assert rule(stats(2, 0.49), params=no_f) == ("floor", False)
    neither = GateParams(score_unit=0.05, admissibility=False, noise_band=False)
    assert rule(stats(2, 0.10), params=neither) == ("unfiltered", True)


def test_the_unregularized_gate_accepts_only_a_new_best_whatever_it_costs() -> None:
    assert rule(stats(2, 0.56, cost=9000.0), gate=unregularized_gate) == ("unregularized_beats_best", True)
    assert rule(stats(2, 0.55), gate=unregularized_gate) == ("unregularized_not_better", False)


# --- The choice, acceptance and what the loop writes -------------------------------------


def test_the_highest_admissible_score_is_chosen_then_the_lower_cost_then_the_lower_id() -> None:
    decided = decide(stats(2, 0.60, cost=1200.0), stats(3, 0.62, cost=1400.0), stats(4, 0.45))
    assert decided.chosen == 3
    assert [(d.candidate_id, d.accepted, d.chosen) for d in decided.candidates] == [
        (2, False, False),
        (3, True, True),
        (4, False, False),
    ]
    # 2 was admissible but not chosen: its reason says so, apart from a rejection by a rule.
    assert decided.of(2).admissible and decided.of(2).reason == NOT_CHOSEN
    assert decided.of(4).reason == decided.of(4).explanation
    assert decided.best_score == pytest.approx(0.62)
    # Equal scores: the cheaper wins; equal costs too: the lower id.
    assert decide(stats(5, 0.60, cost=1100.0), stats(6, 0.60, cost=1000.0)).chosen == 6
    assert decide(stats(8, 0.60), stats(7, 0.60)).chosen == 7


def test_accepting_every_admissible_candidate() -> None:
    decided = decide(stats(2, 0.60, cost=1200.0), stats(3, 0.62, cost=1400.0), accept="admissible")
    assert decided.chosen == 3
    assert [(d.candidate_id, d.accepted, d.chosen) for d in decided.candidates] == [(2, True, False), (3, True, True)]
    assert decided.of(2).reason == decided.of(2).explanation
    with pytest.raises(ValueError, match="accept"):
        decide(stats(2, 0.60), accept="all")


def test_nothing_admissible_keeps_the_current_harness_and_s_best() -> None:
    decided = decide(stats(2, 0.45), stats(3, 0.52, cost=1100.0))
    assert decided.chosen is None
    assert decided.best_score == 0.55
    assert not any(d.accepted for d in decided.candidates)
    empty = decide()
    assert (empty.chosen, empty.candidates, empty.ledger, empty.best_score) == (None, (), (), 0.55)


def test_a_chosen_candidate_below_s_best_does_not_lower_it() -> None:
    # Inside the band and cheaper: admissible at S = 0.52 < S_best = 0.55, which stays.
    decided = decide(stats(2, 0.52, cost=900.0))
    assert decided.chosen == 2
    assert decided.best_score == 0.55


def test_ledger_rows_carry_each_edit_with_its_candidates_ds_and_dc() -> None:
    edits = {
        2: [Edit(21, "prompt", "shorter prompt"), Edit(22, "client_tool", "a grep tool")],
        3: [Edit(31, "config", "lower temperature")],
    }
    decided = decide(
        stats(2, 0.60, cost=1200.0, components=frozenset({"prompt", "client_tool"})),
        stats(3, 0.45, cost=800.0, components=frozenset({"config"})),
        edits=edits,
    )
    rows = [(r.edit_id, r.candidate_id, r.component, r.accepted) for r in decided.ledger]
    assert rows == [(21, 2, "prompt", True), (22, 2, "client_tool", True), (31, 3, "config", False)]
    assert [r.delta_score for r in decided.ledger] == pytest.approx([0.10, 0.10, -0.05])
    assert [r.delta_cost for r in decided.ledger] == pytest.approx([0.20, 0.20, -0.20])
    # Only accepted candidates add structural kinds; config is not structural anyway.
    assert decided.accepted_structural == ("client_tool",)
    assert decided.measured_components == ("client_tool", "config", "prompt")


def test_no_relative_cost_change_from_a_harness_that_reported_no_cost() -> None:
    free = CandidateStats(candidate_id=1, score=0.50, cost=0.0)
    decided = decide(stats(2, 0.60, cost=100.0), current=free)
    assert decided.ledger[0].delta_cost is None
    # A rise from 0 is an infinite rise: it never passes the cost rule.
    assert decided.candidates[0].rule == "cost_too_high"
    assert decided.candidates[0].numbers["dC"] is None
    assert decide(stats(2, 0.60, cost=0.0), current=free).ledger[0].delta_cost == 0.0


# --- Pruning ------------------------------------------------------------------------------


def test_pruning_targets_the_kinds_whose_best_ds_in_the_window_is_not_above_the_threshold() -> None:
    # Round 3, window 2: rounds 2 and 3 count. Threshold 0.
    so_far = [
        LedgerPoint(round=1, component="config", dS=-0.10),  # outside the window: config is not judged
        LedgerPoint(round=2, component="prompt", dS=-0.05),
        LedgerPoint(round=2, component="memory", dS=0.00),  # exactly at the threshold: a target
        LedgerPoint(round=2, component="skill", dS=0.04),
    ]
    edits = {2: [Edit(20, "prompt", "p")], 3: [Edit(30, "skill", "s")]}
    decided = decide(
        stats(2, 0.53, cost=1050.0),  # dS = +0.03 for prompt: its best in the window is now +0.03
        stats(3, 0.45),  # dS = -0.05 for skill: its best stays +0.04
        edits=edits,
        ledger_so_far=so_far,
        pruning=Pruning(window=2, threshold=0.0),
    )
    assert decided.pruning_targets == ("memory",)
    assert decided.measured_components == ("config", "memory", "prompt", "skill")
    # A threshold of 0.035 adds prompt (+0.03) but not skill (+0.04).
    raised = decide(
        stats(2, 0.53, cost=1050.0),
        stats(3, 0.45),
        edits=edits,
        ledger_so_far=so_far,
        pruning=Pruning(window=2, threshold=0.035),
    )
    assert raised.pruning_targets == ("memory", "prompt")
    # Without pruning the decision names no targets.
    assert decide(stats(2, 0.60), ledger_so_far=so_far).pruning_targets is None


def test_the_decision_is_a_function_of_its_inputs() -> None:
    args = (stats(2, 0.60, cost=1200.0), stats(3, 0.52, cost=900.0))
    assert decide(*args) == decide(*args)
    with pytest.raises(ValueError, match="unique"):
        decide(stats(2, 0.60), stats(2, 0.61))
