"""evolution.loop.measure, the one place S, cost and the rates are computed: hand-computed cases, no database."""

from __future__ import annotations

import random

import pytest

from evolution.loop.measure import (
    DeltaEstimate,
    Totals,
    TrialRow,
    _quantile,
    cost,
    measure,
    paired_delta,
    score,
    score_sql,
    totals,
)

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


# --- The paired bootstrap: as fast as it can be, and the same numbers as before ------------------------------


def _bootstrap_before(
    base: dict[str, list[TrialRow]], new: dict[str, list[TrialRow]], metric: str, *, seed: int, resamples: int
) -> DeltaEstimate | None:
    """``paired_delta`` as it was written first (commit b80f1a5): rows drawn with ``Random.choices`` and summed
    into ``Totals``, S by ``score``. The faster one must give these numbers to the last bit."""
    s_base = score(totals(row for rows in base.values() for row in rows), metric)
    s_new = score(totals(row for rows in new.values() for row in rows), metric)
    if s_base is None or s_new is None:
        return None
    shared = sorted(task for task in base.keys() & new.keys() if base[task] and new[task])
    if len(shared) < 5:
        return DeltaEstimate(s_new - s_base, None, None, len(shared), metric, 0.95)
    rng = random.Random(seed)
    differences = []
    for _ in range(resamples):
        drawn_base = Totals()
        drawn_new = Totals()
        for task in rng.choices(shared, k=len(shared)):
            drawn_base += totals(rng.choices(base[task], k=len(base[task])))
            drawn_new += totals(rng.choices(new[task], k=len(new[task])))
        differences.append((score(drawn_new, metric) or 0.0) - (score(drawn_base, metric) or 0.0))
    differences.sort()
    tail = (1.0 - 0.95) / 2.0
    return DeltaEstimate(
        s_new - s_base, _quantile(differences, tail), _quantile(differences, 1.0 - tail), len(shared), metric, 0.95
    )


def _rows(draw: random.Random, tasks: int, most: int) -> dict[str, list[TrialRow]]:
    return {
        f"t{i:02d}": [
            TrialRow(
                draw.choice(["pass", "fail", "error"]), draw.choice([None, 0.0, 1, draw.random()]), draw.randint(1, 900)
            )
            for _ in range(draw.randint(1, most))
        ]
        for i in range(tasks)
        if draw.random() < 0.9  # a task measured on one side only is not paired
    }


@pytest.mark.parametrize("metric", ["pass_at_1", "mean_score"])
def test_the_bootstrap_gives_the_same_numbers_as_before_for_the_same_seed(metric: str) -> None:
    draw = random.Random(2026)
    for _ in range(40):
        base, new = _rows(draw, draw.randint(3, 25), 4), _rows(draw, draw.randint(3, 25), 4)
        seed = draw.randrange(10**6)
        assert paired_delta(base, new, metric, seed=seed, resamples=200) == _bootstrap_before(
            base, new, metric, seed=seed, resamples=200
        )


def test_the_bootstrap_of_fixed_trials_is_pinned() -> None:
    """Printed by the first implementation (b80f1a5) for these rows and seed 17: a change of the draws or of the
    order of the sums fails here."""
    base = {
        f"t{i}": [TrialRow("pass" if (i * 7 + j) % 3 else "fail", ((i + j) % 5) / 4, 100 + i) for j in range(2)]
        for i in range(8)
    }
    new = {
        f"t{i}": [
            TrialRow("pass" if (i * 5 + j) % 4 else ("error" if j else "fail"), ((i * 3 + j) % 7) / 6, 90 + j)
            for j in range(1 + i % 3)
        ]
        for i in range(1, 9)
    }
    assert paired_delta(base, new, "pass_at_1", seed=17) == DeltaEstimate(
        0.07720588235294112, -0.33333333333333337, 0.4891483516483509, 7, "pass_at_1", 0.95
    )
    assert paired_delta(base, new, "mean_score", seed=17) == DeltaEstimate(
        0.01746323529411775, -0.38368957431457423, 0.26374007936507937, 7, "mean_score", 0.95
    )
