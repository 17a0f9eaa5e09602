"""Parity: does the platform add disagreement beyond what direct runs show among themselves?

Pure computation, no ORM (``evolution.services.parity`` runs the trials). Each
iteration of the protocol gives three runs of the same trials, with the same
seeds: direct A, platform P, direct B. A run maps ``(task, trial index)`` to
the trial's outcome (pass, fail or error).

Two levels are compared. A *trial* disagrees between two runs when its
outcome differs. A *task* disagrees when its outcome counts over its k trials
(passes, fails, errors) differ.

The verdict is a test of exchangeability: if the platform is just one more
direct run, then in a triple (A, P, B) where exactly one run differs from the
other two, that odd one is P with probability 1/3. Let u triples have P as the
odd one and v have A or B; the platform-vs-direct rate minus the direct-vs-
direct rate is exactly (u - v/2) / N, so "the platform disagrees more than the
direct runs do" is "u is larger than a Binomial(u + v, 1/3) draw would be".
The p-value is that binomial's upper tail at u; the verdict fails when it is
below ``alpha / 2`` at either level (Bonferroni over the two levels, so a
platform that behaves like a direct run fails at most ``alpha`` of the time).
Triples where all three differ carry no odd one and are left out of the test
(they still count in the rates).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ALPHA = 0.05
LEVELS = ("trials", "tasks")
OUTCOMES = ("pass", "fail", "error")

TrialKey = tuple[str, int]
RunOutcomes = Mapping[TrialKey, str]


@dataclass(frozen=True)
class Rate:
    disagree: int
    of: int

    @property
    def rate(self) -> float | None:
        return self.disagree / self.of if self.of else None

    def as_dict(self) -> dict[str, Any]:
        return {"disagree": self.disagree, "of": self.of, "rate": self.rate}


@dataclass(frozen=True)
class Level:
    """One level's numbers (trials or tasks), summed over the iterations."""

    direct_vs_direct: Rate
    platform_vs_direct: Rate
    discordant: int  # triples with exactly one odd run
    platform_odd: int  # of those, the ones where the odd run is the platform's
    p_value: float

    def passed(self, alpha: float) -> bool:
        return self.p_value >= alpha / len(LEVELS)

    def as_dict(self) -> dict[str, Any]:
        return {
            "direct_vs_direct": self.direct_vs_direct.as_dict(),
            "platform_vs_direct": self.platform_vs_direct.as_dict(),
            "discordant": self.discordant,
            "platform_odd": self.platform_odd,
            "p_value": self.p_value,
        }


@dataclass(frozen=True)
class ParityReport:
    trials: Level
    tasks: Level
    runs: list[dict[str, Any]]  # per iteration: outcome counts of direct A, platform, direct B
    alpha: float

    @property
    def passed(self) -> bool:
        return self.trials.passed(self.alpha) and self.tasks.passed(self.alpha)

    def as_dict(self) -> dict[str, Any]:
        return {
            "trials": self.trials.as_dict(),
            "tasks": self.tasks.as_dict(),
            "runs": self.runs,
            "alpha": self.alpha,
            "level_alpha": self.alpha / len(LEVELS),
            "verdict": "pass" if self.passed else "fail",
        }


def binomial_upper_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p); 1.0 when k <= 0. Summed in log space
    (the binomial coefficients of a few thousand trials overflow a float)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for j in range(k, n + 1):
        log_term = math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * log_p + (n - j) * log_q
        total += math.exp(log_term)
    return min(1.0, total)


def task_outcomes(run: RunOutcomes) -> dict[str, tuple[int, ...]]:
    """Per task: how many of its trials passed, failed and errored."""
    counts: dict[str, Counter[str]] = {}
    for (task, _index), outcome in run.items():
        counts.setdefault(task, Counter())[outcome] += 1
    return {task: tuple(c[o] for o in OUTCOMES) for task, c in counts.items()}


def outcome_counts(run: RunOutcomes) -> dict[str, int]:
    counts = Counter(run.values())
    return {outcome: counts[outcome] for outcome in OUTCOMES}


def _level(triples: Sequence[tuple[Mapping[Any, Any], Mapping[Any, Any], Mapping[Any, Any]]]) -> Level:
    dd = pd = pd_of = dd_of = discordant = platform_odd = 0
    for a, p, b in triples:
        for key in a:
            x, y, z = a[key], p[key], b[key]
            dd_of += 1
            pd_of += 2
            dd += x != z
            pd += (y != x) + (y != z)
            distinct = len({x, y, z})
            if distinct == 2:
                discordant += 1
                platform_odd += x == z
    return Level(
        direct_vs_direct=Rate(dd, dd_of),
        platform_vs_direct=Rate(pd, pd_of),
        discordant=discordant,
        platform_odd=platform_odd,
        p_value=binomial_upper_tail(discordant, platform_odd, 1 / 3),
    )


def parity_compare(
    iterations: Sequence[tuple[RunOutcomes, RunOutcomes, RunOutcomes]], *, alpha: float = ALPHA
) -> ParityReport:
    """Compare (direct A, platform, direct B) outcomes of each iteration.

    Raises ValueError when the three runs of an iteration do not cover the
    same trials: a missing trial is a broken protocol, not a disagreement.
    """
    if not iterations:
        raise ValueError("parity needs at least one iteration")
    for number, (a, p, b) in enumerate(iterations):
        if set(a) != set(p) or set(a) != set(b):
            raise ValueError(f"iteration {number}: the three runs do not cover the same trials")
        unknown = {o for run in (a, p, b) for o in run.values()} - set(OUTCOMES)
        if unknown:
            raise ValueError(f"iteration {number}: unknown outcomes {sorted(unknown)}")
    return ParityReport(
        trials=_level(iterations),
        tasks=_level([(task_outcomes(a), task_outcomes(p), task_outcomes(b)) for a, p, b in iterations]),
        runs=[
            {"direct_a": outcome_counts(a), "platform": outcome_counts(p), "direct_b": outcome_counts(b)}
            for a, p, b in iterations
        ],
        alpha=alpha,
    )
