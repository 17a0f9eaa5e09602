"""Trial slots apart from CPU cores, and the limits on trials in flight.

Trials go to their own queue, which a worker with a thread pool serves: a
slot only waits on its sandboxed agent, so a 2-core host holds many. The
limits (per experiment, per model endpoint) are counted in the database,
so they hold across every worker process.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.db import connection

from evolution import selectors
from evolution.models import CertifiedResult, Evaluation, Experiment, ModelEndpoint, Trial
from evolution.services import evaluation as evaluation_services
from evolution.services.experiments import evaluator_upsert
from tests.conftest import wait_until
from tests.evolution.test_trials import trial_python
from tests.factories import TINY_AGENT, make_tiny_experiment, seed_of, tiny_evaluator_tree


def _with_agent(experiment: Experiment, prelude: str, env_allowlist: list[str] | None = None) -> None:
    """Give ``experiment`` the tiny evaluator whose agent runs ``prelude`` first."""
    evaluator = evaluator_upsert(
        name=f"tiny-{experiment.pk}-agent",
        files=tiny_evaluator_tree(agent=prelude + TINY_AGENT),
        runner_argv=experiment.evaluator.runner_argv,
        verifier_argv=experiment.evaluator.verifier_argv,
        env_allowlist=env_allowlist or ["PATH"],
        timeout_seconds=30,
    )
    Experiment.objects.filter(pk=experiment.pk).update(evaluator=evaluator)


def _max_overlap(intervals: Sequence[tuple[datetime, datetime] | tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = current = 0
    for _, step in events:
        current += step
        best = max(best, current)
    return best


def _certified(evaluation: Evaluation) -> bool:
    evaluation.refresh_from_db()
    return evaluation.state in {Evaluation.State.CERTIFIED, Evaluation.State.FAILED}


def _report(evaluation: Evaluation, *workers: Any) -> str:
    rows = list(Trial.objects.filter(evaluation=evaluation).values_list("state", "attempt", "error")[:5])
    logs = "\n".join(f"--- {w.hostname}:\n{w.log()[-2000:]}" for w in workers)
    return f"evaluation {evaluation.state}; trials {rows}\n{logs}"


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_thread_pool_worker_holds_more_trials_at_once_than_pool_processes_and_cores(
    start_worker: Any, redis_url: str
) -> None:
    """A prefork worker of one process on the default queue and a trial
    worker of 8 threads: 16 trials whose agent sleeps 2 s run 8 at a time
    (more than the prefork processes and this machine's cores), and the
    evaluation is certified once with every trial's first attempt."""
    cores = os.cpu_count() or 1
    slots = max(8, cores + 2)
    experiment = make_tiny_experiment(tasks=8, k=2)
    _with_agent(experiment, "import time\ntime.sleep(2)\n")
    default = start_worker(broker_url=redis_url, concurrency=1, queues="celery")
    trials = start_worker(broker_url=redis_url, concurrency=slots, pool="threads", queues="trials")

    began = time.monotonic()
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=sorted(experiment.split_digests)
    )
    wait_until(lambda: _certified(evaluation), timeout=120, what="certification",
               diagnose=lambda: _report(evaluation, default, trials))  # fmt: skip
    wall = time.monotonic() - began

    assert evaluation.state == Evaluation.State.CERTIFIED, _report(evaluation, default, trials)
    rows = list(
        Trial.objects.filter(evaluation=evaluation).values_list("started_at", "finished_at", "attempt", "state")
    )
    assert len(rows) == 16
    assert {(attempt, state) for _, _, attempt, state in rows} == {(1, Trial.State.DONE)}
    intervals = [(started, finished) for started, finished, _, _ in rows if started and finished]
    assert len(intervals) == 16
    overlap = _max_overlap(intervals)
    assert overlap > max(cores, 1), f"at most {overlap} trials at once with {slots} slots"
    assert overlap >= slots - 2, f"at most {overlap} trials at once with {slots} slots"
    # 16 trials of 2 s one at a time would take 32 s; in 8 slots about 4 s.
    assert wall < 20, wall
    record = CertifiedResult.objects.get(experiment=experiment)
    assert len(record.payload["trials"]) == 16
    # Every trial ran in the thread pool (a claim names its thread), none on the prefork worker.
    owners = set(Trial.objects.filter(evaluation=evaluation).values_list("lease_owner", flat=True))
    assert all(owner.count(":") == 2 for owner in owners), owners
    assert len(owners) >= slots - 2, owners


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_trials_that_outlive_a_third_of_their_lease_finish_in_more_slots_than_database_connections(
    postgres: None, start_worker: Any, redis_url: str
) -> None:
    """A trial worker's slots share a pool of fewer connections than slots,
    and real agents run far longer than a third of the lease, when the lease
    is first renewed. A renewal must give its connection back: when each
    trial's renewals kept one to the trial's end, the renewals held the whole
    pool, the finishes waited for it until the pool's timeout, and the
    evaluation never ended (seen: 6 of 12 trials still running after 240 s,
    33 PoolTimeout errors in the worker's log)."""
    slots, pool = 6, 4
    experiment = make_tiny_experiment(tasks=6, k=2)
    # A lease of 2 s, renewed every 0.67 s: an agent of 3 s is renewed four times.
    _with_agent(experiment, "import time\ntime.sleep(3)\n")
    lease = {"RSI_TRIAL_LEASE_SECONDS": "2", "RSI_DB_POOL_SIZE": str(pool), "RSI_DB_POOL_TIMEOUT": "15"}
    default = start_worker(broker_url=redis_url, concurrency=1, queues="celery")
    trials = start_worker(broker_url=redis_url, concurrency=slots, pool="threads", queues="trials", extra_env=lease)
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=sorted(experiment.split_digests)
    )
    wait_until(lambda: _certified(evaluation), timeout=90, what="certification",
               diagnose=lambda: _report(evaluation, default, trials))  # fmt: skip
    assert evaluation.state == Evaluation.State.CERTIFIED, _report(evaluation, default, trials)
    rows = list(Trial.objects.filter(evaluation=evaluation).values_list("attempt", "state"))
    assert sorted(rows) == [(1, Trial.State.DONE)] * 12, rows
    times = Trial.objects.filter(evaluation=evaluation).values_list("started_at", "finished_at")
    intervals = [(started, finished) for started, finished in times if started and finished]
    assert len(intervals) == 12
    assert _max_overlap(intervals) > pool, "the slots never held more trials than the pool has connections"
    assert "PoolTimeout" not in trials.log()


@pytest.mark.django_db
def test_a_trial_is_held_back_at_its_experiments_limit_and_claimed_once_a_slot_frees(settings: Any) -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    Experiment.objects.filter(pk=experiment.pk).update(max_trials_in_flight=1)
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=sorted(experiment.split_digests)
    )
    first, second = Trial.objects.filter(evaluation=evaluation).order_by("pk")
    before = second.lease_expires_at

    claimed = evaluation_services.trial_claim(trial_id=first.pk, owner="a")
    assert claimed is not None
    with pytest.raises(evaluation_services.TrialHeldBack, match="its experiment has 1 trial"):
        evaluation_services.trial_claim(trial_id=second.pk, owner="b")
    second.refresh_from_db()
    assert (second.state, second.attempt, second.lease_owner) == (Trial.State.PENDING, 0, "")
    assert second.lease_expires_at is not None and before is not None and second.lease_expires_at >= before
    assert selectors.trials_in_flight(experiment_id=experiment.pk) == 1

    assert evaluation_services.trial_execute(trial_id=first.pk, owner="a") is False  # held by "a" already
    Trial.objects.filter(pk=first.pk).update(state=Trial.State.DONE)
    again = evaluation_services.trial_claim(trial_id=second.pk, owner="b")
    assert again is not None and again.lease_owner == "b"


@pytest.mark.django_db
def test_a_finished_trial_sends_one_held_back_trial_of_its_endpoint_at_once(
    monkeypatch: pytest.MonkeyPatch, django_assert_num_queries: Any
) -> None:
    sent: list[list[int]] = []
    monkeypatch.setattr(evaluation_services, "_enqueue_trials", lambda ids: sent.append(list(ids)))
    endpoint = ModelEndpoint.objects.create(name="one-at-a-time", max_in_flight=1)
    experiment = make_tiny_experiment(tasks=3, k=1)
    Experiment.objects.filter(pk=experiment.pk).update(endpoint=endpoint)
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=sorted(experiment.split_digests)
    )
    first, second, third = Trial.objects.filter(evaluation=evaluation).order_by("pk")
    assert evaluation_services.trial_claim(trial_id=first.pk, owner="w1") is not None
    for waiting in (second, third):
        with pytest.raises(evaluation_services.TrialHeldBack):
            evaluation_services.trial_claim(trial_id=waiting.pk, owner="w2")
    # Its claim given back, the first is run through: the oldest trial the limit held back is sent as it
    # ends, not after that trial's backoff.
    Trial.objects.filter(pk=first.pk).update(state=Trial.State.PENDING, lease_owner="", attempt=0)
    sent.clear()
    assert evaluation_services.trial_execute(trial_id=first.pk, owner="w1") is True
    assert Trial.objects.get(pk=first.pk).state == Trial.State.DONE
    assert sent == [[second.pk]]

    # Without a limit nothing waits, and finding that out costs no query.
    unlimited = Trial.objects.select_related("evaluation__experiment").get(pk=first.pk)
    unlimited.evaluation.experiment.endpoint_id = None
    with django_assert_num_queries(0):
        assert evaluation_services.held_back_wake(trial=unlimited) is None


@pytest.mark.django_db
def test_a_model_endpoints_limit_is_shared_by_every_experiment_calling_it() -> None:
    endpoint = ModelEndpoint.objects.create(name="provider-x", max_in_flight=2)
    one, two = make_tiny_experiment(tasks=2, k=1), make_tiny_experiment(tasks=2, k=1)
    Experiment.objects.filter(pk__in=[one.pk, two.pk]).update(endpoint=endpoint)
    other = make_tiny_experiment(tasks=2, k=1)  # no endpoint: not limited by it
    ids = []
    for experiment in (one, two, other):
        evaluation = evaluation_services.evaluation_start(
            candidate=seed_of(experiment), splits=sorted(experiment.split_digests)
        )
        ids.append(list(Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True)))

    assert evaluation_services.trial_claim(trial_id=ids[0][0], owner="w1") is not None
    assert evaluation_services.trial_claim(trial_id=ids[1][0], owner="w2") is not None
    with pytest.raises(evaluation_services.TrialHeldBack, match="model endpoint has 2"):
        evaluation_services.trial_claim(trial_id=ids[1][1], owner="w2")
    assert evaluation_services.trial_claim(trial_id=ids[2][0], owner="w3") is not None
    assert selectors.trials_in_flight(endpoint_id=endpoint.pk) == 2


class _CountingEndpoint:
    """A real HTTP server standing in for a model API: each request takes
    ``delay`` seconds, and the most requests it held at once is kept.

    A call is open from the handler's start to the moment it decides to
    answer, taken before the answer is written: the agent can start its next
    call (or its trial end and another trial's begin) only after reading the
    answer, so a handler thread the machine is slow to schedule again after
    writing cannot make two calls that never overlapped look as if they did."""

    def __init__(self, delay: float) -> None:
        self.lock = threading.Lock()
        self.intervals: list[tuple[float, float]] = []
        counter = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                started = time.monotonic()
                time.sleep(delay)
                with counter.lock:
                    counter.intervals.append((started, time.monotonic()))
                body = b'{"choices": [{"message": {"content": "ok"}}]}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat/completions"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def calls(self) -> int:
        with self.lock:
            return len(self.intervals)

    @property
    def most(self) -> int:
        with self.lock:
            return _max_overlap(list(self.intervals))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def counting_endpoint() -> Iterator[_CountingEndpoint]:
    endpoint = _CountingEndpoint(delay=0.4)
    yield endpoint
    endpoint.close()


# Two calls to the model a trial (the stand-in for an agent's turns).
CALLING_AGENT = """import os, urllib.request
for _ in range(2):
    urllib.request.urlopen(urllib.request.Request(os.environ["RSI_STUB_URL"], data=b"{}"), timeout=30).read()
"""


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_model_endpoints_limit_holds_across_two_worker_processes(
    start_worker: Any, redis_url: str, counting_endpoint: _CountingEndpoint
) -> None:
    """Two trial workers of 6 slots each (different hostnames, as two hosts)
    and an endpoint limited to 3: the stub endpoint never sees more than 3
    calls at once, though the workers together had 12 slots, and both
    workers ran trials."""
    limit = 3
    endpoint = ModelEndpoint.objects.create(name="stub", max_in_flight=limit)
    experiment = make_tiny_experiment(tasks=9, k=2)
    _with_agent(experiment, CALLING_AGENT, env_allowlist=["PATH", "RSI_STUB_URL"])
    Experiment.objects.filter(pk=experiment.pk).update(endpoint=endpoint)
    # The agent calls the network: no bubblewrap (it would take the network away). A root
    # worker then runs it as a uid of its own, which must reach the interpreter: not one
    # inside a 0700 checkout (a clone in `mktemp -d`, say).
    env = {
        "RSI_SANDBOX": "off",
        "RSI_PYTHON": trial_python(),
        "RSI_STUB_URL": counting_endpoint.url,
        "RSI_TRIAL_DEFER_SECONDS": "0.2",
    }
    default = start_worker(broker_url=redis_url, concurrency=1, queues="celery", extra_env=env)
    hosts = [
        start_worker(broker_url=redis_url, concurrency=6, pool="threads", queues="trials", extra_env=env, hostname=h)
        for h in ("host-a", "host-b")
    ]

    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=sorted(experiment.split_digests)
    )
    wait_until(lambda: _certified(evaluation), timeout=180, what="certification",
               diagnose=lambda: _report(evaluation, default, *hosts))  # fmt: skip

    assert evaluation.state == Evaluation.State.CERTIFIED, _report(evaluation, default, *hosts)
    assert counting_endpoint.calls == 36
    assert counting_endpoint.most <= limit, f"{counting_endpoint.most} calls at once past the limit of {limit}"
    # The limit is what bounded it, not a lack of slots or of work.
    assert counting_endpoint.most == limit
    pids = {
        owner.split(":")[1]
        for owner in Trial.objects.filter(evaluation=evaluation).values_list("lease_owner", flat=True)
    }
    assert pids == {str(worker.pid) for worker in hosts}
    assert set(Trial.objects.filter(evaluation=evaluation).values_list("attempt", "state")) == {(1, Trial.State.DONE)}


@pytest.mark.django_db(transaction=True)
def test_an_in_process_driver_waits_for_a_held_back_trial_instead_of_failing(settings: Any) -> None:
    """Workers elsewhere hold the endpoint's one slot; the in-process driver
    waits until it frees, then runs the trial."""
    settings.RSI_TRIAL_DEFER_SECONDS = 0.1
    endpoint = ModelEndpoint.objects.create(name="one-slot", max_in_flight=1)
    experiment = make_tiny_experiment(tasks=2, k=1)
    Experiment.objects.filter(pk=experiment.pk).update(endpoint=endpoint)
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=sorted(experiment.split_digests)
    )
    elsewhere, mine = Trial.objects.filter(evaluation=evaluation).order_by("pk")
    assert evaluation_services.trial_claim(trial_id=elsewhere.pk, owner="another-host") is not None
    with pytest.raises(evaluation_services.TrialHeldBack):
        evaluation_services.trial_execute(trial_id=mine.pk, owner="inline")

    def free_the_slot() -> None:
        time.sleep(0.5)
        try:
            Trial.objects.filter(pk=elsewhere.pk).update(state=Trial.State.DONE)
        finally:
            connection.close()

    freer = threading.Thread(target=free_the_slot)
    freer.start()
    began = time.monotonic()
    assert evaluation_services.trial_execute_in_process(trial_id=mine.pk, owner="inline") is True
    freer.join()
    assert time.monotonic() - began >= 0.5
    mine.refresh_from_db()
    assert (mine.state, mine.attempt, mine.lease_owner) == (Trial.State.DONE, 1, "inline")
