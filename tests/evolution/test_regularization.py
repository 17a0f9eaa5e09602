"""Unit tests for evolution.loop.regularization: pure functions, no database.

Most gate tests use scores that are multiples of 1/8 (exact in binary
floating point) with ``score_unit = 1/8``, so every dS, unit count and cost
allowance is exact; the published example uses its own 1/178 trials, where
the EPSILON tolerance at the band edge is what keeps it inside the band.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from evolution.loop.regularization import (
    GATE_RULES,
    CandidateStats,
    GateParams,
    GateVerdict,
    LedgerPoint,
    choose,
    edit_budget,
    is_stalled,
    new_structural_kinds,
    noise_delta,
    noise_estimate,
    pruning_targets,
    regularized_gate,
    score_unit_size,
    unexplored_kinds,
    unregularized_gate,
)

EIGHTH = 1 / 8
PARAMS = GateParams(score_unit=EIGHTH)


def stats(
    candidate_id: int,
    score: float,
    cost: float = 1000.0,
    *,
    valid: float = 1.0,
    no_submission: float = 0.0,
    components: tuple[str, ...] = ("prompt",),
) -> CandidateStats:
    return CandidateStats(
        candidate_id=candidate_id,
        score=score,
        cost=cost,
        valid_rate=valid,
        no_submission_rate=no_submission,
        components=frozenset(components),
    )


CURRENT = stats(0, 0.5, 1000.0, valid=0.9, no_submission=0.05, components=())


def gate_one(
    candidate: CandidateStats,
    *,
    current: CandidateStats = CURRENT,
    best_score: float = 0.5,
    delta: float | None = EIGHTH,
    params: GateParams = PARAMS,
    accepted: frozenset[str] = frozenset(),
) -> GateVerdict:
    (verdict,) = regularized_gate(
        current,
        [candidate],
        best_score=best_score,
        delta=delta,
        params=params,
        accepted_structural_kinds=accepted,
    )
    return verdict


# --- A. Edit budget -------------------------------------------------------------------


def test_edit_budget_follows_the_published_cosine_schedule() -> None:
    budgets = [edit_budget(t, k_max=4, k_min=1, T=10) for t in range(10)]

    assert budgets == [4, 4, 4, 4, 3, 3, 3, 2, 2, 2]


def test_edit_budget_is_k_min_at_T_and_after() -> None:
    assert [edit_budget(t, k_max=4, k_min=1, T=10) for t in (10, 11, 25)] == [1, 1, 1]


def test_edit_budget_does_not_round_an_exact_integer_up() -> None:
    # 1 + 4 * (1 + cos(2 pi / 3)) / 2 is exactly 2, but the float is
    # 2.0000000000000004 and a bare ceil would give 3.
    assert edit_budget(2, k_max=5, k_min=1, T=3) == 2
    assert edit_budget(1, k_max=5, k_min=1, T=3) == 4


def test_edit_budget_is_constant_when_k_min_equals_k_max() -> None:
    assert [edit_budget(t, k_max=2, k_min=2, T=5) for t in range(6)] == [2, 2, 2, 2, 2, 2]


@pytest.mark.parametrize(
    ("t", "k_max", "k_min", "T", "message"),
    [
        pytest.param(-1, 4, 1, 10, "round t must be >= 0, got -1", id="negative-t"),
        pytest.param(0, 4, 0, 10, "k_min must be >= 1, got 0", id="k-min-0"),
        pytest.param(0, 1, 2, 10, "k_max (1) must be >= k_min (2)", id="k-max-below-k-min"),
        pytest.param(0, 4, 1, 0, "T must be >= 1, got 0", id="T-0"),
    ],
)
def test_edit_budget_rejects_bad_arguments(t: int, k_max: int, k_min: int, T: int, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        edit_budget(t, k_max=k_max, k_min=k_min, T=T)


# --- C. Stall ---------------------------------------------------------------------------


def test_is_stalled_when_the_best_rose_by_exactly_delta_over_w_rounds() -> None:
    # 0.52 - 0.50 is 0.020000000000000018 in floats: still "not more than delta".
    assert is_stalled([0.5, 0.51, 0.52, 0.52], w=3, delta=0.02) is True


def test_is_not_stalled_when_the_best_rose_by_more_than_delta() -> None:
    assert is_stalled([0.5, 0.5, 0.5, 0.53], w=3, delta=0.02) is False


def test_is_not_stalled_with_fewer_than_w_plus_one_rounds() -> None:
    assert is_stalled([0.5, 0.5, 0.5], w=3, delta=0.02) is False


def test_is_stalled_compares_with_the_best_exactly_w_rounds_ago() -> None:
    # The rise from 0.3 happened four rounds ago, outside the window.
    assert is_stalled([0.3, 0.5, 0.5, 0.5, 0.5], w=3, delta=0.0) is True
    assert is_stalled([0.3, 0.5, 0.5, 0.5], w=3, delta=0.0) is False


def test_is_stalled_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="^w must be >= 1, got 0$"):
        is_stalled([0.5, 0.5], w=0, delta=0.0)
    with pytest.raises(ValueError, match="^delta must be a finite number >= 0"):
        is_stalled([0.5, 0.5], w=1, delta=-0.1)


def test_unexplored_kinds_lists_kinds_never_measured_in_vocabulary_order() -> None:
    assert unexplored_kinds(["prompt", "skill", "config", "prompt"]) == [
        "control_flow",
        "output_plumbing",
        "context_mgmt",
        "client_tool",
        "memory",
        "subagent",
    ]


# --- E. Noise --------------------------------------------------------------------------


def test_noise_delta_range_is_max_minus_min() -> None:
    assert noise_delta([0.5, 0.625, 0.5625], rule="range") == 0.125


def test_noise_delta_std_is_the_sample_standard_deviation() -> None:
    assert noise_delta([0.25, 0.75], rule="std") == math.sqrt(0.125)


def test_noise_delta_fixed_ignores_the_scores() -> None:
    assert noise_delta([], rule="fixed", fixed=0.017) == 0.017


@pytest.mark.parametrize(
    ("scores", "rule", "fixed", "message"),
    [
        pytest.param([0.5, 0.6], "iqr", None, "unknown noise rule 'iqr'", id="unknown-rule"),
        pytest.param([0.5], "range", None, "the range rule needs at least 2 scores, got 1", id="one-score"),
        pytest.param([0.5, 0.6], "fixed", None, "the fixed noise rule needs a value", id="fixed-missing"),
        pytest.param([0.5, 0.6], "range", 0.1, "a fixed value is only used with the fixed rule", id="stray-fixed"),
        pytest.param([], "fixed", -0.1, "delta must be a finite number >= 0", id="fixed-negative"),
    ],
)
def test_noise_delta_rejects_bad_input(scores: list[float], rule: str, fixed: float | None, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        noise_delta(scores, rule=rule, fixed=fixed)


# --- Units ------------------------------------------------------------------------------


def test_score_unit_size_converts_each_unit_to_a_fraction_of_s() -> None:
    assert score_unit_size("trial", evolve_trials=178) == 1 / 178
    assert score_unit_size("criterion", 100, evolve_criteria=14100) == 100 / 14100
    assert score_unit_size("point", 2) == 0.02
    assert score_unit_size("fraction", 0.5) == 0.5


def test_score_unit_size_needs_the_count_of_its_unit() -> None:
    with pytest.raises(ValueError, match="^evolve_trials must be a positive count, got None$"):
        score_unit_size("trial")
    with pytest.raises(ValueError, match="^evolve_criteria must be a positive count, got 0$"):
        score_unit_size("criterion", 100, evolve_criteria=0)
    with pytest.raises(ValueError, match="^unknown score unit 'task'"):
        score_unit_size("task")


# --- E. The noise band as measured ---------------------------------------------------------


def repeat(**tasks: list[float]) -> dict[str, list[float]]:
    return dict(tasks)


def test_the_bootstrap_band_is_not_zero_when_two_evaluations_agree_by_chance() -> None:
    # The case: two evaluations with the same S (0.5) whose trials disagreed task by task.
    first, second = repeat(a=[1.0], b=[0.0]), repeat(a=[0.0], b=[1.0])
    assert noise_delta([0.5, 0.5], rule="range") == 0.0  # the range of the two S collapses
    estimate = noise_estimate([first, second], rule="bootstrap")
    assert estimate.delta is not None and estimate.delta > 0.1
    assert (estimate.evaluations, estimate.trials_per_task) == (2, 2)
    assert estimate.note.startswith("expected range of S over 2 evaluations")


def test_the_bootstrap_band_is_zero_only_when_every_trial_agreed() -> None:
    same = repeat(a=[1.0, 1.0], b=[0.0, 0.0])
    assert noise_estimate([same, same, same], rule="bootstrap").delta == 0.0


def test_the_bootstrap_band_is_deterministic_and_grows_with_the_spread() -> None:
    noisy = [repeat(a=[1.0, 0.0], b=[0.0, 1.0], c=[1.0, 0.0])] * 3
    quiet = [repeat(a=[1.0, 1.0], b=[0.0, 0.0], c=[1.0, 0.0])] * 3
    assert noise_estimate(noisy, rule="bootstrap", seed=7) == noise_estimate(noisy, rule="bootstrap", seed=7)
    loud, soft = noise_estimate(noisy, rule="bootstrap").delta, noise_estimate(quiet, rule="bootstrap").delta
    assert loud is not None and soft is not None and loud > soft > 0


def test_the_expected_range_matches_its_closed_form_for_one_coin_task() -> None:
    # One task, p = 1/2, one trial per evaluation, two evaluations: E|X1 - X2| = 2 p (1 - p) = 0.5.
    coin = [repeat(a=[1.0, 0.0]), repeat(a=[0.0, 1.0])]
    # Each evaluation draws one trial from the pooled four values (two 1s, two 0s).
    one = [repeat(a=[1.0]), repeat(a=[0.0])]
    estimate = noise_estimate(one, rule="bootstrap", draws=20000, seed=1)
    assert estimate.delta is not None and abs(estimate.delta - 0.5) < 0.02
    assert noise_estimate(coin, rule="bootstrap").trials_per_task == 4


@pytest.mark.parametrize("rule", ["range", "std"])
def test_two_equal_evaluations_give_no_band_for_range_and_std(rule: str) -> None:
    estimate = noise_estimate([repeat(a=[1.0], b=[0.0]), repeat(a=[0.0], b=[1.0])], rule=rule)
    assert estimate.delta is None
    assert "says nothing about the spread" in estimate.note


def test_one_evaluation_gives_no_band_and_a_fixed_band_needs_none() -> None:
    assert noise_estimate([repeat(a=[1.0, 0.0])], rule="bootstrap").delta is None
    assert noise_estimate([], rule="fixed", fixed=0.02).delta == 0.02
    assert noise_estimate([repeat(a=[1.0]), repeat(a=[1.0]), repeat(a=[0.0])], rule="range").delta == 1.0


def test_an_unknown_band_blocks_acceptance_inside_the_band_but_not_above_it() -> None:
    cost_cut = gate_one(stats(1, 0.5, 750.0), delta=None)  # accepted inside a band of 1/8 (see below)
    assert (cost_cut.admissible, cost_cut.rule) == (False, "noise_unknown")
    assert "could not be estimated" in cost_cut.explanation
    assert gate_one(stats(1, 0.5, 750.0)).rule == "inside_noise_gain"
    better = gate_one(stats(2, 0.5 + EIGHTH, 1000.0), delta=None)
    assert (better.admissible, better.rule, better.numbers["delta"]) == (True, "admissible_above_noise", 0.0)
    assert better.numbers["delta_estimated"] is None
    worse = gate_one(stats(3, 0.5 - EIGHTH, 500.0), delta=None)  # the floor has no slack either
    assert (worse.admissible, worse.rule) == (False, "floor")


def test_the_floor_is_on_the_evolve_score_unless_the_recipe_puts_it_on_the_gate_split() -> None:
    # S on the evolve set (train + gate) is at the floor; on the gate split alone it fell by a quarter.
    candidate = CandidateStats(2, score=0.5, cost=750.0, floor_score=0.5)
    on_evolve = gate_one(candidate)
    assert on_evolve.rule == "inside_noise_gain" and "floor_on" not in on_evolve.numbers
    (on_gate,) = regularized_gate(
        CURRENT, [candidate], best_score=0.5, delta=EIGHTH, params=PARAMS, best_floor_score=0.75
    )
    assert (on_gate.admissible, on_gate.rule) == (False, "floor")
    assert on_gate.explanation.startswith("S on the gate split = 50.00 points is below the floor the best gate score")
    assert (on_gate.numbers["floor_on"], on_gate.numbers["S_floor"], on_gate.numbers["floor"]) == ("gate", 0.5, 0.625)
    with pytest.raises(ValueError, match="needs every candidate's gate score"):
        regularized_gate(CURRENT, [stats(3, 0.5, 1.0)], best_score=0.5, delta=0.0, params=PARAMS, best_floor_score=0.5)


# --- F. The regularized gate ---------------------------------------------------------------


def test_gate_rejects_the_published_inside_noise_example() -> None:
    # Coding: 178 evolve trials, delta = 3 trials (1.69 points); the candidate
    # passes 3 more trials (+1.69 points) with 26.1% more tokens, prompt only.
    current = stats(1, 100 / 178, 1000.0, components=())
    candidate = stats(2, 103 / 178, 1261.0, components=("prompt",))

    verdict = gate_one(
        candidate,
        current=current,
        best_score=100 / 178,
        delta=3 / 178,
        params=GateParams(score_unit=1 / 178, lambda_S=0.0),
    )

    assert verdict.admissible is False
    assert verdict.rule == "inside_noise_no_gain"
    assert verdict.explanation == (
        "dS = +1.69 points is inside the noise band (1.69 points), dC = +26.1%, and the objective "
        "0 x dS - 1 x dC + 0.25 x 0 new structural kind(s) = -0.261 is not positive, so the candidate is rejected."
    )
    assert verdict.numbers["dC"] == 0.261
    assert verdict.numbers["objective"] == -0.261
    assert verdict.numbers["N_new"] == 0
    assert verdict.numbers["delta"] == 3 / 178


def test_gate_accepts_a_cost_cut_inside_the_noise_band() -> None:
    verdict = gate_one(stats(1, 0.5 - EIGHTH, 750.0))

    assert (verdict.admissible, verdict.rule) == (True, "inside_noise_gain")
    assert verdict.numbers["dC"] == -0.25
    assert verdict.numbers["objective"] == 0.25


def test_gate_rejects_an_unchanged_score_at_an_unchanged_cost() -> None:
    verdict = gate_one(stats(1, 0.5, 1000.0))

    assert (verdict.admissible, verdict.rule) == (False, "inside_noise_no_gain")
    assert verdict.numbers["objective"] == 0.0


def test_gate_gives_the_novelty_bonus_only_to_the_first_structural_kind() -> None:
    # +12.5% tokens inside the band: -1 x 0.125 + 0.25 x 1 new kind > 0.
    first = gate_one(stats(1, 0.5, 1125.0, components=("prompt", "skill")))
    after_skill_accepted = gate_one(stats(2, 0.5, 1125.0, components=("skill",)), accepted=frozenset({"skill"}))

    assert (first.admissible, first.rule, first.numbers["N_new"]) == (True, "inside_noise_gain", 1)
    assert first.numbers["new_structural_kinds"] == ["skill"]
    assert first.numbers["objective"] == 0.125
    assert (after_skill_accepted.admissible, after_skill_accepted.rule) == (False, "inside_noise_no_gain")
    assert after_skill_accepted.numbers["N_new"] == 0


def test_new_structural_kinds_ignores_non_structural_and_accepted_kinds() -> None:
    assert new_structural_kinds(["prompt", "memory", "subagent", "config"], {"memory"}) == ["subagent"]


def test_gate_floor_rejects_below_best_minus_delta() -> None:
    current = stats(0, 0.75, 1000.0, components=())
    verdict = gate_one(stats(1, 0.5, 500.0), current=current, best_score=0.75, delta=EIGHTH)

    assert (verdict.admissible, verdict.rule) == (False, "floor")
    assert verdict.numbers["floor"] == 0.625
    assert verdict.explanation == (
        "S = 50.00 points is below the floor S_best - delta = 75.00 - 12.50 = 62.50 points, "
        "so the candidate is rejected."
    )


def test_gate_floor_accepts_exactly_at_best_minus_delta() -> None:
    # 110/178 - 3/178 is not bit-equal to 107/178; the tolerance keeps it on the floor.
    current = stats(0, 110 / 178, 1000.0, components=())
    verdict = gate_one(
        stats(1, 107 / 178, 900.0),
        current=current,
        best_score=110 / 178,
        delta=3 / 178,
        params=GateParams(score_unit=1 / 178),
    )

    assert (verdict.admissible, verdict.rule) == (True, "inside_noise_gain")


def test_gate_above_noise_accepts_a_cost_rise_up_to_c0_plus_c1_ds() -> None:
    # dS = 3 units of 1/8 > delta = 1/8; allowance 0.1 + 0.25 x 3 = 0.85.
    params = GateParams(score_unit=EIGHTH, c0=0.1, c1=0.25)

    at_limit = gate_one(stats(1, 0.875, 1850.0), params=params)
    over_limit = gate_one(stats(2, 0.875, 1860.0), params=params)

    assert (at_limit.admissible, at_limit.rule) == (True, "admissible_above_noise")
    assert at_limit.numbers["dS_units"] == 3.0
    assert at_limit.numbers["c_limit"] == 0.85
    assert (over_limit.admissible, over_limit.rule) == (False, "cost_too_high")
    assert over_limit.explanation == (
        "dS = +37.50 points is above the noise band (12.50 points) but dC = +86.0% exceeds "
        "c0 + c1 x dS = 0.1 + 0.25 x 3 units = +85.0%, so the candidate is rejected."
    )


def test_gate_treats_a_cost_rise_from_zero_as_infinite() -> None:
    current = stats(0, 0.5, 0.0, components=())

    above = gate_one(stats(1, 0.875, 10.0), current=current)
    inside = gate_one(
        stats(2, 0.5, 10.0, components=("memory",)),
        current=current,
        params=GateParams(score_unit=EIGHTH, lambda_C=0.0),
    )

    assert (above.admissible, above.rule, above.numbers["dC"]) == (False, "cost_too_high", None)
    # lambda_C = 0 ignores cost entirely instead of computing 0 x inf = NaN.
    assert (inside.admissible, inside.rule, inside.numbers["objective"]) == (True, "inside_noise_gain", 0.25)


@pytest.mark.parametrize(
    ("valid", "no_submission", "admissible", "rule"),
    [
        pytest.param(0.87, 0.05, True, "inside_noise_gain", id="valid-drop-at-0.03"),
        pytest.param(0.86, 0.05, False, "guard_valid_output", id="valid-drop-over-0.03"),
        pytest.param(0.90, 0.07, True, "inside_noise_gain", id="no-submission-rise-at-0.02"),
        pytest.param(0.90, 0.08, False, "guard_no_submission", id="no-submission-rise-over-0.02"),
    ],
)
def test_gate_guards_allow_exactly_the_threshold(
    valid: float, no_submission: float, admissible: bool, rule: str
) -> None:
    # Current: valid 0.90, no-submission 0.05. A cost cut that would otherwise pass.
    verdict = gate_one(stats(1, 0.5, 900.0, valid=valid, no_submission=no_submission))

    assert (verdict.admissible, verdict.rule) == (admissible, rule)


def test_gate_guard_explains_the_rates() -> None:
    verdict = gate_one(stats(1, 0.875, 900.0, valid=0.80))

    assert verdict.explanation == (
        "The valid-output rate falls from 90.0% to 80.0% (by 10.0%, more than the 3.0% allowed), "
        "so the candidate is rejected."
    )


def test_gate_guard_set_to_none_is_off() -> None:
    params = GateParams(score_unit=EIGHTH, valid_output_drop=None)

    verdict = gate_one(stats(1, 0.5, 900.0, valid=0.2), params=params)

    assert (verdict.admissible, verdict.rule) == (True, "inside_noise_gain")


def test_gate_without_noise_band_has_no_floor_and_a_zero_band() -> None:
    params = GateParams(score_unit=EIGHTH, noise_band=False)

    lower = gate_one(stats(1, 0.375, 500.0), params=params)
    higher = gate_one(stats(2, 0.625, 1000.0), params=params)

    assert (lower.admissible, lower.rule, lower.numbers["floor"]) == (False, "below_current", None)
    assert (higher.admissible, higher.rule, higher.numbers["delta"]) == (True, "admissible_above_noise", 0.0)
    assert higher.numbers["delta_estimated"] == EIGHTH


def test_gate_without_admissibility_admits_everything_past_the_floor() -> None:
    with_floor = GateParams(score_unit=EIGHTH, admissibility=False)
    without_filters = GateParams(score_unit=EIGHTH, admissibility=False, noise_band=False)

    costly = gate_one(stats(1, 0.5, 5000.0, valid=0.1), params=with_floor)
    below_floor = gate_one(stats(2, 0.25, 1000.0), params=with_floor)
    anything = gate_one(stats(3, 0.25, 5000.0), params=without_filters)

    assert (costly.admissible, costly.rule) == (True, "passes_floor")
    assert (below_floor.admissible, below_floor.rule) == (False, "floor")
    assert (anything.admissible, anything.rule) == (True, "unfiltered")


def test_gate_numbers_are_json_safe_and_rules_are_known() -> None:
    current = stats(0, 0.5, 0.0, components=())
    verdicts = regularized_gate(
        current,
        [stats(1, 0.875, 10.0), stats(2, 0.5, 0.0), stats(3, 0.0, 0.0)],
        best_score=0.5,
        delta=EIGHTH,
        params=PARAMS,
    )

    for verdict in verdicts:
        json.dumps(verdict.numbers, allow_nan=False)
        assert verdict.rule in GATE_RULES
    assert [verdict.rule for verdict in verdicts] == ["cost_too_high", "inside_noise_no_gain", "floor"]


def test_gate_rejects_duplicate_candidate_ids_and_a_negative_delta() -> None:
    with pytest.raises(ValueError, match="^candidate ids must be unique$"):
        regularized_gate(CURRENT, [stats(1, 0.5), stats(1, 0.6)], best_score=0.5, delta=0.0, params=PARAMS)
    with pytest.raises(ValueError, match="^delta must be a finite number >= 0"):
        regularized_gate(CURRENT, [stats(1, 0.5)], best_score=0.5, delta=-0.01, params=PARAMS)


def test_candidate_stats_rejects_points_and_unknown_kinds() -> None:
    with pytest.raises(ValueError, match=r"^score of candidate 1 must be in \[0, 1\], got 56.2$"):
        CandidateStats(candidate_id=1, score=56.2, cost=10.0)
    with pytest.raises(ValueError, match="^unknown component kind"):
        CandidateStats(candidate_id=1, score=0.5, cost=10.0, components=frozenset({"prompts"}))


def test_gate_params_reject_a_negative_c1() -> None:
    with pytest.raises(ValueError, match="^c1 must be a finite number >= 0, got -0.25$"):
        GateParams(score_unit=EIGHTH, c1=-0.25)


# --- The unregularized gate ---------------------------------------------------------------


def test_unregularized_gate_accepts_only_a_strict_improvement_over_best() -> None:
    verdicts = unregularized_gate(
        CURRENT,
        [stats(1, 0.5, 100.0), stats(2, 0.625, 9000.0, valid=0.0), stats(3, 0.375, 10.0)],
        best_score=0.5,
    )

    assert [(v.candidate_id, v.admissible, v.rule) for v in verdicts] == [
        (1, False, "unregularized_not_better"),
        (2, True, "unregularized_beats_best"),
        (3, False, "unregularized_not_better"),
    ]
    assert verdicts[1].numbers["dS_best"] == EIGHTH


# --- Choice ---------------------------------------------------------------------------------


def test_choose_picks_the_admissible_candidate_with_the_highest_score() -> None:
    candidates = [stats(1, 0.625, 1000.0), stats(2, 0.75, 1000.0), stats(3, 0.875, 1000.0)]
    verdicts = [
        GateVerdict(1, True, "inside_noise_gain", ""),
        GateVerdict(2, True, "admissible_above_noise", ""),
        GateVerdict(3, False, "cost_too_high", ""),
    ]

    assert choose(verdicts, candidates) == 2


def test_choose_breaks_score_ties_by_lower_cost_then_lower_id() -> None:
    candidates = [stats(7, 0.75, 900.0), stats(5, 0.75, 800.0), stats(4, 0.75, 800.0)]
    verdicts = [GateVerdict(c.candidate_id, True, "admissible_above_noise", "") for c in candidates]

    assert choose(verdicts, candidates) == 4
    assert choose(verdicts[:2], candidates) == 5


def test_choose_returns_none_when_nothing_is_admissible() -> None:
    candidates = [stats(1, 0.875)]

    assert choose([GateVerdict(1, False, "cost_too_high", "")], candidates) is None
    assert choose([], []) is None


def test_choose_end_to_end_with_the_regularized_gate() -> None:
    candidates = [
        stats(1, 0.875, 3000.0),  # +3 units, +200% tokens: too costly
        stats(2, 0.75, 1400.0),  # +2 units, +40% tokens: admissible
        stats(3, 0.5, 800.0),  # cost cut inside the band: admissible, lower S
    ]
    verdicts = regularized_gate(CURRENT, candidates, best_score=0.5, delta=EIGHTH, params=PARAMS)

    assert [v.admissible for v in verdicts] == [False, True, True]
    assert choose(verdicts, candidates) == 2


# --- G. Pruning --------------------------------------------------------------------------------

LEDGER = [
    LedgerPoint(round=2, component="skill", dS=-0.1),  # before the window
    LedgerPoint(round=3, component="memory", dS=-0.02),
    LedgerPoint(round=4, component="prompt", dS=-0.05),
    LedgerPoint(round=5, component="prompt", dS=0.0),
    LedgerPoint(round=4, component="config", dS=0.01),
    LedgerPoint(round=5, component="config", dS=-0.03),
]


def test_pruning_targets_components_whose_best_ds_is_not_above_the_threshold() -> None:
    targets = pruning_targets(LEDGER, current_round=5, window=3, threshold=0.0)

    assert targets == ["memory", "prompt"]


def test_pruning_threshold_is_inclusive() -> None:
    assert pruning_targets(LEDGER, current_round=5, window=3, threshold=0.01) == ["config", "memory", "prompt"]
    assert pruning_targets(LEDGER, current_round=5, window=3, threshold=-0.03) == []


def test_pruning_ignores_rounds_outside_the_window() -> None:
    assert pruning_targets(LEDGER, current_round=5, window=2, threshold=0.0) == ["prompt"]
    assert pruning_targets(LEDGER, current_round=5, window=4, threshold=0.0) == ["memory", "prompt", "skill"]


def test_pruning_refuses_entries_from_a_later_round() -> None:
    with pytest.raises(ValueError, match="^ledger entry of round 5 is after the current round 4$"):
        pruning_targets(LEDGER, current_round=4, window=3, threshold=0.0)
