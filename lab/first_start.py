"""The README's first command as a newcomer meets it, checked end to end (CI runs this).

    python3.11 lab/first_start.py [--commit REV] [--rounds N] [--keep]

Standard library only, run with the machine's Python 3.11 outside any virtual environment. It clones REV
(default HEAD) into a fresh folder and runs ``python3.11 dev.py run`` there with nothing of this shell's
configuration (no DATABASE_URL, broker or RSI_* variable, no virtual environment on PATH), so ``dev.py``
builds ``.venv`` from requirements.txt alone (pip's download cache is shared). It fails, with the reason and
the tail of the output, unless:

1. ``/login/`` answers 200, and every product module imports in that runtime-only environment;
2. the web server and both workers are up when the page is served and still up once the example's first
   round is certified through the workers;
3. SIGTERM to ``dev.py`` stops it with status 0 and leaves no process it started;
4. a second ``dev.py run`` on the stopped, half-run example says it continues the example's run, serves again,
   and the workers finish that run; SIGTERM stops it cleanly again;
5. no output of either start holds a traceback, and ``manage.py verify_records`` passes afterwards.

It prints the minutes each stage took; the README quotes them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = "[rsiweb] web server: "
# A first install on a loaded machine: building .venv is most of it.
SERVE_TIMEOUT = 900.0
ROUND_TIMEOUT = 1500.0
STOP_TIMEOUT = 90.0
POLL_SECONDS = 5.0
# What a newcomer's shell does not have: the product's own settings and another virtual environment.
DROPPED_PREFIXES = ("RSI_", "DJANGO_", "CELERY_")
DROPPED = {"DATABASE_URL", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
PRODUCT_PACKAGES = ("rsiweb", "evolution", "review", "api", "lab")

# Read in the clone's environment by ``manage.py shell``: where the example's own run stands.
RUN_STATE = """
import json
from evolution.models import CertifiedResult, Experiment
experiment = Experiment.objects.filter(name="example-routing").first()
run = experiment.runs.order_by("pk").first() if experiment else None
print(json.dumps(None if run is None else {
    "run": run.pk, "status": run.status, "round": run.current_round, "rounds": run.rounds,
    "stop_reason": run.stop_reason, "error": run.error[-500:],
    "certified": {str(n): CertifiedResult.objects.filter(candidate__run=run, candidate__round=n).count()
                  for n in range(1, run.rounds + 1)},
}))
"""

# Every module of the product, imported in the runtime-only environment (what a worker or command may import).
IMPORT_ALL = """
import importlib, os, pkgutil, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings")
import django
django.setup()
failed = []
count = 0
for package in sys.argv[1:]:
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        count += 1
        try:
            importlib.import_module(info.name)
        except Exception as exc:  # every failure is reported, not the first only
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
print(f"imported {count - len(failed)} of {count} modules")
for line in failed:
    print("  " + line)
sys.exit(1 if failed else 0)
"""


# Whether the example's run, as RUN_STATE reads it, has reached what a check waits for.
Done = Callable[[dict[str, object]], bool]


class Failed(Exception):
    """A check did not hold; the message says which and why."""


def say(message: str) -> None:
    print(f"[first-start] {message}", flush=True)


def newcomer_env(port: int) -> dict[str, str]:
    env = {
        key: value for key, value in os.environ.items() if key not in DROPPED and not key.startswith(DROPPED_PREFIXES)
    }
    own_venv = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != own_venv)
    env["RSI_PORT"] = str(port)
    return env


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, session) of ``pid``; None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid, _pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
    return state, int(ppid), int(session)


def live_pids() -> list[int]:
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if (stat := proc_stat(pid)) is not None and stat[0] != "Z"]


def children_of(pid: int) -> dict[int, str]:
    """The live children of ``pid``, with what each runs (web server or which worker)."""
    found = {}
    for child in live_pids():
        stat = proc_stat(child)
        if stat is None or stat[1] != pid:
            continue
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"runserver" in argv:
                found[child] = "web server"
            elif b"-Q" in argv:
                found[child] = f"worker ({argv[argv.index(b'-Q') + 1].decode()})"
            else:
                found[child] = b" ".join(argv).decode(errors="replace")
    return found


def started_by(folder: Path, sessions: set[int]) -> list[int]:
    """Live processes in the children's sessions, or working in the clone."""
    mine = []
    for pid in live_pids():
        stat = proc_stat(pid)
        in_session = stat is not None and stat[2] in sessions
        try:
            in_folder = os.readlink(f"/proc/{pid}/cwd").startswith(str(folder))
        except OSError:
            in_folder = False
        if (in_session or in_folder) and pid != os.getpid():
            mine.append(pid)
    return mine


class Start:
    """One ``python3.11 dev.py run`` in the clone, its output in a file."""

    def __init__(self, folder: Path, env: dict[str, str], log: Path) -> None:
        self.folder, self.env, self.log = folder, env, log
        self.began = time.monotonic()
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "dev.py", "run"],
                cwd=folder,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.children: dict[int, str] = {}

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def fail(self, why: str) -> Failed:
        return Failed(f"{why}\n--- the last of {self.log.name} ---\n{self.output()[-6000:]}")

    def wait_served(self, port: int) -> float:
        """Seconds from the start to a 200 on /login/; notes the three children."""
        deadline = self.began + SERVE_TIMEOUT
        while READY not in self.output():
            if self.process.poll() is not None:
                raise self.fail(f"dev.py run exited with status {self.process.returncode} before serving")
            if time.monotonic() > deadline:
                raise self.fail(f"no page served within {SERVE_TIMEOUT:.0f} s")
            time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=30) as response:
            if response.status != 200 or b'name="password"' not in response.read():
                raise self.fail(f"/login/ answered {response.status} without a login form")
        served = time.monotonic() - self.began
        self.children = children_of(self.process.pid)
        self.check_alive("when the page was served")
        return served

    def check_alive(self, when: str) -> None:
        now = children_of(self.process.pid)
        roles = sorted(now.values())
        expected = ["web server", "worker (celery)", "worker (trials)"]
        if roles != expected or set(now) != set(self.children):
            raise self.fail(f"{when}: dev.py's children are {now}, expected {expected} with pids {self.children}")

    def run_state(self) -> dict[str, object] | None:
        shell = subprocess.run(
            [str(self.folder / ".venv" / "bin" / "python"), "manage.py", "shell", "-c", RUN_STATE],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if shell.returncode != 0:
            raise self.fail(f"reading the run's state failed:\n{shell.stderr[-3000:]}")
        state: dict[str, object] | None = json.loads(shell.stdout.strip().splitlines()[-1])
        return state

    def wait_for(self, what: str, done: Done, timeout: float) -> tuple[float, dict[str, object]]:
        """Poll the run's state until ``done(state)``; seconds from the start, and the state."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise self.fail(f"dev.py run exited with status {self.process.returncode} while waiting for {what}")
            state = self.run_state()
            if state is not None and done(state):
                return time.monotonic() - self.began, state
            if state is not None and state["status"] in ("failed", "cancelled", "paused"):
                raise self.fail(f"{what}: the example's run is {state['status']} ({state})")
            if time.monotonic() > deadline:
                raise self.fail(f"{what}: not within {timeout:.0f} s (the run: {state})")
            time.sleep(POLL_SECONDS)

    def stop(self) -> None:
        """SIGTERM as a user's ``kill``; exit 0 and nothing left behind."""
        sessions = set(self.children)
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            code = self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise self.fail(f"dev.py run did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM") from exc
        if code != 0:
            raise self.fail(f"dev.py run exited with status {code} after SIGTERM")
        if "[rsiweb] stopped by SIGTERM: web server and workers" not in self.output():
            raise self.fail("dev.py run did not say it stopped the web server and the workers")
        left = started_by(self.folder, sessions)
        if left:
            raise self.fail(f"processes left running after SIGTERM: {left}")

    def kill_all(self) -> None:
        """Whatever state a failed check left: ``dev.py`` and everything it started, killed."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pid in started_by(self.folder, set(self.children)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def check_no_traceback(self) -> None:
        if "Traceback (most recent call last)" in self.output():
            raise self.fail("the output holds a traceback")


def round_certified(number: int) -> Done:
    def done(state: dict[str, object]) -> bool:
        certified = state["certified"]
        assert isinstance(certified, dict)
        moved_on = state["status"] == "finished" or int(str(state["round"])) > number
        return moved_on and int(certified.get(str(number), 0)) > 0

    return done


def run_finished(state: dict[str, object]) -> bool:
    return state["status"] == "finished"


def check(folder: Path, rounds: int) -> list[str]:
    port = free_port()
    env = newcomer_env(port)
    if rounds:
        env["RSI_EXAMPLE_ROUNDS"] = str(rounds)
    figures = []

    first = Start(folder, env, folder.parent / "first-start.log")
    try:
        served = first.wait_served(port)
        say(f"first start: /login/ answered 200 after {served:.0f} s; web server and both workers up")
        figures.append(f"fresh clone to a served page: {served:.0f} s")
        imports = subprocess.run(
            [str(folder / ".venv" / "bin" / "python"), "-c", IMPORT_ALL, *PRODUCT_PACKAGES],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
        )
        say(f"runtime-only environment: {imports.stdout.strip()}")
        if imports.returncode != 0:
            raise first.fail(f"a product module does not import from requirements.txt alone:\n{imports.stderr[-3000:]}")
        if "started the example's run" not in first.output():
            raise first.fail("the first start did not say it started the example's run")
        took, state = first.wait_for("the example's first round certified", round_certified(1), ROUND_TIMEOUT)
        say(f"first start: round 1 certified through the workers after {took:.0f} s: {state}")
        figures.append(f"fresh clone to the example's first round certified: {took:.0f} s")
        first.check_alive("once round 1 was certified")
        first.check_no_traceback()
        first.stop()
        say("first start: SIGTERM stopped it (status 0), nothing left running")
    except BaseException:
        first.kill_all()
        raise

    stopped_at = first.run_state()
    assert stopped_at is not None
    second = Start(folder, env, folder.parent / "second-start.log")
    try:
        served = second.wait_served(port)
        say(f"second start: /login/ answered 200 after {served:.0f} s")
        if stopped_at["status"] == "running":
            expected = f"continuing the example's run {stopped_at['run']}"
            if expected not in second.output():
                raise second.fail(f"the second start did not say {expected!r} (the run stood at {stopped_at})")
            took, state = second.wait_for("the interrupted run's end", run_finished, 2 * ROUND_TIMEOUT)
            say(f"second start: the run, stopped at round {stopped_at['round']}, finished after {took:.0f} s: {state}")
        elif "continuing" in second.output() or "started the example's run" in second.output():
            raise second.fail(f"the run had ended ({stopped_at}), yet the second start runs it again")
        second.check_alive("at the end of the second start")
        second.check_no_traceback()
        second.stop()
        say("second start: SIGTERM stopped it (status 0), nothing left running")
    except BaseException:
        second.kill_all()
        raise

    verify = subprocess.run(
        [str(folder / ".venv" / "bin" / "python"), "manage.py", "verify_records"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
    )
    say(f"verify_records: exit {verify.returncode}: {verify.stdout.strip()[-400:]}")
    if verify.returncode != 0:
        raise Failed(f"verify_records failed after the two starts:\n{verify.stdout[-2000:]}{verify.stderr[-2000:]}")
    return figures


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="what to clone (default HEAD)")
    parser.add_argument("--rounds", type=int, default=0, help="RSI_EXAMPLE_ROUNDS for the start (default: dev.py's)")
    parser.add_argument("--keep", action="store_true", help="keep the clone and the logs")
    args = parser.parse_args(argv)
    if sys.version_info[:2] != (3, 11):
        say(f"run it with python3.11 (this is {sys.version.split()[0]})")
        return 2
    work = Path(tempfile.mkdtemp(prefix="rsiweb-first-start-"))
    folder = work / "rsiweb"
    commit = subprocess.run(
        ["git", "rev-parse", "--verify", f"{args.commit}^{{commit}}"], cwd=ROOT, capture_output=True, text=True
    )
    if commit.returncode != 0:
        say(f"{args.commit!r} is not a commit of {ROOT}")
        return 2
    sha = commit.stdout.strip()
    # A stopped check (CI's time limit, Ctrl-C) still stops what it started: the handlers below run.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(folder)], check=True)
    subprocess.run(["git", "checkout", "--quiet", sha], cwd=folder, check=True)
    say(f"cloned {sha[:12]} into {folder}; running python3.11 dev.py run there as a newcomer would")
    try:
        figures = check(folder, args.rounds)
    except Failed as failure:
        say(f"FAILED: {failure}")
        say(f"the clone and its logs are kept in {work}")
        return 1
    say("passed: " + "; ".join(figures))
    if args.keep:
        say(f"the clone and its logs are kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
