"""``manage.py critique``: run for real as a subprocess with --tasks files,
and in process against a real experiment's splits."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from evolution.models import SplitMembership
from tests.evolution.test_critic import SEED_NOTES, make_diff
from tests.factories import make_tiny_experiment

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE_TASKS = REPO_ROOT / "evolution" / "example" / "tasks.jsonl"

LEAKY_NOTES = SEED_NOTES.replace("(none)", "- Saoirse Nakashima: order D-7824, refund 174.25")
LEAKY_DIFF = make_diff({"memory/notes.md": (SEED_NOTES, LEAKY_NOTES)})
GENERIC_DIFF = make_diff({"skills/amounts.md": (None, "Always normalize amounts to two decimals before submitting.\n")})
LEAKY_LINE = "- Saoirse Nakashima: order D-7824, refund 174.25"


def critique(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "critique", *args],
        cwd=REPO_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def tasks_file(tmp_path: Path) -> Path:
    """Ten tasks of the offline example, route-001 to route-010, as JSONL."""
    lines = EXAMPLE_TASKS.read_text(encoding="utf-8").splitlines()[:10]
    return write(tmp_path / "tasks.jsonl", "\n".join(lines) + "\n")


def test_clean_diff_exits_0(tmp_path: Path, tasks_file: Path) -> None:
    diff_file = write(tmp_path / "change.diff", GENERIC_DIFF)

    result = critique("--tasks", str(tasks_file), "--diff", str(diff_file))

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"flagged": False, "flags": []}
    assert result.stderr == ""


def test_leaky_diff_exits_1_and_names_the_task(tmp_path: Path, tasks_file: Path) -> None:
    diff_file = write(tmp_path / "change.diff", LEAKY_DIFF)

    result = critique("--tasks", str(tasks_file), "--diff", str(diff_file))

    assert result.returncode == 1
    evidence = "literal from the instruction of evolve task route-005 (in 1 of 10 evolve tasks)"
    assert json.loads(result.stdout) == {
        "flagged": True,
        "flags": [
            {
                "rule": "rare_literal",
                "path": "memory/notes.md",
                "line_number": 10,
                "line": LEAKY_LINE,
                "matched": matched,
                "task_id": "route-005",
                "evidence": evidence,
            }
            for matched in ("174.25", "D-7824", "Saoirse Nakashima")
        ],
    }
    assert "3 leakage flag(s)" in result.stderr


def test_diff_is_read_from_stdin_with_dash(tasks_file: Path) -> None:
    result = critique("--tasks", str(tasks_file), "--diff", "-", stdin=LEAKY_DIFF)

    assert result.returncode == 1
    assert [flag["matched"] for flag in json.loads(result.stdout)["flags"]] == ["174.25", "D-7824", "Saoirse Nakashima"]


def test_empty_diff_exits_0(tasks_file: Path) -> None:
    result = critique("--tasks", str(tasks_file), "--diff", "-", stdin="")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"flagged": False, "flags": []}


def test_content_in_the_parent_dir_is_not_flagged(tmp_path: Path, tasks_file: Path) -> None:
    parent = tmp_path / "parent"
    write(parent / "memory" / "notes.md", SEED_NOTES)
    write(parent / "prompts" / "system.md", "Earlier sessions saw Saoirse Nakashima, D-7824 and 174.25.\n")

    result = critique("--tasks", str(tasks_file), "--diff", "-", "--parent-dir", str(parent), stdin=LEAKY_DIFF)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"flagged": False, "flags": []}


def test_tasks_without_expected_or_files_are_accepted(tmp_path: Path) -> None:
    tasks = write(tmp_path / "t.jsonl", '{"id": "case-7", "instruction": "Refund order Q-4417."}\n\n')

    result = critique("--tasks", str(tasks), "--diff", "-", stdin=make_diff({"a.md": (None, "Q-4417 case-7\n")}))

    assert result.returncode == 1
    assert [(f["rule"], f["matched"]) for f in json.loads(result.stdout)["flags"]] == [
        ("task_id", "case-7"),
        ("rare_literal", "Q-4417"),
    ]


def test_garbage_diff_exits_2_without_a_verdict(tasks_file: Path) -> None:
    result = critique("--tasks", str(tasks_file), "--diff", "-", stdin="this is not a diff\n")

    assert result.returncode == 2
    assert result.stdout == ""
    assert "diff is not usable: line 1: expected a 'diff --git' header" in result.stderr


def test_missing_diff_file_exits_2(tmp_path: Path, tasks_file: Path) -> None:
    result = critique("--tasks", str(tasks_file), "--diff", str(tmp_path / "nope.diff"))

    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read diff" in result.stderr


def test_missing_tasks_file_exits_2(tmp_path: Path) -> None:
    result = critique("--tasks", str(tmp_path / "nope.jsonl"), "--diff", "-", stdin=LEAKY_DIFF)

    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read tasks file" in result.stderr


def test_missing_parent_dir_exits_2(tmp_path: Path, tasks_file: Path) -> None:
    result = critique("--tasks", str(tasks_file), "--diff", "-", "--parent-dir", str(tmp_path / "no"), stdin=LEAKY_DIFF)

    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read parent directory" in result.stderr


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        pytest.param(
            ['{"id": "a-1", "instruction": "x"}', "{not json"],
            "line 2: not valid JSON (Expecting property name",
            id="json",
        ),
        pytest.param(['{"instruction": "x"}'], "line 1: 'id' must be a non-empty string", id="no-id"),
        pytest.param(['{"id": "a-1"}'], "line 1: 'instruction' must be a string", id="no-instruction"),
        pytest.param(['["a-1", "x"]'], "line 1: a task must be a JSON object", id="not-object"),
        pytest.param(
            ['{"id": "a-1", "instruction": "x", "files": {"a.txt": 3}}'], "line 1: 'files' must map", id="files"
        ),
        pytest.param(
            ['{"id": "a-1", "instruction": "x"}', '{"id": "a-1", "instruction": "y"}'],
            "line 2: duplicate task id 'a-1'",
            id="duplicate",
        ),
        pytest.param([""], "the evolve set has no tasks", id="empty"),
    ],
)
def test_unusable_tasks_file_exits_2(tmp_path: Path, lines: list[str], message: str) -> None:
    tasks = write(tmp_path / "bad.jsonl", "\n".join(lines) + "\n")

    result = critique("--tasks", str(tasks), "--diff", "-", stdin=LEAKY_DIFF)

    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr


def test_tasks_or_experiment_is_required() -> None:
    result = critique("--diff", "-", stdin=LEAKY_DIFF)

    assert result.returncode == 2
    assert "one of the arguments --experiment --tasks is required" in result.stderr


# --- Against a real experiment ----------------------------------------------------------


def run_in_process(*args: str) -> tuple[dict[str, object], int]:
    out = StringIO()
    try:
        call_command("critique", *args, stdout=out)
    except CommandError as exc:
        return (json.loads(out.getvalue()) if out.getvalue() else {}), exc.returncode
    return json.loads(out.getvalue()), 0


@pytest.mark.django_db
def test_experiment_evolve_set_is_train_and_gate_never_sealed(tmp_path: Path) -> None:
    experiment = make_tiny_experiment(tasks=8)
    by_split: dict[str, list[str]] = {}
    for membership in SplitMembership.objects.filter(experiment=experiment).select_related("task"):
        by_split.setdefault(membership.split, []).append(membership.task.external_id)
    sealed, train = sorted(by_split["sealed"])[0], sorted(by_split["train"])[0]
    # The tiny agent answers with answers/<task id>.txt: the exact leak.
    sealed_diff = write(tmp_path / "sealed.diff", make_diff({f"answers/{sealed}.txt": (None, "yes\n")}))
    train_diff = write(tmp_path / "train.diff", make_diff({f"answers/{train}.txt": (None, "yes\n")}))

    sealed_result = run_in_process("--experiment", str(experiment.pk), "--diff", str(sealed_diff))
    train_result = run_in_process("--experiment", str(experiment.uid), "--diff", str(train_diff))

    assert sealed_result == ({"flagged": False, "flags": []}, 0)
    assert train_result == (
        {
            "flagged": True,
            "flags": [
                {
                    "rule": "task_id",
                    "path": f"answers/{train}.txt",
                    "line_number": None,
                    "line": f"answers/{train}.txt",
                    "matched": train,
                    "task_id": train,
                    "evidence": f"the id of evolve task {train}",
                }
            ],
        },
        1,
    )


@pytest.mark.django_db
def test_unknown_experiment_exits_2(tmp_path: Path) -> None:
    diff_file = write(tmp_path / "change.diff", LEAKY_DIFF)

    with pytest.raises(CommandError, match="experiment 987654321 does not exist") as raised:
        call_command("critique", "--experiment", "987654321", "--diff", str(diff_file), stdout=StringIO())

    assert raised.value.returncode == 2


def test_experiment_that_is_not_an_id_exits_2(tmp_path: Path) -> None:
    diff_file = write(tmp_path / "change.diff", LEAKY_DIFF)

    with pytest.raises(CommandError, match="experiment 'not-an-id' is not an id or uid") as raised:
        call_command("critique", "--experiment", "not-an-id", "--diff", str(diff_file), stdout=StringIO())

    assert raised.value.returncode == 2
