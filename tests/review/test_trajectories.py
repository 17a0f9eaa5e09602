"""The pure trajectory helpers: display model, collapsing, alignment, divergence."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from review import trajectories as tj

ATIF = Path(__file__).resolve().parents[1] / "fixtures" / "atif"


def _steps(name: str) -> list[dict]:
    return json.loads((ATIF / name).read_text())["steps"]


def test_short_text_is_shown_whole() -> None:
    block = tj.text_block("one\ntwo\n")
    assert (block.collapsed, block.lines, block.chars, block.shown, block.hidden_chars) == (
        False,
        2,
        8,
        "one\ntwo\n",
        0,
    )


def test_text_longer_than_forty_lines_is_collapsed_with_a_preview() -> None:
    text = "\n".join(f"line {n}" for n in range(1, 42))
    block = tj.text_block(text)
    assert block.collapsed
    assert block.lines == 41
    assert block.preview == "\n".join(f"line {n}" for n in range(1, tj.PREVIEW_LINES + 1))
    assert block.shown == text
    assert not tj.text_block("\n".join(["x"] * 40)).collapsed


def test_text_longer_than_four_thousand_characters_is_collapsed() -> None:
    assert not tj.text_block("a" * 4000).collapsed
    assert tj.text_block("a" * 4001).collapsed


def test_runaway_text_is_cut_and_the_cut_is_counted() -> None:
    block = tj.text_block("b" * 250_000)
    assert len(block.shown) == tj.SHOW_LIMIT
    assert block.hidden_chars == 50_000
    assert block.chars == 250_000


def test_step_view_of_a_harbor_tool_step() -> None:
    step = _steps("hello-world.trajectory.json")[4]
    view = tj.step_view(step, position=5)
    assert (view.step_id, view.source, view.position) == (5, "agent", 5)
    assert view.message is not None and view.message.shown == "I edited the file /app/hello.txt."
    [call] = view.tool_calls
    assert call.function_name == "str_replace_editor"
    assert call.call_id == "call_fake_1"
    assert json.loads(call.arguments.shown)["path"] == "/app/hello.txt"
    assert "\n  " in call.arguments.shown  # pretty-printed
    [result] = view.observations
    assert result.source_call_id == "call_fake_1"
    assert result.content is not None and result.content.shown == "File created successfully at: /app/hello.txt"
    assert (view.metrics.prompt_tokens, view.metrics.completion_tokens, view.metrics.cost_usd) == (100, 50, 0.00075)
    assert view.metrics.total_tokens == 150
    assert view.error == ""


def test_token_id_lists_are_summarised_not_listed() -> None:
    step = _steps("hello-world-context-summarization.trajectory.json")[1]
    view = tj.step_view(step)
    others = dict(view.metrics.other)
    assert others["prompt_token_ids"] == f"{len(step['metrics']['prompt_token_ids'])} values"


def test_subagent_references_are_named() -> None:
    step = _steps("hello-world-context-summarization.trajectory.json")[4]
    view = tj.step_view(step)
    assert view.observations[0].refs == (
        "trajectory.summarization-1-summary.json",
        "trajectory.summarization-1-questions.json",
        "trajectory.summarization-1-answers.json",
    )


def test_string_arguments_holding_json_are_pretty_printed() -> None:
    view = tj.step_view(
        {"step_id": 1, "source": "agent", "tool_calls": [{"function_name": "f", "arguments": '{"a":1}'}]}
    )
    assert view.tool_calls[0].arguments.shown == '{\n  "a": 1\n}'


def test_errors_are_recognised() -> None:
    assert tj.step_error({"message": "error: the harness has no prompts/system.md"}).startswith("error: the harness")
    assert tj.step_error({"extra": {"error": "boom\nmore"}}) == "boom"
    assert tj.step_error({"observation": {"results": [{"content": "Traceback (most recent call last):\n  x"}]}}) == (
        "Traceback (most recent call last):"
    )
    assert tj.step_error({"observation": {"results": [{"content": "ok", "is_error": True}]}}) != ""
    assert tj.step_error({"message": "All done, no error here."}) == ""
    view = tj.step_view({"step_id": 3, "source": "agent", "observation": {"results": [{"content": "Error: nope"}]}})
    assert view.error == "Error: nope"
    assert view.observations[0].error


def test_call_signature_ignores_call_ids_and_key_order() -> None:
    one = [{"tool_call_id": "toolu_1", "function_name": "bash", "arguments": {"a": 1, "b": 2}}]
    two = [{"tool_call_id": "toolu_9", "function_name": "bash", "arguments": {"b": 2, "a": 1}}]
    three = [{"tool_call_id": "toolu_1", "function_name": "bash", "arguments": {"a": 1, "b": 3}}]
    assert tj.call_signature(one) == tj.call_signature(two)
    assert tj.call_signature(one) != tj.call_signature(three)


def test_first_divergence() -> None:
    assert tj.first_divergence(["a", "b", "c"], ["a", "b", "c"]) is None
    assert tj.first_divergence(["a", "b", "c"], ["a", "x", "c"]) == 2
    assert tj.first_divergence(["a", "b"], ["a", "b", "c"]) == 3
    assert tj.first_divergence([], ["a"]) == 1
    assert tj.first_divergence([], []) is None


def test_align_marks_differing_steps_and_the_first_divergence() -> None:
    left = [
        {"source": "user", "message": "hi"},
        {"source": "agent", "message": "a"},
        {"source": "agent", "message": "b"},
    ]
    right = [
        {"source": "user", "message": "hi", "timestamp": "other time"},
        {"source": "agent", "message": "A"},
        {"source": "agent", "message": "b"},
        {"source": "agent", "message": "c"},
    ]
    rows = tj.align(left, right, key=tj.step_signature)
    assert [(r.position, r.differs, r.first) for r in rows] == [
        (1, False, False),
        (2, True, True),
        (3, False, False),
        (4, True, False),
    ]
    assert rows[3].left is None and rows[3].right == right[3]
    assert rows[3].one_sided


def test_align_window_marks_the_first_divergence_only_in_its_window() -> None:
    left_keys = list(range(300))
    right_keys = [*range(180), -1, *range(181, 300)]
    window = tj.align_window(
        left_keys[100:200], right_keys[100:200], start=101, left_keys=left_keys, right_keys=right_keys
    )
    assert [r.position for r in window if r.differs] == [181]
    assert [r.position for r in window if r.first] == [181]
    later = tj.align_window(
        left_keys[200:300], right_keys[200:300], start=201, left_keys=left_keys, right_keys=right_keys
    )
    assert not any(r.first or r.differs for r in later)
    summary = tj.divergence_summary(left_keys, right_keys)
    assert (summary.first, summary.differing, summary.positions) == (181, 1, 300)


def test_real_trajectories_diverge_where_they_differ() -> None:
    ok = _steps("hello-world-timeout.trajectory.json")
    changed = json.loads(json.dumps(ok))
    changed[2]["tool_calls"][0]["arguments"]["keystrokes"] = "sleep 5\n"
    changed[3]["tool_calls"][0]["tool_call_id"] = "a different id"
    rows = tj.align(ok, changed, key=tj.step_signature)
    assert [r.position for r in rows if r.differs] == [3]
    assert tj.first_divergence([tj.step_signature(s) for s in ok], [tj.step_signature(s) for s in changed]) == 3


def test_tool_arguments_nested_past_the_limit_are_shown_as_text_not_decoded() -> None:
    """Issue 16 item 2: a stored argument string holding 100,000-deep JSON made
    json.loads raise RecursionError, a 500 on the trial page and the compare view."""
    deep = "[" * 100_000 + "]" * 100_000
    assert tj.pretty_json(deep) == deep
    assert tj.call_signature([{"function_name": "f", "arguments": deep}]) == (("f", json.dumps(deep)),)
    assert tj.pretty_json('{"a": [1]}') == '{\n  "a": [\n    1\n  ]\n}'


# --- Alignment by content ------------------------------------------------------------


Call = tuple[str, dict[str, Any]]
Spec = tuple[str, str, list[Call]]


def _step(step_id: int, source: str, message: str, calls: Sequence[Call] = ()) -> dict[str, Any]:
    return {
        "step_id": step_id,
        "source": source,
        "message": message,
        "tool_calls": [
            {"tool_call_id": f"call-{step_id}-{n}", "function_name": name, "arguments": args}
            for n, (name, args) in enumerate(calls)
        ],
    }


def _trajectory(*specs: Spec) -> list[dict[str, Any]]:
    return [_step(n, *spec) for n, spec in enumerate(specs, start=1)]


USER: Spec = ("user", "Change the shipping address of order 1042.", [])
LOOKUP: Spec = ("agent", "Looking up the order.", [("get_order", {"id": 1042})])
ADDRESS: Spec = ("agent", "Updating the address.", [("update_address", {"id": 1042, "city": "Lyon"})])
CONFIRM: Spec = ("agent", "Done: the address is updated.", [])
CHECK: Spec = ("agent", "Checking the customer first.", [("get_customer", {"id": 7})])
POLICY: Spec = ("agent", "Reading the policy.", [("read_policy", {"topic": "address"})])
VERIFY: Spec = ("agent", "Verifying the change.", [("get_order", {"id": 1042})])


def test_trajectories_with_inserted_steps_align_by_content_not_position() -> None:
    # The parent: 7 steps. The child inserts two steps after the lookup and one
    # before the end, and rewords one: 10 steps.
    parent = _trajectory(
        USER,
        LOOKUP,
        ("system", "Order 1042 found.", []),
        ADDRESS,
        ("system", "Address updated.", []),
        ("agent", "Anything else?", []),
        CONFIRM,
    )
    child = _trajectory(
        USER,
        LOOKUP,
        CHECK,
        POLICY,
        ("system", "Order 1042 found.", []),
        ("agent", "Updating the address now.", [("update_address", {"city": "Lyon", "id": 1042})]),
        ("system", "Address updated.", []),
        ("agent", "Anything else?", []),
        VERIFY,
        CONFIRM,
    )
    assert (len(parent), len(child)) == (7, 10)
    left = [tj.step_signature(step) for step in parent]
    right = [tj.step_signature(step) for step in child]
    pairs = tj.align_by_content(left, right)

    def number(index: int | None) -> int | None:
        return None if index is None else index + 1

    shown = [(number(p.left), number(p.right), p.kind) for p in pairs]
    assert shown == [
        (1, 1, "same"),
        (2, 2, "same"),
        (None, 3, "inserted"),
        (None, 4, "inserted"),
        (3, 5, "same"),
        (4, 6, "changed"),  # reworded; the arguments are the same object in another key order
        (5, 7, "same"),
        (6, 8, "same"),
        (None, 9, "inserted"),
        (7, 10, "same"),
    ]
    # By position, every row from the first insertion on would pair unrelated steps.
    by_position = tj.align(parent, child, key=tj.step_signature)
    assert sum(row.differs for row in by_position) == 8
    assert sum(p.differs for p in pairs) == 4


def test_changed_steps_pair_by_source_and_tool_and_the_rest_are_gaps() -> None:
    left = [tj.step_signature(s) for s in _trajectory(USER, LOOKUP, ADDRESS, CONFIRM)]
    right = [
        tj.step_signature(s)
        for s in _trajectory(
            USER,
            ("agent", "Let me look.", [("get_order", {"id": 1043})]),
            ("agent", "Wrong order?", []),
            CONFIRM,
        )
    ]
    kinds = [(p.left, p.right, p.kind) for p in tj.align_by_content(left, right)]
    # The lookup faces the other lookup; the address update faces the agent's next step.
    assert kinds == [(0, 0, "same"), (1, 1, "changed"), (2, 2, "changed"), (3, 3, "same")]
    # One step fewer: the lookups still pair, the update is a gap (deleted).
    shorter = [right[0], right[1], right[3]]
    kinds = [(p.left, p.right, p.kind) for p in tj.align_by_content(left, shorter)]
    assert kinds == [(0, 0, "same"), (1, 1, "changed"), (2, None, "deleted"), (3, 2, "same")]
    assert [(p.left, p.right, p.kind) for p in tj.align_by_content([], right[:1])] == [(None, 0, "inserted")]


def test_word_diff_marks_the_words_that_changed() -> None:
    pieces = tj.word_diff("Updating the address.", "Updating the address now.")
    assert pieces is not None
    assert [(p.text, p.kind) for p in pieces] == [("Updating the address", "same"), (" now", "ins"), (".", "same")]
    swap = tj.word_diff("get_order(1042)", "get_order(1043)")
    assert swap is not None
    assert [(p.text, p.kind) for p in swap] == [("get_order(", "same"), ("1042", "del"), ("1043", "ins"), (")", "same")]
    assert tj.word_diff("x" * 20_001, "y") is None


def _timed(*stamps: str) -> list[tj.StepView]:
    return [tj.step_view({"step_id": i, "timestamp": stamp, "source": "agent"}) for i, stamp in enumerate(stamps, 1)]


def test_a_steps_duration_is_the_time_to_the_next_steps_timestamp() -> None:
    steps = tj.with_durations(
        _timed("2025-01-01T10:00:00Z", "2025-01-01T10:00:02.5Z", "2025-01-01T10:01:30+00:00"),
        following="2025-01-01T11:03:00Z",
    )
    assert [step.duration for step in steps] == [2.5, 87.5, 3690.0]
    assert [step.duration_text for step in steps] == ["2.50 s", "1 min 28 s", "1 h 01 min"]


def test_a_missing_unreadable_or_backwards_timestamp_gives_no_duration() -> None:
    steps = tj.with_durations(
        _timed("2025-01-01T10:00:00Z", "", "2025-01-01T10:00:05Z", "2025-01-01T10:00:04Z", "yesterday")
    )
    # 1 -> 2: the next has none; 2: none of its own; 3 -> 4: backwards; 4 -> 5: unreadable; 5: no next step.
    assert [step.duration for step in steps] == [None, None, None, None, None]
    assert [step.duration_text for step in steps] == [""] * 5
    # A timestamp without a time zone is not compared with one that has one: no figure either.
    assert tj.with_durations(_timed("2025-01-01T10:00:00", "2025-01-01T10:00:05Z"))[0].duration is None


def test_a_steps_tokens_are_priced_from_the_table_or_say_why_not() -> None:
    metrics = {"prompt_tokens": 1_000_000, "completion_tokens": 100_000}
    priced = tj.step_view({"step_id": 1, "source": "agent", "model_name": "gpt-4o", "metrics": metrics})
    assert priced.priced is not None and priced.priced.usd == 2.5 + 1.0 and priced.unpriced == ""
    unknown = tj.step_view({"step_id": 1, "source": "agent", "model_name": "home-made-7b", "metrics": metrics})
    assert unknown.priced is None and unknown.unpriced == "no price for home-made-7b in the price table"
    unnamed = tj.step_view({"step_id": 1, "source": "agent", "metrics": metrics})
    assert unnamed.priced is None and unnamed.unpriced == "the step names no model: no price"
    untokened = tj.step_view({"step_id": 1, "source": "agent", "model_name": "gpt-4o"})
    assert untokened.priced is None and untokened.unpriced == ""
