"""The regularization math of docs/concepts.md, section 4: edit budget, stall
detection, noise band, the admissibility gate, the final choice and pruning.

Pure functions and frozen dataclasses, no ORM: every function depends only on
its arguments, so it is safe to call again on the same input (a resumed loop
recomputes the same decision).

Conventions shared by every function here:

- The score S is a fraction in [0, 1] (pass@1 or mean rubric score on the
  evolve set), never "points". ``delta`` (the noise band) and every dS are in
  the same unit. Explanations print them as points (x 100) for people.
- The cost C is mean policy tokens per trial; dC is the relative change
  ``(C_new - C_current) / C_current`` (``metrics.relative_cost_change``), so
  0.25 means 25% more tokens. A rise from a cost of 0 has no finite relative
  change and is treated as +infinity (it never passes a cost rule). In the
  JSON-bound ``numbers`` of a verdict an infinite value is written as None.
- c1 is "allowed relative cost increase per unit of dS", and the unit is
  explicit: ``GateParams.score_unit`` is the size of one unit in S. For the
  published coding setting (25% more tokens per extra passing trial) the unit
  is one trial of the evolve set, i.e. ``score_unit = 1 / evolve_trials``, so
  ``dS / score_unit`` is the number of extra passing trials. See
  ``score_unit_size``.
- Comparisons at a threshold allow float noise of ``EPSILON``: scores and
  rates are ratios of counts (at most ~10^5 trials, so one trial is >= 1e-5),
  and ``0.90 - 0.87 > 0.03`` must not reject a drop of exactly 3 points.
  "Exactly at the threshold" is therefore always on the permissive side.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolution.metrics import relative_cost_change
from evolution.surfaces import COMPONENT_KINDS, STRUCTURAL_KINDS

__all__ = [
    "EPSILON",
    "GATE_RULES",
    "NOISE_RULES",
    "SCORE_UNITS",
    "STRUCTURAL_KINDS",
    "CandidateStats",
    "GateParams",
    "GateVerdict",
    "LedgerPoint",
    "NoiseEstimate",
    "choose",
    "edit_budget",
    "is_stalled",
    "new_structural_kinds",
    "noise_delta",
    "noise_estimate",
    "pruning_targets",
    "regularized_gate",
    "score_unit_size",
    "unexplored_kinds",
    "unregularized_gate",
]

EPSILON = 1e-9

NOISE_RULES: tuple[str, ...] = ("bootstrap", "range", "std", "fixed")
BOOTSTRAP_DRAWS = 1000
SCORE_UNITS: tuple[str, ...] = ("trial", "criterion", "point", "fraction")

GATE_RULES: tuple[str, ...] = (
    # Regularized gate, in the order the checks run.
    "floor",
    "guard_valid_output",
    "guard_no_submission",
    "admissible_above_noise",
    "cost_too_high",
    "inside_noise_gain",
    "inside_noise_no_gain",
    "noise_unknown",  # delta could not be estimated: nothing is accepted on the inside-noise rule
    "below_current",
    "passes_floor",  # admissibility (F) switched off, floor (E) on
    "unfiltered",  # both E and F switched off
    # Unregularized gate.
    "unregularized_beats_best",
    "unregularized_not_better",
)

CandidateId = int | str


# --- A. Edit budget ---------------------------------------------------------------


def edit_budget(t: int, *, k_max: int, k_min: int, T: int) -> int:
    """Edit budget of round ``t`` (0-based): cosine decay from k_max to k_min over T rounds.

    ``k_t = ceil(k_min + (k_max - k_min) * (1 + cos(pi * t / T)) / 2)``. A value
    within ``EPSILON`` of an integer is that integer, so float noise in the
    cosine cannot round an exact value up. From ``t >= T`` on the budget stays
    at k_min (the cosine would rise again after T).

    Raises ``ValueError`` when ``t < 0``, ``k_min < 1``, ``k_max < k_min`` or
    ``T < 1``.
    """
    if t < 0:
        raise ValueError(f"round t must be >= 0, got {t}")
    if k_min < 1:
        raise ValueError(f"k_min must be >= 1, got {k_min}")
    if k_max < k_min:
        raise ValueError(f"k_max ({k_max}) must be >= k_min ({k_min})")
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if t >= T:
        return k_min
    value = k_min + (k_max - k_min) * (1 + math.cos(math.pi * t / T)) / 2
    nearest = round(value)
    if abs(value - nearest) <= EPSILON:
        return int(nearest)
    return math.ceil(value)


# --- C. Stall exploration ---------------------------------------------------------


def is_stalled(best_by_round: Sequence[float], *, w: int, delta: float) -> bool:
    """Whether the run is stalled now.

    ``best_by_round[i]`` is the best score S_best after round i, oldest
    first; index 0 may be the seed before any round. The run is stalled when
    the best score now has not risen by more than ``delta`` over the last
    ``w`` rounds: ``best_by_round[-1] - best_by_round[-1 - w] <= delta``.
    While fewer than ``w + 1`` values exist the run is not stalled (there is
    no value from w rounds ago to compare with).

    Raises ``ValueError`` when ``w < 1`` or ``delta`` is negative or NaN.
    """
    if w < 1:
        raise ValueError(f"w must be >= 1, got {w}")
    _check_delta(delta)
    if len(best_by_round) < w + 1:
        return False
    rise = best_by_round[-1] - best_by_round[-1 - w]
    return rise <= delta + EPSILON


def unexplored_kinds(measured_kinds: Iterable[str], reachable: Iterable[str] | None = None) -> list[str]:
    """Component kinds never edited and measured, in vocabulary order: what
    the m_draft stall candidates must touch. Only kinds in ``reachable`` (the
    kinds the surface lets the proposer reach, ``surfaces.reachable_kinds``)
    count: a kind with no path on the surface cannot be explored. None: every
    kind of the vocabulary."""
    measured = set(measured_kinds)
    allowed = set(COMPONENT_KINDS) if reachable is None else set(reachable)
    return [kind for kind in COMPONENT_KINDS if kind not in measured and kind in allowed]


# --- E. Noise band ------------------------------------------------------------------


def noise_delta(scores: Sequence[float], *, rule: str, fixed: float | None = None) -> float:
    """The noise band delta from repeated evaluations of the unchanged seed.

    ``rule`` is ``range`` (max - min of the scores), ``std`` (sample standard
    deviation) or ``fixed`` (return ``fixed``, the scores are not used).
    ``range`` and ``std`` need at least two scores: one evaluation says
    nothing about the spread.

    Raises ``ValueError`` on an unknown rule, too few scores, a missing or
    negative ``fixed`` value, or a ``fixed`` value given with another rule.
    """
    if rule not in NOISE_RULES:
        raise ValueError(f"unknown noise rule {rule!r} (expected one of {', '.join(NOISE_RULES)})")
    if rule == "fixed":
        if fixed is None:
            raise ValueError("the fixed noise rule needs a value")
        _check_delta(fixed)
        return float(fixed)
    if fixed is not None:
        raise ValueError(f"a fixed value is only used with the fixed rule, not {rule!r}")
    if len(scores) < 2:
        raise ValueError(f"the {rule} rule needs at least 2 scores, got {len(scores)}")
    if rule == "range":
        return max(scores) - min(scores)
    return statistics.stdev(scores)


@dataclass(frozen=True)
class NoiseEstimate:
    """The noise band as measured: ``delta`` None when it could not be estimated (``note`` says why), else
    the band and one sentence on what it rests on."""

    delta: float | None
    rule: str
    evaluations: int
    trials_per_task: int
    note: str


def noise_estimate(
    repeats: Sequence[Mapping[str, Sequence[float]]],
    *,
    rule: str,
    fixed: float | None = None,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
    k: int | None = None,
) -> NoiseEstimate:
    """Estimate delta from the seed's repeated evaluations: ``repeats`` holds, per evaluation, each task's
    trial values (1 or 0 for pass@1, the rubric score for mean_score; an error trial counts 0, as in S).

    ``bootstrap`` (the default rule, docs/loop.md says why): the expected range of S over as many
    evaluations as were made, each drawn task by task from the task's pooled trials (every repeat's, with
    replacement): ``k`` trials per task, the k the gate's evaluations run (None: as many as each repeat
    ran). It uses every trial, not only each evaluation's S,
    so two evaluations whose S happen to agree still show the spread their trials had; it is 0 only when
    every task gave the same value in every trial. ``range`` and ``std`` use the evaluations' S alone;
    two evaluations that agree exactly say nothing about the spread, so that gives no estimate (None)
    rather than a band of 0. ``fixed`` returns ``fixed``. Deterministic for a given ``seed``.
    """
    if rule not in NOISE_RULES:
        raise ValueError(f"unknown noise rule {rule!r} (expected one of {', '.join(NOISE_RULES)})")
    per_task = min((len(values) for repeat in repeats for values in repeat.values()), default=0)
    pooled = _pool(repeats)
    trials_per_task = min((len(values) for values in pooled.values()), default=0)
    if rule == "fixed":
        return NoiseEstimate(noise_delta([], rule=rule, fixed=fixed), rule, len(repeats), trials_per_task, "fixed")
    if fixed is not None:
        raise ValueError(f"a fixed value is only used with the fixed rule, not {rule!r}")
    scores = [_mean([v for values in repeat.values() for v in values]) for repeat in repeats if repeat]
    if len(scores) < 2 or per_task < 1:
        return NoiseEstimate(
            None, rule, len(scores), trials_per_task, f"{len(scores)} evaluation(s) of the seed: at least 2 are needed"
        )
    if rule == "bootstrap":
        counts = [dict.fromkeys(pooled, k) if k else _trial_counts(r) for r in repeats]
        delta = _bootstrap_range(pooled, counts, draws=draws, seed=seed)
        size = f" of k={k}" if k else ""
        note = (
            f"expected range of S over {len(scores)} evaluations{size}, {draws} bootstrap draws from "
            f"{trials_per_task} pooled trials per task"
        )
        return NoiseEstimate(delta, rule, len(scores), trials_per_task, note)
    if len(scores) == 2 and scores[0] == scores[1]:
        return NoiseEstimate(
            None,
            rule,
            2,
            trials_per_task,
            f"the 2 evaluations of the seed gave the same S ({scores[0]:.3f}): their {rule} says nothing about "
            "the spread (use 3 or more repeats, or the bootstrap rule)",
        )
    return NoiseEstimate(
        noise_delta(scores, rule=rule),
        rule,
        len(scores),
        trials_per_task,
        f"{rule} of S over {len(scores)} evaluations",
    )


def _pool(repeats: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    pooled: dict[str, list[float]] = {}
    for repeat in repeats:
        for task, values in repeat.items():
            pooled.setdefault(task, []).extend(float(v) for v in values)
    return pooled


def _trial_counts(repeat: Mapping[str, Sequence[float]]) -> dict[str, int]:
    return {task: len(values) for task, values in repeat.items()}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _bootstrap_range(
    pooled: Mapping[str, Sequence[float]], counts: Sequence[Mapping[str, int]], *, draws: int, seed: int
) -> float:
    """Mean over ``draws`` of (max S - min S) among ``len(counts)`` simulated evaluations; an evaluation
    draws ``counts[r][task]`` trials of each task from the task's pooled values. S is the share of the
    drawn values (the S of measure.score: every task has its trials, S sums them)."""
    rng = random.Random(seed)
    tasks = sorted(pooled)
    total = 0.0
    for _ in range(draws):
        scores = []
        for count in counts:
            drawn, n = 0.0, 0
            for task in tasks:
                k = count.get(task, 0)
                if k:
                    drawn += sum(rng.choices(pooled[task], k=k))
                    n += k
            scores.append(drawn / n if n else 0.0)
        total += max(scores) - min(scores)
    return total / draws


def _check_delta(delta: float) -> None:
    if not (delta >= 0 and math.isfinite(delta)):  # also rejects NaN
        raise ValueError(f"delta must be a finite number >= 0, got {delta!r}")


# --- F. Admissibility ----------------------------------------------------------------


def score_unit_size(
    unit: str,
    size: float = 1.0,
    *,
    evolve_trials: int | None = None,
    evolve_criteria: int | None = None,
) -> float:
    """Size in S of one unit of dS, for ``GateParams.score_unit``.

    - ``trial``: ``size`` trials of the evolve set, ``size / evolve_trials``.
      With S = pass@1, dS / unit is the number of extra passing trials
      (published coding: c1 = 0.25 per 1 trial; design: c1 = 0.10 per 1).
    - ``criterion``: ``size`` criterion judgments, ``size / evolve_criteria``
      where ``evolve_criteria`` counts all criterion judgments of the evolve
      set (published workspace domain: c1 = 0.25 per 100 criteria of about
      14,100). Exact when every trial is graded on the same number of
      criteria, a close approximation otherwise.
    - ``point``: ``size`` points of S, ``size * 0.01``.
    - ``fraction``: ``size`` in S itself.

    Raises ``ValueError`` on an unknown unit, a size that is not positive, or
    a missing or non-positive count for ``trial`` / ``criterion``.
    """
    if not (size > 0 and math.isfinite(size)):
        raise ValueError(f"unit size must be a finite number > 0, got {size!r}")
    if unit == "trial":
        return size / _positive_count(evolve_trials, "evolve_trials")
    if unit == "criterion":
        return size / _positive_count(evolve_criteria, "evolve_criteria")
    if unit == "point":
        return size * 0.01
    if unit == "fraction":
        return float(size)
    raise ValueError(f"unknown score unit {unit!r} (expected one of {', '.join(SCORE_UNITS)})")


def _positive_count(count: int | None, name: str) -> int:
    if count is None or count < 1:
        raise ValueError(f"{name} must be a positive count, got {count!r}")
    return count


@dataclass(frozen=True)
class CandidateStats:
    """What the gate knows of one harness on the evolve set.

    ``score`` is S in [0, 1]; ``cost`` is C, mean policy tokens per trial;
    ``valid_rate`` and ``no_submission_rate`` are shares of trials in [0, 1];
    ``components`` are the component kinds the candidate's edits touch (empty
    for the current harness, whose edits are already accepted).
    ``floor_score`` is S on the floor's splits when the recipe puts the floor
    on the gate split alone (``noise.floor: gate``); None otherwise.

    Raises ``ValueError`` on values out of range or an unknown component kind.
    """

    candidate_id: CandidateId
    score: float
    cost: float
    valid_rate: float = 1.0
    no_submission_rate: float = 0.0
    components: frozenset[str] = frozenset()
    floor_score: float | None = None

    def __post_init__(self) -> None:
        for name in ("score", "valid_rate", "no_submission_rate", "floor_score"):
            value = getattr(self, name)
            if value is None and name == "floor_score":
                continue
            if not 0.0 <= value <= 1.0:  # also true for NaN
                raise ValueError(f"{name} of candidate {self.candidate_id!r} must be in [0, 1], got {value!r}")
        if not (self.cost >= 0 and math.isfinite(self.cost)):
            raise ValueError(f"cost of candidate {self.candidate_id!r} must be a finite number >= 0")
        unknown = sorted(set(self.components) - set(COMPONENT_KINDS))
        if unknown:
            raise ValueError(f"unknown component kind(s) of candidate {self.candidate_id!r}: {', '.join(unknown)}")


@dataclass(frozen=True)
class GateParams:
    """Parameters of the regularized gate (switches E and F of a recipe).

    ``score_unit``: size in S of one unit of dS for the cost rule (see
    ``score_unit_size``); it has no default because a wrong unit silently
    changes the cost allowance by orders of magnitude.
    ``noise_band`` (E): the floor and the noise band; when off, the band is 0
    and there is no floor. ``admissibility`` (F): the cost rule, the
    inside-noise objective and the domain guards; when off, every candidate
    that passes the floor is admissible. A guard threshold of None switches
    that guard off. Defaults are the published coding settings where there
    is one (c1, lambda_S, guards) and our choice otherwise (see docs/recipes.md).
    """

    score_unit: float
    noise_band: bool = True
    admissibility: bool = True
    c0: float = 0.0
    c1: float = 0.25
    lambda_S: float = 0.0  # names as in docs/concepts.md
    lambda_C: float = 1.0
    lambda_N: float = 0.25
    valid_output_drop: float | None = 0.03
    no_submission_rise: float | None = 0.02

    def __post_init__(self) -> None:
        if not (self.score_unit > 0 and math.isfinite(self.score_unit)):
            raise ValueError(f"score_unit must be a finite number > 0, got {self.score_unit!r}")
        if not math.isfinite(self.c0):
            raise ValueError(f"c0 must be a finite number, got {self.c0!r}")
        for name in ("c1", "lambda_S", "lambda_C", "lambda_N", "valid_output_drop", "no_submission_rise"):
            value = getattr(self, name)
            if value is None and name in ("valid_output_drop", "no_submission_rise"):
                continue
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class GateVerdict:
    """The gate's decision on one candidate.

    ``rule`` is a short machine name from ``GATE_RULES``; ``explanation`` one
    sentence with the numbers; ``numbers`` the values the rule used (JSON
    safe: finite floats, ints, lists of strings or None).
    """

    candidate_id: CandidateId
    admissible: bool
    rule: str
    explanation: str
    numbers: dict[str, Any] = field(default_factory=dict)


def new_structural_kinds(components: Iterable[str], accepted_structural_kinds: Iterable[str]) -> list[str]:
    """Structural kinds among ``components`` (the kinds the candidate's edits
    touch) that the candidate introduces for the first time: kinds no accepted
    harness has had (``accepted_structural_kinds``: the kinds present in the
    seed and every accepted harness, and those accepted edits added), sorted.
    Its length is N_new (docs/concepts.md, rule F): editing a memory file
    when an accepted harness already has memory earns nothing."""
    return sorted((set(components) & STRUCTURAL_KINDS) - set(accepted_structural_kinds))


def regularized_gate(
    current: CandidateStats,
    candidates: Sequence[CandidateStats],
    *,
    best_score: float,
    delta: float | None,
    params: GateParams,
    accepted_structural_kinds: Iterable[str] = frozenset(),
    best_floor_score: float | None = None,
) -> list[GateVerdict]:
    """Verdicts of the regularized gate (docs/concepts.md, rules E and F), one
    per candidate in input order.

    The floor compares S on the evolve splits with S_best (the seed text). With ``best_floor_score``
    (``noise.floor: gate``, RSIHub's choice) it compares each candidate's ``floor_score``, S on the gate
    split alone, with the best gate score of an accepted harness instead.

    ``current`` is the harness the candidates are compared with; ``best_score``
    is S_best, the best score of an accepted harness so far; ``delta`` the
    estimated noise band; ``accepted_structural_kinds`` the structural kinds
    some accepted harness has had so far, the seed's included (novelty is
    counted against them: N_new counts only kinds introduced for the first time). With
    dS = S - S_current and dC the relative cost change, checks run in order
    and the first that decides gives the rule:

    1. (E) floor: rejected when S < S_best - delta ("floor").
    2. (F) guards: rejected when the valid-output rate falls by more than
       ``valid_output_drop`` or the no-submission rate rises by more than
       ``no_submission_rise`` compared with ``current``.
    3. (F) dS > delta: admissible iff dC <= c0 + c1 * dS / score_unit
       ("admissible_above_noise" / "cost_too_high").
    4. (F) |dS| <= delta: admissible iff
       lambda_S * dS - lambda_C * dC + lambda_N * N_new > 0
       ("inside_noise_gain" / "inside_noise_no_gain"); dS is in S here, as
       is delta.
    5. (F) dS < -delta: rejected ("below_current"); reachable only when the
       floor is off or S_current < S_best.

    With ``params.noise_band`` off the effective delta is 0 and step 1 is
    skipped; with ``params.admissibility`` off steps 2-5 are skipped and a
    candidate past step 1 is admissible ("passes_floor", or "unfiltered" when
    E is off too).

    ``delta`` None means the band could not be estimated (``noise_estimate``): the floor and the band are
    then 0, and a candidate that would be accepted inside the band is rejected ("noise_unknown"), since
    nobody measured how large the band is; a candidate must beat the current harness to be accepted.

    Raises ``ValueError`` on a negative delta, a non-finite best score or
    duplicate candidate ids.
    """
    if delta is not None:
        _check_delta(delta)
    if not math.isfinite(best_score):
        raise ValueError(f"best_score must be finite, got {best_score!r}")
    _check_unique(candidates)
    accepted = frozenset(accepted_structural_kinds)
    band = (delta or 0.0) if params.noise_band else 0.0
    if best_floor_score is not None:
        missing = [c.candidate_id for c in candidates if c.floor_score is None]
        if missing or not math.isfinite(best_floor_score):
            raise ValueError(f"a floor on the gate split needs every candidate's gate score (missing: {missing})")
    return [
        _regularized_verdict(current, candidate, best_score, band, delta, params, accepted, best_floor_score)
        for candidate in candidates
    ]


def _regularized_verdict(
    current: CandidateStats,
    candidate: CandidateStats,
    best_score: float,
    band: float,
    estimated_delta: float | None,
    params: GateParams,
    accepted: frozenset[str],
    best_floor_score: float | None = None,
) -> GateVerdict:
    d_score = candidate.score - current.score
    d_cost = _relative_cost(candidate.cost, current.cost)
    d_units = d_score / params.score_unit
    c_limit = params.c0 + params.c1 * d_units
    new_kinds = new_structural_kinds(candidate.components, accepted)
    n_new = len(new_kinds)
    # lambda_C = 0 must ignore an infinite cost rise rather than give 0 * inf = NaN.
    cost_term = params.lambda_C * d_cost if params.lambda_C else 0.0
    objective = params.lambda_S * d_score - cost_term + params.lambda_N * n_new
    on_gate = best_floor_score is not None and candidate.floor_score is not None
    floor_best = best_floor_score if on_gate and best_floor_score is not None else best_score
    floor_value = candidate.floor_score if on_gate and candidate.floor_score is not None else candidate.score
    floor = floor_best - band if params.noise_band else None
    valid_drop = current.valid_rate - candidate.valid_rate
    no_submission_rise = candidate.no_submission_rate - current.no_submission_rate
    numbers: dict[str, Any] = {
        "S": candidate.score,
        "S_current": current.score,
        "S_best": best_score,
        "dS": d_score,
        "C": candidate.cost,
        "C_current": current.cost,
        "dC": _finite_or_none(d_cost),
        "delta": band,
        "delta_estimated": estimated_delta,
        "floor": floor,
        "score_unit": params.score_unit,
        "dS_units": d_units,
        "c0": params.c0,
        "c1": params.c1,
        "c_limit": c_limit,
        "lambda_S": params.lambda_S,
        "lambda_C": params.lambda_C,
        "lambda_N": params.lambda_N,
        "N_new": n_new,
        "new_structural_kinds": new_kinds,
        "objective": _finite_or_none(objective),
        "valid_drop": valid_drop,
        "valid_drop_limit": params.valid_output_drop,
        "no_submission_rise": no_submission_rise,
        "no_submission_rise_limit": params.no_submission_rise,
    }

    def verdict(admissible: bool, rule: str, explanation: str) -> GateVerdict:
        return GateVerdict(candidate.candidate_id, admissible, rule, explanation, numbers)

    if on_gate:
        numbers.update(floor_on="gate", S_floor=floor_value, S_best_floor=floor_best)
    score_text = f"S = {_points(candidate.score)} points"
    if floor is not None and floor_value < floor - EPSILON:
        what = f"S on the gate split = {_points(floor_value)} points" if on_gate else score_text
        best = "the best gate score" if on_gate else "S_best"
        return verdict(
            False,
            "floor",
            f"{what} is below the floor {best} - delta = {_points(floor_best)} - {_points(band)} "
            f"= {_points(floor)} points, so the candidate is rejected.",
        )
    if not params.admissibility:
        if floor is None:
            return verdict(True, "unfiltered", f"{score_text}; no floor and no admissibility rule apply.")
        return verdict(
            True, "passes_floor", f"{score_text} is at or above the floor {_points(floor)} points; admissible."
        )
    if params.valid_output_drop is not None and valid_drop > params.valid_output_drop + EPSILON:
        return verdict(
            False,
            "guard_valid_output",
            f"The valid-output rate falls from {_percent(current.valid_rate)} to {_percent(candidate.valid_rate)} "
            f"(by {_percent(valid_drop)}, more than the {_percent(params.valid_output_drop)} allowed), "
            "so the candidate is rejected.",
        )
    if params.no_submission_rise is not None and no_submission_rise > params.no_submission_rise + EPSILON:
        return verdict(
            False,
            "guard_no_submission",
            f"The no-submission rate rises from {_percent(current.no_submission_rate)} to "
            f"{_percent(candidate.no_submission_rate)} (by {_percent(no_submission_rise)}, more than the "
            f"{_percent(params.no_submission_rise)} allowed), so the candidate is rejected.",
        )
    gain_text = f"dS = {_signed_points(d_score)} points"
    cost_text = f"dC = {_signed_percent(d_cost)}"
    if d_score > band + EPSILON:
        allowance = f"c0 + c1 x dS = {params.c0:g} + {params.c1:g} x {d_units:.4g} units = {_signed_percent(c_limit)}"
        if d_cost <= c_limit + EPSILON:
            return verdict(
                True,
                "admissible_above_noise",
                f"{gain_text} is above the noise band ({_points(band)} points) and {cost_text} is within "
                f"{allowance}; admissible.",
            )
        return verdict(
            False,
            "cost_too_high",
            f"{gain_text} is above the noise band ({_points(band)} points) but {cost_text} exceeds "
            f"{allowance}, so the candidate is rejected.",
        )
    if d_score >= -band - EPSILON:
        formula = (
            f"{params.lambda_S:g} x dS - {params.lambda_C:g} x dC + {params.lambda_N:g} x {n_new} new structural "
            f"kind(s) = {_objective_text(objective)}"
        )
        if objective > EPSILON and estimated_delta is None and params.noise_band:
            return verdict(
                False,
                "noise_unknown",
                f"{gain_text} with {cost_text} would be accepted inside the noise band ({formula}), but the band "
                "could not be estimated, so the candidate is rejected: it must beat the current harness.",
            )
        if objective > EPSILON:
            return verdict(
                True,
                "inside_noise_gain",
                f"{gain_text} is inside the noise band ({_points(band)} points), {cost_text}, and the objective "
                f"{formula} is positive; admissible.",
            )
        return verdict(
            False,
            "inside_noise_no_gain",
            f"{gain_text} is inside the noise band ({_points(band)} points), {cost_text}, and the objective "
            f"{formula} is not positive, so the candidate is rejected.",
        )
    return verdict(
        False,
        "below_current",
        f"{gain_text} is below the current harness by more than the noise band ({_points(band)} points), "
        "so the candidate is rejected.",
    )


def unregularized_gate(
    current: CandidateStats,
    candidates: Sequence[CandidateStats],
    *,
    best_score: float,
    delta: float | None = 0.0,
    params: GateParams | None = None,
    accepted_structural_kinds: Iterable[str] = frozenset(),
    best_floor_score: float | None = None,
) -> list[GateVerdict]:
    """Verdicts of the unregularized baseline: admissible iff S > S_best
    (strictly, beyond ``EPSILON``), whatever the cost, guards or noise.

    Same signature as ``regularized_gate`` so the loop can swap them;
    ``delta``, ``params``, ``accepted_structural_kinds`` and ``best_floor_score`` are ignored.
    ``current`` only feeds the reported dS and dC. Raises ``ValueError`` on a
    non-finite best score or duplicate candidate ids.
    """
    if not math.isfinite(best_score):
        raise ValueError(f"best_score must be finite, got {best_score!r}")
    _check_unique(candidates)
    verdicts = []
    for candidate in candidates:
        d_best = candidate.score - best_score
        numbers = {
            "S": candidate.score,
            "S_current": current.score,
            "S_best": best_score,
            "dS": candidate.score - current.score,
            "dS_best": d_best,
            "C": candidate.cost,
            "C_current": current.cost,
            "dC": _finite_or_none(_relative_cost(candidate.cost, current.cost)),
        }
        comparison = f"S = {_points(candidate.score)} points vs S_best = {_points(best_score)} points"
        if d_best > EPSILON:
            verdicts.append(
                GateVerdict(
                    candidate.candidate_id,
                    True,
                    "unregularized_beats_best",
                    f"{comparison}: beats the best; admissible.",
                    numbers,
                )
            )
        else:
            verdicts.append(
                GateVerdict(
                    candidate.candidate_id,
                    False,
                    "unregularized_not_better",
                    f"{comparison}: does not beat the best, so the candidate is rejected.",
                    numbers,
                )
            )
    return verdicts


def choose(verdicts: Sequence[GateVerdict], stats: Sequence[CandidateStats]) -> CandidateId | None:
    """The candidate that becomes the next harness: among admissible verdicts
    the highest S, ties broken by lower cost, then lower id (ids of one call
    must be of one type). None when nothing is admissible: the current
    harness stays.

    Raises ``ValueError`` when an admissible verdict has no stats.
    """
    by_id = {item.candidate_id: item for item in stats}
    admissible = []
    for verdict in verdicts:
        if not verdict.admissible:
            continue
        if verdict.candidate_id not in by_id:
            raise ValueError(f"no stats for admissible candidate {verdict.candidate_id!r}")
        admissible.append(by_id[verdict.candidate_id])
    if not admissible:
        return None
    best = min(admissible, key=lambda item: (-item.score, item.cost, item.candidate_id))
    return best.candidate_id


def _relative_cost(new: float, old: float) -> float:
    change = relative_cost_change(new, old)
    return math.inf if change is None else change


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _check_unique(candidates: Sequence[CandidateStats]) -> None:
    ids = [candidate.candidate_id for candidate in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("candidate ids must be unique")


def _points(value: float) -> str:
    return f"{value * 100:.2f}"


def _signed_points(value: float) -> str:
    return f"{value * 100:+.2f}"


def _percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def _signed_percent(value: float) -> str:
    if math.isinf(value):
        return "+inf% (cost rose from 0)"
    return f"{value * 100:+.1f}%"


def _objective_text(value: float) -> str:
    return f"{value:+.4g}" if math.isfinite(value) else "-inf"


# --- G. Pruning --------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerPoint:
    """One measured atomic edit: its round, component kind and the dS of its candidate."""

    round: int
    component: str
    dS: float


def pruning_targets(entries: Sequence[LedgerPoint], *, current_round: int, window: int, threshold: float) -> list[str]:
    """Component kinds to advise deleting, sorted.

    The window is the last ``window`` rounds up to and including
    ``current_round`` (rounds r with ``current_round - window < r <=
    current_round``). For each component measured at least once in the
    window, its best dS there is taken; it is a target when that best is not
    above ``threshold`` (exactly at the threshold is a target). Components
    not measured in the window are not judged.

    Raises ``ValueError`` when ``window < 1`` or an entry is from a round
    after ``current_round`` (the caller passed the wrong round).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    best: dict[str, float] = {}
    for entry in entries:
        if entry.round > current_round:
            raise ValueError(f"ledger entry of round {entry.round} is after the current round {current_round}")
        if entry.round <= current_round - window:
            continue
        best[entry.component] = max(best.get(entry.component, -math.inf), entry.dS)
    return sorted(component for component, value in best.items() if value <= threshold + EPSILON)
