"""evolution.loop.measure, the one place S, cost and the rates are computed: hand-computed cases, no database."""

from __future__ import annotations

import pytest

from evolution.loop.measure import Totals, TrialRow, cost, measure, score, score_sql, totals

ROWS = [
    TrialRow("pass", 1.0, tokens=100),
    TrialRow("fail", 0.5, tokens=300, valid_output=False),
    TrialRow("fail", 0.25, tokens=None, submitted=False),
    # An infrastructure error: never a score, whatever its row holds.
    TrialRow("error", 0.9, tokens=200, valid_output=False, submitted=False),
]


def test_totals_sum_what_the_database_can_sum() -> None:
    t = totals(ROWS)
    assert t == Totals(trials=4, passed=1, score_sum=1.75, tokens_sum=600, tokens_count=3, valid=2, submitted=2)
    assert totals([]) == Totals()
    assert t + Totals(trials=1, passed=1, score_sum=1.0) == Totals(4 + 1, 2, 2.75, 600, 3, 2, 2)


def test_s_honours_the_recipes_metric_and_an_error_counts_zero() -> None:
    t = totals(ROWS)
    assert score(t, "pass_at_1") == pytest.approx(1 / 4)
    # (1.0 + 0.5 + 0.25 + 0) / 4: the error's 0.9 is not a score.
    assert score(t, "mean_score") == pytest.approx(1.75 / 4)
    assert score(Totals(), "pass_at_1") is None
    with pytest.raises(ValueError, match="unknown score metric"):
        score(t, "pass_at_k")


def test_cost_and_rates() -> None:
    t = totals(ROWS)
    assert cost(t) == pytest.approx(600 / 3)  # over the trials that reported tokens
    assert cost(totals([TrialRow("pass", 1.0)])) is None
    measured = measure(t, "pass_at_1")
    assert measured is not None
    assert (measured.valid_rate, measured.no_submission_rate, measured.trials) == (0.5, 0.5, 4)
    assert measure(Totals(), "mean_score") is None


def test_the_sql_form_is_the_same_formula() -> None:
    assert score_sql("pass_at_1", passed="p", score_sum="s", trials="n") == "(p) / (n)"
    assert score_sql("mean_score", passed="p", score_sum="s", trials="n") == "(s) / (n)"
    with pytest.raises(ValueError):
        score_sql("median", passed="p", score_sum="s", trials="n")
