"""The novelty bonus (docs/concepts.md, rule F: lambda_N x N_new) through the real loop: the example's offline
proposer adds a subagent, a kind the seed harness does not have, the agent runs it on real tasks, and rrsi's
gate counts it as a new structural kind; the comparison's rules-fired report counts the decision."""

from __future__ import annotations

import pytest

from evolution.example.proposer import SUBAGENT_PATH
from evolution.example.setup import example_experiment_create, example_recipe
from evolution.loop import lifecycle, load
from evolution.loop.compare import rules_fired
from evolution.loop.inline import run_drive
from evolution.models import Candidate, GateDecision, Run
from evolution.recipes import parse_recipe, recipe_to_dict

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_subagent_the_example_proposer_adds_fires_the_novelty_bonus() -> None:
    import evolution.proposers  # noqa: F401  (registers the example proposer)

    experiment = example_experiment_create(name="novelty", task_limit=6)
    assert "subagent" not in load.structural_kinds_had(experiment)  # the seed has tools, skills, memory
    data = recipe_to_dict(example_recipe(rounds=1, candidates=1, k=1))
    data["proposal"]["params"] = {"edits": ["subagent-ticket-reader"]}  # the real edit, alone
    run = run_drive(lifecycle.run_create(experiment=experiment, recipe=parse_recipe(data)))

    assert run.status == Run.Status.FINISHED, run.stop_reason
    candidate = Candidate.objects.get(run=run, round=1)
    assert list(candidate.edits.values_list("component", flat=True)) == ["subagent"]
    assert candidate.tree.entries.filter(path=SUBAGENT_PATH).exists()
    decision = GateDecision.objects.get(run=run, candidate=candidate)
    numbers = decision.numbers
    print(f"\nsubagent-ticket-reader: {decision.rule}, accepted {decision.accepted}, {numbers}")
    assert (numbers["N_new"], numbers["new_structural_kinds"], numbers["lambda_N"]) == (1, ["subagent"], 0.25)
    # The bonus is counted only inside the noise band (beyond it the cost rule decides alone): this edit's
    # measured dS fell inside it here, so the rule fired, and the objective holds lambda_N x 1.
    assert abs(numbers["dS"]) <= numbers["delta"]
    assert numbers["objective"] == pytest.approx(numbers["lambda_S"] * numbers["dS"] - numbers["dC"] + 0.25)
    assert rules_fired(run)["novelty_bonus"] == 1
