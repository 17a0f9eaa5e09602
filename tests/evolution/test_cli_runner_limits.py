"""cli_runner.py holds what it decodes from a command-line agent to the platform's input limits."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from evolution import limits
from evolution.agents import cli_runner

CONFIG = """
    command = ["{python}", "{harness}/agent.py"]
    trajectory = "{output}/messages.json"
    trajectory_format = "openai-messages"
"""


def run_with_arguments(tmp_path: Path, arguments: str) -> tuple[int, Path]:
    """Run an agent whose message list holds one tool call with ``arguments`` (a JSON string)."""
    harness, task, output = tmp_path / "harness", tmp_path / "task", tmp_path / "output"
    for folder in (harness, task, output):
        folder.mkdir()
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    (harness / "messages.json").write_text(json.dumps(messages))
    agent = """
        import os, pathlib, shutil
        shutil.copy(pathlib.Path(__file__).parent / "messages.json", pathlib.Path(os.environ["AGENT_OUTPUT"]))
    """
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    (harness / "agent.toml").write_text(textwrap.dedent(CONFIG))
    (task / "instruction.md").write_text("go")
    status = cli_runner.main(["--harness", str(harness), "--task", str(task), "--output", str(output)])
    return status, output


def nested(levels: int) -> str:
    return '{"a": ' * (levels - 1) + "{}" + "}" * (levels - 1)


def test_runner_depth_is_the_platforms_default() -> None:
    assert limits.DEFAULTS["RSI_MAX_INPUT_DEPTH"] == cli_runner.MAX_INPUT_DEPTH


def test_runner_converts_tool_call_arguments_nested_100_levels(tmp_path: Path) -> None:
    status, output = run_with_arguments(tmp_path, nested(100))
    assert status == 0
    document = json.loads((output / "trajectory.json").read_text())
    arguments = document["steps"][1]["tool_calls"][0]["arguments"]
    assert arguments == json.loads(nested(100))


def test_runner_refuses_tool_call_arguments_nested_101_levels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, output = run_with_arguments(tmp_path, nested(101))
    assert status == 2
    assert capsys.readouterr().err == (
        "cli_runner: cannot convert the agent's messages: message 1: tool call 'c1' (its arguments string) "
        "is nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)\n"
    )
    assert not (output / "trajectory.json").exists()


def test_runner_refuses_tool_call_arguments_deeper_than_the_parser_recurses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, output = run_with_arguments(tmp_path, "[" * 100_000)
    assert status == 2
    assert "(its arguments string) is nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)" in capsys.readouterr().err
    assert not (output / "trajectory.json").exists()


def test_runner_refuses_a_5000_digit_integer_in_tool_call_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, output = run_with_arguments(tmp_path, '{"n": ' + "7" * 5000 + "}")
    assert status == 2
    assert capsys.readouterr().err == (
        "cli_runner: cannot convert the agent's messages: message 1: tool call 'c1' (its arguments string) "
        "holds an integer of more than 4300 digits (Python's int_max_str_digits)\n"
    )
    assert not (output / "trajectory.json").exists()


def test_runner_keeps_arguments_that_are_not_json_verbatim(tmp_path: Path) -> None:
    status, output = run_with_arguments(tmp_path, '{"a": [1, 2')
    assert status == 0
    document = json.loads((output / "trajectory.json").read_text())
    assert document["steps"][1]["tool_calls"][0]["arguments"] == {"raw": '{"a": [1, 2'}


def test_runner_refuses_a_trajectory_file_nested_past_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    harness, task, output = tmp_path / "harness", tmp_path / "task", tmp_path / "output"
    for folder in (harness, task, output):
        folder.mkdir()
    agent = 'import os, pathlib\npathlib.Path(os.environ["AGENT_OUTPUT"], "messages.json").write_text("[" * 5000)\n'
    (harness / "agent.py").write_text(agent)
    (harness / "agent.toml").write_text(textwrap.dedent(CONFIG))
    (task / "instruction.md").write_text("go")
    status = cli_runner.main(["--harness", str(harness), "--task", str(task), "--output", str(output)])
    assert status == 2
    assert capsys.readouterr().err == (
        "cli_runner: messages.json is nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)\n"
    )
    assert not (output / "trajectory.json").exists()
