"""One trial: a candidate harness run on one task, then graded.

Pure process plumbing, no ORM: the caller materializes the harness, the
task's public input and the evaluator into folders and gets a TrialResult
back to store.

Layout of a trial folder (fresh per trial, removed afterwards)::

    <tmp>/workspace/harness   copy of the candidate's files      agent: rw
    <tmp>/workspace/task      copy of the task's public input    agent: rw
    <tmp>/output              the agent's answer and trajectory  agent: rw, verifier: ro
    <tmp>/evaluator           copy of the evaluator's files      both: ro
    <tmp>/private             expected data, created only after  verifier: rw
                              the agent and all its processes
                              are gone

The agent reports token usage in ``<output>/trajectory.json`` (ATIF) or
``<output>/usage.json`` (``{"tokens": int, "steps": int}``). The verifier
prints one JSON object on stdout: ``passed`` (bool), ``score`` (number in
[0, 1]), ``criteria`` (list), ``valid_output`` (bool), ``submitted`` (bool).

Any error makes the outcome "error", never "pass". The verifier still runs
after an agent timeout or crash, so whether something valid was submitted
is recorded, but its verdict is not honoured and the score stays None.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolution import environments, faults, limits
from evolution.sandbox import (
    SANDBOX_MODES,
    Limits,
    ProcessResult,
    SandboxError,
    interpreter_paths,
    run_sandboxed,
    sandbox_profile,
)

logger = logging.getLogger(__name__)

ERROR_KINDS = (
    "agent_timeout",
    "agent_crash",
    "agent_output",
    "verifier_timeout",
    "verifier_crash",
    "verifier_output",
    "sandbox",
    "infra",
)
PLACEHOLDERS = ("python", "evaluator", "workspace", "harness", "task", "output", "private", "seed", "trial_index")
# Only these exact tokens are replaced, so other braces (inline code, JSON) pass through.
_PLACEHOLDER_RE = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")

AGENT_LOG_CHARS = 16_000
ERROR_TAIL_CHARS = 2_000
TRAJECTORY_FILE = "trajectory.json"
USAGE_FILE = "usage.json"
EXPECTED_FILE = "expected.json"


@dataclass(frozen=True)
class TrialSpec:
    """Everything one trial needs. Validated on construction (ValueError).

    ``runner_argv`` and ``verifier_argv`` are templates over PLACEHOLDERS;
    the runner may not name {private}. ``env_allowlist`` names variables
    copied from the worker's environment when present; ``extra_env`` is
    added on top (e.g. RSI_SEED). ``python`` is the interpreter substituted
    for {python}. ``agent_network``: under bubblewrap the agent's command
    keeps the host's network (an agent that calls a hosted model); the
    verifier's never does. ``environment``: the recipe of a task environment
    (evolution/environments.py), built under ``environments_dir`` when it is
    not yet and used as the root filesystem of the agent and the verifier.
    """

    harness_dir: Path
    task_dir: Path
    evaluator_dir: Path
    private: Mapping[str, Any]
    runner_argv: list[str]
    verifier_argv: list[str]
    env_allowlist: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = 60.0
    limits: Limits = field(default_factory=Limits)
    seed: int = 0
    trial_index: int = 0
    sandbox_mode: str = "auto"
    python: str = sys.executable
    verifier_timeout_seconds: float = 60.0
    # The folders are this trial's own fresh copies: moved into the trial
    # folder instead of copied again (they are gone afterwards).
    move_inputs: bool = False
    agent_network: bool = False
    environment: Mapping[str, Any] | None = None
    environments_dir: Path | None = None
    environment_bases_dir: Path | None = None
    # The task lets its verifier use the network (Harbor's allow_internet).
    verifier_network: bool = False

    def __post_init__(self) -> None:
        for name in ("runner_argv", "verifier_argv"):
            argv = getattr(self, name)
            if isinstance(argv, str) or not argv or not all(isinstance(arg, str) for arg in argv):
                raise ValueError(f"{name} must be a non-empty list of strings")
        if any("{private}" in arg for arg in self.runner_argv):
            raise ValueError("runner_argv must not reference {private}: the agent never sees private data")
        if not all(isinstance(name, str) for name in self.env_allowlist):
            raise ValueError("env_allowlist must be a list of variable names")
        if not all(isinstance(key, str) and isinstance(value, str) for key, value in self.extra_env.items()):
            raise ValueError("extra_env must map strings to strings")
        for name in ("timeout_seconds", "verifier_timeout_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if not isinstance(self.limits, Limits):
            raise ValueError("limits must be a Limits (use Limits.from_dict)")
        if self.sandbox_mode not in SANDBOX_MODES:
            raise ValueError(f"sandbox_mode must be one of {', '.join(SANDBOX_MODES)}")
        if self.trial_index < 0:
            raise ValueError("trial_index must not be negative")
        if not isinstance(self.agent_network, bool) or not isinstance(self.verifier_network, bool):
            raise ValueError("agent_network and verifier_network must be true or false")
        if self.environment is not None and self.environments_dir is None:
            raise ValueError("a task environment needs environments_dir")
        try:
            json.dumps(self.private, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"private data must be JSON-serializable: {exc}") from exc


@dataclass
class TrialResult:
    """What a trial produced. ``wall_time`` is the agent's, in seconds."""

    outcome: str
    score: float | None = None
    criteria_results: list[Any] = field(default_factory=list)
    tokens: int | None = None
    steps: int | None = None
    wall_time: float = 0.0
    valid_output: bool | None = None
    submitted: bool | None = None
    error_kind: str = ""
    error: str = ""
    sandbox_profile: str = "none"
    trajectory: dict[str, Any] | None = None
    agent_log: str = ""
    # The digest of the task environment's recipe the trial ran in ("" for the host's system).
    environment: str = ""


@dataclass(frozen=True)
class Verdict:
    passed: bool
    score: float
    criteria: list[Any]
    valid_output: bool
    submitted: bool


def run_trial(spec: TrialSpec, *, work_root: Path) -> TrialResult:
    """Run the agent, then the verifier, in a fresh folder under ``work_root``.

    Never raises for anything the agent or the verifier does; raises
    ValueError when the spec's folders are missing. The trial folder is
    removed whatever happens. Safe to repeat: each call starts from scratch.
    """
    for name in ("harness_dir", "task_dir", "evaluator_dir"):
        if not Path(getattr(spec, name)).is_dir():
            raise ValueError(f"{name} {getattr(spec, name)} is not a directory")
    try:
        profile = sandbox_profile(spec.sandbox_mode)
    except SandboxError as exc:
        return TrialResult(outcome="error", error_kind="sandbox", error=str(exc))

    work_root = Path(work_root).absolute()
    work_root.mkdir(parents=True, exist_ok=True)
    trial_dir = Path(tempfile.mkdtemp(prefix="trial-", dir=work_root))
    result = TrialResult(
        outcome="error",
        sandbox_profile=recorded_profile(
            profile, agent_network=spec.agent_network, verifier_network=spec.verifier_network
        ),
    )
    root = None
    try:
        if spec.environment is not None:
            result.environment = environments.recipe_digest(dict(spec.environment))
            if profile != "bwrap":
                raise SandboxError("a task environment needs bubblewrap (RSI_SANDBOX=off cannot use it)")
            assert spec.environments_dir is not None  # checked by TrialSpec
            root = environments.environment_build(
                dict(spec.environment), root=spec.environments_dir, bases=spec.environment_bases_dir
            )
        _run(spec, trial_dir, profile, result, root)
    except environments.EnvironmentBuildError as exc:
        _fail(result, "infra", f"the task environment could not be built: {exc}")
    except SandboxError as exc:
        _fail(result, "sandbox", str(exc))
    except OSError as exc:
        # Copying, chowning or reading our own folders failed: the machine, not the agent.
        _fail(result, "infra", f"{type(exc).__name__}: {exc}")
    finally:
        _remove_tree(trial_dir)
    return result


def recorded_profile(profile: str, *, agent_network: bool, verifier_network: bool = False) -> str:
    """The sandbox profile a trial records: bubblewrap's own name gains
    ``+agent-network`` when the agent kept the host's network (and
    ``+verifier-network`` when the verifier did), so a record never reads as
    isolated from the network when it was not."""
    if profile != "bwrap":
        return profile
    return profile + ("+agent-network" if agent_network else "") + ("+verifier-network" if verifier_network else "")


def _run(spec: TrialSpec, trial_dir: Path, profile: str, result: TrialResult, root: Path | None) -> None:
    # Reachable but not listable by the unprivileged trial user.
    trial_dir.chmod(0o711)
    workspace, output = trial_dir / "workspace", trial_dir / "output"
    evaluator, private = trial_dir / "evaluator", trial_dir / "private"
    workspace.mkdir()
    _place(spec.harness_dir, workspace / "harness", move=spec.move_inputs)
    _place(spec.task_dir, workspace / "task", move=spec.move_inputs)
    output.mkdir()
    _place(spec.evaluator_dir, evaluator, move=spec.move_inputs)
    _make_readable(evaluator)

    paths = {
        "python": spec.python,
        "evaluator": str(evaluator),
        "workspace": str(workspace),
        "harness": str(workspace / "harness"),
        "task": str(workspace / "task"),
        "output": str(output),
        "private": str(private),
        "seed": str(spec.seed),
        "trial_index": str(spec.trial_index),
    }
    use_bwrap = profile == "bwrap"
    python_dirs = interpreter_paths(spec.python)
    network_env, network_dirs = _host_network(trial_dir, root if spec.agent_network or spec.verifier_network else None)
    agent = run_sandboxed(
        faults.hold_argv("agent:start", _format_argv(spec.runner_argv, paths)),
        cwd=workspace,
        env={**_trial_env(spec, home=workspace), **(network_env if spec.agent_network else {})},
        timeout=spec.timeout_seconds,
        limits=spec.limits,
        writable=[workspace, output],
        readable=[evaluator, *python_dirs, *(network_dirs if spec.agent_network else [])],
        use_bwrap=use_bwrap,
        network=spec.agent_network,
        root=root,
    )
    result.wall_time = agent.wall_time
    result.agent_log = _tail(agent.stderr, AGENT_LOG_CHARS)
    agent_error = _agent_error(agent, spec)

    # The agent has exited and run_sandboxed swept its processes: nothing of it
    # runs any more, so nothing it leaves behind can react to what follows.
    size, problem = _scan_output(output)
    if problem is None and size > spec.limits.output_bytes:
        problem = f"output folder holds {size} bytes, over the limit of {spec.limits.output_bytes}"
    if problem is not None:
        # Too big or unsafe to hand to the verifier (a link could point at the private data).
        _fail(result, *(agent_error or ("agent_output", problem)))
        return
    usage_error = _read_usage(output, result)
    if agent_error is None and usage_error is not None:
        agent_error = ("agent_output", usage_error)

    private.mkdir(mode=0o700)
    (private / EXPECTED_FILE).write_text(json.dumps(spec.private, allow_nan=False))
    verifier = run_sandboxed(
        _format_argv(spec.verifier_argv, paths),
        cwd=private,
        env={**_trial_env(spec, home=private), **(network_env if spec.verifier_network else {})},
        timeout=spec.verifier_timeout_seconds,
        limits=spec.limits,
        writable=[private],
        readable=[evaluator, output, *python_dirs, *(network_dirs if spec.verifier_network else [])],
        use_bwrap=use_bwrap,
        network=spec.verifier_network,
        root=root,
    )
    verdict, verifier_error = _verdict(verifier, spec)
    if verdict is not None:
        result.criteria_results = verdict.criteria
        result.valid_output = verdict.valid_output
        result.submitted = verdict.submitted
    if agent_error is not None:
        _fail(result, *agent_error)
    elif verifier_error is not None or verdict is None:
        _fail(result, *(verifier_error or ("verifier_output", "no verdict")))
    else:
        result.outcome = "pass" if verdict.passed else "fail"
        result.score = verdict.score


def _host_network(trial_dir: Path, root: Path | None) -> tuple[dict[str, str], list[Path]]:
    """What a phase with the network needs inside a task environment to reach
    the registries as the machine does (a test.sh that pip-installs pytest):
    the machine's proxy variables and a copy of its CA bundle (the
    environment's own, if any, lacks the proxy's certificates), and the folder
    to bind for it. Nothing for a trial on the host's root, which sees both."""
    if root is None:
        return {}, []
    folder = trial_dir / "host-ca"
    if not environments.HOST_CA_BUNDLE.is_file():
        return environments.host_network_env(None), []
    folder.mkdir(mode=0o755)
    shutil.copyfile(environments.HOST_CA_BUNDLE, folder / "ca-certificates.crt")
    (folder / "ca-certificates.crt").chmod(0o644)
    return environments.host_network_env(str(folder / "ca-certificates.crt")), [folder]


def _place(source: Path, dest: Path, *, move: bool) -> None:
    if move:
        try:
            os.rename(source, dest)
            return
        except OSError:  # another file system: copy after all
            pass
    # symlinks=True: a link in the candidate must be followed by the agent with
    # the agent's rights, never dereferenced here with the worker's.
    shutil.copytree(source, dest, symlinks=True)


def _fail(result: TrialResult, kind: str, message: str) -> None:
    result.outcome = "error"
    result.score = None
    result.error_kind = kind
    result.error = message


def _format_argv(template: list[str], values: Mapping[str, str]) -> list[str]:
    return [_PLACEHOLDER_RE.sub(lambda match: values[match.group(1)], arg) for arg in template]


def _trial_env(spec: TrialSpec, *, home: Path) -> dict[str, str]:
    """The complete environment of a trial process, which starts in ``home``:
    nothing else is inherited. PWD names that folder, as a shell started
    there sets it (and bubblewrap does: the sandbox then runs no program to
    put another value back)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(home), "PWD": str(home)}
    if spec.environment is not None:
        # The task environment's ENV lines, as its image would set them.
        env.update({str(k): str(v) for k, v in dict(spec.environment.get("env") or {}).items()})
    env.update({name: os.environ[name] for name in spec.env_allowlist if name in os.environ})
    env.update(spec.extra_env)
    return env


def _make_readable(root: Path) -> None:
    """Give the evaluator copy modes the unprivileged user can read but not change."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                os.chmod(path, 0o755 if st.st_mode & 0o111 else 0o644)


def _remove_tree(path: Path) -> None:
    def retry_writable(func: Any, failed: str, _exc: Any) -> None:
        # An agent (non-root worker) may leave read-only folders behind.
        os.chmod(os.path.dirname(failed), 0o700)
        if os.path.isdir(failed) and not os.path.islink(failed):
            os.chmod(failed, 0o700)
        func(failed)

    try:
        shutil.rmtree(path, onerror=retry_writable)
    except OSError:
        logger.warning("could not remove trial folder %s", path, exc_info=True)


def _tail(data: bytes, chars: int) -> str:
    return data.decode("utf-8", errors="replace")[-chars:]


def _describe_exit(process: ProcessResult) -> str:
    if process.killed_by_signal is not None:
        try:
            name = signal.Signals(process.killed_by_signal).name
        except ValueError:
            name = f"signal {process.killed_by_signal}"
        return f"was killed by {name}"
    return f"exited with code {process.returncode}"


def _agent_error(agent: ProcessResult, spec: TrialSpec) -> tuple[str, str] | None:
    if agent.disk_exceeded:
        return "agent_output", f"agent was killed: {agent.disk_problem}"
    if agent.timed_out:
        return "agent_timeout", f"agent ran longer than {spec.timeout_seconds} s and was killed"
    if agent.returncode != 0:
        tail = _tail(agent.stderr, ERROR_TAIL_CHARS)
        return "agent_crash", f"agent {_describe_exit(agent)}; stderr tail:\n{tail}"
    return None


def _scan_output(root: Path) -> tuple[int, str | None]:
    """Total size of the output folder, and why it must not be read, if so.

    Sizes come from lstat, so links and sparse files are counted as what
    they are, never followed.
    """
    total = 0

    def stop(exc: OSError) -> None:
        raise exc

    try:
        for dirpath, dirnames, filenames in os.walk(root, onerror=stop):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                relative = os.path.relpath(path, root)
                if stat.S_ISLNK(st.st_mode):
                    return total, f"output contains a symbolic link: {relative}"
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                    return total, f"output contains a special file: {relative}"
                total += st.st_size
    except OSError as exc:
        return total, f"output folder is unreadable: {exc}"
    return total, None


def _read_usage(output: Path, result: TrialResult) -> str | None:
    """Fill tokens, steps and trajectory from the agent's files; return an error or None."""
    trajectory_path, usage_path = output / TRAJECTORY_FILE, output / USAGE_FILE
    if trajectory_path.is_file():
        try:
            document = limits.json_loads(trajectory_path.read_bytes(), what=TRAJECTORY_FILE)
        except limits.InputLimitError as exc:
            return str(exc)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"{TRAJECTORY_FILE} is not valid JSON: {exc}"
        try:
            tokens, atif_steps = atif_usage(document)
        except ValueError as exc:
            return f"{TRAJECTORY_FILE} is not an ATIF trajectory: {exc}"
        result.trajectory, result.tokens, result.steps = document, tokens, atif_steps
        if tokens is not None:
            return None
    if usage_path.is_file():
        try:
            usage = limits.json_loads(usage_path.read_bytes(), what=USAGE_FILE)
        except limits.InputLimitError as exc:
            return str(exc)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"{USAGE_FILE} is not valid JSON: {exc}"
        if not isinstance(usage, dict):
            return f"{USAGE_FILE} must be a JSON object"
        try:
            tokens, steps = _count(usage, "tokens"), _count(usage, "steps")
        except ValueError as exc:
            return f"{USAGE_FILE}: {exc}"
        if tokens is not None:
            result.tokens = tokens
            if result.steps is None:
                result.steps = steps
            return None
    return "no token usage reported"


def atif_usage(document: Any) -> tuple[int | None, int]:
    """(policy tokens, steps) of an ATIF trajectory; tokens None when it reports none.

    Tokens are ``final_metrics.total_prompt_tokens + total_completion_tokens``
    (final metrics may include subagents and retries, so they win), else the
    sum of the per-step ``metrics.prompt_tokens`` and ``completion_tokens``.
    Steps is the number of steps. Raises ValueError for a malformed document.
    """
    if not isinstance(document, dict):
        raise ValueError("the document must be a JSON object")
    steps = document.get("steps")
    if not isinstance(steps, list):
        raise ValueError("'steps' must be a list")
    final = document.get("final_metrics")
    if final is not None:
        if not isinstance(final, dict):
            raise ValueError("'final_metrics' must be an object")
        prompt, completion = _count(final, "total_prompt_tokens"), _count(final, "total_completion_tokens")
        if prompt is not None or completion is not None:
            return (prompt or 0) + (completion or 0), len(steps)
    total: int | None = None
    for index, step in enumerate(steps):
        if not isinstance(step, dict):
            raise ValueError(f"step {index} must be an object")
        metrics = step.get("metrics")
        if metrics is None:
            continue
        if not isinstance(metrics, dict):
            raise ValueError(f"step {index}: 'metrics' must be an object")
        for key in ("prompt_tokens", "completion_tokens"):
            count = _count(metrics, key)
            if count is not None:
                total = (total or 0) + count
    return total, len(steps)


def _count(container: Mapping[str, Any], key: str) -> int | None:
    value = container.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key!r} must be a non-negative integer, got {value!r}")
    return value


def _verdict(verifier: ProcessResult, spec: TrialSpec) -> tuple[Verdict | None, tuple[str, str] | None]:
    if verifier.disk_exceeded:
        return None, ("verifier_output", f"verifier was killed: {verifier.disk_problem}")
    if verifier.timed_out:
        return None, ("verifier_timeout", f"verifier ran longer than {spec.verifier_timeout_seconds} s and was killed")
    if verifier.returncode != 0:
        tail = _tail(verifier.stderr, ERROR_TAIL_CHARS)
        return None, ("verifier_crash", f"verifier {_describe_exit(verifier)}; stderr tail:\n{tail}")
    if verifier.stdout_truncated:
        return None, ("verifier_output", f"verifier printed more than {spec.limits.output_bytes} bytes")
    try:
        return parse_verdict(verifier.stdout), None
    except ValueError as exc:
        return None, ("verifier_output", str(exc))


def parse_verdict(stdout: bytes) -> Verdict:
    """The verifier's JSON verdict; ValueError for anything else."""
    try:
        document = limits.json_loads(stdout, what="verifier output")
    except limits.InputLimitError:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"verifier output is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ValueError("verifier output must be a JSON object")
    for key in ("passed", "valid_output", "submitted"):
        if not isinstance(document.get(key), bool):
            raise ValueError(f"verifier output: {key!r} must be true or false, got {document.get(key)!r}")
    score = document.get("score")
    if not isinstance(score, int | float) or isinstance(score, bool) or not math.isfinite(score) or not 0 <= score <= 1:
        raise ValueError(f"verifier output: 'score' must be a number in [0, 1], got {score!r}")
    criteria = document.get("criteria")
    if not isinstance(criteria, list):
        raise ValueError(f"verifier output: 'criteria' must be a list, got {criteria!r}")
    return Verdict(
        passed=document["passed"],
        score=float(score),
        criteria=criteria,
        valid_output=document["valid_output"],
        submitted=document["submitted"],
    )
