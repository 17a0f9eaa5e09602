"""Inter-annotator agreement on failure labels: Cohen's kappa, pure Python.

Two annotators are compared over the items (trials) both labelled; with
three or more, every pair is compared and the overall figure is the mean of
the pairwise kappas that are defined (Light's kappa). Observed agreement is
reported next to kappa because kappa alone hides how often people agreed.

Kappa is undefined when the chance agreement is 1, i.e. both annotators
used one and the same label for every shared item: there is nothing to
agree on beyond chance. We say so instead of printing 0, 1 or NaN.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any


@dataclass(frozen=True)
class Agreement:
    """Agreement of two annotators over ``n`` shared items.

    ``observed`` is the share of items with the same label, ``expected`` the
    agreement expected by chance from each annotator's label frequencies;
    ``kappa`` = (observed - expected) / (1 - expected). ``kappa`` is None when
    undefined, with the reason in ``why_undefined``.
    """

    n: int
    observed: float | None
    expected: float | None
    kappa: float | None
    why_undefined: str = ""


@dataclass(frozen=True)
class PairAgreement:
    first: Hashable
    second: Hashable
    agreement: Agreement


@dataclass(frozen=True)
class Summary:
    """All pairs that share at least one item, and the overall means."""

    pairs: list[PairAgreement]
    mean_kappa: float | None  # mean over pairs with a defined kappa
    mean_observed: float | None  # mean over pairs with at least one shared item
    pairs_with_kappa: int
    items_shared: int  # items labelled by two or more annotators
    why_undefined: str = ""


def cohen_kappa(pairs: Sequence[tuple[Hashable, Hashable]]) -> Agreement:
    """Cohen's kappa of two annotators; ``pairs`` holds one (label of the
    first, label of the second) tuple per item both labelled."""
    n = len(pairs)
    if n == 0:
        return Agreement(0, None, None, None, "no item was labelled by both annotators")
    observed = sum(1 for a, b in pairs if a == b) / n
    first = Counter(a for a, _ in pairs)
    second = Counter(b for _, b in pairs)
    expected = sum(first[label] * second.get(label, 0) for label in first) / (n * n)
    if len(first) == 1 and first.keys() == second.keys():
        # Chance agreement is 1: kappa's denominator vanishes.
        (only,) = first.keys()
        return Agreement(
            n,
            observed,
            expected,
            None,
            f"both annotators used one label only ({only}) on the {n} shared item(s): kappa is undefined",
        )
    kappa = (observed - expected) / (1.0 - expected)
    return Agreement(n, observed, expected, kappa)


def pairwise_agreement(labels: Mapping[Hashable, Mapping[Hashable, Hashable]]) -> Summary:
    """Agreement of every pair of annotators.

    ``labels`` maps item -> {annotator: label} (one label per annotator and
    item). Pairs are ordered by annotator (sorted by their ``str``); pairs
    that share no item are left out.
    """
    shared: dict[tuple[Hashable, Hashable], list[tuple[Hashable, Hashable]]] = {}
    items_shared = 0
    for by_annotator in labels.values():
        annotators = sorted(by_annotator, key=str)
        if len(annotators) >= 2:
            items_shared += 1
        for first, second in combinations(annotators, 2):
            shared.setdefault((first, second), []).append((by_annotator[first], by_annotator[second]))
    pairs = [
        PairAgreement(first, second, cohen_kappa(values))
        for (first, second), values in sorted(shared.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))
    ]
    kappas = [p.agreement.kappa for p in pairs if p.agreement.kappa is not None]
    observed = [p.agreement.observed for p in pairs if p.agreement.observed is not None]
    why = ""
    if not pairs:
        why = "no trial was labelled by two or more annotators"
    elif not kappas:
        why = "kappa is undefined for every pair (each used one label only)"
    return Summary(
        pairs=pairs,
        mean_kappa=_mean(kappas),
        mean_observed=_mean(observed),
        pairs_with_kappa=len(kappas),
        items_shared=items_shared,
        why_undefined=why,
    )


def labels_by_item(rows: Iterable[tuple[Hashable, Hashable, Hashable]]) -> dict[Hashable, dict[Hashable, Hashable]]:
    """(item, annotator, label) rows -> {item: {annotator: label}}."""
    table: dict[Hashable, dict[Hashable, Hashable]] = {}
    for item, annotator, label in rows:
        table.setdefault(item, {})[annotator] = label
    return table


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class NumericAgreement:
    """Agreement on a numeric score over the items scored by two or more annotators.

    ``alpha`` is Krippendorff's alpha with the interval metric (squared differences), 1 - D_o / D_e over every
    annotator (missing values allowed); ``mean_abs_difference`` the mean over items and pairs of annotators of
    |a - b|, in the score's own unit. ``alpha`` is None when undefined, with the reason in ``why_undefined``.
    """

    items: int
    values: int  # pairable values: those of items with two or more
    alpha: float | None
    mean_abs_difference: float | None
    why_undefined: str = ""


def krippendorff_interval(values: Mapping[Any, Mapping[Any, float]]) -> NumericAgreement:
    """Krippendorff's alpha (interval metric) of ``values``: item -> {annotator: value}.

    Only items with two or more values are pairable. Observed disagreement D_o is the mean, per pairable value,
    of its squared differences to the other values of its item (each item's pairs weighted 1 / (m - 1));
    expected disagreement D_e is the mean squared difference of all pairs of pairable values. Krippendorff,
    "Computing Krippendorff's alpha-reliability" (2011).
    """
    units = [list(by.values()) for by in values.values() if len(by) >= 2]
    pooled = [v for unit in units for v in unit]
    n = len(pooled)
    differences = [abs(a - b) for unit in units for a, b in combinations(unit, 2)]
    mad = _mean(differences)
    if not units:
        return NumericAgreement(0, 0, None, None, "no item was scored by two or more annotators")
    observed = sum(sum((a - b) ** 2 for a, b in combinations(unit, 2)) * 2 / (len(unit) - 1) for unit in units) / n
    # The sum over ordered pairs of (a - b)^2 is 2 n times the sum of squared deviations from the mean.
    mean = sum(pooled) / n
    expected = 2 * sum((v - mean) ** 2 for v in pooled) / (n - 1)
    if expected == 0:
        (only,) = set(pooled)
        return NumericAgreement(
            len(units), n, None, mad, f"every score given was {only:g}: there is no variation, alpha is undefined"
        )
    return NumericAgreement(len(units), n, 1.0 - observed / expected, mad)
