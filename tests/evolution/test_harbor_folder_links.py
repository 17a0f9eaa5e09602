"""A Harbor-style benchmark folder is read without following symbolic links (load_harbor_example)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from evolution.agents import cli_runner, harbor
from evolution.models import Benchmark, Evaluator, Experiment, Task

AGENTS = Path(cli_runner.__file__).parent


def copy_example(tmp_path: Path) -> Path:
    """A copy of evolution/agents/ (the example refers to ../cli_runner.py) to change freely."""
    shutil.copytree(AGENTS, tmp_path / "agents", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "agents" / "harbor_example"


def link_elsewhere(tmp_path: Path, folder: Path, relative: str) -> None:
    """Move ``folder/relative`` out of the folder and leave a symbolic link to it in its place."""
    inside = folder / relative
    outside = tmp_path / "elsewhere" / relative.replace("/", "-")
    outside.parent.mkdir(exist_ok=True)
    shutil.move(inside, outside)
    inside.symlink_to(outside, target_is_directory=outside.is_dir())


@pytest.mark.django_db
@pytest.mark.parametrize(
    "relative",
    [
        "tasks/sum-numbers/instruction.md",
        "tasks/sum-numbers/task.toml",
        "tasks/sum-numbers",
        "tasks/sum-numbers/tests",
        "tasks/sum-numbers/environment",
    ],
)
def test_load_refuses_a_symbolic_link_in_a_task_and_writes_nothing(tmp_path: Path, relative: str) -> None:
    folder = copy_example(tmp_path)
    link_elsewhere(tmp_path, folder, relative)
    with pytest.raises(CommandError) as raised:
        call_command("load_harbor_example", "--folder", str(folder), "--name", "linked", stdout=io.StringIO())
    assert str(raised.value) == f"cannot load {folder}: {folder / relative}: a symbolic link (links are not followed)"
    assert raised.value.returncode == 2
    assert not Experiment.objects.exists()
    assert not Benchmark.objects.exists()
    assert not Evaluator.objects.exists()
    assert not Task.objects.exists()


def test_read_task_refuses_a_linked_instruction_naming_it(tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    link_elsewhere(tmp_path, folder, "tasks/count-words/instruction.md")
    task = folder / "tasks" / "count-words"
    with pytest.raises(harbor.HarborFolderRefused) as raised:
        harbor.read_task(task)
    assert str(raised.value) == f"{task / 'instruction.md'}: a symbolic link (links are not followed)"


def test_read_task_still_reads_a_task_without_task_toml(tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    (folder / "tasks" / "count-words" / "task.toml").unlink()
    task = harbor.read_task(folder / "tasks" / "count-words")
    assert task.metadata == {"format": "harbor"}
    assert task.expected["timeout_seconds"] == 30.0
    assert task.instruction == (folder / "tasks" / "count-words" / "instruction.md").read_text()
