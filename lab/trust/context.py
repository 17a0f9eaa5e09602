"""What the trust suite's scenarios run on: ``Suite``.

A suite owns, for its whole life and nothing longer:

- a throwaway database (Django's test-database machinery under a unique
  name: a file in the suite's folder on SQLite, ``rsiweb_trust_<hex>`` on
  PostgreSQL), so the command never reads or writes the user's data; it is
  destroyed at the end, on errors and on Ctrl-C too;
- a queue of its own on the configured broker (and, for the embedded
  file-system broker, a folder of its own), purged between trials, so
  neither its messages nor its leftovers mix with anybody else's;
- real Celery worker processes (``start_worker``), all stopped at the end;
- per benchmark, a base experiment created once, and a fresh twin of it for
  every trial (same benchmark, evaluator, surface, seed harness, splits and
  settings, so certified records compare across trials);
- per benchmark and key, the digest of an uninterrupted control run, made
  once and cached (``control_digest``).

Workers and servers come from ``lab.processes``, record comparisons from
``lab.records`` (the tests use both); ``no_half_made_parent`` is the suite's
check that no half-made candidate could be a parent.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import connection

from evolution import selectors
from evolution.models import Candidate, CertifiedResult, Evaluation, Experiment, Run, Trial
from lab.processes import (
    PrivatePostgres,
    PrivateRedis,
    WorkerProcess,
    database_url_for_subprocess,
    use_broker,
    worker_spawn,
)
from lab.records import record_contents, records_digest
from lab.trust import BENCHMARKS, TrialContext, TrustFailure

REPO_ROOT = Path(__file__).resolve().parents[2]
# Short leases and a fast reaper so a killed worker's work is sent again in
# seconds; they only shorten the waits, every recovery path is the product's.
# Not shorter: a live worker starved of CPU for longer than its lease (seen
# with 3 s at a load average of 11 on two cores) looks dead, and its trials
# are taken over until they end as "gave up after 3 attempts".
LEASE_SECONDS = 8
REAPER_INTERVAL = 1
# Splits and sizes of the suite's runs: small enough for seconds per run.
EVAL_SPLITS = {"example": ["train", "gate"], "harbor": ["train", "gate"]}
EXAMPLE_TASKS = 10
RUN_TIMEOUT = float(os.environ.get("RSI_TRUST_TIMEOUT", "180"))
# RSI_TRUST_BREAK=no-reaper starts every worker without its reaper (beat): a
# deliberately broken platform, to prove the suite reports what it cannot
# recover from. Never set it outside that test.
BREAK = os.environ.get("RSI_TRUST_BREAK", "")
# Variables a held worker may still be given when released (read at run time).
RUN_TIME_VARIABLES = ("RSI_FAULT_",)


# --- Checks ---------------------------------------------------------------------------------------


def no_half_made_parent(experiment: Experiment) -> None:
    """Raise TrustFailure when a candidate that is not fully certified could be
    a parent, or when the record chain does not verify."""
    from evolution.services.records import records_verify

    for candidate in Candidate.objects.filter(experiment=experiment, state=Candidate.State.ACCEPTED):
        if candidate.certified_at is None:
            raise TrustFailure(f"candidate {candidate.pk} is accepted without certified_at")
        if not CertifiedResult.objects.filter(candidate=candidate).exists():
            raise TrustFailure(f"candidate {candidate.pk} is accepted without a certified result")
    report = records_verify(experiment=experiment)
    if not report.ok:
        raise TrustFailure("records do not verify: " + "; ".join(report.problems)[:500])


# --- The suite -----------------------------------------------------------------------------------


class Suite:
    """Database, broker, workers, experiments and controls of one trust-suite run.

    Use as a context manager: everything it made is removed on exit, whatever
    happened (including KeyboardInterrupt and SIGTERM)."""

    def __init__(self, *, log: Callable[[str], None] | None = None) -> None:
        self.uid = uuid.uuid4().hex[:10]
        self.queue = f"rsi-trust-{self.uid}"
        self.log = log or (lambda text: None)
        self.root: Path | None = None
        self.workers: list[WorkerProcess] = []
        self._spare: WorkerProcess | None = None
        self._default_broker_env: dict[str, str] = {}
        self.redis_servers: list[PrivateRedis] = []
        self.postgres_servers: list[PrivatePostgres] = []
        self.broker_env: dict[str, str] = {}
        self._broker: tuple[str, dict[str, Any]] = ("", {})
        self._old_db_name: str | None = None
        self._test_db_name = ""
        self._old_broker: tuple[str, dict[str, Any]] | None = None
        self._bases: dict[str, Experiment] = {}
        self._controls: dict[tuple[str, str], str] = {}
        self._control_experiments: dict[tuple[str, str], Experiment] = {}
        self._count = 0
        self._current: TrialContext | None = None
        self._old_lease: int | None = None
        self._old_sigterm: Any = None

    # Life cycle

    def __enter__(self) -> Suite:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)
        self.root = Path(tempfile.mkdtemp(prefix=f"rsi-trust-{self.uid}-"))
        self.root.chmod(0o711)
        self._db_create()
        self._broker_setup()
        self._old_lease = settings.RSI_TRIAL_LEASE_SECONDS
        settings.RSI_TRIAL_LEASE_SECONDS = LEASE_SECONDS

    def _stop_servers(self) -> None:
        """Stop the private Redis and PostgreSQL servers started for this context."""
        for server in self.redis_servers:
            server.stop()
        self.redis_servers.clear()
        for cluster in self.postgres_servers:
            try:
                cluster.stop()
            except (OSError, subprocess.SubprocessError) as exc:
                self.log(f"(could not stop the private PostgreSQL in {cluster.folder}: {exc})")
        self.postgres_servers.clear()

    def close(self) -> None:
        for worker in [*self.workers, *([self._spare] if self._spare else [])]:
            worker.kill()
        self.workers.clear()
        self._spare = None
        self._stop_servers()
        if self._old_broker is not None:
            from rsiweb.celery import queue_everything_to

            self.purge()
            use_broker(*self._old_broker)
            queue_everything_to(None)
            self._old_broker = None
        if self._old_lease is not None:
            settings.RSI_TRIAL_LEASE_SECONDS = self._old_lease
            self._old_lease = None
        if self._old_db_name is not None:
            self._db_destroy()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def _db_create(self) -> None:
        assert self.root is not None
        name = str(self.root / "trust.sqlite3") if connection.vendor == "sqlite" else f"rsiweb_trust_{self.uid}"
        for db in (settings.DATABASES["default"], connection.settings_dict):
            db.setdefault("TEST", {})["NAME"] = name
        self._test_db_name = name
        self._old_db_name = connection.settings_dict["NAME"]
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=False)
        if connection.settings_dict["NAME"] != name:
            raise RuntimeError(f"the suite's database is {connection.settings_dict['NAME']!r}, expected {name!r}")

    def _db_destroy(self) -> None:
        old_name, self._old_db_name = self._old_db_name, None
        connection.close()
        if connection.settings_dict["NAME"] != self._test_db_name:
            # Creation failed before switching over: drop nothing, it is not ours.
            assert old_name is not None  # set by _db_create, which ran first
            settings.DATABASES["default"]["NAME"] = connection.settings_dict["NAME"] = old_name
            return
        for attempt in range(10):
            try:
                connection.creation.destroy_test_db(old_name, verbosity=0, keepdb=False)
                return
            except Exception:  # a killed worker's session may linger a moment on PostgreSQL
                if attempt == 9:
                    raise
                connection.close()
                time.sleep(0.5)

    def _broker_setup(self) -> None:
        from rsiweb.celery import app, queue_everything_to

        assert self.root is not None
        url = settings.CELERY_BROKER_URL
        self._old_broker = (app.conf.broker_url, dict(app.conf.broker_transport_options or {}))
        self.broker_env = {"RSI_TRUST_QUEUE": self.queue}
        if urlsplit(url).scheme == "filesystem":
            folder = self.root / "broker"
            for sub in ("queue", "processed", "control"):
                (folder / sub).mkdir(parents=True)
            options = {
                **settings.CELERY_BROKER_TRANSPORT_OPTIONS,
                "data_folder_in": str(folder / "queue"),
                "data_folder_out": str(folder / "queue"),
                "processed_folder": str(folder / "processed"),
                "control_folder": str(folder / "control"),
            }
            self.broker_env.update(CELERY_BROKER_URL=url, RSI_BROKER_DIR=str(folder))
        else:
            options = dict(settings.CELERY_BROKER_TRANSPORT_OPTIONS)
            self.broker_env["CELERY_BROKER_URL"] = url
        self._broker = (url, options)
        self._default_broker_env = dict(self.broker_env)
        use_broker(url, options)
        queue_everything_to(self.queue)

    @property
    def database_name(self) -> str:
        return f"{connection.vendor} {connection.settings_dict['NAME']}"

    @property
    def broker_url(self) -> str:
        return self._default_broker_env.get("CELERY_BROKER_URL", "")

    @property
    def broker_kind(self) -> str:
        return urlsplit(self._broker[0]).scheme

    @contextmanager
    def broker(self, url: str) -> Iterator[None]:
        """Publish to ``url`` (a private redis-server of a scenario) meanwhile;
        workers started meanwhile get it too."""
        saved_env, saved = dict(self.broker_env), self._broker
        self.broker_env = {"RSI_TRUST_QUEUE": self.queue, "CELERY_BROKER_URL": url}
        self._broker = (url, {"visibility_timeout": 3600})
        use_broker(*self._broker)
        try:
            yield
        finally:
            self.broker_env, self._broker = saved_env, saved
            use_broker(*saved)

    def purge(self) -> None:
        """Drop every message waiting on the suite's queue."""
        from rsiweb.celery import app

        try:
            with app.connection_for_write() as conn:
                conn.default_channel.queue_purge(self.queue)  # type: ignore[attr-defined]  # stubs: StdChannel lacks it; Channel has it
        except Exception as exc:  # an unreachable private broker has nothing to purge
            self.log(f"(could not purge {self.queue}: {exc})")

    def private_postgres(self) -> PrivatePostgres:
        """A private cluster, created and started (stopped by ``end_trial``)."""
        assert self.root is not None
        server = PrivatePostgres(self.root / f"postgres-{uuid.uuid4().hex[:8]}")
        self.postgres_servers.append(server)
        server.create()
        server.start()
        return server

    def private_redis(self) -> PrivateRedis:
        assert self.root is not None
        server = PrivateRedis(self.root / f"redis-{uuid.uuid4().hex[:8]}")
        self.redis_servers.append(server)
        server.start()
        return server

    # Workers

    def worker_env(self, extra_env: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url_for_subprocess(),
            RSI_TRIAL_LEASE_SECONDS=str(LEASE_SECONDS),
            RSI_REAPER_INTERVAL=str(REAPER_INTERVAL),
            **self.broker_env,
        )
        env.update(extra_env or {})
        return env

    def start_worker(
        self,
        *,
        extra_env: dict[str, str] | None = None,
        hostname: str | None = None,
        beat: bool = True,
        concurrency: int = 2,
        hold: bool = False,
    ) -> WorkerProcess:
        """A real worker on this suite's database and queue (with the reaper
        when ``beat``), stopped by ``end_trial`` or at the end of the suite.
        With ``hold``, a standby that consumes only after ``release()``."""
        assert self.root is not None
        if BREAK == "no-reaper":
            beat = False
        extra_env = dict(extra_env or {})
        spare = self._spare
        if (
            spare is not None
            and spare.alive()
            and hostname is None
            and beat
            and concurrency == 2
            and self.broker_env == self._default_broker_env
            and all(key.startswith(RUN_TIME_VARIABLES) for key in extra_env)
        ):
            # A worker spawned ahead (held) takes over: ready in a moment.
            self._spare = None
            self.workers.append(spare)
            spare.pending_env = extra_env
            if not hold:
                spare.release()
            self._spawn_spare()
            return spare
        worker = self._spawn(extra_env=extra_env, hostname=hostname, beat=beat, concurrency=concurrency, hold=hold)
        self.workers.append(worker)
        if self._spare is None and self.broker_env == self._default_broker_env:
            self._spawn_spare()
        return worker

    def _spawn(
        self, *, extra_env: dict[str, str], hostname: str | None, beat: bool, concurrency: int, hold: bool
    ) -> WorkerProcess:
        assert self.root is not None
        name = hostname or f"trust-{uuid.uuid4().hex[:8]}"
        return worker_spawn(
            env=self.worker_env(extra_env),
            log_path=self.root / f"worker-{name}.log",
            hostname=name,
            concurrency=concurrency,
            beat=beat,
            schedule_path=self.root / f"beat-{name}",
            hold=hold,
        )

    def _spawn_spare(self) -> None:
        """Start the next worker now, held, so the next ``start_worker`` needs no start-up."""
        if BREAK == "no-reaper":
            return
        self._spare = self._spawn(extra_env={}, hostname=None, beat=True, concurrency=2, hold=True)

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers.clear()

    def fault_env(self, point: str, marker: Path, *, skip: int = 0) -> dict[str, str]:
        """Worker variables that block a worker process at ``point`` (see evolution/faults.py)."""
        return {"RSI_FAULT_POINT": point, "RSI_FAULT_MARKER": str(marker), "RSI_FAULT_SKIP": str(skip)}

    # Experiments

    def base_experiment(self, benchmark: str) -> Experiment:
        if benchmark not in self._bases:
            self._bases[benchmark] = _create_base(benchmark, name=f"trust {benchmark} base {self.uid}")
        return self._bases[benchmark]

    def fresh_experiment(self, benchmark: str, name: str) -> Experiment:
        """A twin of the benchmark's base experiment: comparable records."""
        from evolution.services.experiments import experiment_twin

        self._count += 1
        return experiment_twin(like=self.base_experiment(benchmark), name=f"{name} #{self._count}")

    def trial_context(self, benchmark: str, trial: int, scenario: str) -> TrialContext:
        assert self.root is not None
        self.purge()
        workdir = self.root / f"{scenario}-{benchmark}-{trial}"
        workdir.mkdir(parents=True)
        workdir.chmod(0o711)
        experiment = self.fresh_experiment(benchmark, f"trust {scenario} {benchmark} {trial}")
        self._current = TrialContext(
            benchmark=benchmark, trial=trial, experiment=experiment, workdir=workdir, suite=self
        )
        return self._current

    def keep_logs(self, label: str) -> Path | None:
        """Copy the current trial's worker logs (and its private servers'
        logs) out of the suite's throwaway folder, for a failure to be read
        later; the folder they were copied to, or None when there were none."""
        logs = [worker.log_path for worker in self.workers]
        logs += [server.folder / "log" for server in self.postgres_servers]
        logs = [path for path in logs if path.is_file()]
        if not logs:
            return None
        kept = Path(settings.VAR_DIR) / "trust-failures" / f"{self.uid}-{label}"
        kept.mkdir(parents=True, exist_ok=True)
        for number, path in enumerate(logs):
            shutil.copyfile(path, kept / f"{number:02d}-{path.parent.name}-{path.name}")
        return kept

    def end_trial(self) -> None:
        """Stop the trial's workers and private brokers; drop its leftover messages."""
        for worker in self.workers:
            worker.kill()
        self.workers.clear()
        self._stop_servers()
        self.purge()
        self._current = None

    # Runs and evaluations

    def loop_recipe(self, benchmark: str) -> Any:
        return loop_recipe(benchmark)

    def run_start(self, experiment: Experiment) -> Run:
        from evolution.loop import lifecycle

        return lifecycle.run_create(experiment=experiment, recipe=loop_recipe(experiment_benchmark(experiment)))

    def evaluation_start(self, experiment: Experiment) -> Evaluation:
        """The seed evaluated once (baseline) on the benchmark's evaluation splits, k=1."""
        from evolution.services.evaluation import evaluation_start

        return evaluation_start(
            candidate=selectors.experiment_seed(experiment),
            splits=EVAL_SPLITS[experiment_benchmark(experiment)],
            k=1,
            purpose=Evaluation.Purpose.BASELINE,
        )

    def wait_run(self, run: Run, *, timeout: float = RUN_TIMEOUT) -> Run:
        def done() -> bool:
            run.refresh_from_db()
            return run.status in {Run.Status.FINISHED, Run.Status.FAILED, Run.Status.CANCELLED}

        self.wait_until(done, timeout=timeout, what=f"run {run.pk} to finish")
        if run.status != Run.Status.FINISHED:
            raise TrustFailure(f"run {run.pk} ended {run.status}: {run.error[:300]}")
        return run

    def wait_evaluation(self, evaluation: Evaluation, *, timeout: float = RUN_TIMEOUT) -> Evaluation:
        def done() -> bool:
            evaluation.refresh_from_db()
            return evaluation.state in {Evaluation.State.CERTIFIED, Evaluation.State.FAILED}

        self.wait_until(done, timeout=timeout, what=f"evaluation {evaluation.pk} to be certified")
        if evaluation.state != Evaluation.State.CERTIFIED:
            raise TrustFailure(f"evaluation {evaluation.pk} ended {evaluation.state}: {evaluation.error[:300]}")
        return evaluation

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str, *, interval: float = 0.1) -> None:
        """Poll ``predicate``; on timeout raise TrustFailure saying what state was reached."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TrustFailure(f"timed out after {timeout:.0f} s waiting for {what}\n{self.diagnose()}")
            time.sleep(interval)

    def diagnose(self) -> str:
        lines = []
        if self._current is not None:
            experiment = self._current.experiment
            runs = list(Run.objects.filter(experiment=experiment).values_list("pk", "status", "state__phase"))
            lines.append(f"runs: {runs}")
            evaluations = Counter(Evaluation.objects.filter(experiment=experiment).values_list("state", flat=True))
            trials = Counter(Trial.objects.filter(evaluation__experiment=experiment).values_list("state", flat=True))
            candidates = Counter(Candidate.objects.filter(experiment=experiment).values_list("state", flat=True))
            lines.append(f"evaluations: {dict(evaluations)}; trials: {dict(trials)}; candidates: {dict(candidates)}")
        for worker in self.workers:
            state = "alive" if worker.alive() else f"exited {worker.process.returncode}"
            lines.append(f"worker {worker.hostname} ({state}) log tail:\n{worker.log()[-1500:]}")
        return "\n".join(lines)

    # Controls

    def control_digest(self, benchmark: str, key: str) -> str:
        """The records digest of an uninterrupted control of ``key`` ("loop":
        a run of the benchmark's loop recipe; "evaluation": one evaluation of
        the seed) on a fresh twin, made once per suite and cached. Call it
        before the trial starts its own workers (they share the queue)."""
        if (benchmark, key) not in self._controls:
            if any(worker.alive() for worker in self.workers):
                raise RuntimeError("control_digest must run before the trial starts workers")
            current, self._current = self._current, None
            experiment = self.fresh_experiment(benchmark, f"trust control {key} {benchmark}")
            self._current = TrialContext(
                benchmark=benchmark, trial=-1, experiment=experiment, workdir=Path(), suite=self
            )
            started = time.monotonic()
            try:
                self.start_worker(hostname=f"control-{benchmark}-{key}-{self.uid}")
                if key == "loop":
                    self.wait_run(self.run_start(experiment))
                elif key == "evaluation":
                    self.wait_evaluation(self.evaluation_start(experiment))
                else:
                    raise ValueError(f"unknown control {key!r}")
                no_half_made_parent(experiment)
                self._controls[(benchmark, key)] = records_digest(experiment)
                self._control_experiments[(benchmark, key)] = experiment
                self.log(
                    f"  (control {key} on {benchmark}: {len(record_contents(experiment))} records, "
                    f"{time.monotonic() - started:.1f} s)"
                )
            finally:
                self.stop_workers()
                self.purge()
                self._current = current
        return self._controls[(benchmark, key)]

    def control_experiment(self, benchmark: str, key: str) -> Experiment:
        """The experiment of that control (made now if not yet)."""
        self.control_digest(benchmark, key)
        return self._control_experiments[(benchmark, key)]


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def experiment_benchmark(experiment: Experiment) -> str:
    """Which of the suite's benchmarks ``experiment`` is a twin of."""
    return "harbor" if experiment.benchmark.name.startswith("harbor") else "example"


def _create_base(benchmark: str, *, name: str) -> Experiment:
    if benchmark == "example":
        # The bundled example as ``load_example`` creates it, on its first
        # ``EXAMPLE_TASKS`` tasks so a run takes seconds.
        from evolution.example.setup import example_experiment_create

        return example_experiment_create(name=name, task_limit=EXAMPLE_TASKS)
    if benchmark == "harbor":
        from evolution.agents.setup import EXAMPLE_DIR, harbor_experiment_create

        return harbor_experiment_create(folder=EXAMPLE_DIR, name=name)
    raise ValueError(f"unknown benchmark {benchmark!r} (known: {', '.join(BENCHMARKS)})")


def proposer_python() -> str:
    """An interpreter a command proposer can run: as root it runs as an
    unprivileged uid, which cannot reach a pyenv under /root, nor a checkout
    inside a folder closed to others. TrustFailure when there is none."""
    from evolution.sandbox import first_blocked

    if os.geteuid() != 0:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        # The resolved path: the one given may pass through a folder closed to
        # that user (a checkout's .venv linked from elsewhere, say).
        real = os.path.realpath(candidate)
        if os.path.exists(real) and first_blocked(Path(real)) is None:
            return real
    raise TrustFailure("no Python interpreter here is executable by the unprivileged proposer user")


def loop_recipe(benchmark: str) -> Any:
    """The suite's loop: the rrsi preset, one round of two candidates, k=1,
    the seed measured twice for the noise band, sealed tasks never run (the
    records stay few); the example proposer on the example benchmark, the
    command proposer running ``proposer_program.py`` (its text, with ``-c``)
    on the Harbor one."""
    import evolution.proposers  # noqa: F401  (registers the example and command proposers)
    from evolution.recipes import load_preset, parse_recipe, recipe_to_dict

    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=1, candidates_per_round=2)
    if benchmark == "example":
        data["proposal"] = {"operator": "example", "params": {"family_weights": {"generic": 1.0}}}
    else:
        # The program's text, not its path: the checkout may sit in a folder
        # the unprivileged user a root worker runs it as cannot enter.
        program = Path(__file__).resolve().with_name("proposer_program.py").read_text()
        argv = [proposer_python(), "-c", program, "{workspace}", "{manifest}"]
        data["proposal"] = {"operator": "command", "params": {"argv": argv, "timeout_seconds": 60}}
    data["evaluation"] = {
        **data["evaluation"],
        "trials_per_task": 1,
        "evolve_splits": EVAL_SPLITS[benchmark],
        "sealed": "never",
    }
    data["noise"] = {**data["noise"], "repeats": 2}
    data["edit_budget"] = {**data["edit_budget"], "T": 1}
    return parse_recipe(data)
