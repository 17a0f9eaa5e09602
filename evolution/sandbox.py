"""Run one command under resource limits, optionally inside bubblewrap.

Pure process plumbing, no ORM. Linux only (rlimits, prctl, /proc).

What a run guarantees:

- The environment is exactly the ``env`` the caller passes; nothing is
  inherited from the worker.
- rlimits (CPU, address space, file size, processes, open files, no core
  dumps) are set in the child before it executes anything.
- What the command adds to its ``writable`` paths, all files together, is
  capped at ``disk_bytes``: measured while it runs and stopped (its group
  killed) once over, so it can overshoot by what it writes between two
  measurements (``DISK_POLL_SECONDS``, longer for big trees, shorter for
  a fast writer near its limit); see ``_DiskWatch``. Trial folders sit in
  ``/dev/shm`` by default, where every byte is host memory that the
  address-space limit does not count.
- stdout and stderr go to anonymous temporary files outside every workspace
  and are read back capped, so a flood costs at most ``file_bytes`` of disk
  per stream (RLIMIT_FSIZE applies to them too) and ``output_bytes`` of
  memory.
- The child leads a new session; on timeout its whole process group is
  killed. Afterwards every process that escaped the group (double-forked
  daemons) is killed and reaped: the caller becomes a child subreaper, so
  orphans are reparented to it instead of to init.
- When the worker runs as root, the command runs as a uid and gid of its
  own (``run_ids``: a fixed base plus the id of the worker thread that
  starts it, so no two runs in progress on the host share them) with no supplementary groups and
  no_new_privs, after the writable paths are chowned to it: RLIMIT_NPROC does
  not bind root, and root could read the database and key files. A uid per
  run keeps concurrent trials apart: RLIMIT_NPROC counts every task of a
  real uid on the host, so under a shared uid one trial's fork bomb would use
  up the process budget of every other trial running beside it, and one
  trial could signal another's processes.
- With bubblewrap: no network (unless the caller passes ``network=True``:
  then the host's, for an agent that calls a hosted model), a private
  pid/ipc/uts namespace, a private ``/tmp`` and ``/dev/shm`` (tmpfs of at
  most ``disk_bytes`` each), a read-only root, and a filesystem holding only
  the system directories, the Python
  interpreter, the ``readable`` paths (read-only) and the ``writable`` paths.
  The root filesystem is never bound, so the database and keys are not even
  visible.

What it does not promise: containment of hostile code. Without bubblewrap
the command sees every world-readable file of the host; under a non-root worker
without bubblewrap it runs as the worker's own user and can read and change
whatever the worker can. Disk use outside the writable paths (the host's
``/tmp`` without bubblewrap) is capped only per file.
The platform records and audits; it sandboxes what the machine allows.

Runs may go on at once in several threads of one process (a thread-pool
worker holds dozens of trials waiting on their agents). Each thread runs one
command at a time. The sweep after a run kills the new children of the
process that are not the command of a run still in progress; under a root
worker it also spares processes of another run's uid, so one trial ending
does not stop what another trial started. A non-root worker without
bubblewrap cannot tell two runs' escaped daemons apart: a daemon one trial
left behind may then be stopped when another trial ends, never later than
its own trial's end. Other code in the process must not start subprocesses
it expects to outlive a run.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

# Root-dropped runs use uid = gid = RUN_ID_BASE + the thread id of the
# thread that starts them (pids and thread ids share one range, at most
# 4,194,304 on Linux): above the system and user
# ranges and above systemd's container ranges (which end at 0x6FFFFFFF,
# 1,879,048,191), and below 2**31.
RUN_ID_BASE = 1_900_000_000

SANDBOX_MODES = ("auto", "required", "off")

# prctl(2) option numbers from <linux/prctl.h>.
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# Host directories a sandboxed program needs to start; symlinks (merged /usr)
# are recreated as symlinks instead of being bound.
SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib64", "/etc")

# Seconds the sweep keeps killing and reaping escaped processes before giving up.
SWEEP_SECONDS = 10.0

# Seconds between two measurements of what a run wrote to its writable
# paths; longer when measuring takes more than a twentieth of it, shorter
# (down to DISK_POLL_MIN_SECONDS) when a run writing DISK_FAST_WRITE_BYTES
# a second, or faster as measured, could use half of what it may still
# add before the next one.
DISK_POLL_SECONDS = 0.05
DISK_POLL_MAX_SECONDS = 1.0
DISK_POLL_MIN_SECONDS = 0.005
# A fast writer into /dev/shm: Python writing 1 MiB blocks to 4 MiB files
# as fast as it can (docs/agents.md has what it measured).
DISK_FAST_WRITE_BYTES = 4 << 30

# Runs inside bubblewrap as the sandboxed command where setpriv or env is
# missing: drops root to the given uid/gid after bwrap has set up the mounts
# (bwrap as root cannot do it itself without a user namespace, which would
# map the sandbox back to root), puts back the PWD the caller gave (bwrap
# sets it to the working directory: "-" removes it, "=value" sets it, ""
# keeps bwrap's), then becomes the real command.
_BWRAP_EXEC = (
    "import os,sys\n"
    "uid,gid,pwd=sys.argv[1:4]\n"
    "if pwd=='-':os.environ.pop('PWD',None)\n"
    "elif pwd:os.environ['PWD']=pwd[1:]\n"
    "if uid!='-':os.setgroups([]);os.setgid(int(gid));os.setuid(int(uid))\n"
    "try:os.execvp(sys.argv[4],sys.argv[4:])\n"
    "except OSError as e:sys.stderr.write('sandbox: cannot run %r: %s\\n'%(sys.argv[4],e));os._exit(127)\n"
)

# Held while a command is started and registered, and while a sweep lists
# the children, so a sweep never takes another run's command for a stray.
# A sweep lists the children of its own thread and of the main thread, where
# the kernel puts orphans (``_run_child_pids``): a command another thread
# starts is listed under that thread alone until it is reaped, so no other
# sweep can see it. A bubblewrap command started there needs neither the
# lock nor the registration (``_guarded``): nothing of it outlives it outside
# its PID namespace, where a command run directly could leave a daemon that
# another run's sweep must recognize by its uid.
_SPAWN_LOCK = threading.Lock()
# The commands of the runs in progress in this process: pid -> the run's
# uid when it dropped root, else -1.
_LIVE_RUNS: dict[int, int] = {}

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - every Linux libc loads
    _LIBC = None


def run_ids() -> tuple[int, int]:
    """The uid and gid a root worker's runs drop to from this thread.

    Unique among the runs in progress on the host: a thread runs one
    sandboxed command at a time, and thread ids (the main thread's is its
    process's pid) are unique on the host while their threads live.
    """
    ident = RUN_ID_BASE + threading.get_native_id()
    return ident, ident


class SandboxError(RuntimeError):
    """The sandbox could not be set up; the command itself is not to blame."""


class SandboxUnavailable(SandboxError):
    """Bubblewrap was required but does not work on this machine."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run. All values are positive integers.

    ``processes`` is the number of tasks (processes and threads) the run may
    add to those its uid already has; ``output_bytes`` caps the captured
    stdout/stderr and, for trials, the total size of the output folder;
    ``disk_bytes`` caps what the run adds to its writable paths, all files
    together (``file_bytes`` is per file), and the size of its private
    ``/tmp`` and ``/dev/shm`` under bubblewrap.
    """

    cpu_seconds: int = 60
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    processes: int = 256
    open_files: int = 256
    output_bytes: int = 4 << 20
    disk_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            # bool is an int subclass; True as a limit is a configuration mistake.
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"limit {field.name!r} must be a positive integer, got {value!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Limits:
        """Limits from a JSON object; missing keys take the defaults."""
        data = dict(data or {})
        known = [field.name for field in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown limit {', '.join(map(repr, unknown))}; known limits: {', '.join(known)}")
        return cls(**data)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class ProcessResult:
    """How a sandboxed command ended.

    ``returncode`` is negative (``-signal``) when the command was killed by a
    signal; under bubblewrap an exit status above 128 is read as a signal,
    as bwrap reports it that way. ``stdout`` is the head and ``stderr`` the
    tail of the stream, each at most ``Limits.output_bytes``.
    ``strays_reaped`` counts processes outside the command's own exit that
    the sweep had to kill or reap. ``disk_exceeded`` says the command was
    killed for writing more than ``Limits.disk_bytes`` to its writable
    paths (or for making a folder there that cannot be measured), and
    ``disk_problem`` says which.
    """

    returncode: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    wall_time: float
    killed_by_signal: int | None
    strays_reaped: int = 0
    disk_exceeded: bool = False
    disk_problem: str = ""


def sandbox_profile(mode: str) -> str:
    """The sandbox a trial runs under for ``mode`` ("auto", "required", "off").

    Returns "bwrap" or "none"; raises SandboxUnavailable when ``mode`` is
    "required" and the bubblewrap probe fails. Safe to repeat (the probe is
    cached per process).
    """
    if mode not in SANDBOX_MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; expected one of {', '.join(SANDBOX_MODES)}")
    if mode == "off":
        return "none"
    if probe_bubblewrap():
        return "bwrap"
    if mode == "required":
        raise SandboxUnavailable("bubblewrap is required but missing or not working on this machine")
    return "none"


@functools.cache
def probe_bubblewrap() -> bool:
    """Whether bubblewrap works here with exactly the flags trials use.

    Starts the worker's Python interpreter in a sandbox built like a trial's,
    so a kernel without user namespaces, a missing bwrap or an interpreter
    that cannot be bound all show up as False. Cached per process.
    """
    # The bubblewrap probed is the one every later command runs.
    _bwrap_path.cache_clear()
    _bwrap_has_size.cache_clear()
    if shutil.which("bwrap") is None:
        return False
    try:
        with tempfile.TemporaryDirectory(prefix="rsi-bwrap-probe-") as tmp:
            result = run_sandboxed(
                [sys.executable, "-I", "-S", "-c", "pass"],
                cwd=Path(tmp),
                env={"LANG": "C.UTF-8"},
                timeout=30,
                limits=Limits(),
                writable=[Path(tmp)],
                readable=[],
                use_bwrap=True,
            )
    except (OSError, SandboxError):
        return False
    return result.returncode == 0 and not result.timed_out


def interpreter_paths(python: str) -> list[Path]:
    """Directories a sandbox must expose read-only for ``python`` to start.

    The interpreter's prefix, the prefix of the binary it resolves to, and
    for a virtualenv the base installation named in ``pyvenv.cfg``. The root
    directory is never returned.
    """
    located = shutil.which(python) or python
    exe = Path(located).absolute()
    candidates = [exe.parent.parent, Path(os.path.realpath(exe)).parent.parent]
    config = exe.parent.parent / "pyvenv.cfg"
    if config.is_file():
        for line in config.read_text(errors="replace").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                home = Path(value.strip())
                candidates += [home.parent, Path(os.path.realpath(home)).parent]
    found: list[Path] = []
    for path in candidates:
        if path != Path("/") and path.is_dir() and path not in found:
            found.append(path)
    return found


def run_sandboxed(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    limits: Limits,
    writable: Sequence[Path],
    readable: Sequence[Path],
    use_bwrap: bool,
    network: bool = False,
    root: Path | None = None,
) -> ProcessResult:
    """Run ``argv`` to completion (or ``timeout`` seconds) and clean up after it.

    Under bubblewrap the command has no network unless ``network`` is true;
    then it shares the host's (everything else stays private). Without
    bubblewrap it always has the host's network. ``root``: a task
    environment's root filesystem (evolution/environments.py), whose system
    directories replace the host's, read-only; it needs bubblewrap.

    Preconditions: absolute paths; ``cwd`` and every ``writable`` path exist;
    ``readable`` paths that do not exist are skipped. Raises ValueError for
    bad arguments and SandboxError when the sandbox cannot be set up; a
    command that cannot be started gives returncode 127. When it returns,
    the command and every process it started are gone. Under root, the
    ``writable`` trees are chowned to ``run_ids()`` as a side effect.
    """
    argv = _checked_argv(argv)
    cwd, writable_paths, readable_paths = _checked_paths(cwd, writable, readable)
    if root is not None and not use_bwrap:
        raise SandboxError("a task environment's root filesystem needs bubblewrap (RSI_SANDBOX=off cannot use it)")
    env = _checked_env(env)
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")

    drop = os.geteuid() == 0
    run_uid, run_gid = run_ids()
    if drop:
        for path in writable_paths:
            _chown_tree(path, run_uid, run_gid)
        if not use_bwrap:
            # Outside bwrap the run's uid must reach the real paths; say so plainly
            # instead of letting the command fail with EACCES.
            for path in [cwd, *writable_paths]:
                _check_reachable(path, run_uid, run_gid, "directory")
            program = shutil.which(argv[0], path=env.get("PATH", os.defpath))
            if program is not None:
                _check_reachable(Path(os.path.realpath(program)), run_uid, run_gid, "program")
    rlimits = _rlimit_plan(limits, None if drop else os.getuid())
    # Measured before the command starts: what it may add is counted from here.
    watch = _DiskWatch(writable_paths, limits.disk_bytes)
    _become_subreaper()
    before = _run_child_pids()
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(tempfile.TemporaryFile())
        err = stack.enter_context(tempfile.TemporaryFile())
        status, status_sink = _pipe(stack)
        # A root worker's sandbox (no user namespace) gets its limits from
        # this process: bubblewrap names its first process in the sandbox
        # on --info-fd and holds it on --block-fd until the limits are set
        # (``_limit_and_release``), before it forks or executes anything.
        # Nothing runs between fork and exec in the worker, so subprocess
        # starts bubblewrap with vfork instead of copying the worker's
        # memory map (5 ms a start for a worker of 120 MB), and no program
        # in the sandbox sets them (one exec less a command).
        gate = (_pipe(stack), _pipe(stack)) if use_bwrap and drop else None
        popen_kwargs: dict[str, Any]
        if use_bwrap:
            command = _bwrap_command(
                argv,
                cwd=cwd,
                env=env,
                writable=writable_paths,
                readable=readable_paths,
                ids=(run_uid, run_gid) if drop else None,
                network=network,
                disk_bytes=limits.disk_bytes,
                root=root,
            )
            # bwrap reports {"exit-code": n} only if the command really ran,
            # which tells a broken sandbox from a failing command.
            command[1:1] = ["--json-status-fd", str(status_sink.fileno())]
            passed = [status_sink.fileno()]
            if gate is not None:
                (_, info_sink), (block, _) = gate
                command[1:1] = ["--info-fd", str(info_sink.fileno()), "--block-fd", str(block.fileno())]
                passed += [info_sink.fileno(), block.fileno()]
            popen_kwargs = {"cwd": "/", "env": {}, "pass_fds": tuple(passed)}
            if gate is None:
                # An unprivileged worker's sandbox is a user namespace, whose
                # processes this one may not limit from outside: the limits
                # are set before bwrap starts (RLIMIT_NPROC then counts the
                # uid's tasks on the host, not the namespace's). bwrap sets
                # no_new_privs itself; a setuid bwrap must not get it earlier.
                popen_kwargs["preexec_fn"] = _preexec(rlimits, no_new_privs=False)
        else:
            command = argv
            popen_kwargs = {"cwd": cwd, "env": env, "preexec_fn": _preexec(rlimits, no_new_privs=True)}
            if drop:
                popen_kwargs.update(user=run_uid, group=run_gid, extra_groups=[])
        guarded = _guarded(use_bwrap)
        started = time.monotonic()
        try:
            # Dozens of trial slots start commands at once: the lock only where a sweep could see the command.
            with _SPAWN_LOCK if guarded else contextlib.nullcontext():
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    **popen_kwargs,
                )
                if guarded:
                    _LIVE_RUNS[proc.pid] = run_uid if drop else -1
        except subprocess.SubprocessError as exc:
            # Only preexec_fn failures land here: limits or prctl refused.
            raise SandboxError(f"could not apply limits to the child: {exc}") from exc
        except OSError as exc:
            if use_bwrap:
                raise SandboxError(f"could not start bubblewrap: {exc}") from exc
            err.write(f"sandbox: cannot run {argv[0]!r}: {exc}\n".encode())
            return _result(127, False, out, err, limits, time.monotonic() - started, use_bwrap, 0)
        # Only the child holds the write ends now, so the reads below end at its exit.
        status_sink.close()
        timed_out = False
        try:
            if gate is not None:
                (info, info_sink), (block, release) = gate
                info_sink.close()
                block.close()
                # Until a byte is written to ``release`` the sandbox runs nothing; if the
                # limits cannot be set, the finally below kills it before ``release`` closes.
                _limit_and_release(info, release, rlimits, timeout)
            timed_out = _wait(proc, max(0.0, timeout - (time.monotonic() - started)), watch)
        finally:
            # Also runs on KeyboardInterrupt: never leave the group behind.
            _kill_group(proc.pid)
            proc.wait()
            wall_time = time.monotonic() - started
            # Reaped: from here the pid may name another run's new command.
            if guarded:
                with _SPAWN_LOCK:
                    _LIVE_RUNS.pop(proc.pid, None)
            strays = _sweep(before, own_uid=run_uid if drop else None)
        result = _result(proc.returncode, timed_out, out, err, limits, wall_time, use_bwrap, strays)
        if watch.problem:
            return replace(result, disk_exceeded=True, disk_problem=watch.problem)
        if use_bwrap and not timed_out and b'"exit-code"' not in _read_available(status):
            tail = result.stderr[-2000:].decode(errors="replace")
            if proc.returncode is not None and proc.returncode < 0:
                # bubblewrap itself was killed from outside (not the
                # agent inside it, whose exit bubblewrap would report).
                name = signal.Signals(-proc.returncode).name
                raise SandboxError(f"the sandbox was killed by {name} before the command finished: {tail}")
            raise SandboxError(f"bubblewrap could not set up the sandbox: {tail}")
        return result


def _pipe(stack: contextlib.ExitStack) -> tuple[IO[bytes], IO[bytes]]:
    """A pipe's read and write ends as unbuffered files closed with ``stack``."""
    read, write = os.pipe()
    return (
        stack.enter_context(open(read, "rb", buffering=0)),
        stack.enter_context(open(write, "wb", buffering=0)),
    )


def _limit_and_release(
    info: IO[bytes], release: IO[bytes], rlimits: Sequence[tuple[int, tuple[int, int]]], timeout: float
) -> None:
    """Set ``rlimits`` on bubblewrap's first process in the sandbox, which
    waits on ``--block-fd`` before it forks the command, and let it go on.

    bubblewrap writes ``{"child-pid": N}`` to ``info`` once it has cloned
    that process, and closes it. Nothing is written when it failed before
    (a bad option, say): the sandbox never started and bubblewrap reports
    why on stderr. bubblewrap builds the sandbox's mounts before it waits
    on the gate: when that fails the process ends on its own, before it
    could run anything, and is gone (ESRCH) by the time its limits are set;
    bubblewrap's status then tells the caller why. Once the process waits
    on the gate it cannot end or be replaced, so its pid names it.
    SandboxError when a limit cannot be set or bubblewrap says nothing
    within ``timeout``; the caller then kills the process group (the
    blocked process is still in it) before the gate closes, so the command
    never runs without its limits.
    """
    deadline = time.monotonic() + timeout
    report = b""
    while True:
        ready, _, _ = select.select([info], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise SandboxError(f"bubblewrap did not start the sandbox within {timeout:g} s")
        chunk = info.read(4096)
        if not chunk:
            break
        report += chunk
    if not report:
        return
    try:
        pid = int(json.loads(report)["child-pid"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SandboxError(f"bubblewrap reported no sandbox process: {report[:200]!r}") from exc
    try:
        for res, value in rlimits:
            resource.prlimit(pid, res, value)
    except ProcessLookupError:
        return  # it failed to build the sandbox and ran nothing; the gate stays shut
    except OSError as exc:
        raise SandboxError(f"could not apply limits to the sandbox: {exc}") from exc
    with contextlib.suppress(BrokenPipeError):  # it ended after its limits were set, before the gate
        release.write(b"\0")


def _guarded(use_bwrap: bool) -> bool:
    """Whether a command must be started under ``_SPAWN_LOCK`` and registered in ``_LIVE_RUNS``: all but
    a bubblewrap command started on a thread other than the main one, where the kernel lists each
    thread's children (see ``_SPAWN_LOCK``)."""
    return not (use_bwrap and _CHILDREN_LISTED and threading.current_thread() is not threading.main_thread())


# --- argument checks ----------------------------------------------------------


def _checked_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str) or not argv or not all(isinstance(arg, str) for arg in argv):
        raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
    return list(argv)


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key:
            raise ValueError(f"bad environment entry {key!r}={value!r}")
    return dict(env)


def _checked_paths(
    cwd: Path, writable: Sequence[Path], readable: Sequence[Path]
) -> tuple[Path, list[Path], list[Path]]:
    cwd = Path(cwd)
    if not cwd.is_absolute() or not cwd.is_dir():
        raise ValueError(f"cwd must be an existing absolute directory, got {cwd}")
    writable_paths = [Path(path) for path in writable]
    readable_paths = [Path(path) for path in readable]
    for path in [*writable_paths, *readable_paths]:
        if not path.is_absolute():
            raise ValueError(f"sandbox paths must be absolute, got {path}")
        if path == Path("/"):
            # Binding / would expose the database and the keys.
            raise ValueError("the root filesystem can never be bound into a sandbox")
    for path in writable_paths:
        if not path.exists():
            raise ValueError(f"writable path {path} does not exist")
    return cwd, writable_paths, [path for path in readable_paths if path.exists()]


# --- limits and privileges ----------------------------------------------------


def _rlimit_plan(limits: Limits, shared_uid: int | None) -> list[tuple[int, tuple[int, int]]]:
    """The (resource, (soft, hard)) pairs to set in the child.

    RLIMIT_NPROC counts every task of the real uid on the host. A run that
    drops root runs as its own uid (``run_ids``: this thread's, whose every
    process the sweep removed before the thread's last run returned), so
    its budget is the limit itself, with no scan of every process on the
    host before each command (two a trial, over hundreds of processes with
    dozens of trial slots busy); were any left, the budget would only be
    tighter. Otherwise the run shares ``shared_uid`` (the worker's own)
    with everything else it runs, and the budget is added to what that uid
    already runs. Values are clamped to the current hard limit, which an
    unprivileged child could not raise.
    """
    already = 0 if shared_uid is None else _task_count(shared_uid)
    plan = [
        # One second of grace: SIGXCPU first, SIGKILL at the hard limit.
        (resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1)),
        (resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes)),
        (resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes)),
        (resource.RLIMIT_NPROC, (already + limits.processes,) * 2),
        (resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    clamped = []
    for res, (soft, hard) in plan:
        _, current_hard = resource.getrlimit(res)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        clamped.append((res, (soft, hard)))
    return clamped


def _task_count(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) whose real uid is ``uid``.

    Only processes whose /proc folder belongs to ``uid`` (their effective
    uid) are read: a stat costs far less than rendering every process's
    status, and a process whose real and effective uids differ (a setuid
    program) is not one a trial's unprivileged user runs.
    """
    total = 0
    for name in _proc_pids():
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            with open(f"/proc/{name}/status", "rb") as handle:
                status = handle.read()
        except OSError:
            continue
        real_uid = threads = None
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                real_uid = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                threads = int(line.split()[1])
        if real_uid == uid:
            total += threads or 1
    return total


def _prctl(option: int, value: int) -> None:
    if _LIBC is None or _LIBC.prctl(option, value, 0, 0, 0) != 0:
        errno = ctypes.get_errno() if _LIBC is not None else 0
        raise OSError(errno, f"prctl({option}, {value}) failed: {os.strerror(errno)}")


def _preexec(rlimits: list[tuple[int, tuple[int, int]]], *, no_new_privs: bool) -> Callable[[], None]:
    """The function run in the child between fork and exec (after any setuid)."""

    def preexec() -> None:
        for res, value in rlimits:
            resource.setrlimit(res, value)
        # Die with the worker instead of running on as an orphan.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if no_new_privs:
            # setuid binaries (su, sudo, ...) must not hand root back.
            _prctl(PR_SET_NO_NEW_PRIVS, 1)

    return preexec


def _become_subreaper() -> None:
    """Make orphaned descendants reparent to this process so the sweep sees them."""
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
    except OSError as exc:
        raise SandboxError(f"cannot become a child subreaper: {exc}") from exc


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    os.chown(root, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def first_blocked(path: Path, uid: int | None = None, gid: int | None = None) -> Path | None:
    """The first of ``path`` and its ancestors that uid/gid may not search or execute.

    None when the whole path is reachable. The default ids are this
    process's run ids (``run_ids``), which own no file but the writable paths
    of its runs: what a root-dropped run can reach. Looks at mode bits only
    (no ACLs), and at the path as given: pass a resolved path to check a
    symlink's target.
    """
    if uid is None or gid is None:
        uid, gid = run_ids()
    for part in [*reversed(path.parents), path]:
        st = part.stat()
        if st.st_uid == uid:
            bit = 0o100
        elif st.st_gid == gid:
            bit = 0o010
        else:
            bit = 0o001
        if not st.st_mode & bit:
            return part
    return None


def _check_reachable(path: Path, uid: int, gid: int, what: str) -> None:
    blocked = first_blocked(path, uid, gid)
    if blocked is not None:
        raise SandboxError(
            f"{what} {path} is unreachable for uid {uid} without bubblewrap: {blocked} is not searchable "
            "or executable by it (use directories with mode 0711 or wider, and an interpreter outside /root)"
        )


# --- bubblewrap ---------------------------------------------------------------


def _bwrap_command(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    writable: list[Path],
    readable: list[Path],
    ids: tuple[int, int] | None,
    network: bool = False,
    disk_bytes: int = Limits.disk_bytes,
    root: Path | None = None,
) -> list[str]:
    """The bubblewrap command line; the caller adds the descriptors.

    ``ids`` is the (uid, gid) a root worker drops to. A root worker's
    sandbox has no user namespace, so the drop happens inside it, with the
    system's setpriv after bwrap has built the mounts. bwrap sets PWD to the
    working directory; env puts back what the caller gave, and nothing runs
    for that when the caller's PWD is the working directory (as a trial's
    is). Where setpriv or env is missing, a Python shim does both.
    ``network``: the host's network namespace instead of an empty one.
    ``disk_bytes``: the size of the private ``/tmp`` and ``/dev/shm``
    (tmpfs, in memory, mode 1777 so that a root worker's command can write
    them too); the root bwrap builds is then remounted read-only, since in
    a user namespace the command owns it (and could fill memory there). A
    bubblewrap without ``--size`` (before 0.8) leaves them uncapped, and
    writable only by a command that owns them (in a user namespace).
    ``root``: the system directories come from this root filesystem instead
    of the host's; a readable path inside them would be hidden by them, so
    it is refused (SandboxError).
    """
    drop = ids is not None
    bwrap = _bwrap_path()
    system_part, system_mounts = _system_part() if root is None else _root_part(str(root))
    if drop:
        # Everything --unshare-all does except the user namespace: as root it
        # would map the sandbox back to root, and the drop to the run's uid below
        # needs to happen in the host's user namespace to count for RLIMIT_NPROC.
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        if not network:
            namespaces.insert(2, "--unshare-net")
    else:
        namespaces = ["--unshare-all", "--share-net"] if network else ["--unshare-all"]
    command = [bwrap, *namespaces, "--die-with-parent", "--new-session", *system_part]
    # Capped, the private /tmp and /dev/shm are writable by everyone (1777, as a
    # system's /tmp): a root worker's command runs as a uid of its own, and
    # tools (compilers, test runners, package managers) write /tmp.
    sized = ["--size", str(disk_bytes), "--perms", "1777"] if _bwrap_has_size() else []
    command += ["--proc", "/proc", "--dev", "/dev", *sized, "--tmpfs", "/tmp", *sized, "--tmpfs", "/dev/shm"]
    fresh_mounts = {"/proc", "/dev", "/tmp"}
    # Host directories visible in the sandbox: their subdirectories already exist.
    # On strings (absolute and normalized, as pathlib gives them, "/" never among
    # them): pathlib's parents and comparisons cost a millisecond a command line.
    host_mounts = list(system_mounts)

    interpreter = (str(Path(sys.prefix)), str(Path(sys.base_prefix)))  # normalized, as the other paths are
    binds = [("--ro-bind", path) for path in interpreter if os.path.exists(path)]
    binds += [("--ro-bind", str(path)) for path in readable if path.exists()]
    binds += [("--bind", str(path)) for path in writable]
    created: set[str] = set()
    seen: set[tuple[str, str]] = set()
    # Parents first, so a later bind never hides an earlier one below it.
    for flag, path in sorted(binds, key=lambda bind: bind[1].count("/")):
        if (flag, path) in seen:
            continue
        if _covered(path, system_mounts):
            if root is not None:
                raise SandboxError(f"{path} is inside the system directories of the root filesystem {root}")
            if flag == "--ro-bind":
                continue  # the host's system directories hold it already
        seen.add((flag, path))
        parent = ""
        for part in path.split("/")[1:-1]:
            parent = f"{parent}/{part}"
            if parent in created or parent in fresh_mounts or _covered(parent, host_mounts):
                continue
            # bwrap would create missing parents 0700, unreachable after the drop.
            command += ["--perms", "0755", "--dir", parent]
            created.add(parent)
        command += [flag, path, path]
        host_mounts.append(path)

    if sized:
        # Last of the mounts: every folder made for a bind is made by now.
        command += ["--remount-ro", "/"]
    command.append("--clearenv")
    for key, value in env.items():
        command += ["--setenv", key, value]
    command += ["--chdir", str(cwd), "--"]
    uid, gid = (str(ids[0]), str(ids[1])) if ids is not None else ("-", "-")
    # What bwrap's PWD (the working directory) must become: "-" none, "=value" the caller's, "" as it is.
    pwd = "-" if "PWD" not in env else "" if env["PWD"] == str(cwd) else f"={env['PWD']}"
    tools = _exec_tools()
    if tools is not None and "=" not in argv[0]:
        # The same steps with small C programs: a second Python start-up
        # costs more than a whole trivial trial.
        setpriv, env_program = tools
        drop_to = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"] if drop else []
        if pwd == "-":
            restore = [env_program, "-u", "PWD", "--"]
        elif pwd or not drop:
            # Without setpriv, env is what runs the command: exit 127 when it
            # cannot (bwrap's own exec failure would exit 1).
            restore = [env_program, "--", *([f"PWD{pwd}"] if pwd else [])]
        else:
            restore = []
        return [*command, *drop_to, *restore, *argv]
    return [*command, sys.executable, "-I", "-S", "-c", _BWRAP_EXEC, uid, gid, pwd, *argv]


@functools.cache
def _exec_tools() -> tuple[str, str] | None:
    """setpriv and env from the system directories (bound in every
    sandbox), or None to fall back to the Python shim. An ``env`` exits
    with 127 and names the program when it cannot run it, like the shim;
    so does setpriv."""
    found = []
    for name in ("setpriv", "env"):
        for directory in ("/usr/bin", "/bin"):
            path = os.path.join(directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                found.append(path)
                break
        else:
            return None
    return found[0], found[1]


def _covered(path: str, mounts: Sequence[str]) -> bool:
    # Paths are absolute and normalized, and "/" is never a mount.
    return any(path == mount or path.startswith(f"{mount}/") for mount in mounts)


@functools.cache
def _system_part() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The system directories' part of every bubblewrap command line, and
    the paths it mounts: the host's layout, read once."""
    part: list[str] = []
    mounts: list[str] = []
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            part += ["--symlink", os.readlink(name), name]
            mounts.append(name)
        elif os.path.isdir(name):
            part += ["--ro-bind", name, name]
            mounts.append(name)
    return tuple(part), tuple(mounts)


# Top-level folders of a task environment's root that stay private: the
# sandbox makes its own /proc, /dev and /tmp, and the rest belongs to no trial.
ROOT_SKIPPED = frozenset({"proc", "dev", "sys", "tmp", "run", "root", "home", "mnt", "media", "lost+found", "boot"})


@functools.lru_cache(maxsize=64)
def _root_part(root: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Like ``_system_part`` for a task environment's root filesystem: its
    top-level folders bound read-only (links recreated as links) in place of
    the host's, but for ROOT_SKIPPED."""
    part: list[str] = []
    mounts: list[str] = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name in ROOT_SKIPPED or name.startswith("."):
            continue
        if os.path.islink(path):
            part += ["--symlink", os.readlink(path), f"/{name}"]
            mounts.append(f"/{name}")
        elif os.path.isdir(path):
            part += ["--ro-bind", path, f"/{name}"]
            mounts.append(f"/{name}")
    return tuple(part), tuple(mounts)


@functools.cache
def _bwrap_has_size() -> bool:
    """Whether this bubblewrap takes ``--size`` (0.8 and later)."""
    try:
        shown = subprocess.run([_bwrap_path(), "--help"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return b"--size" in shown.stdout + shown.stderr


@functools.cache
def _bwrap_path() -> str:
    """bubblewrap's path; an exception is not cached, so it is looked up until found."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bwrap is not installed")
    return bwrap


# --- processes ----------------------------------------------------------------


def _proc_pids() -> list[str]:
    try:
        return [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _child_pids() -> set[int]:
    """Pids whose parent is this process.

    Read from the kernel's list of each thread's children
    (/proc/self/task/<tid>/children): a few small reads, where scanning
    every process's /proc/<pid>/stat costs milliseconds on a busy host,
    twice per command. The scan remains where the kernel keeps no such
    list (built without CONFIG_PROC_CHILDREN).
    """
    if not _CHILDREN_LISTED:
        return _child_pids_scanned()
    children: set[int] = set()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return _child_pids_scanned()
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as handle:
                children.update(int(pid) for pid in handle.read().split())
        except FileNotFoundError:
            # The thread ended while this ran: orphans go to a live thread of the
            # process (the main one, which started every sandboxed command).
            continue
    return children


def _run_child_pids() -> set[int]:
    """The children of this process a run can have: those of the calling
    thread (its command) and of the main thread, to which the kernel
    reparents orphans (the first live thread of a subreaper). Two reads,
    where ``_child_pids`` reads one per thread: a thread-pool worker has
    a hundred and more, and a trial lists children four times."""
    if not _CHILDREN_LISTED:
        return _child_pids_scanned()
    children: set[int] = set()
    for tid in {os.getpid(), threading.get_native_id()}:
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as handle:
                children.update(int(pid) for pid in handle.read().split())
        except FileNotFoundError:  # the main thread ended: orphans go to another thread
            return _child_pids()
    return children


def _children_listed() -> bool:
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/children", "rb"):
            return True
    except OSError:
        return False


def _child_pids_scanned() -> set[int]:
    """``_child_pids`` from every process's /proc/<pid>/stat."""
    me = os.getpid()
    children = set()
    for name in _proc_pids():
        # Plain descriptors: this runs over every process, twice per command.
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
        except OSError:
            continue
        try:
            stat = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        # The command name may contain spaces and parentheses; fields resume after the last ')'.
        fields_after_comm = stat[stat.rindex(b")") + 2 :].split()
        if int(fields_after_comm[1]) == me:
            children.add(int(name))
    return children


_CHILDREN_LISTED = _children_listed()


def _wait(proc: subprocess.Popen[bytes], timeout: float, watch: _DiskWatch) -> bool:
    """Wait for ``proc`` to exit; True when ``timeout`` passed first. Between
    waits ``watch`` measures the writable paths, and the wait ends (False)
    once it finds them over their limit (``watch.problem``).

    ``Popen.wait(timeout=...)`` polls with sleeps of up to 50 ms, which
    costs more than a whole fast trial; a pidfd wakes us the moment the
    child exits. Falls back to polling where pidfds are unavailable.
    """
    deadline = time.monotonic() + timeout
    try:
        pidfd: int | None = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            step = min(remaining, watch.interval)
            if pidfd is None:
                try:
                    proc.wait(timeout=step)
                    return False
                except subprocess.TimeoutExpired:
                    pass
            else:
                ready, _, _ = select.select([pidfd], [], [], step)
                if ready:
                    proc.wait()
                    return False
            if watch.over():
                return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def disk_poll_interval(walk_seconds: float, grown: int, elapsed: float, headroom: int) -> float:
    """Seconds to the next measurement of a run's writable paths.

    ``walk_seconds`` is what the last measurement took, ``grown`` the bytes
    the paths grew by in the ``elapsed`` seconds since the one before (0
    for the first), and ``headroom`` the bytes the run may still add. The
    steady interval is twenty walks (measuring costs at most a twentieth
    of a core), between ``DISK_POLL_SECONDS`` and ``DISK_POLL_MAX_SECONDS``.
    A run that could use half its headroom before then, writing
    ``DISK_FAST_WRITE_BYTES`` a second or as fast as it was measured to,
    is measured once it may have, but not sooner than
    ``DISK_POLL_MIN_SECONDS`` nor than two walks: what it can write past
    its limit is what it writes in about that long, not in a whole steady
    interval (at 2 GB/s, 50 ms let 100 MiB through a limit of 32 MiB).
    """
    steady = min(DISK_POLL_MAX_SECONDS, max(DISK_POLL_SECONDS, 20 * walk_seconds))
    rate = max(DISK_FAST_WRITE_BYTES, grown / elapsed if grown > 0 and elapsed > 0 else 0)
    halfway = max(0, headroom) / 2 / rate
    return min(steady, max(DISK_POLL_MIN_SECONDS, 2 * walk_seconds, halfway))


class _DiskWatch:
    """What a run adds to its writable paths, measured from outside.

    A size-capped file system cannot be made without privileges, and a
    per-file limit (RLIMIT_FSIZE) does not cap a folder of many files, so
    the trees are walked between waits: the blocks every entry takes
    (``st_blocks``: what a tmpfs charges to memory, sparse files as
    allocated, links as themselves, hard links once per name), compared
    with what they took before the command started. Once over
    ``maximum`` the run is stopped; it may have written past the limit by
    what it writes in one interval (``disk_poll_interval``: from the time
    a walk takes, shorter for a limit a fast writer reaches soon). A folder
    that cannot be read (a command running as the worker's user may chmod
    one to 000) cannot be measured, which stops the run too.
    """

    def __init__(self, paths: Sequence[Path], maximum: int) -> None:
        self.paths = [str(path) for path in paths]
        self.maximum = maximum
        self.problem = ""
        started = time.monotonic()
        self.baseline, _ = self._usage()
        self._last = (time.monotonic(), self.baseline)
        self.interval = disk_poll_interval(self._last[0] - started, 0, 0, maximum)

    def _usage(self) -> tuple[int, str]:
        """Bytes the trees take, and the folder that could not be read ("" when none)."""
        total = 0
        stack = list(self.paths)
        while stack:
            folder = stack.pop()
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:  # removed while this ran
                            continue
                        total += st.st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
            except FileNotFoundError:
                continue
            except OSError:
                return total, folder
        return total, ""

    def over(self) -> bool:
        """Measure; True (with ``problem`` set) when the run must stop."""
        started = time.monotonic()
        used, unreadable = self._usage()
        finished = time.monotonic()
        last_at, last_used = self._last
        self._last = (finished, used)
        headroom = self.maximum - (used - self.baseline)
        self.interval = disk_poll_interval(finished - started, used - last_used, finished - last_at, headroom)
        if unreadable:
            self.problem = f"its writable folder {unreadable} could not be read to measure it"
        elif headroom < 0:
            self.problem = f"it wrote more than {self.maximum} bytes to its writable folders (limits.disk_bytes)"
        return bool(self.problem)


def _kill_group(pgid: int) -> None:
    # The group id stays reserved while any member lives, so this cannot hit a stranger.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _strays(before: set[int], own_uid: int | None) -> set[int]:
    """Children of this process that no run in progress claims: not present
    in ``before``, not the command of a run in progress and, for a
    root-dropped run (``own_uid``), not running as another run's uid."""
    with _SPAWN_LOCK:
        strays = _run_child_pids() - before - set(_LIVE_RUNS)
        others = {uid for uid in _LIVE_RUNS.values() if uid >= 0 and uid != own_uid}
    if own_uid is None or not others:
        return strays
    return {pid for pid in strays if _real_uid(pid) not in others}


def _real_uid(pid: int) -> int | None:
    """The real uid of ``pid`` from /proc, None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _sweep(before: set[int], *, own_uid: int | None = None) -> int:
    """Kill and reap every child of this process that no run in progress
    claims (``_strays``).

    Escaped daemons were reparented here (subreaper), and killing one can
    reparent its own children here, so repeat until a pass finds none.
    Returns how many processes were reaped.
    """
    reaped = 0
    deadline = time.monotonic() + SWEEP_SECONDS
    while time.monotonic() < deadline:
        strays = _strays(before, own_uid)
        if not strays:
            return reaped
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in strays:
            reaped += _reap(pid, deadline)
    raise SandboxError(f"processes of the sandboxed command survived {SWEEP_SECONDS} s of SIGKILL")


def _reap(pid: int, deadline: float) -> int:
    # Woken by a pidfd the moment the killed process exits: polling with
    # sleeps cost milliseconds per command, as bubblewrap's own child is
    # reparented here and reaped in every run.
    with contextlib.suppress(AttributeError, OSError):
        pidfd = os.pidfd_open(pid)
        try:
            select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(pidfd)
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if done:
            return 1
        if time.monotonic() > deadline:
            return 0
        time.sleep(0.005)


def _result(
    returncode: int,
    timed_out: bool,
    out: IO[bytes],
    err: IO[bytes],
    limits: Limits,
    wall_time: float,
    use_bwrap: bool,
    strays: int,
) -> ProcessResult:
    if use_bwrap and returncode > 128 and (returncode - 128) in signal.valid_signals():
        returncode = -(returncode - 128)
    stdout, stdout_truncated = _read_head(out, limits.output_bytes)
    stderr, stderr_truncated = _read_tail(err, limits.output_bytes)
    return ProcessResult(
        returncode=returncode,
        timed_out=timed_out,
        stdout=stdout,
        stderr=stderr,
        stdout_truncated=stdout_truncated,
        stderr_truncated=stderr_truncated,
        wall_time=wall_time,
        killed_by_signal=-returncode if returncode < 0 else None,
        strays_reaped=strays,
    )


def _read_available(stream: IO[bytes]) -> bytes:
    """What the pipe holds; every writer is gone, so this never blocks."""
    os.set_blocking(stream.fileno(), False)
    chunks: list[bytes] = []
    while len(chunks) < 64:
        try:
            chunk = stream.read(65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _read_head(stream: IO[bytes], cap: int) -> tuple[bytes, bool]:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(0)
    return stream.read(cap), size > cap


def _read_tail(stream: IO[bytes], cap: int) -> tuple[bytes, bool]:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - cap))
    return stream.read(cap), size > cap
