"""End to end through real Celery worker processes.

The seed of the bundled example is evaluated on every split by a worker
started as a separate process (embedded file-system broker, and Redis),
certified, and verified by ``verify_records`` run as a separate process too.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import Any

import pytest
from django.core.management import call_command

from evolution.models import CertifiedResult, Evaluation, Experiment, Trial
from evolution.services import evaluation as evaluation_services
from evolution.services.experiments import evaluator_upsert
from tests.conftest import REPO_ROOT, database_url_for_subprocess, wait_until
from tests.factories import TINY_AGENT, make_tiny_experiment, seed_of, tiny_evaluator_tree

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def evaluation_state(evaluation: Evaluation) -> str:
    evaluation.refresh_from_db()
    return evaluation.state


def verify_records_in_a_subprocess(experiment: Experiment) -> subprocess.CompletedProcess[str]:
    env = {"DATABASE_URL": database_url_for_subprocess(), "PATH": "/usr/bin:/bin"}
    import os

    env.update({k: v for k, v in os.environ.items() if k.startswith("RSI_") or k in {"HOME", "LANG"}})
    return subprocess.run(
        [sys.executable, "manage.py", "verify_records", "--experiment", str(experiment.pk)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("broker", ["embedded", "redis"])
def test_example_seed_is_evaluated_certified_and_verified_through_a_worker(
    broker: str, request: pytest.FixtureRequest, start_worker
) -> None:
    broker_url = request.getfixturevalue("redis_url") if broker == "redis" else None
    call_command("load_example", verbosity=0)
    experiment = Experiment.objects.get(name="example-routing")
    tasks = experiment.split_memberships.count()
    k = experiment.trials_per_task

    worker = start_worker(broker_url=broker_url)
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment),
        splits=["train", "gate", "sealed"],
        purpose=Evaluation.Purpose.BASELINE,
    )
    wait_until(
        lambda: evaluation_state(evaluation) in {Evaluation.State.CERTIFIED, Evaluation.State.FAILED},
        timeout=300,
        what=f"certification (worker log: {worker.log_path})",
    )

    assert evaluation.state == Evaluation.State.CERTIFIED, worker.log()[-3000:]
    trials = Trial.objects.filter(evaluation=evaluation)
    assert trials.count() == tasks * k
    assert not trials.exclude(state=Trial.State.DONE).exists(), list(
        trials.exclude(state=Trial.State.DONE).values_list("error_kind", "error")[:3]
    )
    outcomes = set(trials.values_list("outcome", flat=True))
    assert outcomes == {"pass", "fail"}
    assert not trials.filter(tokens__isnull=True).exists()
    record = CertifiedResult.objects.get(experiment=experiment)
    assert len(record.payload["trials"]) == tasks * k
    assert sorted(record.payload["task_sets"]) == ["gate", "sealed", "train"]

    verified = verify_records_in_a_subprocess(experiment)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert f"{tasks * k} trial(s)" in verified.stdout


def trial_report(evaluation: Evaluation, *workers: Any) -> str:
    """The state an evaluation reached, for a failure message."""
    evaluation.refresh_from_db()
    rows = Counter(Trial.objects.filter(evaluation=evaluation).values_list("state", "attempt", "error_kind").order_by())
    logs = "\n".join(f"--- worker {w.hostname}:\n{w.log()[-2500:]}" for w in workers)
    progress = f"{evaluation.trials_finished}/{evaluation.trials_total}"
    error = f" ({evaluation.error})" if evaluation.error else ""
    return f"evaluation {evaluation.state}{error} {progress}; trials (state, attempt, error) {rows}\n{logs}"


def test_a_trial_that_outlives_its_lease_is_not_taken_over_while_its_worker_lives(start_worker) -> None:
    """The worker renews the lease while the agent runs: a trial slower
    than the lease keeps its first claim (no stolen, repeated attempts)."""
    experiment = make_tiny_experiment(tasks=4, k=1)
    slow = evaluator_upsert(
        name="tiny-slow",
        files=tiny_evaluator_tree(agent="import time\ntime.sleep(2.5)\n" + TINY_AGENT),
        runner_argv=experiment.evaluator.runner_argv,
        verifier_argv=experiment.evaluator.verifier_argv,
        env_allowlist=["PATH"],
        timeout_seconds=30,
    )
    Experiment.objects.filter(pk=experiment.pk).update(evaluator=slow)
    worker = start_worker(extra_env={"RSI_TRIAL_LEASE_SECONDS": "1", "RSI_REAPER_INTERVAL": "1"}, beat=True)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train", "gate"])
    wait_until(
        lambda: evaluation_state(evaluation) == Evaluation.State.CERTIFIED,
        timeout=120,
        what="certification",
        diagnose=lambda: trial_report(evaluation, worker),
    )
    trials = Trial.objects.filter(evaluation=evaluation)
    assert set(trials.values_list("attempt", flat=True)) == {1}, trial_report(evaluation, worker)
    assert set(trials.values_list("outcome", flat=True)) <= {Trial.Outcome.PASS, Trial.Outcome.FAIL}


def test_a_worker_killed_mid_evaluation_is_replaced_and_nothing_is_lost(start_worker, settings) -> None:
    """SIGKILL the worker while trials run; a new worker with the reaper
    finishes the evaluation, and the record equals an uninterrupted run's.

    The killed worker may hold prefetched, unacknowledged messages (on Redis
    they come back only after the visibility timeout, an hour): the reaper
    sends those pending trials again once their dispatch lease, set here by
    ``evaluation_start`` in this process, expires, so this process uses the
    workers' short lease too."""
    lease = {"RSI_TRIAL_LEASE_SECONDS": "3", "RSI_REAPER_INTERVAL": "1"}
    settings.RSI_TRIAL_LEASE_SECONDS = 3
    control = make_tiny_experiment(tasks=12, k=2, name="control")
    crashed = make_tiny_experiment(tasks=12, k=2, name="crashed")

    worker = start_worker(extra_env=lease, beat=True)
    control_eval = evaluation_services.evaluation_start(candidate=seed_of(control), splits=["train", "gate"])
    wait_until(lambda: evaluation_state(control_eval) == Evaluation.State.CERTIFIED, timeout=120, what="control")

    crash_eval = evaluation_services.evaluation_start(candidate=seed_of(crashed), splits=["train", "gate"])
    wait_until(
        lambda: Trial.objects.filter(evaluation=crash_eval, state=Trial.State.DONE).exists(),
        timeout=60,
        interval=0.05,
        what="the first finished trial",
    )
    worker.kill()
    assert evaluation_state(crash_eval) == Evaluation.State.RUNNING

    replacement = start_worker(extra_env=lease, beat=True)
    wait_until(
        lambda: evaluation_state(crash_eval) == Evaluation.State.CERTIFIED,
        timeout=180,
        what="recovery",
        diagnose=lambda: trial_report(crash_eval, worker, replacement),
    )

    control_trials = CertifiedResult.objects.get(experiment=control).payload["trials"]
    crashed_trials = CertifiedResult.objects.get(experiment=crashed).payload["trials"]
    assert crashed_trials == control_trials
    assert Trial.objects.filter(evaluation=crash_eval, state=Trial.State.DONE).count() == crash_eval.trials_total
