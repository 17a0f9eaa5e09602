"""Memory: the resident memory of a worker evaluating many trials stays flat.

One worker (main process and two pool processes, started here) evaluates
the seed of a throwaway experiment again and again (repeat evaluations of
``batch`` trials each, certified one after the other) until ``trials``
trials have run. A sampler reads VmRSS of the worker's main process and of
its pool processes from /proc every ``interval`` seconds. The figure is the
peak after the first ``checkpoint`` trials over the peak up to them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from evolution import selectors
from evolution.models import Evaluation, Experiment, Trial
from evolution.services import evaluation as evaluation_services
from lab.bench import BenchResult, benchmark, stopwatch
from lab.bench.orchestration import SPLITS, wait_certified, with_bench_experiment, worker_start
from lab.processes import WorkerProcess as Worker


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (the worker's pool processes), from /proc."""
    children = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        if int(stat[stat.rindex(b")") + 2 :].split()[1]) == pid:
            children.append(int(name))
    return children


class Periodic:
    """Calls ``sample()`` every ``interval`` seconds in a background thread between ``__enter__`` and
    ``__exit__`` (the subclass gives ``interval``, ``_stop`` and ``sample``); the thread's database
    connection is closed when it ends."""

    interval: float
    _stop: threading.Event

    def sample(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        from django.db import connection

        try:
            while not self._stop.wait(self.interval):
                self.sample()
        finally:
            connection.close()

    def __enter__(self) -> Self:
        self.thread = threading.Thread(target=self.run, name="rss-sampler", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.thread.join()


@dataclass
class Sampler(Periodic):
    """Samples (trials finished, worker RSS in KiB) in a background thread."""

    worker: Worker
    experiment: Experiment
    interval: float = 0.5
    samples: list[tuple[int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        finished = Trial.objects.filter(
            evaluation__experiment=self.experiment, state__in=[Trial.State.DONE, Trial.State.ERROR]
        ).count()
        main = self.worker.process.pid
        # The pool processes are the worker's direct children; the trials'
        # own processes are the pool processes' children and are not counted.
        total = rss_kib(main) + sum(rss_kib(child) for child in child_pids(main))
        self.samples.append((finished, total))


@benchmark(
    "memory",
    "worker resident memory over 10,000 trials: peak after the first 1,000 / peak up to them",
    quick={"trials": 40, "checkpoint": 20, "batch": 20},
)
def memory_benchmark(*, trials: int = 10_000, checkpoint: int = 1_000, batch: int = 1_000) -> BenchResult:
    k = 2
    tasks = max(1, batch // k)
    evaluations = max(1, -(-trials // (tasks * k)))

    def body(experiment: Experiment, scratch: Path) -> BenchResult:
        worker = worker_start(log_dir=scratch, concurrency=2)
        try:
            with stopwatch() as elapsed, Sampler(worker=worker, experiment=experiment) as sampler:
                for repeat in range(evaluations):
                    evaluation = evaluation_services.evaluation_start(
                        candidate=selectors.experiment_seed(experiment),
                        splits=SPLITS,
                        purpose=Evaluation.Purpose.NOISE,
                        repeat=repeat,
                    )
                    wait_certified(evaluation, timeout=120 + 2 * tasks * k, workers=[worker], poll=0.2)
                sampler.sample()
        finally:
            worker.stop()
        ran = Trial.objects.filter(evaluation__experiment=experiment)
        errors = ran.filter(outcome=Trial.Outcome.ERROR).count()
        certified = Evaluation.objects.filter(experiment=experiment, state=Evaluation.State.CERTIFIED).count()
        early = [rss for finished, rss in sampler.samples if finished <= checkpoint]
        late = [rss for finished, rss in sampler.samples if finished > checkpoint]
        at_checkpoint = max(early) if early else sampler.samples[0][1]
        at_end = max(late) if late else at_checkpoint
        final = sampler.samples[-1][1]
        return BenchResult(
            ratio=at_end / at_checkpoint,
            target=1.10,
            label="memory: worker peak RSS after / up to the first checkpoint",
            lines=[
                f"trials: {ran.count()} in {certified} certified evaluations of {tasks * k}, "
                f"{errors} errors, {elapsed[0]:.0f} s; {len(sampler.samples)} samples",
                "worker: main process + 2 pool processes (VmRSS summed)",
                f"peak RSS up to trial {checkpoint}: {at_checkpoint / 1024:8.1f} MiB",
                f"peak RSS after it:        {at_end / 1024:8.1f} MiB  (at the end: {final / 1024:.1f} MiB)",
            ],
            checks={"no errors": errors == 0, "all certified": certified == evaluations},
        )

    return with_bench_experiment("memory", tasks, k, body, shell=True)
