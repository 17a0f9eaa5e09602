"""``python3.11 dev.py run`` as a user runs it: stopped by every usual
signal, restarted at once on the same port, and refused on a busy port.

Each test starts the real command (migrate, the example without rounds, the
admin account, a Celery worker and the web server) in a folder of its own,
with its own SQLite database, broker and port, so nothing else is touched.
Its children are found as the kernel sees them (``/proc``): the processes
whose parent is ``dev.py``, each the leader of a session of its own, and
every process of those sessions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from lab.first_start import proc_stat as _stat
from tests.conftest import REPO_ROOT

DEV = REPO_ROOT / "dev.py"
READY = "[rsiweb] web server: "
START_TIMEOUT = 240  # a first start migrates a new database, on a machine shared with other test runs


def _dev_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rsiweb_dev", DEV)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _require_current_venv() -> None:
    # dev.py run installs the requirements when the venv is not current for
    # them; a test must not change the environment it runs in. (`dev.py test`
    # has just made it current, so CI always runs these.)
    if not _dev_module().venv_current("requirements.txt"):
        pytest.skip("the venv is not current for requirements.txt: dev.py run would install into it")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the web server binds it
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _env(folder: Path, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CELERY_BROKER_URL", None)  # the embedded file-system broker, in the folder below
    env.update(
        RSI_VAR_DIR=str(folder / "var"),
        RSI_BROKER_DIR=str(folder / "var" / "broker"),
        RSI_WORK_DIR=str(folder / "work"),
        DATABASE_URL=f"sqlite:///{folder / 'var' / 'rsiweb.sqlite3'}",
        RSI_HOST="127.0.0.1",
        RSI_PORT=str(port),
        RSI_EXAMPLE_ROUNDS="0",
    )
    return env


def _default_signals() -> None:
    # As from a terminal: whatever ignores SIGHUP or SIGINT above pytest is
    # not passed on to dev.py (it keeps a signal it was started ignoring).
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _children(pid: int) -> list[int]:
    return sorted(p for p in _all_pids() if (s := _stat(p)) and s[1] == pid and s[0] != "Z")


def _alive_in(sessions: set[int]) -> list[int]:
    """The live (not zombie) processes of ``sessions``."""
    return sorted(p for p in _all_pids() if (s := _stat(p)) and s[2] in sessions and s[0] != "Z")


class DevRun:
    """One ``dev.py run`` and its output."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(DEV), "run"],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_default_signals,
            )
        self.sessions: set[int] = set()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        """Until it prints the URL; then notes its three children's sessions."""
        deadline = time.monotonic() + START_TIMEOUT
        while READY not in self.output():
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dev.py run did not start (exit {self.process.poll()}):\n{self.output()[-4000:]}")
            time.sleep(0.5)
        children = _children(self.process.pid)
        # The worker of the default queue, the trial worker and the web server.
        assert len(children) == 3, (children, self.output()[-2000:])
        argvs = [Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0") for child in children]
        # Trials on their own queue, in a thread pool; the rest on the prefork default queue.
        pools = sorted((argv[argv.index(b"-Q") + 1], b"--pool=threads" in argv) for argv in argvs if b"-Q" in argv)
        assert pools == [(b"celery", False), (b"trials", True)], argvs
        # Each leads a session of its own (start_new_session), which holds its processes.
        stats = [_stat(child) for child in children]
        assert {stat[2] for stat in stats if stat is not None} == set(children)
        self.sessions = set(children)

    def stop(self, signum: int, timeout: float = 60) -> int | None:
        os.kill(self.process.pid, signum)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_all(self) -> None:
        """The tests' own clean-up, whatever state they failed in."""
        for pid in [self.process.pid, *_alive_in(self.sessions)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def dev_runs() -> Iterator[list[DevRun]]:
    runs: list[DevRun] = []
    yield runs
    for run in runs:
        run.kill_all()


def _wait_gone(sessions: set[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (alive := _alive_in(sessions)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_dev_run_stops_web_and_worker_on_each_signal_and_starts_again_at_once(
    signum: signal.Signals, tmp_path: Path, dev_runs: list[DevRun]
) -> None:
    _require_current_venv()
    port = _free_port()
    env = _env(tmp_path, port)
    first = DevRun(env, tmp_path / "first.log")
    dev_runs.append(first)
    first.wait_ready()
    assert not _port_free(port)

    code = first.stop(signum)
    if signum == signal.SIGKILL:
        # Nothing runs in dev.py any more: the children's parent-death
        # signal (SIGTERM) stops them.
        assert code == -signal.SIGKILL
        assert _wait_gone(first.sessions, timeout=60) == []
    else:
        assert code == 0, first.output()[-3000:]
        # dev.py waits for every process of both sessions before it exits.
        assert _alive_in(first.sessions) == []
        assert f"[rsiweb] stopped by {signum.name}: web server and workers" in first.output()
        assert "exited with an error" not in first.output()
    assert _port_free(port)

    # At once, on the same port, database and folder.
    again = DevRun(env, tmp_path / "again.log")
    dev_runs.append(again)
    again.wait_ready()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=30) as response:
        assert response.status == 200
        assert b'name="password"' in response.read()
    assert again.stop(signal.SIGTERM) == 0, again.output()[-3000:]
    assert _alive_in(again.sessions) == []
    assert _port_free(port)


def test_dev_run_refuses_a_busy_port_before_starting_anything(tmp_path: Path) -> None:
    _require_current_venv()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, str(DEV), "run"],
            cwd=REPO_ROOT,
            env=_env(tmp_path, port),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        assert result.stderr == ""
        line = result.stdout.strip()
        found = re.fullmatch(r".* e\.g\. RSI_PORT=(\d+) python3\.11 dev\.py run", line)
        assert found is not None, line
        suggested = int(found.group(1))
        assert line == (
            f"[rsiweb] port {port} on 127.0.0.1 is already in use (another dev.py run, or another server): "
            f"choose another port with RSI_PORT, e.g. RSI_PORT={suggested} python3.11 dev.py run"
        )
        # The suggestion is a port that is free now.
        assert suggested > port and _port_free(suggested)
    # Nothing was started or written: no database, no keys, no broker folder.
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize(
    ("variable", "port"),
    [("RSI_PORT", "eighty"), ("RSI_PORT", "0"), ("RSI_PORT", "70000"), ("RSI_LLM_PORT", "eighty")],
)
def test_dev_run_refuses_a_port_that_is_not_one(variable: str, port: str, tmp_path: Path) -> None:
    env = {**_env(tmp_path, _free_port()), variable: port}
    if variable == "RSI_LLM_PORT":
        env["RSI_LLM"] = "local"  # the local model's server port is checked only when it is asked for
    result = subprocess.run(
        [sys.executable, str(DEV), "run"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stdout == (
        f"[rsiweb] {variable}={port!r} is not a port number (1 to 65535): choose another port with {variable}, "
        f"e.g. {variable}=<port> python3.11 dev.py run\n"
    )
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize(
    ("given", "prefork_max_age", "trial_pool"),
    [
        ({}, "60", None),
        ({"DATABASE_URL": "postgres://u@db:5432/rsi"}, "60", "5"),
        ({"DATABASE_URL": "postgresql://u@db/rsi", "RSI_TRIAL_SLOTS": "64"}, "60", "12"),
        ({"DATABASE_URL": "postgres://u@db/rsi", "RSI_DB_CONN_MAX_AGE": "5"}, "5", None),
        # A pool excludes persistent connections (settings refuse both): left as given.
        ({"DATABASE_URL": "postgres://u@db/rsi", "RSI_DB_POOL_SIZE": "6"}, None, "6"),
    ],
)
def test_dev_run_gives_the_prefork_worker_kept_connections_and_the_trial_worker_a_pool_on_postgresql(
    given: dict[str, str], prefork_max_age: str | None, trial_pool: str | None
) -> None:
    workers = {name: (command, env) for name, command, env in _dev_module().worker_commands({"PATH": "/bin", **given})}
    assert set(workers) == {"worker", "trial worker"}
    prefork_command, prefork_env = workers["worker"]
    trial_command, trial_env = workers["trial worker"]
    assert "--pool=threads" not in prefork_command and "--pool=threads" in trial_command
    assert prefork_env.get("RSI_DB_CONN_MAX_AGE") == prefork_max_age
    assert prefork_env.get("RSI_DB_POOL_SIZE") == given.get("RSI_DB_POOL_SIZE")
    assert trial_env.get("RSI_DB_POOL_SIZE") == trial_pool
    assert trial_env.get("RSI_DB_CONN_MAX_AGE") == given.get("RSI_DB_CONN_MAX_AGE")


@pytest.mark.parametrize("slots", [1, 2, 8, 31, 32, 64, 100, 1000])
def test_dev_run_sizes_the_trial_workers_pool_as_the_settings_do(slots: int) -> None:
    from rsiweb.settings import pool_size

    env = {"DATABASE_URL": "postgres://u@db/rsi", "RSI_TRIAL_SLOTS": str(slots)}
    trial_env = {name: worker_env for name, _, worker_env in _dev_module().worker_commands(env)}["trial worker"]
    assert trial_env["RSI_DB_POOL_SIZE"] == str(pool_size(slots))
