"""``RunState``: the only code that knows the keys of ``Run.state``.

``Run.state`` is a JSON column the loop writes at every step; the screens, the API and the commands read it
through ``RunState.of(run)``, never by key. ``RunState.save(run)`` writes it back (the caller saves the row).
Rows written before this class existed load unchanged: every key is optional and unknown keys are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from evolution.models import Run

__all__ = ["PHASES", "Dropped", "Event", "FinalReport", "NoiseReport", "RoundSummary", "RunState"]

# baseline -> propose -> proposing -> evaluating -> (gate) -> propose ... -> final -> finished (or failed)
PHASES: tuple[str, ...] = ("baseline", "propose", "proposing", "evaluating", "final", "finished", "failed")
IN_ROUND_PHASES = frozenset({"propose", "proposing", "evaluating"})


class Event(TypedDict, total=False):
    round: int
    kind: str  # baseline, gate, stop, pause, error, divergence
    text: str


class Dropped(TypedDict, total=False):
    slot: int
    why: str  # proposer_error, invalid, duplicate, ...
    reason: str


class RoundSummary(TypedDict, total=False):
    round: int
    parent: int | None
    budget: int | None
    proposed: int
    flagged: int
    rejected_surface: int
    rejected_budget: int
    evaluated: int
    accepted: int
    current: int | None
    scores: dict[str, float]  # S per split of the current harness after the round
    tokens_per_trial: float | None
    dropped: list[Dropped]


class FinalReport(TypedDict, total=False):
    current: int | None
    scores: dict[str, float]
    start: int | None  # the candidate the run started from
    start_scores: dict[str, float]  # its scores: what the run's gains are measured from
    seed_scores: dict[str, float]  # runs before start_scores (and runs that start from the seed)
    divergence: str


class NoiseReport(TypedDict, total=False):
    """How the noise band was measured (``regularization.NoiseEstimate``); ``delta`` None: not estimable."""

    delta: float | None
    rule: str
    evaluations: int
    trials_per_task: int
    note: str


@dataclass
class RunState:
    phase: str = "baseline"
    events: list[Event] = field(default_factory=list)
    rounds: dict[int, RoundSummary] = field(default_factory=dict)  # by round number; 0 is the seed
    best_score: float | None = None  # S_best
    best_by_round: list[float] = field(default_factory=list)  # S_best after each round, the seed's first
    accepted_structural: list[str] = field(default_factory=list)
    measured_components: list[str] = field(default_factory=list)
    pruning_targets: list[str] = field(default_factory=list)
    stalled_rounds: list[int] = field(default_factory=list)
    round_parents: dict[int, int] = field(default_factory=dict)
    round_budgets: dict[int, int | None] = field(default_factory=dict)
    dropped: dict[int, list[Dropped]] = field(default_factory=dict)
    proposer_usage: dict[int, dict[int, dict[str, float]]] = field(default_factory=dict)
    proposing_since: datetime | None = None
    stopped_by_limit: bool = False
    final: FinalReport | None = None
    noise: NoiseReport | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # keys this class does not know, kept as they were

    # --- reading and writing ------------------------------------------------------

    @classmethod
    def of(cls, run: Run) -> RunState:
        return cls.from_json(run.state)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> RunState:
        data = dict(data or {})

        def by_round(key: str) -> dict[int, Any]:
            return {int(k): v for k, v in (data.pop(key, None) or {}).items()}

        since = data.pop("proposing_since", None)
        state = cls(
            phase=str(data.pop("phase", "baseline")),
            events=list(data.pop("events", None) or []),
            rounds=by_round("rounds"),
            best_score=_float_or_none(data.pop("best_score", None)),
            best_by_round=[float(x) for x in data.pop("best_by_round", None) or []],
            accepted_structural=list(data.pop("accepted_structural", None) or []),
            measured_components=list(data.pop("measured_components", None) or []),
            pruning_targets=list(data.pop("pruning_targets", None) or []),
            stalled_rounds=[int(x) for x in data.pop("stalled_rounds", None) or []],
            round_parents=by_round("round_parents"),
            round_budgets=by_round("round_budgets"),
            dropped=by_round("dropped"),
            proposer_usage={
                r: {int(slot): dict(numbers) for slot, numbers in slots.items()}
                for r, slots in by_round("proposer_usage").items()
            },
            proposing_since=datetime.fromisoformat(since) if since else None,
            stopped_by_limit=bool(data.pop("stopped_by_limit", False)),
            final=data.pop("final", None) or None,
            noise=data.pop("noise", None) or None,
        )
        state.extra = data
        return state

    def to_json(self) -> dict[str, Any]:
        def by_round(values: dict[int, Any]) -> dict[str, Any]:
            return {str(k): v for k, v in sorted(values.items())}

        data: dict[str, Any] = {
            **self.extra,
            "phase": self.phase,
            "events": list(self.events),
            "rounds": by_round(self.rounds),
            "best_by_round": list(self.best_by_round),
            "accepted_structural": list(self.accepted_structural),
            "measured_components": list(self.measured_components),
            "pruning_targets": list(self.pruning_targets),
        }
        optional: dict[str, Any] = {
            "best_score": self.best_score,
            "stalled_rounds": list(self.stalled_rounds),
            "round_parents": by_round(self.round_parents),
            "round_budgets": by_round(self.round_budgets),
            "dropped": by_round(self.dropped),
            "proposer_usage": {
                str(r): {str(slot): numbers for slot, numbers in sorted(slots.items())}
                for r, slots in sorted(self.proposer_usage.items())
            },
            "proposing_since": self.proposing_since.isoformat() if self.proposing_since else None,
            "stopped_by_limit": self.stopped_by_limit or None,
            "final": self.final,
            "noise": self.noise,
        }
        data.update({key: value for key, value in optional.items() if value not in (None, [], {})})
        return data

    def save(self, run: Run) -> None:
        """Put this state on ``run`` (the caller saves the row, with ``state`` among its fields)."""
        run.state = self.to_json()

    # --- what the screens ask -----------------------------------------------------

    def event(self, round_number: int, kind: str, text: str) -> None:
        self.events.append({"round": round_number, "kind": kind, "text": text})

    @property
    def in_round(self) -> bool:
        """Proposing or evaluating a round (not the baseline, not the final report)."""
        return self.phase in IN_ROUND_PHASES

    @property
    def gated_rounds(self) -> int:
        """Rounds whose gate has run (the seed's round 0 not counted)."""
        return len([r for r in self.rounds if r != 0])

    @property
    def last_gated_round(self) -> int:
        return max(self.rounds, default=0)

    def dropped_in(self, round_number: int) -> list[Dropped]:
        return list(self.dropped.get(round_number, []))

    def unexplored_kinds(self, reachable: list[str]) -> list[str]:
        """The component kinds among ``reachable`` (the surface's, ``surfaces.reachable_kinds``) never edited
        and measured: what a stalled round's exploration slots must touch (the rule the loop applies,
        ``regularization.unexplored_kinds``)."""
        from evolution.loop.regularization import unexplored_kinds

        return unexplored_kinds(self.measured_components, reachable)

    @property
    def noise_unknown(self) -> bool:
        """The band was measured and could not be estimated: the gate accepts nothing inside it."""
        return self.noise is not None and self.noise.get("delta") is None

    @property
    def start_scores(self) -> dict[str, float]:
        """The final report's scores of the run's start (``seed_scores`` in reports written before it)."""
        final = self.final or {}
        return dict(final.get("start_scores") or final.get("seed_scores") or {})

    @property
    def evolve_gain(self) -> float | None:
        """S_best's rise over the run, from its start's S (None before a round was gated)."""
        if len(self.best_by_round) < 2:
            return None
        return self.best_by_round[-1] - self.best_by_round[0]

    def transfer_change(self, split: str) -> float | None:
        """The final harness's score on ``split`` minus the start's, when the final report has both."""
        start, final = self.start_scores, (self.final or {}).get("scores", {})
        if split not in start or split not in final:
            return None
        return float(final[split]) - float(start[split])

    def special_events(self) -> list[Event]:
        """Stops, pauses the platform made, errors and divergence warnings: what a reader must not miss."""
        return [e for e in self.events if e.get("kind") in {"stop", "pause", "error", "divergence"}]


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)
