"""``manage.py surface_check`` run for real as a subprocess: exit codes and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Aliased so pytest does not collect the helper as a test of this module.
from tests.conftest import database_url_for_subprocess as subprocess_database_url
from tests.evolution.test_surfaces import ISSUE_SURFACE, git_diff
from tests.factories import make_tiny_experiment

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

PROMPT_EDIT = (
    "diff --git a/prompts/a.md b/prompts/a.md\nindex 1111111..2222222 100644\n"
    "--- a/prompts/a.md\n+++ b/prompts/a.md\n@@ -1 +1 @@\n-a\n+b\n"
)
EVALUATOR_EDIT = PROMPT_EDIT.replace("prompts/a.md", "evaluator/verify.py")
REASON_RESERVED = "reserved path (evaluator files, task data and records are outside every surface)"


def surface_check(*args: str, stdin: str = "", database_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "manage.py", "surface_check", *args],
        cwd=REPO_ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def surface_file(tmp_path: Path) -> Path:
    path = tmp_path / "surface.yaml"
    path.write_text(ISSUE_SURFACE)
    return path


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_allowed_diff_exits_0_and_prints_the_verdict(tmp_path: Path, surface_file: Path) -> None:
    diff = git_diff(
        tmp_path,
        {"prompts/a.md": b"a\n", "tools/run.sh": b"echo\n"},
        {"prompts/a.md": b"b\n"},
        change=lambda repo: (repo / "tools/run.sh").chmod(0o755),
    )
    diff_file = write(tmp_path, "change.diff", diff)

    result = surface_check("--surface", str(surface_file), "--diff", str(diff_file))

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"allowed": True, "violations": [], "components": ["client_tool", "prompt"]}
    assert result.stderr == ""


def test_violating_diff_exits_1_and_lists_the_violations(tmp_path: Path, surface_file: Path) -> None:
    diff = git_diff(
        tmp_path,
        {"prompts/a.md": b"a\n", "config.toml": b'model = "a"\n'},
        {"prompts/link": ("symlink", "../../etc/passwd"), "config.toml": b'model = "b"\n', "notes.md": b"x\n"},
        # Full blob ids let the checker prove the hunk is the whole file.
        flags=("--full-index",),
    )
    diff_file = write(tmp_path, "change.diff", diff)

    result = surface_check("--surface", str(surface_file), "--diff", str(diff_file))

    assert result.returncode == 1
    assert json.loads(result.stdout) == {
        "allowed": False,
        "violations": [
            {"path": "config.toml", "reason": "protected key 'model' changed"},
            {"path": "notes.md", "reason": "outside surface (matches no include pattern)"},
            {"path": "prompts/link", "reason": "symlink not allowed (the surface does not set allow_symlinks)"},
        ],
        "components": ["config", "prompt"],
    }
    assert "3 surface violation(s)" in result.stderr


def test_diff_is_read_from_stdin_with_dash(surface_file: Path) -> None:
    result = surface_check("--surface", str(surface_file), "--diff", "-", stdin=EVALUATOR_EDIT)

    assert result.returncode == 1
    assert json.loads(result.stdout) == {
        "allowed": False,
        "violations": [{"path": "evaluator/verify.py", "reason": REASON_RESERVED}],
        "components": [],
    }


def test_empty_diff_exits_0_with_no_components(surface_file: Path) -> None:
    result = surface_check("--surface", str(surface_file), "--diff", "-", stdin="")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"allowed": True, "violations": [], "components": []}


def test_extra_reserved_prefix_is_a_violation(surface_file: Path) -> None:
    result = surface_check("--surface", str(surface_file), "--diff", "-", "--reserved", "prompts/", stdin=PROMPT_EDIT)

    assert result.returncode == 1
    assert json.loads(result.stdout)["violations"] == [{"path": "prompts/a.md", "reason": REASON_RESERVED}]


def test_garbage_diff_exits_2_without_a_verdict(surface_file: Path) -> None:
    result = surface_check("--surface", str(surface_file), "--diff", "-", stdin="this is not a diff\n")

    assert result.returncode == 2
    assert result.stdout == ""
    assert "diff is not usable: line 1: expected a 'diff --git' header" in result.stderr


def test_missing_diff_file_exits_2(tmp_path: Path, surface_file: Path) -> None:
    result = surface_check("--surface", str(surface_file), "--diff", str(tmp_path / "nope.diff"))

    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read diff" in result.stderr


def test_missing_surface_file_exits_2(tmp_path: Path) -> None:
    result = surface_check("--surface", str(tmp_path / "nope.yaml"), "--diff", "-", stdin=PROMPT_EDIT)

    assert result.returncode == 2
    assert result.stdout == ""
    assert "cannot read surface file" in result.stderr


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param("include: [", "surface is not valid YAML", id="bad-yaml"),
        pytest.param("include: []\nextra: 1\n", "unknown key 'extra' in surface", id="unknown-key"),
        pytest.param("include: ['a/**']\ncomponents: {'a/**': tool}\n", "unknown component kind 'tool'", id="kind"),
    ],
)
def test_unusable_surface_exits_2(tmp_path: Path, document: str, message: str) -> None:
    result = surface_check("--surface", str(write(tmp_path, "s.yaml", document)), "--diff", "-", stdin=PROMPT_EDIT)

    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr


def test_surface_or_experiment_is_required() -> None:
    result = surface_check("--diff", "-", stdin=PROMPT_EDIT)

    assert result.returncode == 2
    assert "one of the arguments --experiment --surface is required" in result.stderr


@pytest.mark.django_db(transaction=True)
def test_experiment_surface_is_loaded_from_the_database() -> None:
    # The tiny surface: default.txt is a prompt, answers/** and notes/** memory.
    experiment = make_tiny_experiment(tasks=2)
    allowed = PROMPT_EDIT.replace("prompts/a.md", "default.txt")

    ok = surface_check(
        "--experiment", str(experiment.pk), "--diff", "-", stdin=allowed, database_url=subprocess_database_url()
    )
    by_uid = surface_check(
        "--experiment", str(experiment.uid), "--diff", "-", stdin=EVALUATOR_EDIT, database_url=subprocess_database_url()
    )

    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"allowed": True, "violations": [], "components": ["prompt"]}
    assert by_uid.returncode == 1
    assert json.loads(by_uid.stdout)["violations"] == [{"path": "evaluator/verify.py", "reason": REASON_RESERVED}]


@pytest.mark.django_db(transaction=True)
def test_missing_experiment_exits_2() -> None:
    result = surface_check(
        "--experiment", "987654321", "--diff", "-", stdin=PROMPT_EDIT, database_url=subprocess_database_url()
    )

    assert result.returncode == 2
    assert result.stdout == ""
    assert "experiment 987654321 does not exist" in result.stderr


def test_experiment_that_is_not_an_id_exits_2() -> None:
    result = surface_check("--experiment", "not-an-id", "--diff", "-", stdin=PROMPT_EDIT)

    assert result.returncode == 2
    assert "experiment 'not-an-id' is not an id or uid" in result.stderr


def test_a_diff_adding_hidden_characters_exits_1_under_refuse_hidden_characters(tmp_path: Path) -> None:
    strict = write(tmp_path, "strict.yaml", ISSUE_SURFACE + "refuse_hidden_characters: true\n")
    lenient = write(tmp_path, "lenient.yaml", ISSUE_SURFACE)
    diff = git_diff(tmp_path, {"prompts/a.md": b"a\n"}, {"prompts/a.md": "a\n# x \u202e y\n".encode()})
    diff_file = tmp_path / "change.diff"
    diff_file.write_text(diff, encoding="utf-8")

    result = surface_check("--surface", str(strict), "--diff", str(diff_file))

    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["violations"] == [
        {
            "path": "prompts/a.md",
            "reason": "adds hidden characters: U+202E RIGHT-TO-LEFT OVERRIDE (bidi) on line 2, column 5 "
            "(the surface sets refuse_hidden_characters)",
        }
    ]
    assert surface_check("--surface", str(lenient), "--diff", str(diff_file)).returncode == 0


@pytest.mark.django_db(transaction=True)
def test_experiment_split_that_holds_every_task_of_a_kind_is_warned_about() -> None:
    from evolution.example.setup import example_experiment_create
    from evolution.services.experiments import splits_assign

    # The example stratifies its split by task kind: every kind has tasks in train, gate and sealed.
    experiment = example_experiment_create(name="concentrated")
    allowed = PROMPT_EDIT.replace("prompts/a.md", "prompts/system.md")

    def check() -> subprocess.CompletedProcess[str]:
        return surface_check(
            "--experiment", str(experiment.pk), "--diff", "-", stdin=allowed, database_url=subprocess_database_url()
        )

    stratified = check()
    assert stratified.returncode == 0, stratified.stderr
    assert stratified.stderr.splitlines() == []
    # Cut unstratified, the same seed and ratios put all 3 tasks that need the ticket (kind from_ticket) in
    # sealed: no gate could see an edit that helps them.
    splits_assign(experiment=experiment, stratify_by="")
    result = check()
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["warning: sealed holds all 3 tasks of kind from_ticket"]
