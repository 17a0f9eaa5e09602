"""``manage.py compare_recipes`` on a small slice of the example: its JSON, and what it refuses."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from evolution.example import preset_proposer, proposer_mismatch
from evolution.example.setup import example_evaluator_with_recall, example_experiment_create
from evolution.loop.compare import RULES, process_owner
from evolution.models import Candidate, Experiment, RecipeComparison, Run
from evolution.services.experiments import experiment_twin

pytestmark = pytest.mark.django_db(transaction=True)


def test_compare_recipes_prints_each_run_and_the_start_as_json() -> None:
    import evolution.proposers  # noqa: F401  (registers the example proposer)

    experiment = example_experiment_create(name="compare-small", task_limit=9)
    out = io.StringIO()
    call_command(
        "compare_recipes",
        experiment=experiment.pk,
        recipes="unregularized",
        seeds=2,
        rounds=1,
        candidates=1,
        k=1,
        proposer="example",
        transfer_seeds=2,
        json=True,
        inline=True,
        stdout=out,
    )
    data = json.loads(out.getvalue())
    assert (data["seeds"], data["rounds"], data["transfer_seeds"]) == (2, 1, 2)
    stored = RecipeComparison.objects.get(pk=data["comparison"])
    assert stored.owner == process_owner() and stored.heartbeat_at is not None  # the command's process
    twins = Experiment.objects.filter(pk__in=[r["experiment"] for r in data["recipes"]["unregularized"]["runs"]])
    assert all(f"· comparison {stored.pk}" in twin.name for twin in twins)  # apart from a concurrent one
    assert set(data["start"]) == {"train", "gate", "sealed", "held_out", "cost", "leaky_accepted", "leaky_by_transfer"}
    for name in ("unregularized",):
        runs = data["recipes"][name]["runs"]
        assert [r["seed"] for r in runs] == [0, 1]
        for r in runs:
            assert r["status"] == "finished"
            assert len(r["transfer_by_seed"]["sealed"]) == 2  # one certified evaluation per trial seed
            assert r["sealed"] == pytest.approx(sum(r["transfer_by_seed"]["sealed"]) / 2)
            run = Run.objects.get(pk=r["run"])
            assert run.experiment_id == r["experiment"] != experiment.pk  # a twin, never the start itself
            assert run.current_candidate_id == r["final_candidate"]
        summary = data["recipes"][name]["summary"]["sealed"]
        values = [r["sealed"] for r in runs]
        assert summary["mean"] == pytest.approx(sum(values) / 2)
        assert summary["low"] <= summary["mean"] <= summary["high"]
    assert not Run.objects.filter(experiment=experiment).exists()
    assert Experiment.objects.count() == 1 + 2  # the start and two run twins (the start measured in the first)
    for r in runs:  # every accepted edit judged by sealed transfer, against its parent's sealed score
        assert len(r["edits"]) == r["accepted"]
        assert r["leaky_by_transfer"] == sum(e["leaky"] for e in r["edits"])
        assert set(r["rules"]) == set(RULES)
        assert r["rules"]["edit_budget"] == Candidate.objects.filter(run=r["run"], state="rejected_budget").count()


def test_compare_recipes_refuses_an_unknown_recipe_or_experiment() -> None:
    experiment = example_experiment_create(name="compare-refuse", task_limit=3)
    with pytest.raises(CommandError, match="unknown recipe"):
        call_command("compare_recipes", experiment=experiment.pk, recipes="rrsi,nope", seeds=1, stdout=io.StringIO())
    with pytest.raises(CommandError, match="no experiment with id"):
        call_command("compare_recipes", experiment=999999, stdout=io.StringIO())
    with pytest.raises(CommandError, match="the llm proposal operator is not configured"):
        call_command("compare_recipes", experiment=experiment.pk, recipes="rrsi", proposer="llm", stdout=io.StringIO())
    # The reasoning-gym proposer on a slice of the example (whose default is the example's own).
    with pytest.raises(
        CommandError,
        match=r"^the offline proposer 'rgym' edits another benchmark's harness; on "
        r"'support-routing-offline-first-3' use --proposer example \(the default there\)",
    ):
        call_command("compare_recipes", experiment=experiment.pk, recipes="rrsi", proposer="rgym", stdout=io.StringIO())
    with pytest.raises(CommandError, match=r"^the case recall similarity must be in \(0, 1\], not 1\.5$"):
        call_command(
            "compare_recipes",
            experiment=experiment.pk,
            recipes="rrsi",
            case_recall_similarity=1.5,
            stdout=io.StringIO(),
        )
    assert Experiment.objects.count() == 1  # nothing was created
    assert not RecipeComparison.objects.exists()


def test_each_bundled_benchmark_and_its_slices_get_their_own_offline_proposer() -> None:
    names = {
        "support-routing-offline": "example",
        "support-routing-offline-first-30": "example",
        "reasoning-gym": "rgym",
        "reasoning-gym-2-per-split": "rgym",
        "reasoning-gym-heldout": None,
        "support-routing-offline-first-x": None,
        "swe-bench": None,
    }
    assert {name: preset_proposer(benchmark=name) for name in names} == names
    assert proposer_mismatch(benchmark="reasoning-gym-2-per-split", proposer="example") == (
        "the offline proposer 'example' edits another benchmark's harness; on 'reasoning-gym-2-per-split' use "
        "--proposer rgym (the default there) or a model-driven proposer"
    )
    assert proposer_mismatch(benchmark="reasoning-gym", proposer="llm") is None
    assert proposer_mismatch(benchmark="swe-bench", proposer="example") is None


def test_a_case_recall_similarity_runs_the_example_agent_with_it_under_an_evaluator_of_its_own() -> None:
    experiment = example_experiment_create(name="compare-recall", task_limit=3)
    evaluator = example_evaluator_with_recall(experiment.evaluator, 0.6)

    assert evaluator.name == f"{experiment.evaluator.name}-recall-0-6"
    assert evaluator.runner_argv == [*experiment.evaluator.runner_argv, "--case-recall-similarity", "0.6"]
    assert evaluator.files_id == experiment.evaluator.files_id
    assert example_evaluator_with_recall(experiment.evaluator, 0.6) == evaluator  # safe to repeat
    twin = experiment_twin(like=experiment, name="compare-recall twin", evaluator=evaluator)
    assert twin.evaluator == evaluator and twin.benchmark == experiment.benchmark
    with pytest.raises(ValueError, match="needs the example's offline agent"):
        example_evaluator_with_recall(evaluator, 0.7)  # already sets it
