"""RunState, the only reader and writer of Run.state's keys: a round trip, old rows, what the screens ask."""

from __future__ import annotations

from datetime import UTC, datetime

from evolution.loop.state import RunState


def test_round_trip_keeps_every_field_and_unknown_keys() -> None:
    state = RunState(
        phase="evaluating",
        events=[{"round": 1, "kind": "gate", "text": "round 1"}],
        rounds={0: {"round": 0, "proposed": 0}, 2: {"round": 2, "proposed": 3}, 1: {"round": 1, "proposed": 2}},
        best_score=0.6,
        best_by_round=[0.5, 0.6],
        accepted_structural=["skill"],
        measured_components=["prompt", "skill"],
        pruning_targets=["config"],
        stalled_rounds=[2],
        round_parents={1: 10, 2: 12},
        round_budgets={1: 4, 2: None},
        dropped={2: [{"slot": 1, "why": "proposer_error", "reason": "timeout"}]},
        proposer_usage={1: {0: {"tokens": 120, "cost_usd": 0.01}}},
        proposing_since=datetime(2026, 12, 2, 3, 0, tzinfo=UTC),
        stopped_by_limit=True,
        final={"current": 12, "scores": {"train": 0.7}, "seed_scores": {"train": 0.5}, "divergence": ""},
        extra={"written_by_a_newer_version": [1, 2]},
    )
    data = state.to_json()
    # JSON keys are strings, in round order.
    assert list(data["rounds"]) == ["0", "1", "2"]
    assert data["proposer_usage"] == {"1": {"0": {"tokens": 120, "cost_usd": 0.01}}}
    assert data["proposing_since"] == "2026-12-02T03:00:00+00:00"
    assert RunState.from_json(data) == state


def test_a_row_written_before_the_class_loads() -> None:
    old = {
        "phase": "propose",
        "events": [],
        "rounds": {"0": {"round": 0}},
        "best_by_round": [0.5],
        "best_score": 0.5,
        "round_budgets": {"1": 3},
    }
    state = RunState.from_json(old)
    assert (state.phase, state.rounds, state.round_budgets, state.final) == ("propose", {0: {"round": 0}}, {1: 3}, None)
    assert RunState.from_json(None) == RunState()
    assert RunState.from_json({}).phase == "baseline"


def test_what_the_screens_ask() -> None:
    state = RunState(
        phase="proposing",
        rounds={0: {}, 1: {}, 2: {}},
        measured_components=["prompt", "config"],
        events=[{"kind": "gate", "text": "a"}, {"kind": "stop", "text": "b"}, {"kind": "divergence", "text": "c"}],
        dropped={3: [{"slot": 0}]},
    )
    assert state.in_round and not RunState(phase="final").in_round
    assert (state.gated_rounds, state.last_gated_round) == (2, 2)
    assert RunState().last_gated_round == 0
    assert [e["text"] for e in state.special_events()] == ["b", "c"]
    assert state.dropped_in(3) == [{"slot": 0}] and state.dropped_in(4) == []
    assert state.unexplored_kinds(["prompt", "config", "skill", "memory"]) == ["skill", "memory"]
    # A kind the surface does not reach is never asked for.
    assert state.unexplored_kinds(["prompt", "config"]) == []
