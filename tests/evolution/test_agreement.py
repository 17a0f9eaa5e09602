"""Unit tests for evolution.agreement: Cohen's kappa by hand, no database."""

from __future__ import annotations

import pytest

from evolution.agreement import cohen_kappa, krippendorff_interval, labels_by_item, pairwise_agreement


def _table(a: int, b: int, c: int, d: int) -> list[tuple[str, str]]:
    """A 2x2 table as pairs: a yes/yes, b yes/no, c no/yes, d no/no."""
    return [("yes", "yes")] * a + [("yes", "no")] * b + [("no", "yes")] * c + [("no", "no")] * d


def test_kappa_of_the_wikipedia_example_is_0_4() -> None:
    # 50 items: observed 35/50 = 0.7; chance 0.5*0.6 + 0.5*0.4 = 0.5.
    result = cohen_kappa(_table(20, 5, 10, 15))
    assert result.n == 50
    assert result.observed == pytest.approx(0.7)
    assert result.expected == pytest.approx(0.5)
    assert result.kappa == pytest.approx(0.4)
    assert result.why_undefined == ""


@pytest.mark.parametrize(
    ("cells", "observed", "expected", "kappa"),
    [
        # Same observed agreement (0.6), different marginals, different kappa.
        ((45, 15, 25, 15), 0.6, 0.54, 0.06 / 0.46),
        ((25, 35, 5, 35), 0.6, 0.46, 0.14 / 0.54),
    ],
)
def test_kappa_depends_on_the_marginals(
    cells: tuple[int, int, int, int], observed: float, expected: float, kappa: float
) -> None:
    result = cohen_kappa(_table(*cells))
    assert result.observed == pytest.approx(observed)
    assert result.expected == pytest.approx(expected)
    assert result.kappa == pytest.approx(kappa)


def test_kappa_with_three_labels() -> None:
    # first: a4 b3 c1; second: a3 b3 c2; observed 6/8; chance 23/64 -> kappa 25/41.
    pairs = [("a", "a")] * 3 + [("b", "b")] * 2 + [("c", "c"), ("a", "b"), ("b", "c")]
    result = cohen_kappa(pairs)
    assert result.observed == pytest.approx(0.75)
    assert result.expected == pytest.approx(23 / 64)
    assert result.kappa == pytest.approx(25 / 41)


def test_perfect_and_opposite_agreement() -> None:
    assert cohen_kappa([("a", "a"), ("b", "b")]).kappa == pytest.approx(1.0)
    assert cohen_kappa([("a", "b"), ("b", "a")]).kappa == pytest.approx(-1.0)


def test_kappa_is_undefined_when_both_used_one_label_only() -> None:
    result = cohen_kappa([("tool-misuse", "tool-misuse")] * 4)
    assert result.kappa is None
    assert result.observed == pytest.approx(1.0)
    assert result.expected == pytest.approx(1.0)
    assert "one label only (tool-misuse)" in result.why_undefined
    assert "undefined" in result.why_undefined


def test_kappa_is_zero_when_one_annotator_used_one_label_and_the_other_varied() -> None:
    result = cohen_kappa([("a", "a"), ("a", "b"), ("a", "a"), ("a", "b")])
    assert result.kappa == pytest.approx(0.0)
    assert result.observed == pytest.approx(0.5)


def test_no_shared_item_gives_no_numbers() -> None:
    result = cohen_kappa([])
    assert (result.n, result.observed, result.expected, result.kappa) == (0, None, None, None)
    assert "no item" in result.why_undefined


def test_pairwise_agreement_of_three_annotators_is_the_mean_of_pairs() -> None:
    rows = [
        # item, annotator, label
        (1, "ann", "x"),
        (1, "bob", "x"),
        (1, "cat", "y"),
        (2, "ann", "y"),
        (2, "bob", "y"),
        (2, "cat", "y"),
        (3, "ann", "x"),
        (3, "bob", "y"),
        (4, "ann", "x"),  # labelled by one person only: not shared
    ]
    summary = pairwise_agreement(labels_by_item(rows))
    by_pair = {(p.first, p.second): p.agreement for p in summary.pairs}
    assert list(by_pair) == [("ann", "bob"), ("ann", "cat"), ("bob", "cat")]
    # ann/bob over items 1,2,3: (x,x) (y,y) (x,y): observed 2/3; ann x2 y1, bob x1 y2 -> chance 4/9.
    assert by_pair["ann", "bob"].n == 3
    assert by_pair["ann", "bob"].kappa == pytest.approx((2 / 3 - 4 / 9) / (1 - 4 / 9))  # 0.4
    # ann/cat over items 1,2: (x,y) (y,y): observed 1/2; chance (1*0 + 1*2)/4 = 1/2 -> kappa 0.
    assert by_pair["ann", "cat"].kappa == pytest.approx(0.0)
    # bob/cat over items 1,2: (x,y) (y,y): same as ann/cat.
    assert by_pair["bob", "cat"].kappa == pytest.approx(0.0)
    assert summary.pairs_with_kappa == 3
    assert summary.mean_kappa == pytest.approx(0.4 / 3)
    assert summary.mean_observed == pytest.approx((2 / 3 + 0.5 + 0.5) / 3)
    assert summary.items_shared == 3


def test_the_mean_skips_pairs_whose_kappa_is_undefined() -> None:
    rows = [(1, "ann", "x"), (1, "bob", "x"), (2, "ann", "x"), (2, "bob", "x"), (1, "cat", "y"), (3, "cat", "y")]
    rows += [(3, "ann", "y")]
    summary = pairwise_agreement(labels_by_item(rows))
    by_pair = {(p.first, p.second): p.agreement for p in summary.pairs}
    assert by_pair["ann", "bob"].kappa is None  # both said x on both shared items
    assert by_pair["ann", "cat"].kappa == pytest.approx(0.0)  # (x,y) (y,y)
    assert by_pair["bob", "cat"].kappa == pytest.approx(0.0)  # (x,y): no agreement, none expected
    assert summary.pairs_with_kappa == 2
    # Counting the undefined pair as 1 (or 0) would move the mean; it is left out.
    assert summary.mean_kappa == pytest.approx(0.0)
    assert summary.mean_observed == pytest.approx((1.0 + 0.5 + 0.0) / 3)


def test_nothing_shared_says_why() -> None:
    summary = pairwise_agreement(labels_by_item([(1, "ann", "x"), (2, "bob", "y")]))
    assert summary.pairs == []
    assert summary.mean_kappa is None
    assert summary.items_shared == 0
    assert "two or more annotators" in summary.why_undefined


def test_every_pair_undefined_says_why() -> None:
    summary = pairwise_agreement(labels_by_item([(1, "ann", "x"), (1, "bob", "x")]))
    assert summary.mean_kappa is None
    assert summary.mean_observed == pytest.approx(1.0)
    assert "undefined for every pair" in summary.why_undefined


def test_krippendorff_interval_alpha_of_the_papers_example_is_0_849() -> None:
    # Krippendorff, "Computing Krippendorff's alpha-reliability" (2011), section C: four observers, twelve units,
    # missing values; the paper gives alpha = 0.849 for the interval metric (0.743 nominal).
    rows = {
        "A": [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        "B": [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        "C": [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        "D": [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    }
    values: dict[int, dict[str, float]] = {}
    for observer, row in rows.items():
        for unit, value in enumerate(row):
            if value is not None:
                values.setdefault(unit, {})[observer] = float(value)
    result = krippendorff_interval(values)
    assert result.items == 11  # unit 12 has one value only: not pairable
    assert result.values == 40
    assert result.alpha == pytest.approx(0.849, abs=5e-4)


def test_krippendorff_interval_of_two_annotators_by_hand() -> None:
    # Values 5/4, 1/2, 4/3: each unit disagrees by 1, so D_o = 6 * 1 / 6 = 1; the six values' squared deviations
    # from their mean sum to 65/6, so D_e = 2 * 65/6 / 5 = 13/3 and alpha = 1 - 3/13.
    result = krippendorff_interval(
        {1: {"ann": 5.0, "bob": 4.0}, 2: {"ann": 1.0, "bob": 2.0}, 3: {"ann": 4.0, "bob": 3.0}}
    )
    assert result.alpha == pytest.approx(1 - 3 / 13)
    assert result.mean_abs_difference == pytest.approx(1.0)
    perfect = krippendorff_interval({1: {"ann": 5.0, "bob": 5.0}, 2: {"ann": 1.0, "bob": 1.0}})
    assert perfect.alpha == pytest.approx(1.0) and perfect.mean_abs_difference == 0.0


def test_krippendorff_interval_undefined_says_why() -> None:
    assert krippendorff_interval({1: {"ann": 3.0}}).why_undefined == "no item was scored by two or more annotators"
    same = krippendorff_interval({1: {"ann": 3.0, "bob": 3.0}, 2: {"ann": 3.0, "bob": 3.0}})
    assert same.alpha is None and same.mean_abs_difference == 0.0
    assert same.why_undefined == "every score given was 3: there is no variation, alpha is undefined"
