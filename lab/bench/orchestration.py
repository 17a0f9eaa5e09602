"""Orchestration overhead: trials of the bundled example's real agent and
verifier through Celery and real workers versus the same commands run
directly.

The experiment is the bundled example's (``evolution/example``: its tasks,
its evaluator's ``agent.py`` and ``verify.py``, its seed harness), loaded
under a throwaway name with ``example_experiment_create``. The platform side
is the whole production path: ``evaluation_start`` enqueues one message per
trial, a Celery worker started here as a separate process (two pool
processes) claims each trial, materializes the candidate, the task and the
evaluator from the database, runs agent and verifier in the sandbox,
finishes the trial, and the last one enqueues certification. The clock runs
from ``evaluation_start`` to the certified record.

The direct side runs the same agent and verifier command lines (each trial's
own seed in ``{seed}`` and ``RSI_SEED``), over the same materialized files,
with two parallel processes and nothing else.

Also home of what the other engine benchmarks share: a throwaway experiment
whose agent answers at once, its removal, and starting a worker.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction

from evolution import sandbox, selectors
from evolution.models import (
    Annotation,
    Benchmark,
    Candidate,
    CertifiedResult,
    Evaluation,
    EvaluationSplitStats,
    Evaluator,
    Experiment,
    SplitMembership,
    Surface,
    Task,
    Trajectory,
    TrajectoryStep,
    Trial,
)
from evolution.services import evaluation as evaluation_services
from evolution.services.experiments import (
    TaskInput,
    benchmark_upsert,
    evaluator_upsert,
    experiment_create,
    surface_create,
)
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry
from evolution.trials import TrialSpec, run_trial
from lab.bench import BenchResult, Load, benchmark, load_meter, stopwatch
from lab.processes import WorkerProcess as Worker
from lab.processes import database_url_for_subprocess, process_descendants, process_stats, worker_spawn

# A fixed trivial agent: answers from the harness, reports its usage.
BENCH_AGENT = textwrap.dedent(
    """
    import json, pathlib, sys
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    harness, task, out = (pathlib.Path(args[k]) for k in ("--harness", "--task", "--output"))
    answer = (harness / "default.txt").read_text().strip()
    (out / "answer.txt").write_text(answer)
    words = len((task / "instruction.md").read_text().split())
    (out / "usage.json").write_text(json.dumps({"tokens": 10 + words, "steps": 1}))
    """
)

BENCH_VERIFIER = textwrap.dedent(
    """
    import json, pathlib, sys
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    out = pathlib.Path(args["--output"])
    expected = json.loads(pathlib.Path(args["--expected"]).read_text())["expected"]["answer"]
    answer_path = out / "answer.txt"
    submitted = answer_path.exists()
    passed = submitted and answer_path.read_text().strip() == expected
    print(json.dumps({"passed": passed, "score": 1.0 if passed else 0.0,
                      "criteria": [{"id": "answer", "met": passed}],
                      "valid_output": submitted, "submitted": submitted}))
    """
)

RUNNER_ARGV = ["{python}", "{evaluator}/agent.py", "--harness", "{harness}", "--task", "{task}", "--output", "{output}"]
VERIFIER_ARGV = ["{python}", "{evaluator}/verify.py", "--output", "{output}", "--expected", "{private}/expected.json"]
# The same agent and verifier as two shell lines: for benchmarks that need
# many trials and measure the worker, not the agent.
SHELL_RUNNER_ARGV = [
    "/bin/sh",
    "-c",
    'tr -d "\\n" < {harness}/default.txt > {output}/answer.txt && '
    'echo \'{"tokens": 12, "steps": 1}\' > {output}/usage.json',
]
SHELL_VERIFIER_ARGV = [
    "/bin/sh",
    "-c",
    'if grep -q "\\"answer\\": \\"$(cat {output}/answer.txt)\\"" {private}/expected.json; '
    "then p=true; s=1.0; else p=false; s=0.0; fi; "
    'echo "{\\"passed\\": $p, \\"score\\": $s, \\"criteria\\": [{\\"id\\": \\"answer\\", \\"met\\": $p}], '
    '\\"valid_output\\": true, \\"submitted\\": true}"',
]
SPLITS = ["gate", "sealed", "train"]


# --- a throwaway experiment ---------------------------------------------------


def bench_experiment(
    *, tasks: int, k: int, label: str, shell: bool = False, runner_argv: list[str] | None = None
) -> Experiment:
    """A new experiment of ``tasks`` tasks (expected answer "yes" for even
    ones) whose seed answers "yes", under unique names; remove it with
    ``experiment_discard``. ``shell``: the agent and verifier are shell
    lines instead of Python programs; ``runner_argv`` another agent."""
    tag = f"bench-{label}-{uuid.uuid4().hex[:10]}"
    bench = benchmark_upsert(
        name=tag,
        tasks=[
            TaskInput(
                external_id=f"t{i:05d}",
                instruction=f"Answer task t{i:05d} with yes or no.",
                expected={"answer": "yes" if i % 2 == 0 else "no"},
                criteria=[{"id": "answer", "description": "the answer is right"}],
                files={"id.txt": f"t{i:05d}\n"},
            )
            for i in range(tasks)
        ],
    )
    files = tree_store(
        entries=[
            FileEntry("agent.py", "100644", BENCH_AGENT.encode()),
            FileEntry("verify.py", "100644", BENCH_VERIFIER.encode()),
        ]
    )
    evaluator = evaluator_upsert(
        name=tag,
        files=files,
        runner_argv=runner_argv or (SHELL_RUNNER_ARGV if shell else RUNNER_ARGV),
        verifier_argv=SHELL_VERIFIER_ARGV if shell else VERIFIER_ARGV,
        env_allowlist=["PATH"],
        timeout_seconds=60,
    )
    seed_tree = tree_store(entries=[FileEntry("default.txt", "100644", b"yes\n")])
    return experiment_create(
        name=tag,
        benchmark=bench,
        evaluator=evaluator,
        surface=surface_create(name=tag, spec='include: ["default.txt"]\ncomponents: {"default.txt": prompt}\n'),
        seed_tree=seed_tree,
        split_seed=7,
        split_ratios={"train": 0.5, "gate": 0.25, "sealed": 0.25},
        trials_per_task=k,
        run_settings={"model": "bench", "seed": 11},
    )


def experiment_discard(experiment: Experiment) -> None:
    """Remove a benchmark's own experiment, its benchmark, evaluator and
    surface (content-addressed blobs and trees stay: others may share them).

    Certified results are append-only: the database refuses to delete them
    (a trigger on PostgreSQL), so the trigger is switched off inside this
    one transaction and on again before it commits. Only for experiments a
    benchmark created itself.
    """
    with transaction.atomic():
        experiment = Experiment.objects.select_for_update(no_key=True).get(pk=experiment.pk)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                # Deferred foreign-key checks pending on the table (rows written in
                # this same transaction, as in a test) would refuse the ALTER.
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute(
                    "ALTER TABLE evolution_certifiedresult DISABLE TRIGGER evolution_certifiedresult_no_update_delete"
                )
            cursor.execute("DELETE FROM evolution_certifiedresult WHERE experiment_id = %s", [experiment.pk])
            if connection.vendor == "postgresql":
                cursor.execute(
                    "ALTER TABLE evolution_certifiedresult ENABLE TRIGGER evolution_certifiedresult_no_update_delete"
                )
        Experiment.objects.filter(pk=experiment.pk).update(seed_candidate=None)
        _steps_discard(experiment)
        Trial.objects.filter(evaluation__experiment=experiment).delete()
        Experiment.objects.filter(pk=experiment.pk).delete()
        # The bundled example's benchmark, evaluator and surface are shared
        # with any other experiment loaded from it: kept while one uses them.
        Benchmark.objects.filter(pk=experiment.benchmark_id, experiments__isnull=True).delete()
        Evaluator.objects.filter(pk=experiment.evaluator_id, experiments__isnull=True).delete()
        Surface.objects.filter(pk=experiment.surface_id, experiments__isnull=True).delete()


def _steps_discard(experiment: Experiment) -> None:
    """Remove the trajectory steps of ``experiment``'s trials in two statements.

    Left to the trials' delete, Django's collector loads every step and sets
    the annotations' step to NULL over all of them in one statement: with
    the 200,000 steps ``trajectory-import`` leaves, past SQLite's limit of
    variables ("too many SQL variables"), and slow on any database.
    """
    Annotation.objects.filter(step__trajectory__trial__evaluation__experiment=experiment).update(step=None)
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {TrajectoryStep._meta.db_table} WHERE trajectory_id IN ("
            f"SELECT tj.id FROM {Trajectory._meta.db_table} tj JOIN {Trial._meta.db_table} t ON t.id = tj.trial_id "
            f"JOIN {Evaluation._meta.db_table} e ON e.id = t.evaluation_id WHERE e.experiment_id = %s)",
            [experiment.pk],
        )


# --- worker processes ---------------------------------------------------------


# A prefork worker's processes keep their connection between tasks, as
# ``dev.py run`` and docs/deployment.md set them up.
PREFORK_CONN_MAX_AGE = "60"


def prefork_connections(env: Mapping[str, str]) -> dict[str, str]:
    """What a prefork worker started with ``env`` is given for its database
    connections: RSI_DB_CONN_MAX_AGE, unless ``env`` sets it or a pool."""
    if env.get("RSI_DB_CONN_MAX_AGE") or env.get("RSI_DB_POOL_SIZE"):
        return {}
    return {"RSI_DB_CONN_MAX_AGE": PREFORK_CONN_MAX_AGE}


def worker_start(
    *,
    log_dir: Path,
    concurrency: int = 2,
    pool: str = "prefork",
    queues: str | None = None,
    hostname: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> Worker:
    """Start ``celery worker`` as a separate process against this process's
    database and broker, and wait until it is ready (RuntimeError if it dies
    or takes more than 60 s). Stop it with ``Worker.stop``. By default it
    consumes every queue with a prefork pool; ``pool`` and ``queues`` as for
    ``celery worker``."""
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url_for_subprocess()
    env["CELERY_BROKER_URL"] = settings.CELERY_BROKER_URL
    env.update(extra_env or {})
    if pool == "prefork":
        env.update(prefork_connections(env))
    name = hostname or f"bench-{uuid.uuid4().hex[:8]}"
    return worker_spawn(
        env=env,
        log_path=log_dir / f"worker-{name}.log",
        hostname=name,
        concurrency=concurrency,
        pool=pool,
        queues=queues,
    )


def wait_certified(evaluation: Evaluation, *, timeout: float, workers: Sequence[Worker], poll: float = 0.25) -> float:
    """Poll until ``evaluation`` is certified; return when its record was
    written (``time.time()``'s clock, from the record's ``created_at``).

    The run's end is the record's own time, not the moment a poll sees it,
    so this polls seldom without losing accuracy: polling every 20 ms took
    about 3 % of the two cores the platform side is measured on (its
    queries and their PostgreSQL work), which the direct side never paid.
    RuntimeError when the evaluation fails, a worker dies or ``timeout``
    passes."""
    deadline = time.monotonic() + timeout
    while True:
        state = Evaluation.objects.filter(pk=evaluation.pk).values_list("state", flat=True).get()
        if state == Evaluation.State.CERTIFIED:
            written: datetime = (
                CertifiedResult.objects.filter(evaluation=evaluation).values_list("created_at", flat=True).get()
            )
            return written.timestamp()
        dead = [worker for worker in workers if worker.process.poll() is not None]
        if state == Evaluation.State.FAILED or dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {worker.hostname}:\n{worker.log()[-3000:]}" for worker in workers)
            raise RuntimeError(f"evaluation {evaluation.pk} is {state}\n{logs}")
        time.sleep(poll)


# --- the two sides ------------------------------------------------------------


def trial_specs(experiment: Experiment, *, k: int, root: Path) -> list[tuple[TrialSpec, Path]]:
    """What ``run_trial`` gets for every (task, index) of ``experiment``'s
    seed, written by the worker's own ``trial_spec`` (the same files, command
    lines, limits, seeds and sandbox mode) from trials held in memory alone:
    nothing is stored. Each with a fresh folder under ``root`` to run in."""
    experiment = Experiment.objects.select_related("evaluator").get(pk=experiment.pk)
    evaluation = Evaluation(experiment=experiment)
    seed = selectors.experiment_seed(experiment)
    base_seed = int(experiment.run_settings.get("seed", 0))
    work = []
    for task in experiment.benchmark.tasks.order_by("external_id"):
        for index in range(k):
            trial = Trial(
                evaluation=evaluation,
                candidate=seed,
                task=task,
                index=index,
                seed=evaluation_services.trial_seed(base_seed, task.external_id, index),
            )
            folder = Path(tempfile.mkdtemp(prefix=f"direct-{task.external_id}-{index}-", dir=root))
            work.append((evaluation_services.trial_spec(trial, folder / "inputs"), folder))
    return work


def trials_alone(work: list[tuple[TrialSpec, Path]], *, threads: int, spread: float = 0.0) -> tuple[float, list[str]]:
    """Run ``work`` through ``run_trial`` alone (the function a worker's slot
    calls: the same sandbox, with no Celery, claim, finish or stored row) in
    ``threads`` threads of this process, each taking the next trial in order;
    thread ``i`` starts ``i * spread / threads`` seconds after the first.
    Returns the seconds from the first start to the last finish and every
    trial's outcome, in the order they finished."""
    todo: queue.SimpleQueue[tuple[TrialSpec, Path]] = queue.SimpleQueue()
    for item in work:
        todo.put(item)
    outcomes: list[str] = []

    def slot(delay: float) -> None:
        time.sleep(delay)
        while True:
            try:
                spec, folder = todo.get_nowait()
            except queue.Empty:
                return
            result = run_trial(spec, work_root=folder)
            outcomes.append(result.outcome if result.outcome != "error" else f"error: {result.error}")
            shutil.rmtree(folder, ignore_errors=True)

    pool = [threading.Thread(target=slot, args=(number * spread / threads,)) for number in range(threads)]
    with stopwatch() as elapsed:
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    return elapsed[0], outcomes


def _start_costs(*, use_bwrap: bool, starts: int = 100) -> tuple[float, float]:
    """Seconds per start of ``/bin/true`` through ``run_sandboxed`` (as a
    trial starts its agent and its verifier) and directly: what the sandbox
    alone adds to every command, apart from the rest of the platform."""
    # Reachable by a run's own uid without bubblewrap too (the scratch folder is 0700).
    root = Path(tempfile.mkdtemp(prefix="rsi-bench-starts-"))
    root.chmod(0o711)
    try:
        return _start_costs_in(root, use_bwrap=use_bwrap, starts=starts)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _start_costs_in(root: Path, *, use_bwrap: bool, starts: int) -> tuple[float, float]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    with stopwatch() as sandboxed:
        for _ in range(starts):
            result = sandbox.run_sandboxed(
                ["/bin/true"],
                cwd=root,
                env=env,
                timeout=30,
                limits=sandbox.Limits(),
                writable=[root],
                readable=[],
                use_bwrap=use_bwrap,
            )
            if result.returncode != 0:
                raise RuntimeError(f"/bin/true in the sandbox exited {result.returncode}: {result.stderr[-500:]!r}")
    with stopwatch() as plain:
        for _ in range(starts):
            subprocess.run(["/bin/true"], cwd=root, env=env, check=True, stdin=subprocess.DEVNULL)
    return sandboxed[0] / starts, plain[0] / starts


@dataclass(frozen=True)
class CpuSeconds:
    """CPU time (user and system) used so far by each part of a platform run."""

    worker: float  # the worker's main and pool processes themselves
    commands: float  # what the pool processes started and reaped: sandboxes, agents, verifiers
    postgres: float  # every PostgreSQL process, and the ended ones (reaped by the postmaster)
    redis: float
    here: float  # this process: starting the evaluation and waiting for it

    def __sub__(self, other: CpuSeconds) -> CpuSeconds:
        return CpuSeconds(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_sample(worker_pid: int, pool: list[int]) -> CpuSeconds:
    """Where the machine's CPU time has gone so far, from /proc/<pid>/stat."""
    own: dict[int, float] = {}
    reaped: dict[int, float] = {}
    names: dict[str, list[int]] = {}
    for pid, name, fields in process_stats():
        # Fields 14 to 17 of proc(5): utime, stime, cutime, cstime.
        utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
        own[pid], reaped[pid] = (utime + stime) / _TICKS, (cutime + cstime) / _TICKS
        names.setdefault(name, []).append(pid)
    here = os.times()
    return CpuSeconds(
        worker=sum(own.get(pid, 0.0) for pid in [worker_pid, *pool]),
        commands=sum(reaped.get(pid, 0.0) for pid in pool),
        postgres=sum(own[pid] + reaped[pid] for pid in names.get("postgres", [])),
        redis=sum(own[pid] + reaped[pid] for pid in names.get("redis-server", [])),
        here=here.user + here.system,
    )


def _platform_run(experiment: Experiment, *, k: int, worker: Worker, timeout: float) -> tuple[float, Evaluation]:
    start = time.time()
    evaluation = evaluation_services.evaluation_start(
        candidate=selectors.experiment_seed(experiment), splits=SPLITS, k=k, purpose=Evaluation.Purpose.BASELINE
    )
    certified = wait_certified(evaluation, timeout=timeout, workers=[worker])
    return certified - start, evaluation


def with_bench_experiment(
    label: str,
    tasks: int,
    k: int,
    body: Callable[[Experiment, Path], BenchResult],
    *,
    shell: bool = False,
    runner_argv: list[str] | None = None,
) -> BenchResult:
    """Run ``body(experiment, scratch_dir)`` and clean up whatever happens."""
    experiment = bench_experiment(tasks=tasks, k=k, label=label, shell=shell, runner_argv=runner_argv)
    return _discarded_after(experiment, label, body)


def _discarded_after(
    experiment: Experiment, label: str, body: Callable[[Experiment, Path], BenchResult]
) -> BenchResult:
    """``body(experiment, scratch_dir)``, then the experiment and the folder removed whatever happens."""
    scratch = Path(tempfile.mkdtemp(prefix=f"rsi-bench-{label}-"))
    vacuum_churned()
    try:
        return body(experiment, scratch)
    finally:
        experiment_discard(experiment)
        shutil.rmtree(scratch, ignore_errors=True)


# What a benchmark's experiment fills and its removal empties, run after run.
_CHURNED = (
    Trial,
    Trajectory,
    TrajectoryStep,
    Evaluation,
    EvaluationSplitStats,
    CertifiedResult,
    Candidate,
    Task,
    SplitMembership,
)


def vacuum_churned() -> None:
    """On PostgreSQL, ``VACUUM (ANALYZE)`` the tables benchmark runs fill and
    empty, so that a run's figures do not depend on the dead rows the runs
    before it left. Where the server's autovacuum is off, they pile up: on
    2026-12-03, after about twenty runs, a trial worker spent 17 to 19 ms of
    CPU a trial instead of 12 to 13 and `concurrency` read 1.26 to 1.31;
    after one VACUUM, 1.19 to 1.21 (measured on 2026-12-03; the history of docs/performance.md in git).
    Skipped inside a transaction, where VACUUM cannot run (tests)."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {', '.join(quote(model._meta.db_table) for model in _CHURNED)}")


def with_example_experiment(
    label: str, tasks: int, body: Callable[[Experiment, Path], BenchResult], *, agent: str = "scripted"
) -> BenchResult:
    """Run ``body(experiment, scratch_dir)`` on a new experiment of the bundled
    example (its first ``tasks`` tasks, its ``agent``: the scripted policy or
    the model's, ``example_experiment_create``) and clean up whatever happens."""
    from evolution.example.setup import example_experiment_create

    name = f"bench-{label}-{uuid.uuid4().hex[:10]}"
    experiment = example_experiment_create(name=name, task_limit=tasks, agent=agent)
    return _discarded_after(experiment, label, body)


@benchmark(
    "orchestration",
    "the bundled example's agent and verifier through Celery, a worker with two processes and certification "
    "vs the same trials through the same sandbox alone",
    quick={"tasks": 10, "k": 2},
)
def orchestration(*, tasks: int = 60, k: int = 7, parallel: int = 2) -> BenchResult:
    def direct(experiment: Experiment, root: Path) -> tuple[float, list[str], float, float, Load]:
        """The direct side once: (seconds, outcomes, CPU seconds of the
        commands and of this process, the load), its inputs written first."""
        root.mkdir()
        work = trial_specs(experiment, k=k, root=root)
        start = os.times()
        with load_meter() as load:
            seconds, outcomes = trials_alone(work, threads=parallel)
        end = os.times()
        commands = (end.children_user + end.children_system) - (start.children_user + start.children_system)
        return seconds, outcomes, commands, (end.user + end.system) - (start.user + start.system), load[0]

    def body(experiment: Experiment, scratch: Path) -> BenchResult:
        tasks = experiment.benchmark.tasks.count()
        # Direct runs before and after the platform's, averaged: the load of
        # a shared machine drifts over a run of minutes.
        before, direct_outcomes, direct_commands, direct_here, before_load = direct(experiment, scratch / "direct-1")
        worker = worker_start(log_dir=scratch, concurrency=parallel)
        try:
            pool = process_descendants(worker.pid)  # the pool processes, before any trial
            cpu_start = _cpu_sample(worker.pid, pool)
            with load_meter() as platform_load:
                platform_seconds, evaluation = _platform_run(experiment, k=k, worker=worker, timeout=60 + 2 * tasks * k)
            cpu = _cpu_sample(worker.pid, pool) - cpu_start
        finally:
            worker.stop()
        after, _, _, _, after_load = direct(experiment, scratch / "direct-2")
        direct_seconds = (before + after) / 2
        direct_passes = direct_outcomes.count("pass")
        direct_errors = [outcome for outcome in direct_outcomes if outcome.startswith("error")]
        per_trial = 1000 / (tasks * k)
        outcomes = Trial.objects.filter(evaluation=evaluation)
        platform_passes = outcomes.filter(outcome=Trial.Outcome.PASS).count()
        errors = outcomes.filter(outcome=Trial.Outcome.ERROR).count()
        profiles = sorted(set(outcomes.values_list("sandbox_profile", flat=True)))
        sandboxed, plain = _start_costs(use_bwrap="bwrap" in profiles)
        on_postgres, on_redis = connection.vendor == "postgresql", settings.CELERY_BROKER_URL.startswith("redis")
        own_cpu = cpu.worker + cpu.here + (cpu.postgres if on_postgres else 0.0) + (cpu.redis if on_redis else 0.0)
        return BenchResult(
            ratio=platform_seconds / direct_seconds,
            target=1.10,
            label="orchestration: platform / the same trials through the same sandbox, wall time",
            lines=[
                f"trials: {tasks * k} ({tasks} tasks of the bundled example x k={k}), its agent.py and verify.py; "
                f"{parallel} parallel processes on each side",
                f"broker: {settings.CELERY_BROKER_URL.split('://')[0]}; database: {connection.vendor}; "
                f"sandbox: {', '.join(profiles)}; a worker process keeps its database connection "
                f"{({**os.environ, **prefork_connections(os.environ)}).get('RSI_DB_CONN_MAX_AGE', '0')} s "
                "between tasks (RSI_DB_CONN_MAX_AGE)",
                f"direct:   {direct_seconds:8.2f} s  ({1000 * direct_seconds / (tasks * k):.1f} ms per trial x "
                f"{parallel}), {direct_passes} passed, {len(direct_errors)} errors; the same trials through "
                f"run_trial alone (the worker's trial_spec and sandbox, no Celery, claim, finish or stored row), "
                f"{parallel} threads; mean of {before:.2f} s before and {after:.2f} s after",
                f"  load before: {before_load.text()}",
                f"  load after: {after_load.text()}",
                f"platform: {platform_seconds:8.2f} s  ({1000 * platform_seconds / (tasks * k):.1f} ms per trial x "
                f"{parallel}), {platform_passes} passed, {errors} errors, certified; {platform_load[0].text()}",
                f"starting /bin/true: {1000 * plain:.2f} ms directly, {1000 * sandboxed:.2f} ms through "
                f"run_sandboxed ({', '.join(profiles)}); a trial starts two commands",
                f"CPU a trial, direct (first run): commands with their sandboxes {per_trial * direct_commands:.1f} ms, "
                f"this process {per_trial * direct_here:.1f} ms",
                f"CPU a trial, platform: commands with their sandboxes {per_trial * cpu.commands:.1f} ms, "
                f"worker processes {per_trial * cpu.worker:.1f} ms, "
                # Every server process on the host (other tenants' too): only when this run used that server.
                + (f"PostgreSQL {per_trial * cpu.postgres:.1f} ms, " if on_postgres else "")
                + (f"Redis {per_trial * cpu.redis:.1f} ms, " if on_redis else "")
                + f"this process {per_trial * cpu.here:.1f} ms; "
                f"{os.cpu_count()} cores x wall time {per_trial * (os.cpu_count() or 1) * platform_seconds:.1f} ms",
                f"the platform's own CPU a trial (worker processes, PostgreSQL, Redis, this process): "
                f"{per_trial * own_cpu:.1f} ms",
            ],
            checks={
                "same outcomes": platform_passes == direct_passes and errors == 0 and not direct_errors,
            },
        )

    return with_example_experiment("orchestration", tasks, body)
