"""Real files of producers other than Harbor (issue 43), parsed as the import
reads them: SWE-agent 0.x and 1.x, OpenHands evaluation output, tau2-bench
results, Claude Code and Codex CLI sessions, NeMo Gym's Responses API
rollouts, mini-swe-agent 1.x by detection, and the one-line refusals. Each
expected count is computed from the raw file by its own route (the
producer's fields), not by the reader. Pure parsing: no database (the
command's end-to-end import is in test_trajectory_interop)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from evolution.trajectory_formats import (
    SUPPORTED,
    TrajectoryFormatError,
    TrajectoryListError,
    loads_text,
    parse,
    trajectory_items,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
SWE_AGENT = FIXTURES / "swe-agent"
OPENHANDS = FIXTURES / "openhands" / "multi-swe-bench-output.first-2.jsonl"
TAU2 = FIXTURES / "tau2-bench" / "whissle-airline_run1.first-2.json"
MINI_1 = FIXTURES / "mini-swe-agent" / "v1.7.0-text-github_issue.traj.json"
CLAUDE = FIXTURES / "claude-code" / "2.0.64-4c2ddfdc-b619-4525-8d03-1950fb1b0257.jsonl"
CODEX = FIXTURES / "codex" / "rollout-2026-01-02T18-39-45-019b7f94-51b4-7593-922e-ba12b5b73b52.jsonl"
ROLLOUTS = FIXTURES / "openai-responses" / "nemo-gym-example_tool_call_multireward-rollouts.jsonl"
MODEL_ITEMS = ("reasoning", "function_call", "custom_tool_call", "web_search_call")


def jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_runs(items: list[dict[str, Any]]) -> int:
    """How many maximal runs of model output (reasoning, assistant messages, calls) ``items`` hold."""
    runs, inside = 0, False
    for item in items:
        output = item.get("type") in MODEL_ITEMS or (item.get("type") == "message" and item.get("role") == "assistant")
        runs += output and not inside
        inside = output
    return runs


def tally(document: dict[str, Any]) -> dict[str, int]:
    steps = document["steps"]
    return {
        "steps": len(steps),
        "tool_calls": sum(len(step.get("tool_calls", [])) for step in steps),
        "observations": sum(len(step.get("observation", {}).get("results", [])) for step in steps),
        "with_tokens": sum(1 for step in steps if "prompt_tokens" in step.get("metrics", {})),
        "with_time": sum(1 for step in steps if step.get("timestamp")),
    }


def read(path: Path) -> Any:
    return loads_text(path.read_text())


def test_swe_agent_1_function_calling_traj_imports_every_call_and_answer() -> None:
    path = SWE_AGENT / "1.x-function-calling-marshmallow-code__marshmallow-1867.traj"
    raw = json.loads(path.read_text())
    history = raw["history"]
    tool_messages = [m for m in history if m["role"] == "tool"]
    fmt, document = parse(read(path))
    assert fmt == "swe-agent"
    assert tally(document) == {
        "steps": len(history) - len(tool_messages),  # 13: each answer joins its call's step
        "tool_calls": sum(len(m.get("tool_calls") or []) for m in history),  # 11
        "observations": len(tool_messages),  # 11
        "with_tokens": 0,  # a replayed demonstration: SWE-agent records totals only
        "with_time": 0,  # SWE-agent records no times
    }
    assert tally(document)["steps"] == 13
    calls = [call for step in document["steps"] for call in step.get("tool_calls", [])]
    assert [call["function_name"] for call in calls] == [
        m["tool_calls"][0]["function"]["name"] for m in history if m.get("tool_calls")
    ]
    assert calls[0]["arguments"] == json.loads(history[2]["tool_calls"][0]["function"]["arguments"])
    answers = [r["content"] for step in document["steps"] for r in step.get("observation", {}).get("results", [])]
    assert answers == [m["content"] for m in tool_messages]
    assert document["extra"]["exit_status"] == raw["info"]["exit_status"] == "submitted"
    assert document["final_metrics"]["total_steps"] == 13
    assert len(document["extra"]["trajectory"]) == len(raw["trajectory"]) == 11


def test_swe_agent_0_text_traj_makes_each_action_a_bash_call_answered_by_the_next_message() -> None:
    path = SWE_AGENT / "0.x-swe-agent__test-repo-i1.traj"
    raw = json.loads(path.read_text())
    history = raw["history"]
    actions = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    answered = [i for i in actions if i + 1 < len(history) and history[i + 1]["role"] == "user"]
    fmt, document = parse(read(path))
    assert fmt == "swe-agent"
    assert tally(document) == {
        "steps": len(history) - len(answered),  # 8
        "tool_calls": len(raw["trajectory"]),  # 5: one action per trajectory entry
        "observations": len(answered),  # 4: the last action, submit, has no answer in the history
        "with_tokens": 0,
        "with_time": 0,
    }
    calls = [call for step in document["steps"] for call in step.get("tool_calls", [])]
    assert [call["arguments"]["command"] for call in calls] == [e["action"].strip() for e in raw["trajectory"]]
    assert {call["function_name"] for call in calls} == {"bash"}
    stats = raw["info"]["model_stats"]
    assert document["final_metrics"] == {
        "total_steps": 8,
        "total_prompt_tokens": stats["tokens_sent"],  # 52861
        "total_completion_tokens": stats["tokens_received"],  # 326
        "total_cost_usd": stats["instance_cost"],  # 0.53839
    }
    assert stats["tokens_sent"] == 52861


def test_openhands_output_jsonl_is_one_trajectory_per_instance() -> None:
    document = read(OPENHANDS)
    instances = [json.loads(line) for line in OPENHANDS.read_text().splitlines()]
    with pytest.raises(TrajectoryListError) as info:
        parse(document)
    assert (info.value.count, info.value.kind) == (2, "OpenHands instances")
    items = trajectory_items(document)
    assert items is not None and [item["instance_id"] for item in items] == [i["instance_id"] for i in instances]
    got = []
    for instance in instances:
        history = instance["history"]
        calls = {
            e["id"] for e in history if e["source"] == "agent" and e.get("action") not in (None, "message", "system")
        }
        answers = [e for e in history if "observation" in e and e.get("cause") in calls]
        responses = {e["tool_call_metadata"]["model_response"]["id"] for e in history if "tool_call_metadata" in e}
        fmt, converted = parse(instance)
        assert fmt == "openhands"
        assert tally(converted) == {
            "steps": len(history) - len(answers),
            "tool_calls": len(calls),
            "observations": len(answers),
            "with_tokens": len(responses),  # a response's usage counts once, on its first step
            "with_time": len(history) - len(answers),  # every event has its time
        }
        usage = instance["metrics"]["accumulated_token_usage"]
        assert converted["final_metrics"]["total_prompt_tokens"] == usage["prompt_tokens"]
        assert converted["final_metrics"]["total_completion_tokens"] == usage["completion_tokens"]
        assert converted["session_id"] == instance["instance_id"]
        assert converted["extra"]["test_result"] == instance["test_result"]
        got.append((tally(converted), usage["prompt_tokens"]))
    assert got == [
        ({"steps": 27, "tool_calls": 23, "observations": 22, "with_tokens": 23, "with_time": 27}, 565158),
        ({"steps": 38, "tool_calls": 33, "observations": 32, "with_tokens": 33, "with_time": 38}, 410169),
    ]


def test_openhands_tool_calls_carry_what_the_model_sent() -> None:
    instance = json.loads(OPENHANDS.read_text().splitlines()[0])
    _fmt, converted = parse(instance)
    first = next(step for step in converted["steps"] if step.get("tool_calls"))
    event = next(e for e in instance["history"] if e.get("action") == "run")
    assert first["tool_calls"][0] == {
        "tool_call_id": "toolu_01",
        "function_name": "execute_bash",
        "arguments": {"command": event["args"]["command"]},
    }
    assert first["message"] == event["args"]["thought"]
    assert first["metrics"] == {"prompt_tokens": 5920, "completion_tokens": 128}


def test_tau2_bench_results_are_one_trajectory_per_simulation() -> None:
    raw = json.loads(TAU2.read_text())
    with pytest.raises(TrajectoryListError) as info:
        parse(raw)
    assert (info.value.count, info.value.kind) == (2, "tau2-bench simulations")
    items = trajectory_items(raw)
    assert items == raw["simulations"]
    got = []
    for simulation in raw["simulations"]:
        messages = simulation["messages"]
        calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        answers = [m for m in messages if m["role"] == "tool" and m["id"] in {c["id"] for c in calls}]
        fmt, converted = parse(simulation)
        assert fmt == "tau2-bench"
        assert tally(converted) == {
            "steps": len(messages) - len(answers),
            "tool_calls": len(calls),
            "observations": len(answers),
            "with_tokens": sum(1 for m in messages if m["role"] == "assistant" and m.get("usage")),
            "with_time": len(messages) - len(answers),
        }
        assert converted["extra"]["reward"] == simulation["reward_info"]["reward"]
        assert converted["session_id"] == simulation["id"]
        got.append((tally(converted)["steps"], tally(converted)["tool_calls"], converted["extra"]["reward"]))
    assert got == [(14, 4, 0.0), (19, 7, 1.0)]


def test_tau2_bench_tool_calls_keep_name_arguments_and_id() -> None:
    simulation = json.loads(TAU2.read_text())["simulations"][0]
    _fmt, converted = parse(simulation)
    first = next(m for m in simulation["messages"] if m.get("tool_calls"))["tool_calls"][0]
    call = next(step for step in converted["steps"] if step.get("tool_calls"))["tool_calls"][0]
    assert call == {"tool_call_id": first["id"], "function_name": first["name"], "arguments": first["arguments"]}
    assert call["function_name"] == "get_reservation_details"


def test_mini_swe_agent_1_message_list_is_detected_with_all_its_actions() -> None:
    messages = json.loads(MINI_1.read_text())
    assistant = [m for m in messages if m["role"] == "assistant"]
    fmt, document = parse(messages)
    assert fmt == "mini-swe-agent"
    assert tally(document) == {
        "steps": len(messages) - len(assistant),  # 12: each answer joins its action's step
        "tool_calls": len(assistant),  # 10
        "observations": len(assistant),  # 10
        "with_tokens": 0,
        "with_time": 0,
    }
    assert len(assistant) == 10
    assert parse(messages, "mini-swe-agent")[1]["steps"] == document["steps"]


def test_atif_1_7_needs_no_session_id() -> None:
    document = {
        "schema_version": "ATIF-v1.7",
        "agent": {"name": "a", "version": "1"},
        "steps": [{"step_id": 1, "source": "user", "message": "hi"}],
    }
    assert parse(document)[1]["steps"][0]["message"] == "hi"
    with pytest.raises(TrajectoryFormatError) as info:
        parse({**document, "schema_version": "ATIF-v1.6"})
    assert info.value.errors == ["session_id: is required"]


def test_a_strict_refusal_says_when_the_lenient_import_takes_the_file() -> None:
    document = json.loads((FIXTURES / "atif" / "hello-world.trajectory.json").read_text())
    off_spec = copy.deepcopy(document)
    results = [step for step in off_spec["steps"] if step.get("observation")][0]["observation"]["results"]
    results[0]["content"] = {"stdout": "written by one producer as an object"}
    with pytest.raises(TrajectoryFormatError) as info:
        parse(off_spec)
    assert info.value.lenient_imports is True
    with pytest.raises(TrajectoryFormatError) as nothing:
        parse({"schema_version": "ATIF-v1.5", "agent": {}, "steps": []})
    assert nothing.value.lenient_imports is False


@pytest.mark.parametrize(
    ("lines", "looks_like"),
    [
        ([{"type": "summary", "summary": "s", "leafUuid": "u"}] * 42, "a Claude Code session (JSONL, 42 events)"),
        (
            [{"type": "event_msg", "payload": {"type": "token_count"}}] * 2,
            "a Codex CLI session (JSONL, 2 events)",
        ),
        ([{"a": 1}, {"b": 2}], "a JSONL file of 2 objects with keys a, b"),
    ],
)
def test_jsonl_no_reader_takes_is_named_not_called_invalid_json(lines: list[Any], looks_like: str) -> None:
    document = loads_text("\n".join(json.dumps(line) for line in lines) + "\n")
    with pytest.raises(TrajectoryFormatError) as info:
        parse(document)
    assert info.value.errors == [f"document: looks like {looks_like}; supported: {SUPPORTED}"]


def test_a_tau2_bench_voice_simulation_is_named() -> None:
    # tau2-bench's full-duplex mode records ticks of audio chunks, not messages (its test data:
    # tests/test_voice/test_interaction_metrics/testdata/experiment/simulations/*.json).
    voice = {"id": "s", "task_id": "0", "termination_reason": "user_stop", "mode": "full_duplex", "ticks": [{}] * 3}
    with pytest.raises(TrajectoryFormatError) as info:
        parse(voice)
    named = "a tau2-bench full-duplex (voice) simulation (3 ticks, no messages)"
    assert info.value.errors == [f"document: looks like {named}; supported: {SUPPORTED}"]


def test_the_openhands_event_list_harbor_ships_imports() -> None:
    events = json.loads((FIXTURES / "harbor" / "openhands-events.json").read_text())
    fmt, document = parse(events)
    assert fmt == "openhands"
    calls = {e["id"] for e in events if e["source"] == "agent" and e.get("action") not in (None, "message", "system")}
    answers = [e for e in events if "observation" in e and e.get("cause") in calls]
    assert (tally(document)["steps"], tally(document)["tool_calls"], len(answers)) == (len(events) - len(answers), 2, 1)


def test_claude_code_session_imports_its_tool_calls_answers_and_tokens_once_per_response() -> None:
    lines = jsonl(CLAUDE)
    messages = [line for line in lines if line["type"] in ("user", "assistant")]
    blocks = [(line, block) for line in messages for block in line["message"]["content"] if isinstance(block, dict)]
    user_texts = [line for line in messages if line["type"] == "user" and isinstance(line["message"]["content"], str)]
    assistant = [line for line in messages if line["type"] == "assistant"]
    responses: dict[str, Any] = {}
    for line in assistant:
        responses.setdefault(line["message"]["id"], line["message"]["usage"])
    fmt, document = parse(read(CLAUDE))
    assert fmt == "claude-code"
    assert tally(document) == {
        "steps": len(assistant) + len(user_texts),  # 10 + 3
        "tool_calls": sum(1 for _line, block in blocks if block["type"] == "tool_use"),  # 6
        "observations": sum(1 for _line, block in blocks if block["type"] == "tool_result"),  # 6
        "with_tokens": len(responses),  # 7: Claude Code repeats a response's usage on each of its lines
        "with_time": len(assistant) + len(user_texts),
    }
    assert tally(document)["steps"] == 13
    usage = list(responses.values())
    assert document["final_metrics"] == {
        "total_steps": 13,
        "total_prompt_tokens": sum(u["input_tokens"] + u["cache_read_input_tokens"] for u in usage),
        "total_completion_tokens": sum(u["output_tokens"] for u in usage),
        "total_cached_tokens": sum(u["cache_read_input_tokens"] for u in usage),
    }
    assert document["final_metrics"]["total_prompt_tokens"] == 214660
    assert (document["session_id"], document["agent"]["version"]) == (lines[1]["sessionId"], "2.0.64")
    assert document["extra"]["skipped"] == {"file-history-snapshot": len(lines) - len(messages)}


def test_codex_session_imports_its_calls_and_the_tokens_of_each_model_call() -> None:
    lines = jsonl(CODEX)
    items = [line["payload"] for line in lines if line["type"] == "response_item"]
    counts = [line["payload"]["info"] for line in lines if line["payload"].get("type") == "token_count"]
    inputs = [item for item in items if item["type"] == "message" and item["role"] != "assistant"]
    fmt, document = parse(read(CODEX))
    assert fmt == "codex"
    assert tally(document) == {
        "steps": len(inputs) + model_runs(items),  # 3 user messages, 3 model calls
        "tool_calls": sum(1 for item in items if item["type"] == "function_call"),  # 3
        "observations": sum(1 for item in items if item["type"] == "function_call_output"),  # 3
        "with_tokens": model_runs(items),  # each closed by a token_count
        "with_time": len(inputs) + model_runs(items),
    }
    totals = [info for info in counts if info][-1]["total_token_usage"]
    assert document["final_metrics"] == {
        "total_steps": 6,
        "total_prompt_tokens": totals["input_tokens"],  # 22474
        "total_completion_tokens": totals["output_tokens"],  # 300
        "total_cached_tokens": totals["cached_input_tokens"],  # 14848
    }
    first = next(step for step in document["steps"] if step.get("tool_calls"))
    assert first["tool_calls"][0]["arguments"]["command"] == ["bash", "-lc", "ls"]
    assert first["observation"]["results"][0]["extra"]["metadata"]["exit_code"] == 0
    assert document["extra"]["skipped"] == {"ghost_snapshot": 1}


def test_nemo_gym_rollouts_are_one_trajectory_per_line() -> None:
    rollouts = jsonl(ROLLOUTS)
    document = read(ROLLOUTS)
    with pytest.raises(TrajectoryListError) as info:
        parse(document)
    assert (info.value.count, info.value.kind) == (5, "NeMo Gym rollouts")
    got = []
    for rollout in rollouts:
        inputs = rollout["responses_create_params"]["input"]
        output = rollout["response"]["output"]
        fmt, converted = parse(rollout)
        assert fmt == "openai-responses"
        assert tally(converted) == {
            "steps": len(inputs) + model_runs(output),
            "tool_calls": sum(1 for item in output if item["type"] == "function_call"),
            "observations": sum(1 for item in output if item["type"] == "function_call_output"),
            "with_tokens": 0,  # the response's usage is the rollout's total
            "with_time": 0,
        }
        usage = rollout["response"]["usage"]
        assert converted["final_metrics"]["total_prompt_tokens"] == usage["input_tokens"]
        assert converted["final_metrics"]["total_completion_tokens"] == usage["output_tokens"]
        assert converted["extra"]["reward"] == rollout["reward"]
        got.append((tally(converted)["steps"], tally(converted)["tool_calls"], usage["output_tokens"]))
    assert got == [(4, 1, 142), (4, 1, 193), (4, 1, 187), (4, 1, 179), (4, 1, 1193)]


def test_a_list_of_responses_items_imports() -> None:
    rollout = jsonl(ROLLOUTS)[1]
    items = [*rollout["responses_create_params"]["input"], *rollout["response"]["output"]]
    fmt, document = parse(items)
    assert fmt == "openai-responses"
    assert tally(document)["steps"] == 4
    call = next(item for item in rollout["response"]["output"] if item["type"] == "function_call")
    assert document["steps"][2]["tool_calls"] == [
        {"tool_call_id": call["call_id"], "function_name": call["name"], "arguments": json.loads(call["arguments"])}
    ]
    answer = rollout["response"]["output"][-1]
    assert document["steps"][3]["message"] == answer["content"][0]["text"]


def test_a_claude_code_answer_to_no_call_is_refused_and_kept_by_the_lenient_import() -> None:
    # A resumed or cut session: the lines holding the tool_use blocks are gone, their answers remain.
    lines = [
        line
        for line in jsonl(CLAUDE)
        if not (line["type"] == "assistant" and any(b["type"] == "tool_use" for b in line["message"]["content"]))
    ]
    orphans = [b for line in lines if line["type"] == "user" for b in line["message"]["content"] if "tool_use_id" in b]
    with pytest.raises(TrajectoryFormatError) as info:
        parse(lines)
    assert len(info.value.errors) == len(orphans) == 6
    assert info.value.errors[0] == (
        f"line 5: tool_result {orphans[0]['tool_use_id']!r} answers no tool_use of an earlier line"
    )
    assert info.value.lenient_imports is True
    _fmt, document = parse(lines, lenient=True)
    assert document["extra"]["deviations"] == info.value.errors
    assert sum(1 for step in document["steps"] if step["source"] == "system") == 6


def _broken(path: Path, change: Any) -> Any:
    document = read(path)
    items = trajectory_items(document)
    first = copy.deepcopy(items[0] if items is not None else document)
    change(first)
    return first


@pytest.mark.parametrize(
    ("path", "change"),
    [
        (CLAUDE, lambda lines: lines[1].update(type={"user": 1})),
        (CODEX, lambda lines: lines[0].update(type=["session_meta"])),
        (ROLLOUTS, lambda rollout: rollout["responses_create_params"].update(input=True)),
        (OPENHANDS, lambda instance: instance["history"][3].update(cause={"id": 2})),
        (OPENHANDS, lambda instance: instance["history"][4].update(id=[5])),
        (SWE_AGENT / "0.x-swe-agent__test-repo-i1.traj", lambda traj: traj["history"].append(3)),
    ],
)
def test_a_broken_field_is_a_format_error_or_imports_never_a_crash(path: Path, change: Any) -> None:
    # Each of these once raised TypeError (an unhashable or non-iterable value where the reader
    # expected a string or a list), found by mutating the real files at random.
    document = _broken(path, change)
    for lenient in (False, True):
        try:
            _fmt, converted = parse(document, lenient=lenient)
        except TrajectoryFormatError as exc:
            assert exc.errors and all(isinstance(error, str) for error in exc.errors)
        else:
            assert converted["steps"]
