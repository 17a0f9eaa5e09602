"""The gate as published (docs/concepts.md, rules B, C and F; the seed text) (issue 18, item 1).

- N_new counts the structural kinds a candidate introduces for the first time: kinds no accepted harness has
  had, the seed's included; padding an existing memory file earns no bonus.
- The ledger keeps "admissible but not chosen" apart from "rejected".
- Stall exploration asks only for kinds the surface lets the proposer reach.
"""

from __future__ import annotations

import pytest
from django.core.management import call_command

from evolution.loop import load
from evolution.loop.decision import Edit, round_decide
from evolution.loop.regularization import CandidateStats, GateParams, regularized_gate, unexplored_kinds
from evolution.models import Experiment
from evolution.surfaces import COMPONENT_KINDS, parse_surface, reachable_kinds

CURRENT = CandidateStats(candidate_id=1, score=0.50, cost=1000.0)
# Inside the band (dS = +0.02 < 0.05), 10% more tokens, editing the memory file only.
PADDING = CandidateStats(candidate_id=2, score=0.52, cost=1100.0, components=frozenset({"memory"}))


def decide_padding(accepted_structural: list[str]) -> tuple[str, int]:
    decided = round_decide(
        round_number=1,
        current=CURRENT,
        candidates=[PADDING],
        edits={2: [Edit(20, "memory", "pad the memory file")]},
        best_score=0.50,
        delta=0.05,
        gate=regularized_gate,
        params=GateParams(score_unit=0.05),
        accepted_structural=accepted_structural,
    )
    verdict = decided.candidates[0]
    return verdict.rule, int(verdict.numbers["N_new"])  # type: ignore[call-overload]


@pytest.fixture
def example(db: None) -> Experiment:
    call_command("load_example", name="gate-published", verbosity=0)
    return Experiment.objects.get(name="gate-published")


def test_the_seeds_structural_kinds_are_had_before_any_round(example: Experiment) -> None:
    # The example's seed has tools, skills and memory files (and its surface no subagent path).
    assert load.structural_kinds_had(example) == ["client_tool", "memory", "skill"]


def test_padding_a_memory_file_the_seed_already_has_earns_no_novelty(example: Experiment) -> None:
    # -1 x 0.10 + 0.25 x N_new: with memory counted as new (what the loop did before: it started from no
    # kinds), the bonus bought acceptance; with the seed's kinds had, N_new is 0 and the padding is rejected.
    assert decide_padding([]) == ("inside_noise_gain", 1)
    assert decide_padding(load.structural_kinds_had(example)) == ("inside_noise_no_gain", 0)


def test_the_ledger_keeps_admissible_but_not_chosen_apart_from_rejected() -> None:
    decided = round_decide(
        round_number=1,
        current=CURRENT,
        candidates=[
            CandidateStats(candidate_id=2, score=0.60, cost=1000.0),  # admissible, chosen
            CandidateStats(candidate_id=3, score=0.58, cost=1000.0),  # admissible, a sibling scored higher
            CandidateStats(candidate_id=4, score=0.40, cost=1000.0),  # below the floor: rejected
        ],
        edits={2: [Edit(20, "prompt", "a")], 3: [Edit(30, "config", "b")], 4: [Edit(40, "skill", "c")]},
        best_score=0.50,
        delta=0.05,
        gate=regularized_gate,
        params=GateParams(score_unit=0.05),
    )
    assert [(r.candidate_id, r.accepted, r.admissible) for r in decided.ledger] == [
        (2, True, True),
        (3, False, True),
        (4, False, False),
    ]


def test_stall_exploration_asks_only_for_kinds_the_surface_reaches(example: Experiment) -> None:
    spec = parse_surface(example.surface.spec)
    # The example's surface reaches every kind (subagents/** since its proposer can add a subagent) ...
    assert reachable_kinds(spec) == list(COMPONENT_KINDS)
    assert load.reachable_components(example) == reachable_kinds(spec)
    # ... so the rule is shown on the same surface without that pattern.
    narrower = parse_surface(example.surface.spec.replace('  "subagents/**": subagent\n', ""))
    reachable = reachable_kinds(narrower)
    assert "subagent" not in reachable and "memory" in reachable
    measured = ["prompt", "control_flow", "config", "output_plumbing", "context_mgmt", "client_tool", "skill", "memory"]
    # Every reachable kind measured: nothing to explore (before, subagent was asked for and a slot dropped).
    assert unexplored_kinds(measured) == ["subagent"]
    assert unexplored_kinds(measured, reachable) == []
    assert unexplored_kinds(["prompt"], reachable) == [k for k in reachable if k != "prompt"]
