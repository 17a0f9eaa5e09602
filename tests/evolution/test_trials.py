"""Whole trials with real agent and verifier subprocesses (evolution.trials)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evolution import sandbox, trials
from evolution.sandbox import Limits, first_blocked, probe_bubblewrap
from evolution.trials import TrialResult, TrialSpec, atif_usage, parse_verdict, run_trial

MiB = 1 << 20
# Real Harbor trajectories, vendored with their provenance (tests/fixtures/atif/SOURCE.md).
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "atif"

# An ATIF-v1.5 document in the shape of the Harbor golden files (openhands hello-world).
ATIF = {
    "schema_version": "ATIF-v1.5",
    "session_id": "test-session",
    "agent": {"name": "test-agent", "version": "1.0.0", "model_name": "openai/gpt-4o"},
    "steps": [
        {"step_id": 1, "source": "system", "message": "You are a careful agent."},
        {"step_id": 2, "source": "user", "message": "Add the two numbers."},
        {
            "step_id": 3,
            "source": "agent",
            "model_name": "openai/gpt-4o",
            "message": "Reading the input.",
            "tool_calls": [{"tool_call_id": "c1", "function_name": "read", "arguments": {"path": "input.json"}}],
            "observation": {"results": [{"source_call_id": "c1", "content": '{"a": 2, "b": 3}'}]},
            "metrics": {"prompt_tokens": 120, "completion_tokens": 30},
        },
        {
            "step_id": 4,
            "source": "agent",
            "model_name": "openai/gpt-4o",
            "message": "The answer is 5.",
            "metrics": {"prompt_tokens": 100, "completion_tokens": 50},
        },
    ],
    "final_metrics": {"total_prompt_tokens": 220, "total_completion_tokens": 80, "total_cost_usd": 0.00135},
}

# Agent preamble: argv is [task, output]; the answer is a + b from the task input.
AGENT_HEAD = """
import json, os, sys
from pathlib import Path
task, output = Path(sys.argv[1]), Path(sys.argv[2])
numbers = json.loads((task / "input.json").read_text())
answer = numbers["a"] + numbers["b"]
TRAJECTORY = {atif}
def write_trajectory():
    (output / "trajectory.json").write_text(json.dumps(TRAJECTORY))
"""
GOOD_AGENT = """
(output / "answer.txt").write_text(str(answer))
write_trajectory()
"""
GOOD_VERIFIER = """
import json, sys
from pathlib import Path
expected = json.loads(Path("expected.json").read_text())
answer_file = Path(sys.argv[1]) / "answer.txt"
submitted = answer_file.is_file()
answer = answer_file.read_text().strip() if submitted else ""
correct = answer == str(expected["answer"])
print(json.dumps({
    "passed": correct,
    "score": 1.0 if correct else 0.0,
    "criteria": [{"id": "answer", "met": correct}],
    "valid_output": answer.isdigit(),
    "submitted": submitted,
}))
"""


def trial_python() -> str:
    """An interpreter a root-dropped run can execute (see test_sandbox.run_python)."""
    if os.geteuid() != 0:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(candidate) and first_blocked(Path(os.path.realpath(candidate))) is None:
            return candidate
    pytest.fail("no Python interpreter on this machine is executable by an unprivileged uid")


def require_bwrap() -> None:
    if not probe_bubblewrap():
        if os.environ.get("RSI_REQUIRE_SERVICES") == "1":
            pytest.fail("bubblewrap is required (RSI_REQUIRE_SERVICES=1) but does not work here")
        pytest.skip("bubblewrap is not available on this machine")


@pytest.fixture(params=["off", "required"], ids=["plain", "bwrap"])
def mode(request: pytest.FixtureRequest) -> str:
    if request.param == "required":
        require_bwrap()
    return request.param


@pytest.fixture
def work_root() -> Iterator[Path]:
    """Trial folders must be reachable by an unprivileged uid; pytest's tmp_path is 0700 under root."""
    path = Path(tempfile.mkdtemp(prefix="rsi-trials-test-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def make_spec(
    tmp_path: Path,
    agent_body: str = GOOD_AGENT,
    *,
    verifier: str = GOOD_VERIFIER,
    mode: str = "off",
    **overrides: Any,
) -> TrialSpec:
    harness, task, evaluator = tmp_path / "harness", tmp_path / "task", tmp_path / "evaluator"
    for folder in (harness, task, evaluator):
        folder.mkdir(exist_ok=True)
    head = AGENT_HEAD.replace("{atif}", repr(ATIF))
    (harness / "agent.py").write_text(head + textwrap.dedent(agent_body))
    (task / "instruction.md").write_text("Add a and b from input.json; write the sum to answer.txt.\n")
    (task / "input.json").write_text(json.dumps({"a": 2, "b": 3}))
    (evaluator / "verify.py").write_text(textwrap.dedent(verifier))
    fields: dict[str, Any] = {
        "harness_dir": harness,
        "task_dir": task,
        "evaluator_dir": evaluator,
        "private": {"answer": 5},
        "runner_argv": ["{python}", "{harness}/agent.py", "{task}", "{output}"],
        "verifier_argv": ["{python}", "{evaluator}/verify.py", "{output}"],
        "timeout_seconds": 20,
        "verifier_timeout_seconds": 20,
        "sandbox_mode": mode,
        "python": trial_python() if mode == "off" else sys.executable,
    }
    fields.update(overrides)
    return TrialSpec(**fields)


def processes_with_marker(marker: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
            except OSError:
                continue
    return found


def profile_of(mode: str) -> str:
    return "bwrap" if mode == "required" else "none"


# --- outcomes -------------------------------------------------------------------


def test_well_behaved_agent_passes(tmp_path: Path, work_root: Path, mode: str) -> None:
    started = time.monotonic()
    result = run_trial(make_spec(tmp_path, mode=mode), work_root=work_root)
    elapsed = time.monotonic() - started
    assert result == TrialResult(
        outcome="pass",
        score=1.0,
        criteria_results=[{"id": "answer", "met": True}],
        tokens=300,
        steps=4,
        wall_time=result.wall_time,
        valid_output=True,
        submitted=True,
        error_kind="",
        error="",
        sandbox_profile=profile_of(mode),
        trajectory=ATIF,
        agent_log="",
    )
    assert 0 < result.wall_time < elapsed
    assert list(work_root.iterdir()) == []


def test_wrong_answer_fails(tmp_path: Path, work_root: Path) -> None:
    agent = """
    (output / "answer.txt").write_text(str(answer + 1))
    write_trajectory()
    """
    result = run_trial(make_spec(tmp_path, agent), work_root=work_root)
    assert (result.outcome, result.score, result.error_kind) == ("fail", 0.0, "")
    assert result.criteria_results == [{"id": "answer", "met": False}]
    assert (result.valid_output, result.submitted) == (True, True)


def test_crashing_agent_is_an_error_even_with_a_right_answer(tmp_path: Path, work_root: Path, mode: str) -> None:
    agent = """
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    print("boom: the tool broke", file=sys.stderr)
    sys.exit(3)
    """
    result = run_trial(make_spec(tmp_path, agent, mode=mode), work_root=work_root)
    assert (result.outcome, result.score, result.error_kind) == ("error", None, "agent_crash")
    assert result.error == "agent exited with code 3; stderr tail:\nboom: the tool broke\n"
    assert result.agent_log == "boom: the tool broke\n"
    # The verifier did run (and would have passed it): recorded, not honoured.
    assert (result.criteria_results, result.submitted) == ([{"id": "answer", "met": True}], True)
    assert result.tokens == 300


def test_hanging_agent_times_out_and_is_killed(tmp_path: Path, work_root: Path, mode: str) -> None:
    marker = f"rsi-marker-{uuid.uuid4().hex}"
    agent = f"""
    import subprocess, time
    write_trajectory()
    print(os.getpid(), flush=True, file=sys.stderr)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # {marker}"])
    time.sleep(60)
    """
    started = time.monotonic()
    result = run_trial(make_spec(tmp_path, agent, mode=mode, timeout_seconds=2), work_root=work_root)
    assert time.monotonic() - started < 15
    assert (result.outcome, result.error_kind) == ("error", "agent_timeout")
    assert result.error == "agent ran longer than 2 s and was killed"
    assert processes_with_marker(marker) == []
    if mode == "off":
        # Outside bwrap the agent's pid is a host pid.
        with pytest.raises(ProcessLookupError):
            os.kill(int(result.agent_log), 0)


def test_double_forked_daemon_does_not_outlive_the_trial(tmp_path: Path, work_root: Path, mode: str) -> None:
    marker = f"rsi-marker-{uuid.uuid4().hex}"
    agent = f"""
    import time
    pid_file = Path("daemon.pid")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            pid_file.write_text(str(os.getpid()))
            print("daemon", os.getpid(), flush=True, file=sys.stderr)
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)  # {marker}"])
        os._exit(0)
    while not pid_file.exists():
        time.sleep(0.01)
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    """
    result = run_trial(make_spec(tmp_path, agent, mode=mode), work_root=work_root)
    assert (result.outcome, result.error_kind) == ("pass", "")
    assert processes_with_marker(marker) == []
    if mode == "off":
        daemon_pid = int(result.agent_log.split()[1])
        with pytest.raises(ProcessLookupError):
            os.kill(daemon_pid, 0)


def test_output_folder_flood_is_agent_output(tmp_path: Path, work_root: Path) -> None:
    agent = """
    for index in range(5):
        (output / f"blob-{index}.bin").write_bytes(b"x" * (1 << 20))
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    """
    spec = make_spec(tmp_path, agent, limits=Limits(output_bytes=4 * MiB))
    result = run_trial(spec, work_root=work_root)
    assert (result.outcome, result.error_kind) == ("error", "agent_output")
    assert result.error.startswith("output folder holds ")
    assert result.error.endswith(" bytes, over the limit of 4194304")
    # The verifier never ran and nothing was read from the flooded folder.
    assert (result.criteria_results, result.valid_output, result.tokens) == ([], None, None)


def test_stdout_flood_is_capped_and_kills_nothing_else(tmp_path: Path, work_root: Path) -> None:
    agent = """
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    for _ in range(50):
        sys.stdout.buffer.write(b"y" * (1 << 20))
    """
    started = time.monotonic()
    result = run_trial(make_spec(tmp_path, agent), work_root=work_root)
    assert time.monotonic() - started < 10
    # 16 MiB of stdout (RLIMIT_FSIZE) is all the disk a flood gets; then the write fails.
    assert (result.outcome, result.error_kind) == ("error", "agent_crash")
    assert "File too large" in result.agent_log
    assert len(result.agent_log) <= trials.AGENT_LOG_CHARS


def test_an_agent_filling_its_workspace_with_many_files_is_stopped(tmp_path: Path, work_root: Path, mode: str) -> None:
    """Issue 37: under a 16 MiB per-file limit an agent wrote 2 GiB in many
    files to its workspace, which sits in /dev/shm (host memory) by default."""
    agent = """
    write_trajectory()
    for index in range(64):
        (Path.home() / f"fill-{index}.bin").write_bytes(b"x" * (4 << 20))
    (output / "answer.txt").write_text(str(answer))
    """
    spec = make_spec(tmp_path, agent, mode=mode, limits=Limits(disk_bytes=32 * MiB, file_bytes=8 * MiB))
    result = run_trial(spec, work_root=work_root)
    assert (result.outcome, result.error_kind) == ("error", "agent_output")
    assert result.error == (
        f"agent was killed: it wrote more than {32 * MiB} bytes to its writable folders (limits.disk_bytes)"
    )
    assert result.score is None
    assert os.listdir(work_root) == []


def test_memory_bomb_is_agent_crash(tmp_path: Path, work_root: Path, mode: str) -> None:
    agent = """
    write_trajectory()
    hoard = bytearray(4 << 30)
    """
    spec = make_spec(tmp_path, agent, mode=mode, limits=Limits(memory_bytes=256 * MiB))
    result = run_trial(spec, work_root=work_root)
    assert (result.outcome, result.error_kind) == ("error", "agent_crash")
    assert result.error.startswith("agent exited with code 1; stderr tail:")
    assert result.agent_log.rstrip().endswith("MemoryError")


def test_agent_without_usage_is_agent_output(tmp_path: Path, work_root: Path) -> None:
    agent = """
    (output / "answer.txt").write_text(str(answer))
    """
    result = run_trial(make_spec(tmp_path, agent), work_root=work_root)
    assert (result.outcome, result.score, result.error_kind) == ("error", None, "agent_output")
    assert result.error == "no token usage reported"
    assert (result.tokens, result.steps, result.trajectory) == (None, None, None)


def test_usage_file_is_accepted(tmp_path: Path, work_root: Path) -> None:
    agent = """
    (output / "answer.txt").write_text(str(answer))
    (output / "usage.json").write_text(json.dumps({"tokens": 1234, "steps": 7}))
    """
    result = run_trial(make_spec(tmp_path, agent), work_root=work_root)
    assert (result.outcome, result.tokens, result.steps, result.trajectory) == ("pass", 1234, 7, None)


def test_malformed_trajectory_is_agent_output(tmp_path: Path, work_root: Path) -> None:
    agent = """
    (output / "answer.txt").write_text(str(answer))
    (output / "trajectory.json").write_text('{"steps": [')
    (output / "usage.json").write_text(json.dumps({"tokens": 10, "steps": 1}))
    """
    result = run_trial(make_spec(tmp_path, agent), work_root=work_root)
    assert (result.outcome, result.error_kind) == ("error", "agent_output")
    assert result.error.startswith("trajectory.json is not valid JSON: ")


def test_a_100000_deep_trajectory_is_agent_output_not_a_crash(tmp_path: Path, work_root: Path) -> None:
    """Issue 16 item 2: json.loads raised RecursionError in the worker; the depth is checked first."""
    agent = """
    (output / "answer.txt").write_text(str(answer))
    (output / "trajectory.json").write_text("[" * 100_000 + "]" * 100_000)
    """
    result = run_trial(make_spec(tmp_path, agent), work_root=work_root)
    assert (result.outcome, result.error_kind) == ("error", "agent_output")
    assert result.error == "trajectory.json is nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)"
    assert result.trajectory is None


def test_a_100000_deep_verifier_output_is_a_verifier_error(tmp_path: Path, work_root: Path) -> None:
    verifier = "print('[' * 100_000 + ']' * 100_000)"
    result = run_trial(make_spec(tmp_path, verifier=verifier), work_root=work_root)
    assert (result.outcome, result.score, result.error_kind) == ("error", None, "verifier_output")
    assert result.error == "verifier output is nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)"


def test_trajectory_without_steps_list_is_agent_output(tmp_path: Path, work_root: Path) -> None:
    agent = """
    (output / "answer.txt").write_text(str(answer))
    (output / "trajectory.json").write_text(json.dumps({"schema_version": "ATIF-v1.5", "steps": {}}))
    """
    result = run_trial(make_spec(tmp_path, agent), work_root=work_root)
    assert (result.error_kind, result.error) == (
        "agent_output",
        "trajectory.json is not an ATIF trajectory: 'steps' must be a list",
    )


# --- isolation ------------------------------------------------------------------------


def test_agent_cannot_read_the_private_data(tmp_path: Path, work_root: Path, mode: str) -> None:
    agent = """
    stolen = None
    for candidate in (Path.cwd().parent / "private" / "expected.json", output.parent / "private" / "expected.json"):
        try:
            stolen = json.loads(candidate.read_text())["answer"]
        except OSError:
            pass
    print("private:", "read" if stolen is not None else "absent", file=sys.stderr)
    (output / "answer.txt").write_text(str(stolen if stolen is not None else -1))
    write_trajectory()
    """
    result = run_trial(make_spec(tmp_path, agent, mode=mode), work_root=work_root)
    assert result.agent_log == "private: absent\n"
    assert (result.outcome, result.score) == ("fail", 0.0)


def test_output_link_to_the_private_data_is_refused(tmp_path: Path, work_root: Path, mode: str) -> None:
    # The link would resolve for the verifier, which reads output next to private/.
    agent = """
    os.symlink("../private/expected.json", output / "answer.txt")
    write_trajectory()
    """
    result = run_trial(make_spec(tmp_path, agent, mode=mode), work_root=work_root)
    assert (result.outcome, result.error_kind) == ("error", "agent_output")
    assert result.error == "output contains a symbolic link: answer.txt"
    assert result.criteria_results == []


def test_environment_is_scrubbed(tmp_path: Path, work_root: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv("RSI_TEST_SECRET", "hunter2")
    monkeypatch.setenv("RSI_TEST_ALLOWED", "visible")
    monkeypatch.delenv("RSI_TEST_ABSENT", raising=False)
    agent = """
    print(json.dumps({"env": dict(os.environ), "cwd": os.getcwd()}), file=sys.stderr)
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    """
    spec = make_spec(
        tmp_path,
        agent,
        mode=mode,
        env_allowlist=["RSI_TEST_ALLOWED", "RSI_TEST_ABSENT"],
        extra_env={"RSI_SEED": "7"},
    )
    result = run_trial(spec, work_root=work_root)
    logged = json.loads(result.agent_log)
    seen = logged["env"]
    assert seen.pop("HOME").endswith("/workspace")
    # PWD names the folder the agent starts in, whichever sandbox runs it.
    assert seen.pop("PWD") == logged["cwd"]
    assert logged["cwd"].endswith("/workspace")
    assert seen == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "RSI_TEST_ALLOWED": "visible",
        "RSI_SEED": "7",
    }


def test_placeholders_are_substituted(tmp_path: Path, work_root: Path) -> None:
    agent = """
    print(json.dumps(sys.argv[3:]), file=sys.stderr)
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    """
    spec = make_spec(
        tmp_path,
        agent,
        seed=42,
        trial_index=3,
        runner_argv=[
            "{python}", "{harness}/agent.py", "{task}", "{output}",
            "{python}", "{evaluator}", "{workspace}", "{harness}", "{seed}", "{trial_index}", "{x}", "a{seed}b",
        ],
    )  # fmt: skip
    result = run_trial(spec, work_root=work_root)
    python, evaluator, workspace, harness, *rest = json.loads(result.agent_log)
    assert python == spec.python
    assert Path(evaluator).name == "evaluator" and Path(evaluator).parent == Path(workspace).parent
    assert Path(workspace).name == "workspace" and Path(workspace).parent.parent == work_root
    assert harness == f"{workspace}/harness"
    assert rest == ["42", "3", "{x}", "a42b"]


def test_runner_may_not_name_the_private_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"runner_argv must not reference \{private\}"):
        make_spec(tmp_path, runner_argv=["{python}", "{harness}/agent.py", "{private}/expected.json"])


def test_no_network_under_bwrap(tmp_path: Path, work_root: Path) -> None:
    require_bwrap()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    agent = f"""
    import socket
    for port in ({port}, 5432):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            print("connected", file=sys.stderr)
        except OSError:
            print("blocked", file=sys.stderr)
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    """
    try:
        plain = run_trial(make_spec(tmp_path, agent, mode="off"), work_root=work_root)
        boxed = run_trial(make_spec(tmp_path, agent, mode="required"), work_root=work_root)
    finally:
        listener.close()
    # The same agent reaches the listener without bwrap, so "blocked" proves the sandbox.
    assert plain.agent_log.split()[0] == "connected"
    assert boxed.agent_log == "blocked\nblocked\n"
    assert boxed.outcome == "pass"


def test_agent_network_reaches_the_host_for_the_agent_only(tmp_path: Path, work_root: Path) -> None:
    # An agent that calls a hosted model (here a listener on the host) gets the
    # network only when its evaluator allows it, and the trial says so in its profile.
    require_bwrap()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    agent = f"""
    import socket
    socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    """
    try:
        allowed = run_trial(make_spec(tmp_path, agent, mode="required", agent_network=True), work_root=work_root)
        denied = run_trial(make_spec(tmp_path, agent, mode="required"), work_root=work_root)
    finally:
        listener.close()
    assert allowed.outcome == "pass", (allowed.error, allowed.agent_log)
    assert allowed.sandbox_profile == "bwrap+agent-network"
    assert denied.outcome == "error" and denied.error_kind == "agent_crash"
    assert "ConnectionRefusedError" in denied.agent_log
    assert denied.sandbox_profile == "bwrap"


def test_a_verifier_never_gets_the_network(tmp_path: Path, work_root: Path) -> None:
    require_bwrap()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    verifier = f"""
    import json, socket
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    print(json.dumps({{"passed": True, "score": 1.0, "criteria": [], "valid_output": True, "submitted": True}}))
    """
    try:
        result = run_trial(
            make_spec(tmp_path, verifier=verifier, mode="required", agent_network=True), work_root=work_root
        )
    finally:
        listener.close()
    assert result.outcome == "error"
    assert result.error_kind == "verifier_crash"


def test_agent_network_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="agent_network"):
        make_spec(tmp_path, agent_network="yes")


def test_bwrap_hides_host_files_and_keeps_workspace_writable(tmp_path: Path, work_root: Path) -> None:
    require_bwrap()
    secret_dir = Path(tempfile.mkdtemp(prefix="rsi-secret-", dir=Path.home()))
    secret = secret_dir / "key"
    secret.write_text("s3cret")
    project_var = Path(__file__).resolve().parents[2] / "var"
    agent = f"""
    for path in ({str(secret)!r}, {str(project_var)!r}, {str(tmp_path / "task" / "input.json")!r}):
        print(path, os.path.exists(path), file=sys.stderr)
    Path("scratch.txt").write_text("notes")
    (Path("task") / "input.json").write_text("{{}}")
    print("workspace", Path("scratch.txt").read_text(), file=sys.stderr)
    (output / "answer.txt").write_text(str(answer))
    write_trajectory()
    """
    try:
        result = run_trial(make_spec(tmp_path, agent, mode="required"), work_root=work_root)
    finally:
        shutil.rmtree(secret_dir)
    assert result.agent_log.splitlines() == [
        f"{secret} False",
        f"{project_var} False",
        f"{tmp_path / 'task' / 'input.json'} False",
        "workspace notes",
    ]
    assert result.outcome == "pass"
    # The agent changed its copy of the task, never the original.
    assert json.loads((tmp_path / "task" / "input.json").read_text()) == {"a": 2, "b": 3}


# --- the verifier -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verifier", "kind", "message"),
    [
        ("import sys; print('bad', file=sys.stderr); sys.exit(2)", "verifier_crash", "verifier exited with code 2"),
        ("print('hello')", "verifier_output", "verifier output is not JSON: "),
        ("print('[1, 2]')", "verifier_output", "verifier output must be a JSON object"),
        (
            "import json; print(json.dumps({'passed': True, 'score': 1.5, 'criteria': [],"
            " 'valid_output': True, 'submitted': True}))",
            "verifier_output",
            "verifier output: 'score' must be a number in [0, 1], got 1.5",
        ),
        (
            "import json; print(json.dumps({'passed': 'yes', 'score': 1, 'criteria': [],"
            " 'valid_output': True, 'submitted': True}))",
            "verifier_output",
            "verifier output: 'passed' must be true or false, got 'yes'",
        ),
    ],
    ids=["crash", "garbage", "not-an-object", "score-out-of-range", "passed-not-bool"],
)
def test_misbehaving_verifier_is_a_verifier_error(
    tmp_path: Path, work_root: Path, verifier: str, kind: str, message: str
) -> None:
    result = run_trial(make_spec(tmp_path, verifier=verifier), work_root=work_root)
    assert (result.outcome, result.score, result.error_kind) == ("error", None, kind)
    assert result.error.startswith(message)
    # The agent's own report is kept.
    assert (result.tokens, result.steps) == (300, 4)


def test_hanging_verifier_times_out(tmp_path: Path, work_root: Path) -> None:
    spec = make_spec(tmp_path, verifier="import time; time.sleep(60)", verifier_timeout_seconds=2)
    started = time.monotonic()
    result = run_trial(spec, work_root=work_root)
    assert time.monotonic() - started < 15
    assert (result.outcome, result.error_kind, result.error) == (
        "error",
        "verifier_timeout",
        "verifier ran longer than 2 s and was killed",
    )


def test_verifier_reads_private_data_from_its_folder(tmp_path: Path, work_root: Path) -> None:
    verifier = """
    import json, os
    seen = [sorted(os.listdir(".")), json.load(open("expected.json"))]
    print(json.dumps({"passed": False, "score": 0, "criteria": seen, "valid_output": False, "submitted": False}))
    """
    result = run_trial(
        make_spec(tmp_path, verifier=verifier, private={"answer": 5, "criteria": ["sum"]}), work_root=work_root
    )
    assert result.criteria_results == [["expected.json"], {"answer": 5, "criteria": ["sum"]}]
    assert (result.outcome, result.score) == ("fail", 0.0)


# --- infrastructure ---------------------------------------------------------------------


def test_required_sandbox_unavailable_is_a_sandbox_error(
    tmp_path: Path, work_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sandbox, "probe_bubblewrap", lambda: False)
    result = run_trial(make_spec(tmp_path, mode="required"), work_root=work_root)
    assert result == TrialResult(
        outcome="error",
        error_kind="sandbox",
        error="bubblewrap is required but missing or not working on this machine",
        sandbox_profile="none",
    )
    assert list(work_root.iterdir()) == []


def test_infra_failure_is_reported_and_cleaned_up(
    tmp_path: Path, work_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trials, "run_sandboxed", disk_full)
    result = run_trial(make_spec(tmp_path), work_root=work_root)
    assert (result.outcome, result.error_kind, result.error) == (
        "error",
        "infra",
        "OSError: [Errno 28] No space left on device",
    )
    assert list(work_root.iterdir()) == []


def test_programming_errors_propagate_after_cleanup(
    tmp_path: Path, work_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(trials, "run_sandboxed", broken)
    with pytest.raises(RuntimeError, match="bug"):
        run_trial(make_spec(tmp_path), work_root=work_root)
    assert list(work_root.iterdir()) == []


def test_missing_harness_folder_is_a_spec_error(tmp_path: Path, work_root: Path) -> None:
    spec = make_spec(tmp_path, harness_dir=tmp_path / "nowhere")
    with pytest.raises(ValueError, match="harness_dir .* is not a directory"):
        run_trial(spec, work_root=work_root)


# --- ATIF usage (pure) --------------------------------------------------------------------


def test_atif_usage_prefers_final_metrics() -> None:
    assert atif_usage(ATIF) == (300, 4)


def test_atif_usage_sums_steps_without_final_metrics() -> None:
    document = copy.deepcopy(ATIF)
    del document["final_metrics"]
    assert atif_usage(document) == (300, 4)


def test_atif_usage_is_none_without_any_metrics() -> None:
    assert atif_usage({"steps": [{"step_id": 1, "source": "user", "message": "hi"}]}) == (None, 1)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "the document must be a JSON object"),
        ({"steps": "many"}, "'steps' must be a list"),
        ({"steps": [], "final_metrics": {"total_prompt_tokens": -1}}, "'total_prompt_tokens' must be a non-negative"),
        ({"steps": [{"metrics": {"prompt_tokens": True}}]}, "'prompt_tokens' must be a non-negative integer"),
        ({"steps": ["step"]}, "step 0 must be an object"),
    ],
)
def test_atif_usage_rejects_malformed_documents(document: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        atif_usage(document)


GOLDEN = {
    # file: (tokens from final_metrics, tokens summed over steps, steps)
    "hello-world.trajectory.json": (300, 300, 6),
    "hello-world-context-summarization.trajectory.json": (8832, 7192, 10),
    "hello-world-context-summarization.trajectory.summarization-1-summary.json": (700, 700, 5),
    "hello-world-invalid-json.trajectory.json": (2617, 2617, 5),
    "hello-world-timeout.trajectory.json": (1127, 997, 4),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_atif_usage_of_harbor_golden_trajectories(name: str) -> None:
    path = FIXTURES / name
    document = json.loads(path.read_text())
    final_tokens, step_tokens, steps = GOLDEN[name]
    assert atif_usage(document) == (final_tokens, steps)
    del document["final_metrics"]
    assert atif_usage(document) == (step_tokens, steps)


def test_parse_verdict_accepts_integer_scores() -> None:
    verdict = parse_verdict(b'{"passed": true, "score": 1, "criteria": [], "valid_output": true, "submitted": true}\n')
    assert (verdict.passed, verdict.score, verdict.criteria, verdict.valid_output, verdict.submitted) == (
        True,
        1.0,
        [],
        True,
        True,
    )


def test_parse_verdict_rejects_nan_scores() -> None:
    with pytest.raises(ValueError, match="'score' must be a number in"):
        parse_verdict(b'{"passed": true, "score": NaN, "criteria": [], "valid_output": true, "submitted": true}')
