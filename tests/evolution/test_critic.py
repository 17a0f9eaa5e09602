"""The leakage critic on realistic diffs: the offline support-routing tasks
as the evolve set, leaky edits that copy task content, and generic edits
(and near misses) that must pass."""

from __future__ import annotations

import difflib
import json
import random
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from evolution.critic import (
    RULES,
    CriticConfig,
    CriticTask,
    Flag,
    build_index,
    critique,
    extract_literals,
)
from evolution.example import reference_edits
from evolution.gitdiff import DiffParseError

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "evolution" / "example"


def load_example_tasks() -> list[CriticTask]:
    tasks = [json.loads(line) for line in (EXAMPLE / "tasks.jsonl").read_text(encoding="utf-8").splitlines()]
    return [CriticTask(t["id"], t["instruction"], t["expected"], t["files"]) for t in tasks]


TASKS = load_example_tasks()
INDEX = build_index(TASKS)


def make_diff(files: Mapping[str, tuple[str | None, str | None]]) -> str:
    """A git diff of ``{path: (old text or None, new text or None)}``."""
    out: list[str] = []
    for path, (old, new) in files.items():
        header = f"diff --git a/{path} b/{path}\n"
        if old is None:
            header += "new file mode 100644\nindex 0000000..1111111\n"
        elif new is None:
            header += "deleted file mode 100644\nindex 1111111..0000000\n"
        else:
            header += "index 1111111..2222222 100644\n"
        before = [] if old is None else old.splitlines(keepends=True)
        after = [] if new is None else new.splitlines(keepends=True)
        from_name = "/dev/null" if old is None else f"a/{path}"
        to_name = "/dev/null" if new is None else f"b/{path}"
        out.append(header + "".join(difflib.unified_diff(before, after, from_name, to_name)))
    return "".join(out)


def added_file(text: str, path: str = "memory/notes.md") -> str:
    return make_diff({path: (None, text)})


def only(*rules: str, **thresholds: Any) -> CriticConfig:
    return CriticConfig(rules=frozenset(rules), **thresholds)


def summary(flags: list[Flag]) -> list[tuple[str, int | None, str, str | None]]:
    return [(flag.rule, flag.line_number, flag.matched, flag.task_id) for flag in flags]


SEED_FLOW = """# Control flow: the agent runs these steps in order.
steps = ["classify", "extract", "submit"]
# Extra classify/extract/verify rounds after a failed verify.
max_retries = 0
"""

SEED_REFUND_TOOL = """name = "refund_order"
description = "Refund an order."
keywords = ["refund"]

[[args]]
name = "order_id"
patterns = ['\\b([A-Z]-\\d{4})\\b']
"""

SEED_NOTES = """# Memory

## Hints

- "order" -> refund_order
- "account" -> cancel_subscription

## Known cases

(none)
"""


# --- Generic edits pass -----------------------------------------------------------


def test_general_normalization_guidance_is_not_flagged() -> None:
    diff = added_file(
        "## Amounts\n\n"
        "Always normalize amounts to two decimals before submitting.\n"
        "Read a decimal comma as a decimal point, and drop currency symbols.\n"
        "Write postcodes in capitals with one space before the last three characters.\n",
        path="skills/amounts.md",
    )

    assert critique(diff, INDEX) == []


def test_retry_step_in_control_flow_is_not_flagged() -> None:
    new = SEED_FLOW.replace('"extract", "submit"]', '"extract", "verify", "submit"]').replace(
        "max_retries = 0", "max_retries = 2"
    )
    diff = make_diff({"control/flow.toml": (SEED_FLOW, new)})

    assert critique(diff, INDEX) == []


def test_generic_tool_description_is_not_flagged() -> None:
    new = SEED_REFUND_TOOL.replace(
        'description = "Refund an order."',
        'description = "Refund an order when the customer asks for their money back for something they bought; '
        'give the order id as a capital letter, a hyphen and four digits, and the amount with two decimals."',
    ).replace('keywords = ["refund"]', 'keywords = ["refund", "money back", "reimburse", "charged twice"]')
    diff = make_diff({"tools/refund_order.toml": (SEED_REFUND_TOOL, new)})

    assert critique(diff, INDEX) == []


def test_made_up_examples_sharing_everyday_phrases_are_not_flagged() -> None:
    # Nine words in a row equal route-030's message, but only "log" and
    # "account" carry information: everyday English, not a copy.
    diff = added_file(
        "Request: I can't log in to my account any more, please send a reset link.\nTool: reset_password\n"
        "Request: I want my money back for an order that arrived broken.\nTool: refund_order\n",
        path="prompts/examples.md",
    )

    assert critique(diff, INDEX) == []


def test_instruction_preamble_shared_by_every_task_is_not_flagged() -> None:
    diff = added_file(
        "Each task says: Route this customer-support message to one tool and fill in the tool's arguments.\n",
        path="prompts/system.md",
    )

    assert critique(diff, INDEX) == []


def test_generic_python_retry_tool_is_not_flagged() -> None:
    code = (
        "import time\n\n\n"
        "def call_with_retry(call, attempts=3):\n"
        '    """Retry a tool call that timed out, waiting longer each time."""\n'
        "    for attempt in range(attempts):\n"
        "        try:\n"
        "            return call()\n"
        "        except TimeoutError:\n"
        "            if attempt == attempts - 1:\n"
        "                raise\n"
        "            time.sleep(_backoff(attempt))\n"
        '    raise ValueError("attempts must be positive")\n\n\n'
        "def _backoff(attempt):\n"
        "    return 0.5 * 2**attempt\n"
    )

    assert critique(added_file(code, path="tools/retry.py"), INDEX) == []


def test_every_generic_reference_edit_passes_and_leaky_ones_flag_every_copied_line(tmp_path: Path) -> None:
    tasks = [json.loads(line) for line in (EXAMPLE / "tasks.jsonl").read_text(encoding="utf-8").splitlines()]
    splits = reference_edits.split_tasks(tasks)
    evolve = build_index([task for task in TASKS if task.id in {t["id"] for t in splits["train"] + splits["gate"]}])
    seed = {str(p.relative_to(EXAMPLE / "harness")): p.read_text() for p in (EXAMPLE / "harness").rglob("*.*")}

    def edit_diff(name: str) -> str:
        root = tmp_path / name
        shutil.copytree(EXAMPLE / "harness", root)
        reference_edits.apply(name, root, tasks=tasks)
        after = {path: (root / path).read_text() for path in seed}
        return make_diff({path: (seed[path], after[path]) for path in seed if after[path] != seed[path]})

    assert critique(edit_diff("all-generic"), evolve, parent_text=seed) == []
    known_cases = critique(edit_diff("memory-known-cases"), evolve, parent_text=seed)
    # One "known case" line per train task, each flagged for its own task and no other (with the split
    # stratified by kind, route-029 and route-052, which both ask for a callback on 2026-03-10, are in
    # sealed and gate: no train line names the other's date).
    own = [(17 + number, task["id"]) for number, task in enumerate(splits["train"])]
    assert sorted({(flag.line_number, flag.task_id) for flag in known_cases if flag.rule == "rare_literal"}) == own
    assert {flag.rule for flag in known_cases} == {"shared_ngram", "long_substring", "rare_literal", "keyed_condition"}


# --- a. task ids --------------------------------------------------------------------


def test_task_id_in_added_text_is_flagged() -> None:
    flags = critique(added_file("See route-017 for the lost parcel case.\n"), INDEX)

    assert flags == [
        Flag(
            rule="task_id",
            path="memory/notes.md",
            line_number=1,
            line="See route-017 for the lost parcel case.",
            matched="route-017",
            task_id="route-017",
            evidence="the id of evolve task route-017",
        )
    ]


def test_task_id_inside_a_longer_token_is_not_flagged() -> None:
    diff = added_file("Use reroute-017 or route-0171 as a label; the routes are listed below.\n")

    assert critique(diff, INDEX) == []


def test_task_id_is_matched_whatever_the_case() -> None:
    flags = critique(added_file("Same as ROUTE-017.\n"), INDEX)

    assert summary(flags) == [("task_id", 1, "ROUTE-017", "route-017")]


def test_task_id_in_a_new_file_name_is_flagged() -> None:
    flags = critique(added_file("refund the full amount\n", path="memory/cases/route-005.md"), INDEX)

    assert flags == [
        Flag(
            rule="task_id",
            path="memory/cases/route-005.md",
            line_number=None,
            line="memory/cases/route-005.md",
            matched="route-005",
            task_id="route-005",
            evidence="the id of evolve task route-005",
        )
    ]


def test_short_ids_that_are_words_or_numbers_are_ignored_but_coded_ids_are_flagged() -> None:
    tasks = [CriticTask("add", "Add two numbers."), CriticTask("42", "Say hello."), CriticTask("t00", "Say yes.")]

    flags = critique(added_file("To add 42 items, see t00.\n"), tasks)

    assert summary(flags) == [("task_id", 1, "t00", "t00")]


# --- b. task file paths ---------------------------------------------------------------

PATH_TASKS = [
    CriticTask("claim-1", "Check the receipt.", files={"ticket.json": "{}", "attachments/receipt-d7824.txt": "paid"}),
    CriticTask("claim-2", "Check the photo.", files={"ticket.json": "{}"}),
    CriticTask("claim-3", "Check the label.", files={"ticket.json": "{}"}),
    CriticTask("claim-4", "Check the order.", files={"ticket.json": "{}"}),
]


def test_task_file_path_is_flagged_once_as_the_longest_match() -> None:
    flags = critique(added_file("Before anything, open attachments/receipt-d7824.txt and read it.\n"), PATH_TASKS)

    assert flags == [
        Flag(
            rule="task_path",
            path="memory/notes.md",
            line_number=1,
            line="Before anything, open attachments/receipt-d7824.txt and read it.",
            matched="attachments/receipt-d7824.txt",
            task_id="claim-1",
            evidence="file attachments/receipt-d7824.txt of evolve task claim-1",
        )
    ]


def test_task_file_name_without_its_directory_is_flagged() -> None:
    flags = critique(added_file("The file receipt-d7824.txt holds the amount.\n"), PATH_TASKS)

    assert summary(flags) == [("task_path", 1, "receipt-d7824.txt", "claim-1")]


def test_file_name_every_task_has_is_not_flagged() -> None:
    # ticket.json is part of every task: template, not task-specific.
    assert critique(added_file("Read ticket.json for the values on file.\n"), PATH_TASKS) == []
    assert critique(added_file("Read ticket.json for the values on file.\n"), INDEX) == []


# --- c. shared n-grams ------------------------------------------------------------------


def test_copied_task_sentence_is_flagged_as_shared_ngram() -> None:
    diff = added_file("- My bank sent me a replacement after the old one expired -> update_payment\n")

    flags = critique(diff, TASKS, config=only("shared_ngram"))

    assert flags == [
        Flag(
            rule="shared_ngram",
            path="memory/notes.md",
            line_number=1,
            line="- My bank sent me a replacement after the old one expired -> update_payment",
            matched="My bank sent me a replacement after the old one expired",
            task_id="route-023",
            evidence="11 words in a row from the instruction of evolve task route-023",
        )
    ]


def test_fewer_shared_words_than_the_ngram_size_are_not_flagged() -> None:
    diff = added_file("Our blender arrived cracked once too.\n")

    assert critique(diff, TASKS, config=only("shared_ngram")) == []
    assert summary(critique(diff, TASKS, config=only("shared_ngram", ngram_size=3))) == [
        ("shared_ngram", 1, "blender arrived cracked", "route-015"),
        ("shared_ngram", 1, "blender arrived cracked", "route-053"),
    ]


# --- d. long common substrings ----------------------------------------------------------


def test_long_common_substring_is_flagged_whatever_the_case_and_spacing() -> None:
    diff = added_file("NOTE: IT  COST   TWENTY-TWO POUNDS\n")

    flags = critique(diff, TASKS, config=only("long_substring"))

    assert flags == [
        Flag(
            rule="long_substring",
            path="memory/notes.md",
            line_number=1,
            line="NOTE: IT  COST   TWENTY-TWO POUNDS",
            matched="IT  COST   TWENTY-TWO POUNDS",
            task_id="route-044",
            evidence="25 characters in common with the instruction of evolve task route-044",
        )
    ]


def test_common_substring_shorter_than_the_minimum_is_not_flagged() -> None:
    diff = added_file("note: cost twenty-two pounds\n")  # 22 characters in common

    assert critique(diff, TASKS, config=only("long_substring")) == []
    assert summary(critique(diff, TASKS, config=only("long_substring", min_substring_chars=22))) == [
        ("long_substring", 1, "cost twenty-two pounds", "route-044")
    ]


# --- e. rare literals ---------------------------------------------------------------------


def test_customer_name_and_order_id_copied_into_memory_are_rare_literals() -> None:
    new = SEED_NOTES.replace("(none)", "- Saoirse Nakashima: order D-7824, refund 174.25")
    flags = critique(make_diff({"memory/notes.md": (SEED_NOTES, new)}), INDEX)

    line = "- Saoirse Nakashima: order D-7824, refund 174.25"
    source = "literal from the instruction of evolve task route-005 (in 1 of 60 evolve tasks)"
    assert flags == [
        Flag("rare_literal", "memory/notes.md", 10, line, "174.25", "route-005", source),
        Flag("rare_literal", "memory/notes.md", 10, line, "D-7824", "route-005", source),
        Flag("rare_literal", "memory/notes.md", 10, line, "Saoirse Nakashima", "route-005", source),
    ]


def test_literal_answer_is_flagged_with_the_expected_answer_as_source() -> None:
    flags = critique(added_file("Default postcode: B8 8XY\n"), INDEX)

    assert flags == [
        Flag(
            rule="rare_literal",
            path="memory/notes.md",
            line_number=1,
            line="Default postcode: B8 8XY",
            matched="B8 8XY",
            task_id="route-001",
            evidence="literal from the expected answer of evolve task route-001 (in 1 of 60 evolve tasks)",
        )
    ]


def test_literal_from_a_task_file_is_flagged() -> None:
    flags = critique(added_file("Known account: ACC-895143\n"), INDEX)

    assert summary(flags) == [("rare_literal", 1, "ACC-895143", "route-001")]
    assert flags[0].evidence == "literal from the file ticket.json of evolve task route-001 (in 1 of 60 evolve tasks)"


def test_literal_in_more_tasks_than_the_rare_limit_is_not_flagged() -> None:
    tasks = [CriticTask(f"sku-{n}", f"Restock SKU-4471 in aisle {n}.") for n in range(3)]
    diff = added_file("Restock SKU-4471 first.\n")

    assert critique(diff, tasks, config=only("rare_literal")) == []
    assert summary(critique(diff, tasks[:2], config=only("rare_literal"))) == [
        ("rare_literal", 1, "SKU-4471", "sku-0"),
        ("rare_literal", 1, "SKU-4471", "sku-1"),
    ]


def test_years_round_numbers_and_ordinary_words_are_not_literals() -> None:
    text = 'Call me in 2026 about 2000 units, order B-1006 ($40.25), tier "silver", see "Bastiaan Castellanos".'

    assert extract_literals(text) == {"b-1006", "40.25", "bastiaan castellanos"}


def test_literals_of_a_ticket_file_are_extracted() -> None:
    ticket = next(task for task in TASKS if task.id == "route-001").files["ticket.json"]

    assert extract_literals(ticket) == {
        "bastiaan castellanos",
        "cust-57405",
        "acc-895143",
        "447700900189",
        "+447700900189",
        "bastiaan.castellanos@post.example.org",
        "sw9h 5pd",
        "n-3797",
    }


def test_generic_numbers_in_settings_are_not_flagged() -> None:
    diff = added_file(
        'max_request_chars = 2000\ntemperature = 0.2\ndate_format = "YYYY-MM-DD"\n', "context/window.toml"
    )

    assert critique(diff, INDEX) == []


# --- f. keyed conditions --------------------------------------------------------------------


def test_condition_on_an_order_id_is_flagged() -> None:
    flags = critique(
        added_file("If the message mentions order G-6624, use refund_order.\n", "prompts/system.md"), INDEX
    )

    line = "If the message mentions order G-6624, use refund_order."
    assert flags == [
        Flag(
            "rare_literal",
            "prompts/system.md",
            1,
            line,
            "G-6624",
            "route-060",
            "literal from the expected answer of evolve task route-060 (in 1 of 60 evolve tasks)",
        ),
        Flag(
            "keyed_condition",
            "prompts/system.md",
            1,
            line,
            "G-6624",
            "route-060",
            "condition keyed on a literal from the expected answer of evolve task route-060",
        ),
    ]


def test_memory_rule_keyed_on_a_quoted_task_phrase_is_flagged() -> None:
    new = SEED_NOTES.replace('- "account" -> cancel_subscription\n', '- "blender arrived cracked" -> refund_order\n')
    flags = critique(make_diff({"memory/notes.md": (SEED_NOTES, new)}), INDEX)

    assert summary(flags) == [
        ("keyed_condition", 6, "blender arrived cracked", "route-015"),
        ("keyed_condition", 6, "blender arrived cracked", "route-053"),
    ]
    assert flags[0].evidence == "condition keyed on text from the instruction of evolve task route-015"


def test_generic_conditions_are_not_flagged() -> None:
    diff = added_file(
        'if "tracking number" in message.lower():\n'
        "    tool = 'track_shipment'\n"
        "If the message mentions an order id and an amount, use refund_order.\n"
        "When the customer says the parcel has not arrived, use track_shipment.\n"
        '- "money back" -> refund_order\n',
        path="prompts/rules.md",
    )

    assert critique(diff, INDEX) == []


# --- g. inert machinery ----------------------------------------------------------------------

INERT_CODE = '''"""Routing helpers."""


def _unused_helper(value):
    return value.strip()


def route(message):
    if False:
        return "refund_order"
    while 0:
        pass
    return "track_shipment"
    print("never")


class _Orphan:
    pass


def outer():
    def inner():
        return 1

    return 2
'''


def test_provably_inert_python_is_flagged() -> None:
    flags = critique(added_file(INERT_CODE, path="tools/routing.py"), INDEX)

    assert [(flag.line_number, flag.matched, flag.evidence) for flag in flags] == [
        (4, "_unused_helper", "function _unused_helper is defined but referenced nowhere"),
        (9, "if False:", "branch whose condition is always false"),
        (11, "while 0:", "loop whose condition is always false"),
        (14, 'print("never")', "unreachable: follows an unconditional return"),
        (17, "_Orphan", "class _Orphan is defined but referenced nowhere"),
        (22, "inner", "function inner is defined but referenced nowhere"),
    ]
    assert {(flag.rule, flag.task_id) for flag in flags} == {("inert", None)}


def test_ordinary_python_is_not_flagged_as_inert() -> None:
    code = (
        "def public_entry(message):\n"  # may be called by a loader, by name
        "    return _helper(message)\n\n\n"
        "def _helper(message):\n"
        "    def used():\n"
        "        return message.strip()\n\n"
        "    while True:\n"
        "        if used():\n"
        "            break\n"
        "    if not message:\n"
        "        return None\n"
        "    else:\n"
        "        return used()\n\n\n"
        "@register\n"
        "def _registered():\n"
        "    return 1\n"
    )

    assert critique(added_file(code, path="tools/route.py"), INDEX) == []


def test_private_function_referenced_from_another_added_file_is_not_inert() -> None:
    diff = make_diff(
        {
            "tools/a.py": (None, "def _shared():\n    return 1\n"),
            "tools/loader.md": (None, "The loader calls _shared on start.\n"),
        }
    )

    assert critique(diff, INDEX) == []


def test_unused_definition_needs_the_whole_file_to_be_proven() -> None:
    old = "def route(message):\n    return 'x'\n\n\ndef other():\n    return 1\n" + "x = 1\n" * 10
    new = old.replace(
        "    return 'x'\n", "    if False:\n        return 'y'\n    return 'x'\n\n\ndef _dead():\n    return 2\n"
    )
    diff = make_diff({"tools/route.py": (old, new)})

    without_parent = critique(diff, INDEX)
    with_parent = critique(diff, INDEX, parent_text={"tools/route.py": old})

    # The hunk alone cannot show that nothing further down calls _dead.
    assert [(flag.line_number, flag.matched) for flag in without_parent] == [(2, "if False:")]
    assert [(flag.line_number, flag.matched) for flag in with_parent] == [(2, "if False:"), (7, "_dead")]


# --- Added lines only, parent content, plumbing --------------------------------------------------


def rename_diff(old: str, new: str) -> str:
    return f"diff --git a/{old} b/{new}\nsimilarity index 100%\nrename from {old}\nrename to {new}\n"


def test_file_renamed_to_a_task_id_is_flagged_unless_the_parent_had_the_name() -> None:
    to_id = critique(rename_diff("memory/case.md", "memory/route-005.md"), INDEX)
    moved = critique(rename_diff("memory/route-005.md", "memory/cases/route-005.md"), INDEX)

    assert summary(to_id) == [("task_id", None, "route-005", "route-005")]
    assert moved == []


def test_private_name_the_parent_refers_to_is_not_inert() -> None:
    diff = added_file("class _Loader:\n    pass\n", path="tools/loader.py")

    assert summary(critique(diff, INDEX)) == [("inert", 1, "_Loader", None)]
    assert critique(diff, INDEX, parent_text={"config.toml": 'loader = "tools.loader._Loader"\n'}) == []


def test_removed_lines_never_flag() -> None:
    old = SEED_NOTES.replace("(none)", "- Saoirse Nakashima: order D-7824 (route-005), refund 174.25")
    diff = make_diff({"memory/notes.md": (old, SEED_NOTES), "memory/old.md": (old, None)})

    assert critique(diff, INDEX) == []


def test_content_already_in_the_parent_is_not_flagged() -> None:
    diff = added_file("Example order: D-7824 (route-005)\n", path="prompts/examples.md")
    parent = {"memory/notes.md": SEED_NOTES.replace("(none)", "- order D-7824 seen in route-005")}

    assert summary(critique(diff, INDEX)) == [
        ("task_id", 1, "route-005", "route-005"),
        ("rare_literal", 1, "D-7824", "route-005"),
    ]
    assert critique(diff, INDEX, parent_text=parent) == []


def test_context_lines_of_the_diff_count_as_parent_content() -> None:
    old = SEED_NOTES.replace("(none)", "- Saoirse Nakashima asked about D-7824")
    new = old + "- Saoirse Nakashima again\n"

    assert critique(make_diff({"memory/notes.md": (old, new)}), INDEX) == []


def test_evidence_names_the_task_in_every_rule() -> None:
    diff = added_file('- "Please refund $174.25 for D-7824. The jacket was" -> refund_order (route-005)\n')

    flags = critique(diff, INDEX)

    assert {flag.rule for flag in flags} == {
        "task_id",
        "shared_ngram",
        "long_substring",
        "rare_literal",
        "keyed_condition",
    }
    assert all(flag.task_id == "route-005" and "evolve task route-005" in flag.evidence for flag in flags)


def test_binary_files_are_skipped() -> None:
    diff = "diff --git a/img/route-005.png b/img/route-005.png\nindex 1111111..2222222 100644\n"
    diff += "Binary files a/img/route-005.png and b/img/route-005.png differ\n"

    assert critique(diff, INDEX) == []


def test_index_gives_the_same_flags_as_the_tasks() -> None:
    diff = added_file("- Saoirse Nakashima: D-7824\n")

    assert critique(diff, TASKS) == critique(diff, INDEX)
    assert len(critique(diff, INDEX)) == 2


def test_config_must_match_the_index() -> None:
    with pytest.raises(ValueError, match="the config differs from the one the index was built with"):
        critique("", INDEX, config=CriticConfig(ngram_size=5))


def test_duplicate_task_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="task ids must be unique"):
        build_index([CriticTask("a-1", "x"), CriticTask("a-1", "y")])


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown critic rules: \['spelling'\]"):
        CriticConfig(rules=frozenset({"spelling"}))


def test_unreadable_diff_raises() -> None:
    with pytest.raises(DiffParseError, match="line 1: expected a 'diff --git' header"):
        critique("not a diff\n", INDEX)


def test_empty_diff_has_no_flags() -> None:
    assert critique("", INDEX) == []


def test_flag_to_json() -> None:
    flag = Flag("rare_literal", "memory/notes.md", 3, "- D-7824", "D-7824", "route-005", "literal ...")

    assert flag.to_json() == {
        "rule": "rare_literal",
        "path": "memory/notes.md",
        "line_number": 3,
        "line": "- D-7824",
        "matched": "D-7824",
        "task_id": "route-005",
        "evidence": "literal ...",
    }


def test_a_two_thousand_line_diff_against_200_tasks_flags_every_leaky_line() -> None:
    rng = random.Random(5)

    def vary(text: str) -> str:
        return "".join(str(rng.randrange(10)) if char.isdigit() else char for char in text)

    tasks = [
        CriticTask(
            f"route-{number:03d}",
            vary(base.instruction),
            json.loads(vary(json.dumps(base.expected))),
            {path: vary(text) for path, text in base.files.items()},
        )
        for number, base in ((n, TASKS[n % len(TASKS)]) for n in range(200))
    ]
    generic = [
        "Always normalize amounts to two decimals before submitting.",
        "If the message mentions an order id and an amount, use refund_order.",
        'keywords = ["refund", "money back", "reimburse"]',
        'steps = ["classify", "extract", "verify", "submit"]',
    ]
    lines = []
    for number in range(2000):
        if number % 10 == 0:  # one leaky line in ten: a copied message and its answer
            task = tasks[number // 10]
            lines.append(f"- {task.instruction.splitlines()[-1][2:]} => {json.dumps(task.expected)}")
        else:
            lines.append(generic[number % len(generic)])
    diff = added_file("\n".join(lines) + "\n")

    started = time.perf_counter()
    index = build_index(tasks)
    built = time.perf_counter()
    flags = critique(diff, index)
    finished = time.perf_counter()

    # Speed is the critic benchmark's business (machines here are shared); printed for the log.
    print(f"\nindex of 200 tasks: {built - started:.3f} s; critique of 2,000 lines: {finished - built:.3f} s")
    assert {flag.line_number for flag in flags} == set(range(1, 2001, 10))


# --- Hidden characters ----------------------------------------------------------------


def tree_diff(old: Mapping[str, str], new: Mapping[str, str]) -> str:
    """A real git-style diff of two small trees (lines end at LF only)."""
    from evolution.trees import FileEntry, diff_entries

    def entries(files: Mapping[str, str]) -> list[FileEntry]:
        return [FileEntry(path, "100644", text.encode()) for path, text in sorted(files.items())]

    return diff_entries(entries(old), entries(new))


TROJAN_OLD = 'def check(user):\n    access = "user"\n    return access\n'
TROJAN_NEW = (
    'def check(user):\n    access = "user"\n    #\u202e } \u2066if user.isAdmin:\u2069 \u2066 # admins only\n'
    "    return access\n"
)


def test_an_edit_adding_bidi_controls_is_flagged_with_code_point_line_and_column() -> None:
    flags = critique(tree_diff({"tools/check.py": TROJAN_OLD}, {"tools/check.py": TROJAN_NEW}), INDEX)
    assert [(f.rule, f.path, f.line_number, f.matched, f.task_id, f.evidence) for f in flags] == [
        ("hidden_unicode", "tools/check.py", 3, "\u202e", None,
         "U+202E RIGHT-TO-LEFT OVERRIDE (bidi) on line 3, column 6"),
        ("hidden_unicode", "tools/check.py", 3, "\u2066", None,
         "U+2066 LEFT-TO-RIGHT ISOLATE (bidi) on line 3, columns 10, 29"),
        ("hidden_unicode", "tools/check.py", 3, "\u2069", None,
         "U+2069 POP DIRECTIONAL ISOLATE (bidi) on line 3, column 27"),
    ]  # fmt: skip
    assert {f.line for f in flags} == {TROJAN_NEW.split("\n")[2]}


def test_zero_width_tag_and_look_alike_characters_and_new_file_names_are_flagged() -> None:
    diff = tree_diff(
        {"prompts/system.md": "Be brief.\n"},
        {
            "prompts/system.md": "Be brief.\nIf is\u200bAdmin then ok\U000e0041.\n",
            "skills/p\u0430ypal.md": "Use the p\u0430ypal tool.\n",
        },
    )
    flags = critique(diff, TASKS, config=only("hidden_unicode"))
    assert summary(flags) == [
        ("hidden_unicode", 2, "\u200b", None),
        ("hidden_unicode", 2, "\U000e0041", None),
        ("hidden_unicode", None, "\u0430", None),
        ("hidden_unicode", 1, "\u0430", None),
    ]
    assert flags[2].evidence == "U+0430 CYRILLIC SMALL LETTER A (look-alike) in the file name"


def test_hidden_characters_the_parent_already_had_are_not_flagged_again() -> None:
    old = "keep \u200b here\nline two\n"
    moved = "line two\nkeep \u200b here\n"  # the same character moved: no net increase
    assert critique(tree_diff({"memory/notes.md": old}, {"memory/notes.md": moved}), INDEX) == []
    added = "\ufeffintro\nline two\n"  # a byte order mark opening a new file is the file's own
    assert critique(tree_diff({}, {"memory/bom.md": added}), INDEX) == []
    more = old + "and \u200b again\n"
    assert summary(critique(tree_diff({"memory/notes.md": old}, {"memory/notes.md": more}), INDEX)) == [
        ("hidden_unicode", 3, "\u200b", None)
    ]


def test_a_bidi_control_moved_to_another_line_is_flagged() -> None:
    old = "ok = True  # \u202e note\nif user.isAdmin:\n    grant()\n"
    new = "ok = True  # note\nif user.\u202eisAdmin:\n    grant()\n"
    flags = critique(tree_diff({"tools/check.py": old}, {"tools/check.py": new}), INDEX)
    assert [(f.rule, f.line_number, f.matched, f.evidence) for f in flags] == [
        ("hidden_unicode", 2, "\u202e", "U+202E RIGHT-TO-LEFT OVERRIDE (bidi) on line 2, column 9")
    ]


def test_the_bytes_of_a_binary_file_make_one_flag_per_line() -> None:
    from evolution.trees import FileEntry, diff_entries

    old = [FileEntry("memory/blob.bin", "100644", b"head\n")]
    new = [FileEntry("memory/blob.bin", "100644", b"head\n\x89PNG\xff\xfe\n\x00\x00\n")]
    assert critique(diff_entries(old, new), INDEX) == []  # as git shows it: "Binary files differ", no text
    flags = critique(diff_entries(old, new, binary_as_text=True), INDEX)
    assert [(f.line_number, f.matched, f.evidence) for f in flags] == [
        (2, "\udc89", "3 bytes that are not UTF-8 (not UTF-8) on line 2, the first 0x89 at column 1"),
        (3, "\x00", "U+0000 NULL (control) on line 3, columns 1, 2"),
    ]


def test_the_hidden_unicode_rule_can_be_switched_off() -> None:
    diff = tree_diff({"tools/check.py": TROJAN_OLD}, {"tools/check.py": TROJAN_NEW})
    rules = frozenset(rule for rule in RULES if rule != "hidden_unicode")
    assert {flag.rule for flag in critique(diff, INDEX)} == {"hidden_unicode"}
    assert critique(diff, build_index(TASKS, CriticConfig(rules=rules))) == []
