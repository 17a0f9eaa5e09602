"""Processes and servers of the platform, for the trust suite, the benchmarks and ``tests/``.

Real Celery worker processes of rsiweb (``worker_spawn``, ``WorkerProcess``: started, held, released, killed),
private throwaway Redis and PostgreSQL servers (``PrivateRedis``, ``PrivatePostgres``), the database URL a child
process needs to reach this process's database, pointing this process at another broker, and readers of
``/proc`` for process trees and CPU times.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.db import connection

REPO_ROOT = Path(__file__).resolve().parents[1]


def database_url_for_subprocess() -> str:
    """A DATABASE_URL that reaches the database this process uses now (the
    test database once one was created)."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = db.get("HOST") or "localhost"
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{db['NAME']}"


def process_stats() -> Iterator[tuple[int, str, list[str]]]:
    """(pid, command name, the fields after the name) of every live process,
    from /proc/<pid>/stat; the fields start at the state (field 3 of proc(5))."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: split after it.
        yield int(entry), stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def process_descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, grandchildren...), from /proc."""
    children: dict[int, list[int]] = {}
    for child, _name, fields in process_stats():
        children.setdefault(int(fields[1]), []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def process_state(pid: int) -> str:
    """The one-letter state of ``pid`` from /proc (R, S, T, Z...), "" when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[0]


@dataclass
class WorkerProcess:
    """A Celery worker started as its own process group."""

    process: subprocess.Popen[bytes]
    log_path: Path
    hostname: str
    env: dict[str, str] = field(default_factory=dict)
    hold_path: Path | None = None
    pending_env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def child_pids(self) -> list[int]:
        """The worker's descendants: pool children, and whatever they run."""
        return process_descendants(self.process.pid) if self.alive() else []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for Celery's ready line; RuntimeError with the log's tail when
        the worker exits or is not ready in time."""
        deadline = time.monotonic() + timeout
        while " ready." not in self.log():
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited with {self.process.returncode}:\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"worker not ready after {timeout:.0f} s:\n{self.log()[-4000:]}")
            time.sleep(0.05)

    def release(self, extra_env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
        """Let a standby worker (started with ``hold``) consume, with
        ``extra_env`` (variables read at run time only, such as fault points)
        added to its environment, and wait until it does."""
        if self.hold_path is not None and not self.hold_path.exists():
            env = {**self.pending_env, **(extra_env or {})}
            self.env.update(env)
            temporary = self.hold_path.with_suffix(".tmp")
            temporary.write_text(json.dumps(env))
            temporary.replace(self.hold_path)
        self.wait_ready(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._kill_group()

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool children)."""
        if self.process.poll() is None:
            self._kill_group()
            self.process.wait(timeout=20)

    def _kill_group(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def worker_spawn(
    *,
    env: dict[str, str],
    log_path: Path,
    hostname: str,
    concurrency: int = 2,
    beat: bool = False,
    schedule_path: Path | None = None,
    ready_timeout: float = 60.0,
    hold: bool = False,
    pool: str = "prefork",
    queues: str | None = None,
) -> WorkerProcess:
    """Start ``python -m lab.trust.worker`` (Celery's worker of rsiweb,
    on ``RSI_TRUST_QUEUE`` when set) and wait until it is ready. Raises
    RuntimeError, with the log's tail, when it exits or is not ready in time.
    With ``hold`` it returns at once and the worker loads everything but
    consumes nothing until ``release()``. ``pool`` and ``queues`` (``-Q``)
    as for ``celery worker``; by default every declared queue is consumed."""
    argv = [
        sys.executable,
        "-m",
        "lab.trust.worker",
        "--loglevel=INFO",
        f"--concurrency={concurrency}",
        f"--hostname={hostname}@%h",
        "--without-mingle",
        "--without-gossip",
        f"--pool={pool}",
    ]
    if queues:
        argv += ["-Q", queues]
    if beat:
        argv += ["--beat", f"--schedule={schedule_path or log_path.with_suffix('.beat')}"]
    hold_path = None
    if hold:
        hold_path = log_path.with_suffix(".go")
        env = {**env, "RSI_TRUST_HOLD": str(hold_path)}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    worker = WorkerProcess(process=process, log_path=log_path, hostname=hostname, env=env, hold_path=hold_path)
    if not hold:
        worker.wait_ready(ready_timeout)
    return worker


def use_broker(url: str, transport_options: dict[str, Any]) -> None:
    """Point this process's Celery app at ``url`` with ``transport_options``."""
    from kombu import pools as kombu_pools

    from rsiweb.celery import app

    app.conf.update(broker_url=url)
    app.conf.broker_transport_options = transport_options
    # Drop every cached connection and producer pool (kombu keeps a global
    # registry), so the next publish connects to the new broker.
    kombu_pools.reset()
    app._pool = None  # type: ignore[attr-defined]  # a private cache celery-types leaves out
    app.amqp._producer_pool = None  # type: ignore[attr-defined]  # a private cache celery-types leaves out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateRedis:
    """A redis-server of the suite's own on a free port (never the machine's),
    so a scenario may stop and start it."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise FileNotFoundError("redis-server is not installed")
        self.binary = binary
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(self.folder)]
        log = (self.folder / "redis.log").open("ab")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"private redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self, *, kill: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.process.wait(timeout=10)
        self.process = None


class PrivatePostgres:
    """A PostgreSQL cluster of the suite's own (initdb into a folder, run as
    the postgres user on a free port), never the machine's: a scenario may
    stop it immediately and start it again."""

    def __init__(self, folder: Path) -> None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
        if not found:
            raise FileNotFoundError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
        if os.geteuid() != 0 or shutil.which("runuser") is None:
            raise FileNotFoundError("a private cluster is started as user postgres: needs root and runuser")
        self.bin = found[-1].parent
        self.folder = folder
        self.data = folder / "data"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *argv: str, timeout: float = 300) -> None:
        # initdb and a start-up take seconds on a quiet machine and over a
        # minute on a loaded one (seen: initdb past 60 s).
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            check=True,
            capture_output=True,
            timeout=timeout,
            cwd="/",
        )

    def create(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.folder, "postgres", "postgres")
        self._as_postgres(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.folder / "log"), "-w", "start"
        )

    def stop(self, mode: str = "immediate") -> None:
        if (self.data / "postmaster.pid").exists():
            self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
