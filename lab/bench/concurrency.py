"""Concurrency: dozens of waiting trials in flight on one 2-core host.

Real agents spend their time waiting on a model API. The agent here waits
2 s in four calls of 0.5 s (``sleep``, the stand-in for the model's latency)
and writes a short ATIF trajectory; the verifier is a shell line. The
trials go to the trial queue, served by a worker with a thread pool of
``slots`` threads (``--pool=threads``), and certification to the default
queue, served by a prefork worker of one process, both started here. The
clock runs from ``evaluation_start`` to the certified record; the ideal,
``trials x 2 s / slots`` (every slot busy waiting all the time, nothing
else costing anything), is printed beside it.

A sampler reads the resident memory of the trial worker and of everything
below it (the sandboxes, agents and verifiers of the slots) from /proc.
Then the same trials again with the slots split over two trial workers
under different hostnames (two hosts sharing one broker and database), and
the share each one ran.

Last, the floor: the first pass's trials run again through
``evolution.trials.run_trial`` alone, the function a slot calls, in as many
threads of this process as there were slots, with no Celery, claim, finish
or stored trajectory. What the sandboxed commands take by themselves on
this machine, at its speed of the moment, is then printed beside what the
platform took, once with every thread starting at once (as the slots fill
from a full queue) and once with the starts spread over one agent's time
(no two threads' commands starting together).

The trial workers ramp (``RSI_TRIAL_RAMP_SECONDS``, evolution/ramp.py):
their slots' first starts are spread over one agent's time, as the second
floor's threads are. Slots that start together stay together, round after
round, and their commands queue for the CPU at the same moments: the floor
started together is the slower one on every machine so far.

The verdict is the platform's own overhead: the first pass's wall time
over the faster of the two floors. On a 2-core machine the sandboxed
commands alone already take 1.16 to 1.20 of the ideal (issue 44), so the
ideal says how fast the machine is, the floor what the platform adds.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import threading
import time
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from dataclasses import astuple, dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import connection

from evolution import selectors
from evolution.models import CertifiedResult, Evaluation, Experiment, TrajectoryStep, Trial
from evolution.services import evaluation as evaluation_services
from lab.bench import BenchResult, Load, benchmark, load_meter
from lab.bench.memory import Periodic, rss_kib
from lab.bench.orchestration import SPLITS, trials_alone, wait_certified, with_bench_experiment, worker_start
from lab.processes import WorkerProcess as Worker
from lab.processes import process_stats
from rsiweb.settings import pool_size

# Four model calls of 0.5 s, a trajectory of the five steps, the answer.
CALL_SECONDS = 0.5
CALLS = 4
_STEP = (
    '{{"step_id": {n}, "source": "agent", "message": "call {c}", '
    '"metrics": {{"prompt_tokens": 10, "completion_tokens": 2}}}}'
)
_TRAJECTORY = (
    '{"schema_version": "ATIF-v1.5", "session_id": "bench-concurrency", "agent": {"name": "waiting", "version": "1"}, '
    '"steps": [{"step_id": 1, "source": "user", "message": "task"}, '
    + ", ".join(_STEP.format(n=call + 2, c=call + 1) for call in range(CALLS))
    + "]}"
)
WAITING_RUNNER_ARGV = [
    "/bin/sh",
    "-c",
    f"for call in {' '.join(str(c) for c in range(CALLS))}; do sleep {CALL_SECONDS}; done; "
    f"echo '{_TRAJECTORY}' > {{output}}/trajectory.json && "
    'tr -d "\\n" < {harness}/default.txt > {output}/answer.txt',
]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, from the kernel's children lists of
    each thread: a scan of every process on the host (``process_descendants``)
    four times a second would take a share of the two cores it measures."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as handle:
                    children = [int(child) for child in handle.read().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


@dataclass
class MemorySampler(Periodic):
    """Peak resident memory (KiB) of some workers and all their descendants."""

    workers: list[Worker]
    interval: float = 0.25
    peak: int = 0
    peak_workers: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        own = sum(rss_kib(worker.pid) for worker in self.workers)
        below = sum(rss_kib(pid) for worker in self.workers for pid in descendants(worker.pid))
        self.peak = max(self.peak, own + below)
        self.peak_workers = max(self.peak_workers, own)


@dataclass(frozen=True)
class CpuSeconds:
    """CPU time (user and system) used so far, from /proc/<pid>/stat."""

    workers: float  # the trial workers' own threads
    commands: float  # what they started and reaped: sandboxes, agents, verifiers
    postgres: float
    total: float  # every process of the machine, the other tenants' included

    def __sub__(self, other: CpuSeconds) -> CpuSeconds:
        return CpuSeconds(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu(worker_pids: list[int]) -> CpuSeconds:
    workers = commands = postgres = 0.0
    for pid, name, fields in process_stats():
        # Fields 14 to 17 of proc(5): utime, stime, cutime, cstime.
        utime, stime, cutime, cstime = (int(value) / _TICKS for value in fields[11:15])
        if pid in worker_pids:
            workers += utime + stime
            commands += cutime + cstime
        elif name == "postgres":
            postgres += utime + stime + cutime + cstime
    with open("/proc/stat", encoding="ascii") as stat:
        busy = [int(value) for value in stat.readline().split()[1:]]
    # user, nice, system, irq, softirq, steal: what was not idle or waiting on I/O.
    total = (sum(busy[:3]) + sum(busy[5:8])) / _TICKS
    return CpuSeconds(workers=workers, commands=commands, postgres=postgres, total=total)


@dataclass(frozen=True)
class Pass:
    """One measured pass: its wall time, memory and how the trials went."""

    evaluation_id: int
    seconds: float
    peak_kib: int
    peak_workers_kib: int
    trials: int
    errors: int
    attempts: int  # trials claimed more than once
    records: int  # certified records of the evaluation
    steps: int  # trajectory steps stored for its trials
    shares: dict[str, int]  # trials run by each trial worker's hostname
    cpu: CpuSeconds  # where the machine's CPU went during the pass
    timeline: Timeline
    load: Load


@dataclass(frozen=True)
class Timeline:
    """Where a pass's wall time went, from the trials' own timestamps (s)."""

    ramp: float  # from evaluation_start to the first trial's start
    span: float  # a trial's claim to its finish, mean
    agent: float  # the sandboxed agent's own wall time, mean
    idle: float  # a slot's idle time a trial between the first start and the last finish, mean
    tail: float  # from the last trial's finish to the certified record
    # Whether idle slots are spread over the run or bunched at its end: the
    # mean number of trials in flight from the moment every slot first held
    # one to the last trial's start, and from that start to the last finish.
    steady: float = 0.0
    drain: float = 0.0

    @classmethod
    def of(cls, trials: list[tuple[float, float, float]], slots: int, start: float, certified: float) -> Timeline:
        """``trials``: (started, finished, agent wall time), in seconds."""
        if not trials:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0)
        first = min(started for started, _, _ in trials)
        last = max(finished for _, finished, _ in trials)
        busy = sum(finished - started for started, finished, _ in trials)
        last_start = max(started for started, _, _ in trials)
        return cls(
            ramp=first - start,
            span=busy / len(trials),
            agent=sum(agent for _, _, agent in trials) / len(trials),
            idle=(slots * (last - first) - busy) / len(trials),
            tail=certified - last,
            steady=_mean_in_flight(trials, _first_full(trials, slots), last_start),
            drain=last - last_start,
        )


def _first_full(trials: list[tuple[float, float, float]], slots: int) -> float:
    """When ``slots`` trials were first in flight together (the last start if never)."""
    events = sorted([(started, 1) for started, _, _ in trials] + [(finished, -1) for _, finished, _ in trials])
    in_flight = 0
    for moment, change in events:
        in_flight += change
        if in_flight >= slots:
            return moment
    return max(started for started, _, _ in trials)


def _mean_in_flight(trials: list[tuple[float, float, float]], begin: float, end: float) -> float:
    """The mean number of trials in flight over [begin, end] (0 when empty)."""
    if end <= begin:
        return 0.0
    covered = sum(max(0.0, min(finished, end) - max(started, begin)) for started, finished, _ in trials)
    return covered / (end - begin)


def _measure(
    experiment: Experiment,
    trial_workers: list[Worker],
    all_workers: list[Worker],
    repeat: int,
    slots: int,
    around: AbstractContextManager[object] | None = None,
) -> Pass:
    """One evaluation through the running workers; ``around`` (another
    benchmark's meter) is entered for the same span as the clock."""
    pids = [worker.pid for worker in trial_workers]
    cpu_before = _cpu(pids)
    with around or nullcontext(), load_meter() as load, MemorySampler(workers=trial_workers) as sampler:
        start = time.time()
        evaluation = evaluation_services.evaluation_start(
            candidate=selectors.experiment_seed(experiment),
            splits=SPLITS,
            purpose=Evaluation.Purpose.NOISE,
            repeat=repeat,
        )
        certified = wait_certified(evaluation, timeout=600, workers=all_workers)
    cpu = _cpu(pids) - cpu_before
    trials = Trial.objects.filter(evaluation=evaluation)
    by_pid = {str(worker.pid): worker.hostname for worker in trial_workers}
    shares = Counter(by_pid.get(owner.split(":")[1], owner) for owner in trials.values_list("lease_owner", flat=True))
    return Pass(
        evaluation_id=evaluation.pk,
        seconds=certified - start,
        peak_kib=sampler.peak,
        peak_workers_kib=sampler.peak_workers,
        trials=trials.count(),
        errors=trials.filter(outcome=Trial.Outcome.ERROR).count(),
        attempts=trials.filter(attempt__gt=1).count(),
        records=CertifiedResult.objects.filter(evaluation=evaluation).count(),
        steps=TrajectoryStep.objects.filter(trajectory__trial__evaluation=evaluation).count(),
        shares=dict(sorted(shares.items())),
        cpu=cpu,
        load=load[0],
        timeline=Timeline.of(
            [
                (started.timestamp(), finished.timestamp(), wall or 0.0)
                for started, finished, wall in trials.values_list("started_at", "finished_at", "wall_time")
                if started is not None and finished is not None
            ],
            slots,
            start,
            certified,
        ),
    )


@dataclass(frozen=True)
class Floor:
    """The trials' commands alone (``_floor``): wall time, errors, CPU."""

    seconds: float
    errors: int
    cpu: CpuSeconds
    load: Load


def _floor(evaluation_id: int, slots: int, scratch: Path, *, spread: float) -> Floor:
    """Run the trials of an evaluation again through ``run_trial`` alone in
    ``slots`` threads of this process (``trials_alone``), taking them in
    order, thread ``i`` starting ``i * spread / slots`` seconds after the
    first. Each trial's inputs are written by the worker's own
    ``trial_spec`` before the clock starts."""
    trials = Trial.objects.filter(evaluation_id=evaluation_id).select_related(
        "task", "evaluation__experiment__evaluator", "candidate"
    )
    work = []
    for trial in trials.order_by("pk"):
        root = Path(tempfile.mkdtemp(prefix=f"floor-{trial.pk}-", dir=scratch))
        work.append((evaluation_services.trial_spec(trial, root / "inputs"), root))
    cpu_before = _cpu([os.getpid()])
    with load_meter() as load:
        seconds, outcomes = trials_alone(work, threads=slots, spread=spread)
    errors = sum(1 for outcome in outcomes if outcome.startswith("error"))
    return Floor(seconds=seconds, errors=errors, cpu=_cpu([os.getpid()]) - cpu_before, load=load[0])


def _trial_worker_env(slots: int, ramp: float = 0.0) -> dict[str, str]:
    """A trial worker's database connections (on PostgreSQL a pool its
    threads share, as docs/deployment.md sizes it, one a thread on SQLite)
    and its ramp (``RSI_TRIAL_RAMP_SECONDS``)."""
    env = {"RSI_TRIAL_RAMP_SECONDS": f"{ramp:g}"}
    if connection.vendor == "postgresql" and importlib.util.find_spec("psycopg_pool") is not None:
        env["RSI_DB_POOL_SIZE"] = str(pool_size(slots))
    return env


def run_with(
    hosts: list[int],
    experiment: Experiment,
    scratch: Path,
    repeat: int,
    around: AbstractContextManager[object] | None = None,
    ramp: float = 0.0,
) -> Pass:
    """One pass with one trial worker per entry of ``hosts`` (its slots) and
    a prefork worker of one process for certification; ``around`` as for
    ``_measure``; ``ramp``: the trial workers' ``RSI_TRIAL_RAMP_SECONDS``."""
    workers: list[Worker] = []
    try:
        workers.append(worker_start(log_dir=scratch, concurrency=1, queues="celery"))
        trial_workers = [
            worker_start(
                log_dir=scratch,
                concurrency=slots,
                pool="threads",
                queues=settings.RSI_TRIAL_QUEUE,
                hostname=f"bench-host-{chr(ord('a') + number)}-{experiment.pk}",
                extra_env=_trial_worker_env(slots, ramp),
            )
            for number, slots in enumerate(hosts)
        ]
        workers += trial_workers
        return _measure(experiment, trial_workers, workers, repeat, sum(hosts), around)
    finally:
        for worker in workers:
            worker.stop()


@benchmark(
    "concurrency",
    "640 trials of an agent waiting 2 s in 64 trial slots (thread pool), vs the same trials' sandboxed commands "
    "alone in 64 threads (the floor)",
    quick={"trials": 64, "slots": 16},
)
def concurrency(*, trials: int = 640, slots: int = 64) -> BenchResult:
    k = 2
    tasks = max(1, trials // k)
    agent_seconds = CALLS * CALL_SECONDS
    ideal = tasks * k * agent_seconds / slots

    def body(experiment: Experiment, scratch: Path) -> BenchResult:
        # The trial workers spread their slots' first starts over one agent's
        # time, as the second floor spreads its threads' (evolution/ramp.py).
        one = run_with([slots], experiment, scratch, repeat=0, ramp=agent_seconds)
        two = run_with([slots // 2, slots - slots // 2], experiment, scratch, repeat=1, ramp=agent_seconds)
        together = _floor(one.evaluation_id, slots, scratch, spread=0.0)
        spread = _floor(one.evaluation_id, slots, scratch, spread=agent_seconds)
        best = min(together.seconds, spread.seconds)
        per = 1000 / (tasks * k)
        mib = 1024.0
        shares = ", ".join(
            f"{host} {count} ({100 * count / max(1, two.trials):.0f} %)" for host, count in two.shares.items()
        )
        return BenchResult(
            ratio=one.seconds / best,
            target=1.03,
            label="concurrency: one trial worker's wall time / the faster floor",
            lines=[
                f"trials: {tasks * k} ({tasks} tasks x k={k}), an agent of {CALLS} calls of {CALL_SECONDS} s and a "
                f"5-step trajectory; {slots} trial slots (thread pool); ideal {ideal:.1f} s",
                f"broker: {settings.CELERY_BROKER_URL.split('://')[0]}; database: {connection.vendor}; "
                f"connections of a trial worker: {_trial_worker_env(slots).get('RSI_DB_POOL_SIZE', 'one a thread')}"
                f" (RSI_DB_POOL_SIZE); its slots' first starts spread over {agent_seconds:g} s "
                "(RSI_TRIAL_RAMP_SECONDS, one agent's time, as the second floor's)",
                f"one trial worker:  {one.seconds:7.2f} s ({one.seconds / ideal:.3f} x ideal), {one.errors} errors, "
                f"{one.attempts} retried, {one.records} certified record, {one.steps} trajectory steps stored; "
                f"{one.load.text()}",
                f"  memory: peak {one.peak_kib / mib:.1f} MiB for the worker and everything its {slots} slots ran "
                f"(the worker process alone {one.peak_workers_kib / mib:.1f} MiB)",
                f"two trial workers of {slots // 2} + {slots - slots // 2} slots: {two.seconds:7.2f} s "
                f"({two.seconds / ideal:.3f} x ideal), {two.errors} errors, {two.attempts} retried, "
                f"{two.records} certified record; peak {two.peak_kib / mib:.1f} MiB together; {two.load.text()}",
                f"  shares: {shares}",
                *(
                    f"CPU a trial ({name}): trial workers {per * p.cpu.workers:.1f} ms, their commands "
                    f"{per * p.cpu.commands:.1f} ms, PostgreSQL {per * p.cpu.postgres:.1f} ms; the machine "
                    f"{per * p.cpu.total:.1f} ms of {(os.cpu_count() or 1) * per * p.seconds:.1f} ms of core time"
                    for name, p in (("one worker", one), ("two workers", two))
                ),
                *(
                    f"time ({name}): {p.timeline.ramp:.2f} s to the first trial's start; a trial "
                    f"{p.timeline.span:.3f} s from claim to finish (its agent {p.timeline.agent:.3f} s); "
                    f"a slot idle {p.timeline.idle:.3f} s a trial; {p.timeline.steady:.1f} trials in flight "
                    f"on average from the slots' first filling to the last start, then {p.timeline.drain:.2f} s "
                    f"from the last start to the last finish; {p.timeline.tail:.2f} s from the last finish "
                    "to the certified record"
                    for name, p in (("one worker", one), ("two workers", two))
                ),
                f"the floor, the same {tasks * k} trials through run_trial alone in {slots} threads of this "
                f"process (no Celery, claim, finish or stored trajectory): {together.seconds:.2f} s "
                f"({together.seconds / ideal:.3f} x ideal) starting together, {spread.seconds:.2f} s "
                f"({spread.seconds / ideal:.3f} x ideal) with the starts spread over {agent_seconds:g} s; "
                f"{together.errors + spread.errors} errors",
                f"  the floor starting together: {together.load.text()}",
                f"  the floor with the starts spread: {spread.load.text()}",
                *(
                    f"  CPU a trial ({name}): this process {per * f.cpu.workers:.1f} ms, the commands "
                    f"{per * f.cpu.commands:.1f} ms; the machine {per * f.cpu.total:.1f} ms"
                    for name, f in (("together", together), ("spread", spread))
                ),
                f"the platform's share: one trial worker took {one.seconds - best:.2f} s "
                f"({(one.seconds - best) / ideal:.3f} x ideal) more than the faster floor",
            ],
            checks={
                "every trial certified once, no errors": (
                    one.records == two.records == 1 and one.errors == two.errors == 0 and one.trials == tasks * k
                ),
                "every trajectory stored": one.steps == two.steps == tasks * k * (CALLS + 1),
                "memory under 1.5 GiB": one.peak_kib < 1.5 * mib * mib,
                "both hosts ran trials": len(two.shares) == 2 and min(two.shares.values()) > 0,
                "the floor's trials ran without errors": together.errors == spread.errors == 0,
            },
        )

    return with_bench_experiment("concurrency", tasks, k, body, shell=True, runner_argv=WAITING_RUNNER_ARGV)
