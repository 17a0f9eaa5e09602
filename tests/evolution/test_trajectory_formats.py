"""Parsing and validating trajectories: ATIF v1.x, mini-swe-agent, OpenAI messages."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from evolution.trajectory_formats import TrajectoryFormatError, detect_format, is_iso8601, parse, validate_atif

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ATIF_FILES = sorted((FIXTURES / "atif").glob("*.json"))

VALID: dict[str, Any] = {
    "schema_version": "ATIF-v1.5",
    "session_id": "s-1",
    "agent": {"name": "test-agent", "version": "1.0"},
    "steps": [
        {"step_id": 1, "source": "user", "message": "Add 2 and 3.", "timestamp": "2025-10-11T12:00:00Z"},
        {
            "step_id": 2,
            "source": "agent",
            "model_name": "m",
            "message": "Reading.",
            "timestamp": "2025-10-11T12:00:01.250+02:00",
            "tool_calls": [{"tool_call_id": "c1", "function_name": "read", "arguments": {"path": "a"}}],
            "observation": {"results": [{"source_call_id": "c1", "content": "2 3"}]},
            "metrics": {"prompt_tokens": 10, "completion_tokens": 2, "cost_usd": 0.001},
            "custom_field": {"kept": True},
        },
    ],
    "final_metrics": {"total_prompt_tokens": 10, "total_completion_tokens": 2},
    "producer_note": "unknown root field",
}


def errors_of(document: Any, fmt: str = "auto") -> list[str]:
    with pytest.raises(TrajectoryFormatError) as info:
        parse(document, fmt)
    return info.value.errors


def test_ids_assumed_by_this_file() -> None:
    assert len(ATIF_FILES) == 5


@pytest.mark.parametrize("path", ATIF_FILES, ids=lambda p: p.name)
def test_every_harbor_golden_file_validates(path: Path) -> None:
    document = json.loads(path.read_text())
    fmt, normalized = parse(document)
    assert fmt == "atif"
    assert [step["step_id"] for step in normalized["steps"]] == list(range(1, len(document["steps"]) + 1))
    assert normalized["agent"] == document["agent"]


def test_valid_document_keeps_unknown_fields() -> None:
    fmt, normalized = parse(copy.deepcopy(VALID))
    assert fmt == "atif"
    assert normalized["steps"][1]["custom_field"] == {"kept": True}
    assert normalized["extra"] == {"document_fields": {"producer_note": "unknown root field"}}


def test_non_sequential_step_ids_name_the_step() -> None:
    document = copy.deepcopy(VALID)
    document["steps"][1]["step_id"] = 3
    assert errors_of(document) == ["steps[1].step_id: expected 2 (step ids are sequential from 1), got 3"]


def test_step_ids_must_start_at_one() -> None:
    document = copy.deepcopy(VALID)
    document["steps"][0]["step_id"] = 0
    document["steps"][1]["step_id"] = 1
    errors = errors_of(document)
    assert errors[0] == "steps[0].step_id: expected 1 (step ids are sequential from 1), got 0"
    assert len(errors) == 2


def test_dangling_source_call_id() -> None:
    document = copy.deepcopy(VALID)
    document["steps"][1]["observation"]["results"][0]["source_call_id"] = "c9"
    assert errors_of(document) == [
        "steps[1].observation.results[0].source_call_id: 'c9' does not name a tool call of step 2"
    ]


def test_source_call_id_must_name_a_call_of_the_same_step() -> None:
    document = copy.deepcopy(VALID)
    document["steps"].append(
        {"step_id": 3, "source": "agent", "message": "", "observation": {"results": [{"source_call_id": "c1"}]}}
    )
    assert errors_of(document) == [
        "steps[2].observation.results[0].source_call_id: 'c1' does not name a tool call of step 3"
    ]


@pytest.mark.parametrize("stamp", ["yesterday", "2025-13-01T00:00:00Z", "2025-10-11", "12:00:00"])
def test_bad_timestamp(stamp: str) -> None:
    document = copy.deepcopy(VALID)
    document["steps"][0]["timestamp"] = stamp
    assert errors_of(document) == [f"steps[0].timestamp: is not an ISO 8601 date-time: {stamp!r}"]


def test_iso8601_forms() -> None:
    assert is_iso8601("2025-10-11T12:00:00Z")
    assert is_iso8601("2025-10-11T12:00:00.123456+00:00")
    assert not is_iso8601("2025-10-11")


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["steps"][0].update(step_id="1"), "steps[0].step_id: must be an integer, got a string"),
        (lambda d: d["steps"][0].update(step_id=True), "steps[0].step_id: must be an integer, got a boolean"),
        (lambda d: d["steps"][0].update(message=5), "steps[0].message: must be a string or a list of content parts"),
        (lambda d: d["steps"][0].pop("message"), "steps[0].message: is required"),
        (lambda d: d["steps"][0].update(source="robot"), "steps[0].source: must be one of system, user, agent"),
        (lambda d: d.update(steps={}), "steps: must be a list, got an object"),
        (lambda d: d.update(steps=[]), "steps: must hold at least one step"),
        (lambda d: d.pop("session_id"), "session_id: is required"),
        (lambda d: d.update(schema_version="ATIF-v2.0"), "schema_version: must be ATIF-v1.x"),
        (lambda d: d["agent"].pop("version"), "agent.version: is required"),
        (lambda d: d.update(final_metrics=[]), "final_metrics: must be an object, got a list"),
        (lambda d: d["steps"][1].update(tool_calls={}), "steps[1].tool_calls: must be a list, got an object"),
        (
            lambda d: d["steps"][1]["tool_calls"][0].update(arguments="x"),
            "steps[1].tool_calls[0].arguments: must be an object, got a string",
        ),
        (
            lambda d: d["steps"][1]["metrics"].update(prompt_tokens=-1),
            "steps[1].metrics.prompt_tokens: must not be negative",
        ),
        (
            lambda d: d["steps"][1]["metrics"].update(cost_usd="cheap"),
            "steps[1].metrics.cost_usd: must be a number, got a string",
        ),
        (lambda d: d["steps"][0].update(model_name="m"), "steps[0].model_name: is only allowed on agent steps"),
        (lambda d: d["steps"].append("step"), "steps[2]: must be an object, got a string"),
        (lambda d: d["steps"][0].update(step_id=None), "steps[0].step_id: must not be null"),
        (
            lambda d: d["steps"][1]["metrics"].update(cost_usd=False),
            "steps[1].metrics.cost_usd: must be a number, got a boolean",
        ),
        (
            lambda d: d.update(final_metrics={"total_steps": 1.5}),
            "final_metrics.total_steps: must be an integer, got a number",
        ),
        (lambda d: d["agent"].update(name=True), "agent.name: must be a string, got a boolean"),
        (lambda d: d.update(notes=7), "notes: must be a string, got a number"),
    ],
)
def test_wrong_types_and_missing_fields_name_the_field(mutate: Any, expected: str) -> None:
    document = copy.deepcopy(VALID)
    mutate(document)
    errors = errors_of(document, "atif")
    assert any(error.startswith(expected) for error in errors), errors


def test_all_errors_are_reported_at_once() -> None:
    document = copy.deepcopy(VALID)
    document["steps"][0]["timestamp"] = "soon"
    document["steps"][1]["observation"]["results"][0]["source_call_id"] = "nope"
    assert len(errors_of(document)) == 2


def test_not_a_trajectory() -> None:
    assert errors_of("text")[0].startswith("document: not a recognized trajectory")
    assert errors_of({"hello": 1})[0].startswith("document: not a recognized trajectory")
    assert errors_of(VALID, "yaml") == ["format: must be one of auto, atif, mini-swe-agent, openai; got 'yaml'"]
    with pytest.raises(TrajectoryFormatError, match="document: must be a JSON object, got a list"):
        validate_atif([])


def test_detect_format() -> None:
    assert detect_format(VALID) == "atif"
    assert detect_format([{"role": "user", "content": "hi"}]) == "openai"
    assert detect_format({"messages": [{"role": "user", "content": "hi"}]}) == "openai"
    assert detect_format({"info": {}, "messages": []}) == "mini-swe-agent"
    assert detect_format({"trajectory_format": "mini-swe-agent-1.1", "messages": []}) == "mini-swe-agent"


# --- mini-swe-agent -------------------------------------------------------------


def test_mini_swe_agent_text_mode_file() -> None:
    document = json.loads((FIXTURES / "trajectories" / "mini-swe-agent.traj.json").read_text())
    fmt, normalized = parse(document)
    assert fmt == "mini-swe-agent"
    steps = normalized["steps"]
    assert [step["source"] for step in steps] == ["system", "user", "agent", "agent", "agent"]
    assert steps[2]["tool_calls"] == [
        {"tool_call_id": "action-3", "function_name": "bash", "arguments": {"command": "ls -la /app"}}
    ]
    assert steps[2]["observation"]["results"][0]["content"].startswith("<returncode>0</returncode>")
    assert steps[2]["model_name"] == "openai/gpt-4o"
    assert normalized["agent"] == {"name": "mini-swe-agent", "version": "1.17.2", "model_name": "openai/gpt-4o"}
    assert normalized["final_metrics"] == {"total_steps": 5, "total_cost_usd": 0.0123}
    assert normalized["extra"]["info"]["exit_status"] == "Submitted"
    assert normalized["extra"]["trajectory_format"] == "mini-swe-agent-1"


def test_mini_swe_agent_tool_call_mode() -> None:
    document = {
        "info": {"mini_version": "2.0.0", "exit_status": "Submitted"},
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "task"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "t1", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}],
                "extra": {"cost": 0.01},
            },
            {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
        ],
        "trajectory_format": "mini-swe-agent-1.1",
    }
    _, normalized = parse(document, "mini-swe-agent")
    agent = normalized["steps"][2]
    assert agent["tool_calls"] == [{"tool_call_id": "t1", "function_name": "bash", "arguments": {"command": "ls"}}]
    assert agent["observation"] == {"results": [{"source_call_id": "t1", "content": "a.txt"}]}
    assert agent["extra"] == {"extra": {"cost": 0.01}}


def test_mini_swe_agent_errors_name_the_message() -> None:
    assert errors_of({"info": {}, "messages": "x"}) == ["messages: must be a list of messages, got a string"]
    assert errors_of({"info": [], "messages": []}) == ["info: must be an object, got a list"]
    bad_role = {"info": {}, "messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}
    assert errors_of(bad_role) == ["messages[1].role: must be system, user, assistant or tool, got 'robot'"]


# --- OpenAI messages ------------------------------------------------------------


def test_openai_message_list_file() -> None:
    document = json.loads((FIXTURES / "trajectories" / "openai-messages.json").read_text())
    fmt, normalized = parse(document)
    assert fmt == "openai"
    steps = normalized["steps"]
    assert [step["source"] for step in steps] == ["system", "user", "agent", "agent"]
    assert [call["tool_call_id"] for call in steps[2]["tool_calls"]] == ["call_1", "call_2"]
    assert steps[2]["tool_calls"][1]["arguments"] == {"command": "cat /app/hello.txt"}
    assert steps[2]["observation"]["results"][1] == {"source_call_id": "call_2", "content": "Hello, world!\n"}
    assert steps[3]["message"] == "The file is written: Hello, world!"
    assert normalized["schema_version"] == "ATIF-v1.5"


def test_openai_tool_message_without_a_call() -> None:
    messages = [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "zz", "content": "out"}]
    assert errors_of(messages) == [
        "messages[1].tool_call_id: 'zz' does not name a tool call of an earlier assistant message"
    ]


def test_openai_bad_messages() -> None:
    assert errors_of([]) == ["messages: must hold at least one message"]
    assert errors_of([1]) == ["messages[0]: must be an object, got a number"]
    calls = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}]
    assert errors_of(calls) == ["messages[0].tool_calls[0].id: must be a non-empty string"]


def test_openai_with_model_and_unparseable_arguments() -> None:
    document = {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{not json"}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1},
            },
        ],
    }
    _, normalized = parse(document)
    step = normalized["steps"][1]
    assert step["model_name"] == "gpt-4o"
    assert step["tool_calls"][0]["arguments"] == {"input": "{not json"}
    assert step["metrics"] == {"prompt_tokens": 5, "completion_tokens": 1}
