"""Six rounds of the offline example, unregularized and rrsi, through a real worker.

Unregularized (no critic) accepts leaky edits and raises train more than
sealed; rrsi flags those edits before any evaluation, never evaluates them,
and ends with a sealed score no lower than the unregularized run's. A
"leaky" candidate is one the rule-based critic flags on its diff against
the evolve tasks.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from django.core.management import call_command

from evolution.critic import build_index, critique
from evolution.loop import lifecycle
from evolution.management.commands.run_experiment import summary_table
from evolution.models import Candidate, Evaluation, Experiment, Run, Trial
from evolution.recipes import load_preset, parse_recipe, recipe_to_dict
from evolution.services.proposals import evolve_tasks_for_critic
from evolution.services.snapshots import tree_diff
from tests.conftest import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker, pytest.mark.slow]

PROPOSER = {"operator": "example", "params": {"family_weights": {"generic": 0.4, "leaky": 0.5, "cost": 0.1}}}


def recipe(preset: str) -> Any:
    data = recipe_to_dict(load_preset(preset))
    data.update(rounds=6, candidates_per_round=3)
    data["proposal"] = PROPOSER
    data["evaluation"] = {**data["evaluation"], "trials_per_task": 1}
    if data["noise"]["enabled"]:
        data["noise"] = {**data["noise"], "repeats": 2}
    data["edit_budget"] = {**data["edit_budget"], "T": 6}
    return parse_recipe(data)


def example(name: str) -> Experiment:
    call_command("load_example", name=name, verbosity=0)
    return Experiment.objects.get(name=name)


def leaky(run: Run, candidate: Candidate) -> bool:
    index = build_index(evolve_tasks_for_critic(run=run))
    assert candidate.parent is not None
    return bool(critique(tree_diff(old=candidate.parent.tree, new=candidate.tree), index))


def progress(run: Run, worker: Any) -> str:
    """Where a run that did not finish stands, for the failure message."""
    run.refresh_from_db()
    candidates = Counter(Candidate.objects.filter(run=run).values_list("state", flat=True).order_by())
    trials = Counter(Trial.objects.filter(evaluation__candidate__run=run).values_list("state", flat=True).order_by())
    return (
        f"run {run.status}, state {run.state}\ncandidates {dict(candidates)}\ntrials {dict(trials)}\n"
        f"--- worker log:\n{worker.log()[-4000:]}"
    )


def test_regularization_stops_leaks_that_the_unregularized_loop_accepts(start_worker) -> None:
    import evolution.proposers  # noqa: F401  (registers the example proposer in this process)

    # With the lease reaper (beat), as ``dev.py run`` and a deployment run it:
    # a trial whose task a loaded machine loses is taken up again.
    worker = start_worker(concurrency=2, beat=True)
    unregularized = lifecycle.run_create(experiment=example("example-unregularized"), recipe=recipe("unregularized"))
    regularized = lifecycle.run_create(experiment=example("example-rrsi"), recipe=recipe("rrsi"))
    for run in (unregularized, regularized):

        def finished(run: Run = run) -> bool:
            run.refresh_from_db()
            return run.status != Run.Status.RUNNING

        def where(run: Run = run) -> str:
            return progress(run, worker)

        wait_until(
            finished,
            timeout=1500,
            interval=1,
            what=f"run {run.pk}",
            diagnose=where,
        )
        assert run.status == Run.Status.FINISHED, run.error
        print(f"\n{run.recipe.name}:", *summary_table(run), sep="\n")

    accepted = Candidate.objects.filter(run=unregularized, state=Candidate.State.ACCEPTED)
    assert any(leaky(unregularized, c) for c in accepted), "the unregularized run accepted no leaky edit"
    final, seed = unregularized.state["final"]["scores"], unregularized.state["final"]["seed_scores"]
    assert final["train"] - seed["train"] > final["sealed"] - seed["sealed"]

    proposed = Candidate.objects.filter(run=regularized).exclude(origin=Candidate.Origin.SEED)
    flagged = [c for c in proposed if c.leakage_flags.exists()]
    assert flagged, "rrsi flagged nothing"
    for candidate in flagged:
        assert candidate.state in {Candidate.State.FLAGGED, Candidate.State.REJECTED_CRITIC}
        assert not Evaluation.objects.filter(candidate=candidate).exists()
    evaluated = proposed.filter(evaluations__isnull=False).distinct()
    assert not [c.pk for c in evaluated if leaky(regularized, c)]
    assert regularized.state["final"]["scores"]["sealed"] >= final["sealed"]
