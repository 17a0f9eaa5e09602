"""The reasoning-gym benchmark loads offline and runs a round through a real worker (Redis broker).

``load_example --benchmark reasoning-gym --tasks 1`` draws the first seed of every family in every split
from the installed package; one round of rrsi with one candidate, the memorizing edit (the train answers in
a table keyed by a fingerprint of the question), runs in a worker process whose verifier imports
reasoning-gym in the sandbox. The critic is switched off in this run (it flags the table: the answers in
it are the tasks' expected values), to see what the rest of rrsi does with the edit. Measured through the
platform: the table raises train and leaves gate (fresh seeds) where the seed harness is. The gate's
decision is printed, not asserted: at this size rrsi's gate accepts the edit (S is measured on train and
gate together, and the train gain pays for the table's tokens), so without the critic nothing of rrsi
stops memorizing here (docs/loop.md).
"""

from __future__ import annotations

import pytest
from django.core.management import call_command

from evolution.example.setup import example_recipe
from evolution.loop import lifecycle
from evolution.models import RUN_MOVING, Candidate, Evaluation, Experiment, Run, Trial
from evolution.recipes import parse_recipe, recipe_to_dict
from tests.conftest import wait_until

pytestmark = [
    pytest.mark.usefixtures("reasoning_gym_installed"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.slow,
]


def test_a_round_on_reasoning_gym_runs_in_a_worker_and_memorizing_does_not_reach_gate(
    start_worker, redis_url: str
) -> None:
    import evolution.proposers  # noqa: F401  (registers the rgym proposer)

    call_command("load_example", benchmark="reasoning-gym", tasks=1, verbosity=0)
    experiment = Experiment.objects.get(name="example-reasoning-gym")
    splits = dict(experiment.split_memberships.values_list("task__external_id", "split"))
    assert splits["gcd-1000"] == "train" and splits["gcd-2000"] == "gate" and splits["gcd-3000"] == "sealed"
    assert splits["lcm-4000"] == "heldout"
    assert experiment.benchmark.tasks.get(external_id="gcd-1000").expected["version"] == "0.1.25"

    data = recipe_to_dict(example_recipe(rounds=1, candidates=1, k=1, proposer="rgym"))
    data["proposal"]["params"] = {"edits": ["memory-answer-table"]}
    data["critique"] = {**data["critique"], "enabled": False}
    worker = start_worker(broker_url=redis_url)
    run = lifecycle.run_create(experiment=experiment, recipe=parse_recipe(data))

    def ended() -> bool:
        run.refresh_from_db()
        return run.status not in RUN_MOVING

    wait_until(ended, timeout=900, what=f"the run's end (worker log: {worker.log_path})")

    assert run.status == Run.Status.FINISHED, (run.stop_reason, worker.log()[-3000:])
    candidate = Candidate.objects.get(experiment=experiment, round=1)

    def mean(candidate: Candidate, split: str) -> float:
        scores = list(Trial.objects.filter(candidate=candidate, split=split).values_list("score", flat=True))
        return sum(s or 0.0 for s in scores) / len(scores)

    seed = experiment.seed_candidate
    assert seed is not None
    figures = {c.label or f"#{c.pk}": {s: mean(c, s) for s in ("train", "gate")} for c in (seed, candidate)}
    print(f"the memorizing candidate: gate decision {candidate.state}; mean scores {figures}")
    assert mean(candidate, "train") > mean(seed, "train")
    assert mean(candidate, "gate") == pytest.approx(mean(seed, "gate"))
    trials = Trial.objects.filter(evaluation__experiment=experiment)
    assert trials.exists() and not trials.filter(lease_owner__in=["", "inline"]).exists()
    assert not trials.exclude(state=Trial.State.DONE).exists()
    assert not Evaluation.objects.filter(experiment=experiment, state=Evaluation.State.FAILED).exists()
