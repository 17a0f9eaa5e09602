"""Split assignment (pure) and the rules the experiment service adds."""

from __future__ import annotations

import pytest

from evolution import splits
from evolution.splits import SplitError, assign_by_ratio, assign_explicit

IDS = [f"task-{i:02d}" for i in range(10)]


def test_every_task_lands_in_exactly_one_split() -> None:
    assignment = assign_by_ratio(IDS, seed=1, ratios={"train": 0.4, "gate": 0.3, "sealed": 0.3})
    assert sorted(assignment) == IDS
    counts = {name: list(assignment.values()).count(name) for name in ("train", "gate", "sealed")}
    assert counts == {"train": 4, "gate": 3, "sealed": 3}


def test_assignment_is_deterministic_for_a_seed_and_independent_of_input_order() -> None:
    ratios = {"train": 0.5, "gate": 0.25, "sealed": 0.25}
    first = assign_by_ratio(IDS, seed=42, ratios=ratios)
    again = assign_by_ratio(list(reversed(IDS)), seed=42, ratios=ratios)
    other = assign_by_ratio(IDS, seed=43, ratios=ratios)
    assert first == again
    assert first != other


def test_largest_remainder_rounding_keeps_the_total() -> None:
    assignment = assign_by_ratio(IDS[:7], seed=0, ratios={"train": 1 / 3, "gate": 1 / 3, "sealed": 1 / 3})
    counts = sorted(list(assignment.values()).count(name) for name in ("train", "gate", "sealed"))
    assert counts == [2, 2, 3]
    assert len(assignment) == 7


@pytest.mark.parametrize(
    ("ratios", "message"),
    [
        ({"train": 0.5, "gate": 0.5, "sealed": 0.5}, "add up to 1"),
        ({"train": 1.2, "gate": -0.2}, "must not be negative"),
        ({"train": 0.5, "test": 0.5}, "unknown split name"),
    ],
)
def test_bad_ratios_are_refused(ratios: dict[str, float], message: str) -> None:
    with pytest.raises(SplitError, match=message):
        assign_by_ratio(IDS, seed=0, ratios=ratios)


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(SplitError, match="unique"):
        assign_by_ratio(["a", "a", "b"], seed=0, ratios={"train": 1.0})


def test_explicit_lists_are_used_as_given() -> None:
    assignment = assign_explicit(["a", "b", "c"], {"train": ["a"], "gate": ["b"], "sealed": ["c"]})
    assert assignment == {"a": "train", "b": "gate", "c": "sealed"}


@pytest.mark.parametrize(
    ("lists", "message"),
    [
        ({"train": ["a", "b"], "gate": ["b"], "sealed": ["c"]}, "in both 'train' and 'gate'"),
        ({"train": ["a"], "gate": ["b"]}, "1 task\\(s\\) are in no split: c"),
        ({"train": ["a", "b", "c", "zz"]}, "'zz' in split 'train' is not in the benchmark"),
        ({"holdout": ["a", "b", "c"]}, "unknown split name"),
    ],
)
def test_bad_explicit_lists_are_refused(lists: dict[str, list[str]], message: str) -> None:
    with pytest.raises(SplitError, match=message):
        assign_explicit(["a", "b", "c"], lists)


def test_stratify_by_cuts_every_value_by_the_ratios() -> None:
    ids = [f"t{i:02}" for i in range(30)]
    strata = {task_id: ("rare" if i < 3 else "common") for i, task_id in enumerate(ids)}
    ratios = {"train": 0.4, "gate": 0.3, "sealed": 0.3}

    plain = splits.assign_by_ratio(ids, seed=7, ratios=ratios)
    stratified = splits.assign_by_ratio(ids, seed=7, ratios=ratios, strata=strata)

    assert sorted(stratified) == ids
    assert sorted(stratified[t] for t in ids[:3]) == ["gate", "sealed", "train"]
    assert sorted(stratified.values()).count("train") == 12
    assert stratified == splits.assign_by_ratio(ids, seed=7, ratios=ratios, strata=strata)
    assert splits.concentration_warnings(stratified, strata, attribute="size") == []
    # Without strata some seeds put a value's every task in one split; the warning names it.
    concentrated = {t: "sealed" if t in ids[:3] else split for t, split in plain.items()}
    assert splits.concentration_warnings(concentrated, strata, attribute="size") == [
        "sealed holds all 3 tasks of size rare"
    ]


def test_categorical_attributes_are_repeating_strings() -> None:
    metadata = {f"t{i}": {"kind": "a" if i % 2 else "b", "name": f"n{i}", "long": True, "seed": i} for i in range(6)}
    assert splits.categorical_attributes(metadata) == ["kind"]
