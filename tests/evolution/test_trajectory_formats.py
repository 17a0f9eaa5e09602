"""Parsing and validating trajectories: ATIF v1.x, mini-swe-agent, OpenAI messages."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from evolution.trajectory_formats import (
    FORMATS,
    SUPPORTED,
    TrajectoryFormatError,
    TrajectoryListError,
    detect_format,
    is_iso8601,
    join_continuations,
    loads_text,
    parse,
    validate_atif,
)

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
    assert errors_of("text") == [f"document: looks like a string; supported: {SUPPORTED}"]
    assert errors_of({"hello": 1}) == [f"document: looks like a JSON object with keys hello; supported: {SUPPORTED}"]
    assert errors_of(VALID, "yaml") == [f"format: must be one of auto, {', '.join(FORMATS)}; got 'yaml'"]
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
    assert errors_of(bad_role) == ["messages[1].role: must be system, developer, user, assistant or tool, got 'robot'"]


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
    assert errors_of([1], "openai") == ["messages[0]: must be an object, got a number"]
    assert errors_of([1]) == [f"document: looks like a JSON list of 1 item (a number); supported: {SUPPORTED}"]
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


# --- Files real producers wrote (tests/fixtures/*/SOURCE.md) ------------------------

MINI = FIXTURES / "mini-swe-agent"
HARBOR = FIXTURES / "harbor"


def counts(document: dict[str, Any]) -> dict[str, int]:
    steps = document["steps"]
    return {
        "steps": len(steps),
        "tool_calls": sum(len(step.get("tool_calls", [])) for step in steps),
        "observations": sum(1 for step in steps if step.get("observation")),
        "with_tokens": sum(1 for step in steps if "prompt_tokens" in step.get("metrics", {})),
        "with_time": sum(1 for step in steps if step.get("timestamp")),
    }


def test_mini_swe_agent_2_tool_call_run() -> None:
    raw = json.loads((MINI / "v2.2.7-toolcall-sqlfluff__sqlfluff-2419.traj.json").read_text())
    fmt, document = parse(raw)
    assert fmt == "mini-swe-agent"
    # 88 messages: system, user, 43 assistant (43 calls), 42 tool results, the exit message.
    assert counts(document) == {"steps": 46, "tool_calls": 43, "observations": 42, "with_tokens": 43, "with_time": 43}
    assistant = [m for m in raw["messages"] if m["role"] == "assistant"]
    usage = assistant[0]["extra"]["response"]["usage"]
    first_agent = document["steps"][2]
    assert first_agent["metrics"] == {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
        "cost_usd": assistant[0]["extra"]["cost"],
    }
    assert assistant[0]["extra"]["timestamp"] == 1776064266.0279105
    assert first_agent["timestamp"] == "2026-04-13T07:11:06.027910Z"
    assert document["final_metrics"]["total_prompt_tokens"] == sum(
        m["extra"]["response"]["usage"]["prompt_tokens"] for m in assistant
    )
    assert document["final_metrics"]["total_cost_usd"] == raw["info"]["model_stats"]["instance_cost"]
    last = document["steps"][-1]
    assert (last["source"], last["message"]) == ("system", raw["messages"][-1]["content"])
    assert last["extra"]["role"] == "exit"
    assert document["extra"]["exit_status"] == "Submitted"


def test_mini_swe_agent_2_exit_status_of_a_failed_run() -> None:
    raw = json.loads((MINI / "v2.2.7-toolcall-error-pvlib__pvlib-python-1606.traj.json").read_text())
    _fmt, document = parse(raw)
    assert document["extra"]["exit_status"] == "InternalServerError"
    assert document["steps"][-1]["extra"]["extra"]["exit_status"] == "InternalServerError"
    assert counts(document)["tool_calls"] == 4


def test_mini_swe_agent_2_text_mode_message_list() -> None:
    raw = json.loads((MINI / "v2-text-github_issue.traj.json").read_text())
    assert isinstance(raw, list)
    assert detect_format(raw) == "mini-swe-agent"
    fmt, document = parse(raw, "mini-swe-agent")
    assert fmt == "mini-swe-agent"
    # 22 messages: system, task, then 10 actions (```mswea_bash_command) each with its output.
    assert counts(document) == {"steps": 12, "tool_calls": 10, "observations": 10, "with_tokens": 0, "with_time": 0}
    assert document["steps"][2]["tool_calls"][0]["arguments"] == {
        "command": "cat /Users/fuchur/Documents/24/git_sync/swe-agent-test-repo/tests/./missing_colon.py"
    }


def test_mini_swe_agent_1_text_mode_file() -> None:
    raw = json.loads((MINI / "v1.13.4-text-rfc.traj.json").read_text())
    _fmt, document = parse(raw)
    assert document["agent"]["version"] == "1.13.4"
    assert counts(document) == {"steps": 5, "tool_calls": 3, "observations": 3, "with_tokens": 3, "with_time": 0}
    assert document["extra"]["exit_status"] == "Submitted"


def test_atif_continuation_pair_is_joined() -> None:
    head = json.loads((HARBOR / "linear-history" / "trajectory.json").read_text())
    cont = json.loads((HARBOR / "linear-history" / "trajectory.cont-1.json").read_text())
    joined, files = join_continuations(head, {"trajectory.cont-1.json": cont}.__getitem__)
    assert files == ["trajectory.cont-1.json"]
    _fmt, document = parse(joined)
    assert [step["step_id"] for step in document["steps"]] == list(range(1, 14))
    assert document["steps"][-1]["message"] == cont["steps"][-1]["message"]
    assert document["steps"][5]["extra"]["continuation"] == {"file": "trajectory.cont-1.json", "step_id": 1}
    assert document["final_metrics"] == cont["final_metrics"]
    assert "continued_trajectory_ref" not in document.get("extra", {}).get("document_fields", {})


@pytest.mark.parametrize("ref", ["../trajectory.cont-1.json", "/etc/passwd", ".."])
def test_a_continuation_outside_the_folder_is_refused(ref: str) -> None:
    head = json.loads((HARBOR / "linear-history" / "trajectory.json").read_text())
    head["continued_trajectory_ref"] = ref
    with pytest.raises(TrajectoryFormatError) as caught:
        join_continuations(head, dict[str, Any]().__getitem__)
    assert caught.value.errors == [
        f"the trajectory: continued_trajectory_ref must name a file in the same folder, got {ref!r}"
    ]


def test_a_missing_continuation_is_named() -> None:
    head = json.loads((HARBOR / "linear-history" / "trajectory.json").read_text())
    with pytest.raises(TrajectoryFormatError) as caught:
        join_continuations(head, dict[str, Any]().__getitem__)
    assert caught.value.errors == [
        "the trajectory: its continuation 'trajectory.cont-1.json' is missing "
        "(give the files of the trajectory together)"
    ]


def test_streaming_jsonl_is_one_document() -> None:
    whole = json.loads((FIXTURES / "atif" / "hello-world.trajectory.json").read_text())
    document = loads_text((HARBOR / "openhands-hello-world.trajectory.jsonl").read_text())
    assert document == whole
    with pytest.raises(json.JSONDecodeError, match="line 3 of JSONL"):
        loads_text('{"schema_version": "ATIF-v1.5"}\n{"step_id": 1}\n{oops\n')


def test_a_list_of_trajectories_names_its_count() -> None:
    runs = json.loads((FIXTURES / "tau-bench" / "gpt-4o-airline.first-3.json").read_text())
    with pytest.raises(TrajectoryListError) as caught:
        parse(runs)
    assert (caught.value.count, caught.value.kind) == (3, "tau-bench runs")
    assert caught.value.errors == [
        "document: this is a list of 3 tau-bench runs, not one trajectory; import each into its own trial"
    ]
    atif = json.loads((FIXTURES / "atif" / "hello-world.trajectory.json").read_text())
    with pytest.raises(TrajectoryListError, match="a list of 2 ATIF trajectories"):
        parse([atif, atif])


def test_a_tau_bench_run_keeps_tool_names() -> None:
    run = json.loads((FIXTURES / "tau-bench" / "gpt-4o-airline.first-3.json").read_text())[0]
    fmt, document = parse(run)
    assert fmt == "openai"
    assert document["session_id"] == "task-0-trial-0"
    assert document["extra"]["source_fields"]["reward"] == 0.0
    tool_messages = [m for m in run["traj"] if m["role"] == "tool"]
    results = [r for step in document["steps"] for r in step.get("observation", {}).get("results", [])]
    assert [r["extra"]["name"] for r in results] == [m["name"] for m in tool_messages]
    assert len(results) == 8


@pytest.mark.parametrize(
    ("name", "looks_like"),
    [
        ("gemini-cli-session.json", "a gemini-cli session"),
    ],
)
def test_unsupported_producers_are_named_in_one_line(name: str, looks_like: str) -> None:
    assert errors_of(json.loads((HARBOR / name).read_text())) == [
        f"document: looks like {looks_like}; supported: {SUPPORTED}"
    ]


def test_lenient_keeps_off_spec_steps_and_lists_deviations() -> None:
    document = copy.deepcopy(VALID)
    document["steps"][0]["source"] = "environment"
    document["steps"][1]["tool_calls"][0]["arguments"] = "ls -la"
    assert len(errors_of(document)) == 2
    _fmt, kept = parse(document, lenient=True)
    assert kept["extra"]["deviations"] == [
        "steps[0].source: must be one of system, user, agent, got 'environment'",
        "steps[1].tool_calls[0].arguments: must be an object, got a string",
    ]
    assert [(s["source"], s["message"]) for s in kept["steps"]] == [("system", "Add 2 and 3."), ("agent", "Reading.")]
    assert kept["steps"][1]["extra"]["off_spec"] == document["steps"][1]


def test_atif_1_7_trajectory_id_and_embedded_subagents() -> None:
    document = copy.deepcopy(VALID)
    document["schema_version"] = "ATIF-v1.7"
    del document["session_id"]
    document["trajectory_id"] = "t-1"
    child = copy.deepcopy(VALID)
    child["steps"][0]["step_id"] = 3
    document["subagent_trajectories"] = [child]
    assert errors_of(document) == [
        "subagent_trajectories[0].steps[0].step_id: expected 1 (step ids are sequential from 1), got 3"
    ]
    child["steps"][0]["step_id"] = 1
    _fmt, normalized = parse(document)
    assert normalized["session_id"] == "t-1"
    assert len(normalized["extra"]["subagent_trajectories"]) == 1


def test_jsonl_of_whole_trajectories_is_a_list() -> None:
    line = (FIXTURES / "atif" / "hello-world.trajectory.json").read_text().replace("\n", "")
    document = loads_text(f"{line}\n{line}\n")
    with pytest.raises(TrajectoryListError, match="a list of 2 ATIF trajectories"):
        parse(document)


def test_mini_swe_agent_1_message_timestamps() -> None:
    # mini-swe-agent 1.x's add_message stamps each message with time.time() at the top level.
    messages = [
        {"role": "system", "content": "s", "timestamp": 1760000000.25},
        {"role": "user", "content": "task", "timestamp": 1760000001.0},
        {"role": "assistant", "content": "ok\n```bash\nls\n```", "timestamp": 1760000002.5},
        {"role": "user", "content": "<returncode>0</returncode>", "timestamp": 1760000003.0},
    ]
    _fmt, document = parse({"info": {"mini_version": "1.17.5"}, "messages": messages})
    assert [step.get("timestamp") for step in document["steps"]] == [
        "2025-10-09T08:53:20.250000Z",
        "2025-10-09T08:53:21Z",
        "2025-10-09T08:53:22.500000Z",
    ]
    assert document["steps"][2]["observation"]["results"][0]["extra"] == {"timestamp": 1760000003.0}
