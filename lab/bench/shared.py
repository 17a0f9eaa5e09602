"""The shared parts: what one trial costs the database and the broker that
every host uses, and so how many hosts one of each carries.

The trials are ``concurrency``'s (an agent waiting 2 s in four calls, a
5-step trajectory stored, the verifier a shell line), 640 of them on four
trial workers of 16 thread slots under four hostnames (four hosts sharing
one PostgreSQL and one Redis), and a prefork worker of one process for
certification. Over the pass it reads:

- the CPU of the PostgreSQL backends serving this database (from /proc:
  a backend's process title names its database; each backend's last
  reading is kept, so one that ends during the pass still counts), this
  benchmark's own connection left out;
- the rows written (``pg_stat_user_tables``: inserted, updated, deleted)
  and the database's growth (``pg_database_size``), read before the
  workers start and after they stopped (a backend reports its counts when
  it ends, at the latest);
- on Redis, every command sent to the broker's database (``MONITOR``,
  counted by command) and the Redis server's CPU (the whole server: other
  databases' clients, and MONITOR itself, included);
- the trial workers' own CPU and each host's share of the trials.

The verdict is how evenly the four hosts shared the trials: the largest
share over an even one (a quarter).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from django.conf import settings
from django.db import connection

from evolution.models import Experiment
from lab.bench import BenchResult, benchmark
from lab.bench.concurrency import WAITING_RUNNER_ARGV, Pass, run_with
from lab.bench.memory import Periodic
from lab.bench.orchestration import with_bench_experiment
from lab.processes import process_stats

_TICKS = os.sysconf("SC_CLK_TCK")
# A host of 64 trial slots running an agent of 60 s: the sizing the docs state.
HOST_SLOTS = 64
AGENT_SECONDS = 60.0


def backend_cpu(database: str, *, leave_out: int = 0) -> dict[int, float]:
    """CPU seconds (user and system) of every PostgreSQL backend on this
    host connected to ``database``, by pid, but ``leave_out``."""
    found: dict[int, float] = {}
    for pid, name, fields in process_stats():
        if name != "postgres" or pid == leave_out:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                title = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # "postgres: 15/main: USER DATABASE HOST(PORT) STATE"
        if f" {database} " in title.partition(": ")[2].partition(": ")[2]:
            found[pid] = (int(fields[11]) + int(fields[12])) / _TICKS
    return found


def server_cpu(name: str) -> float:
    """CPU seconds of every process called ``name`` on this host, with what they reaped."""
    return sum(
        sum(int(value) for value in fields[11:15]) / _TICKS for _, process, fields in process_stats() if process == name
    )


@dataclass
class BackendSampler(Periodic):
    """The CPU the backends of ``database`` used between ``__enter__`` and ``__exit__``."""

    database: str
    leave_out: int
    interval: float = 0.5
    start: dict[int, float] = field(default_factory=dict)
    seen: dict[int, float] = field(default_factory=dict)
    redis_start: float = 0.0
    redis: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        self.seen.update(backend_cpu(self.database, leave_out=self.leave_out))

    def __enter__(self) -> Self:
        self.start = backend_cpu(self.database, leave_out=self.leave_out)
        self.redis_start = server_cpu("redis-server")
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.sample()
        self.redis = server_cpu("redis-server") - self.redis_start

    @property
    def seconds(self) -> float:
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.seen.items())


class BrokerCommands:
    """Counts the commands Redis runs on the broker's database (``MONITOR``)
    between ``__enter__`` and ``__exit__``, by command name. Nothing on a
    broker that is not Redis."""

    STOP = "rsi-bench-shared-stop"

    def __init__(self, url: str) -> None:
        self.url = url
        self.counts: Counter[str] = Counter()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> Self:
        if not self.url.startswith("redis"):
            return self
        import redis

        # Two clients: the one that sends the stop connects (and SELECTs its database) now,
        # not counted; MONITOR takes a connection of its own.
        self.client = redis.Redis.from_url(self.url)
        self.client.ping()
        self.db = int(self.client.connection_pool.connection_kwargs.get("db", 0))
        self.watcher = redis.Redis.from_url(self.url)
        monitor = self.watcher.monitor()  # type: ignore[no-untyped-call]
        monitor.__enter__()  # sends MONITOR and waits for its OK: counted from here on
        self.monitor = monitor
        self.thread = threading.Thread(target=self._count, name="broker-monitor", daemon=True)
        self.thread.start()
        return self

    def _count(self) -> None:
        while True:
            command: dict[str, Any] = self.monitor.next_command()
            if command.get("db") != self.db:
                continue
            text = str(command.get("command", ""))
            if self.STOP in text:
                return
            self.counts[text.split(" ", 1)[0].upper()] += 1

    def __exit__(self, *exc: object) -> None:
        if self.thread is None:
            return
        self.client.echo(self.STOP)  # seen by MONITOR after every command before it
        self.thread.join(timeout=30)
        self.monitor.__exit__()
        self.client.close()
        self.watcher.close()


def table_writes() -> tuple[dict[str, int], int]:
    """Rows inserted, updated and deleted so far by table, and the database's size in bytes."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables")
        rows = {name: int(count) for name, count in cursor.fetchall()}
        cursor.execute("SELECT pg_database_size(current_database())")
        (size,) = cursor.fetchone() or (0,)
    return rows, int(size)


@dataclass
class SharedMeter:
    """Everything ``shared`` reads over the measured pass (see the module)."""

    database: str
    broker: str
    backends: BackendSampler | None = None
    commands: BrokerCommands | None = None

    def __enter__(self) -> Self:
        own = 0
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                (own,) = cursor.fetchone() or (0,)
        self.backends = BackendSampler(database=self.database, leave_out=int(own)).__enter__()
        self.commands = BrokerCommands(self.broker).__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.backends is not None and self.commands is not None
        self.backends.__exit__(*exc)
        self.commands.__exit__(*exc)


@dataclass(frozen=True)
class Sizing:
    """How many trials a second one server carries at the measured cost a
    trial, and how many hosts of ``HOST_SLOTS`` slots running agents of
    ``AGENT_SECONDS`` that is. Pure."""

    per_second: float
    hosts: float

    @classmethod
    def of(cls, seconds_a_trial: float, *, cores: float = 1.0) -> Sizing:
        per_second = cores / seconds_a_trial if seconds_a_trial > 0 else float("inf")
        return cls(per_second=per_second, hosts=per_second / (HOST_SLOTS / AGENT_SECONDS))


@benchmark(
    "shared",
    "what a trial costs the shared PostgreSQL and Redis: 640 trials on four trial workers under four hostnames",
    quick={"trials": 64, "slots": 4},
)
def shared(*, trials: int = 640, slots: int = 16, hosts: int = 4) -> BenchResult:
    # On SQLite (no server, no statistics) only the hosts' shares and the broker's figures are read.
    on_postgres = connection.vendor == "postgresql"
    k = 2
    tasks = max(1, trials // k)

    def body(experiment: Experiment, scratch: Path) -> BenchResult:
        meter = SharedMeter(database=connection.settings_dict["NAME"], broker=settings.CELERY_BROKER_URL)
        rows_before, size_before = table_writes() if on_postgres else ({}, 0)
        one: Pass = run_with([slots] * hosts, experiment, scratch, repeat=0, around=meter)
        time.sleep(1.0)  # the ended backends' last counts reach the statistics
        rows_after, size_after = table_writes() if on_postgres else ({}, 0)
        assert meter.backends is not None and meter.commands is not None
        count = one.trials
        per = 1000 / max(1, count)
        written = {name: rows_after.get(name, 0) - rows_before.get(name, 0) for name in rows_after}
        top = sorted(((n, name) for name, n in written.items() if n > 0), reverse=True)
        commands = meter.commands.counts
        on_redis = settings.CELERY_BROKER_URL.startswith("redis")
        postgres = Sizing.of(meter.backends.seconds / max(1, count))
        redis = Sizing.of(meter.backends.redis / max(1, count))
        even = 1 / hosts
        largest = max(one.shares.values(), default=0) / max(1, count)
        shares = ", ".join(f"{host} {n} ({100 * n / max(1, count):.0f} %)" for host, n in one.shares.items())
        return BenchResult(
            ratio=largest / even,
            target=1.25,
            label="shared: the largest host's share / an even share",
            lines=[
                f"trials: {count} ({tasks} tasks x k={k}) on {hosts} trial workers of {slots} thread slots "
                f"under {hosts} hostnames, {one.seconds:.2f} s from evaluation_start to the certified record, "
                f"{one.errors} errors, {one.records} certified record; {one.load.text()}",
                f"  shares: {shares}",
                *(
                    [
                        f"PostgreSQL: the backends of this database {per * meter.backends.seconds:.2f} ms of CPU "
                        "a trial (every postgres process on the host, other tenants' too: "
                        f"{per * one.cpu.postgres:.2f} ms)",
                        f"  rows written a trial: {sum(written.values()) / max(1, count):.1f} ("
                        + ", ".join(f"{name} {n / max(1, count):.2f}" for n, name in top[:6])
                        + f"); the database grew {(size_after - size_before) / max(1, count) / 1024:.1f} KiB a trial",
                    ]
                    if on_postgres
                    else [f"database: {connection.vendor} (the database's figures need PostgreSQL)"]
                ),
                (
                    f"Redis: {sum(commands.values()) / max(1, count):.1f} commands a trial on the broker's database ("
                    + ", ".join(f"{name} {n / max(1, count):.2f}" for name, n in commands.most_common(6))
                    + f"); the Redis server {per * meter.backends.redis:.2f} ms of CPU a trial (the whole server, "
                    "MONITOR included)"
                    if on_redis
                    else f"broker: {settings.CELERY_BROKER_URL.split('://')[0]} (Redis figures need a Redis broker)"
                ),
                f"trial workers: {per * one.cpu.workers:.1f} ms of CPU a trial, their commands "
                f"{per * one.cpu.commands:.1f} ms",
                (
                    f"one PostgreSQL core carries {postgres.per_second:.0f} trials a second: {postgres.hosts:.0f} "
                    f"hosts of {HOST_SLOTS} slots running {AGENT_SECONDS:g}-second agents"
                    if on_postgres
                    else "the sizing needs PostgreSQL"
                )
                + (
                    f"; one Redis (one thread) {redis.per_second:.0f} trials a second, {redis.hosts:.0f} such hosts"
                    if on_redis
                    else ""
                ),
            ],
            checks={
                "every trial certified once, no errors": one.records == 1 and one.errors == 0 and count == tasks * k,
                "every host ran trials": len(one.shares) == hosts and min(one.shares.values()) > 0,
            },
        )

    return with_bench_experiment("shared", tasks, k, body, shell=True, runner_argv=WAITING_RUNNER_ARGV)
