"""Hostile documents on the command line (issue 16, items 2 and 3), each run
for real as ``manage.py`` in a subprocess whose address space is capped at
1 GiB and whose time is capped at 120 s: refused with exit status 2 and one
line on stderr, no traceback, nothing written.

On the old code: the 100,000-deep documents printed a RecursionError
traceback (surface_check then exited 1, "not allowed"); the billion-laughs
recipe never finished (its aliases were expanded when the recipe was frozen);
the 45 MB surface ran for minutes; the 4 MB gzip bomb was decompressed whole
(MemoryError); the workspace with 200,000 tasks stored tasks for minutes
before a later limit refused it.
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evolution.models import Benchmark, Evaluation, Experiment, Recipe, Run, Task, Trajectory, TrajectoryStep
from tests.conftest import REPO_ROOT, database_url_for_subprocess
from tests.evolution.test_workspaces import commit_generation, git
from tests.factories import evaluate_seed_inline, make_tiny_experiment
from tests.hostile import DEEP, billion_laughs, long_laughs

CAP = 1024 * 1024 * 1024
DEPTH = "nested more than 100 levels deep (RSI_MAX_INPUT_DEPTH)"


def manage(
    *args: str, database: bool = False, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {})}
    if database:
        env["DATABASE_URL"] = database_url_for_subprocess()

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=cap,
    )


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    """Exit 2, and the one line Django prints for a CommandError."""
    assert (result.returncode, result.stderr) == (2, f"CommandError: {message}\n")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- surface_check --surface (no database) ---------------------------------------------


def test_surface_check_refuses_a_100000_deep_surface_as_unusable(tmp_path: Path) -> None:
    surface = write(tmp_path / "deep.yaml", f"include: {DEEP}\n")
    diff = write(tmp_path / "empty.diff", "")
    result = manage("surface_check", "--surface", str(surface), "--diff", str(diff))
    assert_refused(result, f"surface of {surface} is not valid: YAML is {DEPTH}")
    assert result.stdout == ""


def test_surface_check_refuses_a_45_mb_surface_before_reading_it_whole(tmp_path: Path) -> None:
    surface = tmp_path / "huge.yaml"
    with surface.open("w") as out:
        out.write("include:\n")
        line = "  - " + "p" * 40 + "/**\n"
        out.write(line * (45_000_000 // len(line)))
    assert surface.stat().st_size > 44_000_000
    diff = write(tmp_path / "empty.diff", "")
    result = manage("surface_check", "--surface", str(surface), "--diff", str(diff))
    assert_refused(
        result,
        f"surface file {surface} is refused: surface is larger than the limit of 256 KiB (RSI_MAX_SURFACE_BYTES)",
    )


def test_surface_check_refuses_a_pattern_past_its_length_limit(tmp_path: Path) -> None:
    surface = write(tmp_path / "long.yaml", f"include: [{'a' * 5000}/**]\n")
    diff = write(tmp_path / "empty.diff", "")
    result = manage("surface_check", "--surface", str(surface), "--diff", str(diff))
    assert_refused(
        result,
        f"surface of {surface} is not valid: include[0]: pattern of 5003 characters, over 4096 (RSI_MAX_PATTERN_CHARS)",
    )


# --- bundles (the file is refused before the database is touched) ----------------------


def gzip_bomb(path: Path) -> Path:
    """4 MB of gzip that decompress to 4 GiB of zeros (64 members of 64 MiB)."""
    member = gzip.compress(bytes(64 * 1024 * 1024), compresslevel=9, mtime=0)
    path.write_bytes(member * 64)
    return path


@pytest.mark.django_db(transaction=True)
def test_a_gzip_bomb_bundle_is_refused_within_the_memory_cap(tmp_path: Path) -> None:
    bomb = gzip_bomb(tmp_path / "bomb.json.gz")
    assert 4_000_000 < bomb.stat().st_size < 4_300_000
    refusal = f"{bomb}: refused: the bundle decompresses to more than 256 MiB (RSI_MAX_BUNDLE_BYTES)"
    assert_refused(manage("verify_records", "--bundle", str(bomb)), refusal)
    assert_refused(manage("import_bundle", str(bomb), database=True), refusal)
    assert Experiment.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_100000_deep_bundle_is_refused(tmp_path: Path) -> None:
    deep = write(tmp_path / "deep.json", DEEP)
    with gzip.open(tmp_path / "deep.json.gz", "wt") as out:
        out.write(DEEP)
    for path in (deep, tmp_path / "deep.json.gz"):
        refusal = f"{path}: refused: the bundle is {DEPTH}"
        assert_refused(manage("verify_records", "--bundle", str(path)), refusal)
        assert_refused(manage("import_bundle", str(path), database=True), refusal)
    assert Experiment.objects.count() == 0


# --- commands that need rows -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_run_experiment_refuses_a_billion_laughs_recipe_and_a_deep_one_and_stores_nothing(tmp_path: Path) -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    params = "\n".join("    " + line for line in billion_laughs().splitlines())
    laughs = write(
        tmp_path / "laughs.yaml",
        f"name: laughs\nbase: rrsi\nparent_selection:\n  operator: latest_accepted\n  params:\n{params}\n",
    )
    assert laughs.stat().st_size < 600
    deep = write(tmp_path / "deep.json", '{"base": "rrsi", "x": ' + DEEP + "}")
    recipes = Recipe.objects.count()
    result = manage("run_experiment", str(experiment.pk), "--recipe", str(laughs), database=True)
    assert_refused(result, "YAML expands to more than 10000 nodes with its aliases (RSI_MAX_YAML_NODES)")
    result = manage("run_experiment", str(experiment.pk), "--recipe", str(deep), database=True)
    assert_refused(result, f"recipe is {DEPTH}")
    assert (Run.objects.count(), Recipe.objects.count()) == (0, recipes)


@pytest.mark.django_db(transaction=True)
def test_run_experiment_refuses_a_5000_digit_integer_and_aliases_of_long_strings_and_stores_nothing(
    tmp_path: Path,
) -> None:
    """Issue 37: int() of 5,000 digits raised a bare ValueError (a traceback);
    a recipe under the node limit expanded to megabytes of strings."""
    experiment = make_tiny_experiment(tasks=2, k=1)
    head = "name: big\nbase: rrsi\nparent_selection:\n  operator: latest_accepted\n  params:\n"
    digits = write(tmp_path / "digits.yaml", head + "    n: " + "9" * 5000 + "\n")
    params = "\n".join("    " + line for line in long_laughs(length=2_000, first=10, second=100).splitlines())
    long = write(tmp_path / "long.yaml", head + params + "\n")
    recipes = Recipe.objects.count()
    result = manage("run_experiment", str(experiment.pk), "--recipe", str(digits), database=True)
    assert_refused(result, "YAML holds an integer of more than 4300 digits (Python's int_max_str_digits)")
    result = manage("run_experiment", str(experiment.pk), "--recipe", str(long), database=True)
    assert_refused(result, "YAML expands to more than 256 KiB of text with its aliases (RSI_MAX_RECIPE_BYTES)")
    assert (Run.objects.count(), Recipe.objects.count()) == (0, recipes)


@pytest.mark.django_db(transaction=True)
def test_import_trajectory_refuses_a_5000_digit_integer_and_keeps_the_trajectory(tmp_path: Path) -> None:
    experiment = make_tiny_experiment(tasks=1, k=1, split_lists={"train": ["t00"]})
    trial = evaluate_seed_inline(experiment, splits=("train",)).trials.get()
    before = list(Trajectory.objects.values_list("pk", "trial_id", "step_count"))
    big = write(tmp_path / "big.json", '[{"role": "user", "content": "hi", "n": ' + "7" * 5000 + "}]")
    result = manage("import_trajectory", "--trial", str(trial.pk), str(big), database=True)
    assert_refused(
        result, f"{big} holds an integer of more than 4300 digits (Python's int_max_str_digits); nothing was imported"
    )
    assert list(Trajectory.objects.values_list("pk", "trial_id", "step_count")) == before


@pytest.mark.django_db(transaction=True)
def test_import_trajectory_refuses_a_100000_deep_file_and_keeps_the_trajectory(tmp_path: Path) -> None:
    experiment = make_tiny_experiment(tasks=1, k=1, split_lists={"train": ["t00"]})
    evaluation: Evaluation = evaluate_seed_inline(experiment, splits=("train",))
    trial = evaluation.trials.get()

    def state() -> list[Any]:
        return [
            list(Trajectory.objects.values_list("pk", "trial_id", "step_count")),
            list(TrajectoryStep.objects.values_list("pk", "message")),
        ]

    before = state()
    deep = write(tmp_path / "deep.json", '{"schema_version": "ATIF-v1.4", "steps": ' + DEEP + "}")
    result = manage("import_trajectory", "--trial", str(trial.pk), str(deep), database=True)
    assert_refused(result, f"{deep} is {DEPTH}; nothing was imported")
    assert state() == before


def workspace_with_tasks(tmp_path: Path, tasks: int) -> Path:
    repo = tmp_path / "ws-hostile"
    repo.mkdir()
    git(repo, "init", "-q")
    commit_generation(repo, "0", {"prompt.md": "seed\n"})
    vector = {"schema_version": 1, "tasks": {f"task-{n:06d}": {"trials": [{"status": "passed"}]} for n in range(tasks)}}
    event = {"genid": "0", "parent": None, "verdict": "keep", "task_vector": vector}
    (repo / "archive.jsonl").write_text(json.dumps(event) + "\n")
    return repo


@pytest.mark.django_db(transaction=True)
def test_import_workspace_refuses_200000_tasks_up_front_and_writes_nothing(tmp_path: Path) -> None:
    repo = workspace_with_tasks(tmp_path, 200_000)
    result = manage("import_workspace", str(repo), database=True)
    assert_refused(
        result,
        "archive.jsonl line 1 (generation 0): 200000 trial results, over the limit of 10000; nothing was imported",
    )
    assert (Experiment.objects.count(), Benchmark.objects.count(), Task.objects.count()) == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_import_workspace_refuses_a_deep_archive_line_and_more_tasks_than_the_setting(tmp_path: Path) -> None:
    repo = workspace_with_tasks(tmp_path, 3)
    good = (repo / "archive.jsonl").read_text()
    (repo / "archive.jsonl").write_text(good + DEEP + "\n")
    result = manage("import_workspace", str(repo), database=True)
    assert_refused(result, f"archive.jsonl line 2: the line is {DEPTH}; nothing was imported")
    (repo / "archive.jsonl").write_text(good)
    result = manage("import_workspace", str(repo), database=True, env={"RSI_MAX_TASKS": "2"})
    assert_refused(
        result,
        "archive.jsonl line 1 (generation 0): 3 tasks in the workspace, over the limit of 2 (RSI_MAX_TASKS); "
        "nothing was imported",
    )
    assert (Experiment.objects.count(), Benchmark.objects.count(), Task.objects.count()) == (0, 0, 0)
    # Within the limits the same workspace imports: the limit was the only difference.
    result = manage("import_workspace", str(repo), database=True)
    assert (result.returncode, Task.objects.count()) == (0, 3), result.stderr
