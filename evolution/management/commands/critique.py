"""Run the leakage critic on a git diff and print the flags as JSON.

    manage.py critique (--experiment ID | --tasks FILE.jsonl) --diff FILE [--parent-dir DIR]

The evolve set is the experiment's train and gate tasks (never sealed or
held-out: the critic guards what the proposer may learn from), or one task
per line of a JSONL file: ``{"id", "instruction", "expected"?, "files"?}``.
Exit codes: 0 clean, 1 flagged, 2 unusable input (missing or unreadable
file, bad JSONL, bad diff, unknown experiment).
"""

from __future__ import annotations

import json
import sys
import uuid
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from evolution import limits
from evolution.critic import CriticTask, critique
from evolution.gitdiff import DiffParseError
from evolution.models import EVOLVE_SPLITS, Experiment, SplitMembership, Task
from evolution.services.snapshots import tree_entries
from evolution.trees import MODE_SYMLINK, SnapshotError, read_directory

UNUSABLE = 2


class Command(BaseCommand):
    help = "Flag benchmark-specific content in a git diff; prints JSON, exits 0 clean, 1 flagged, 2 unusable input."

    def add_arguments(self, parser: ArgumentParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--experiment", help="experiment id (or uid) whose train and gate tasks to use")
        source.add_argument("--tasks", help="JSONL file, one evolve-set task per line")
        parser.add_argument("--diff", required=True, help="file holding `git diff` output, or - for stdin")
        parser.add_argument("--parent-dir", help="directory holding the parent harness")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["tasks"] is not None:
            tasks = _tasks_from_jsonl(options["tasks"])
        else:
            tasks = _tasks_from_experiment(options["experiment"])
        if not tasks:
            # Passing a diff against nothing would look like a clean verdict.
            raise CommandError("the evolve set has no tasks", returncode=UNUSABLE)
        diff_text = _read_diff(options["diff"])
        parent = _read_parent(options["parent_dir"]) if options["parent_dir"] else None
        try:
            flags = critique(diff_text, tasks, parent_text=parent)
        except DiffParseError as exc:
            raise CommandError(f"diff is not usable: {exc}", returncode=UNUSABLE) from exc
        self.stdout.write(json.dumps({"flagged": bool(flags), "flags": [flag.to_json() for flag in flags]}, indent=2))
        if flags:
            raise CommandError(f"{len(flags)} leakage flag(s)", returncode=1)


def _tasks_from_jsonl(name: str) -> list[CriticTask]:
    try:
        data = limits.read_bytes(Path(name), setting="RSI_MAX_TASKS_FILE_BYTES", what=f"tasks file {name}")
        lines = list(limits.jsonl_loads(data.decode("utf-8"), what=f"tasks file {name}"))
        limits.check_count(len(lines), setting="RSI_MAX_TASKS", what=f"tasks in {name}")
    except limits.InputLimitError as exc:
        raise CommandError(str(exc), returncode=UNUSABLE) from exc
    except limits.JSONLineError as exc:
        raise CommandError(f"{name} line {exc.line}: {exc.detail}", returncode=UNUSABLE) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandError(f"cannot read tasks file {name}: {exc}", returncode=UNUSABLE) from exc
    tasks: list[CriticTask] = []
    seen: set[str] = set()
    for number, value in lines:
        try:
            task = _task_from_json(value)
        except ValueError as exc:
            raise CommandError(f"{name} line {number}: {exc}", returncode=UNUSABLE) from exc
        if task.id in seen:
            raise CommandError(f"{name} line {number}: duplicate task id {task.id!r}", returncode=UNUSABLE)
        seen.add(task.id)
        tasks.append(task)
    return tasks


def _task_from_json(data: Any) -> CriticTask:
    if not isinstance(data, dict):
        raise ValueError("a task must be a JSON object")
    task_id, instruction = data.get("id"), data.get("instruction")
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError("'id' must be a non-empty string")
    if not isinstance(instruction, str):
        raise ValueError("'instruction' must be a string")
    files = data.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ValueError("'files' must map paths to texts")
    return CriticTask(id=task_id, instruction=instruction, expected=data.get("expected"), files=files)


def _tasks_from_experiment(experiment: str) -> list[CriticTask]:
    """The experiment's train and gate tasks, looked up by numeric id or uid."""
    lookup: dict[str, Any]
    if experiment.isdigit():
        lookup = {"pk": int(experiment)}
    else:
        try:
            lookup = {"uid": uuid.UUID(experiment)}
        except ValueError:
            raise CommandError(f"experiment {experiment!r} is not an id or uid", returncode=UNUSABLE) from None
    try:
        found = Experiment.objects.get(**lookup)
        memberships = (
            SplitMembership.objects.filter(experiment=found, split__in=EVOLVE_SPLITS)
            .select_related("task__public_files")
            .order_by("task__external_id")
        )
        return [_critic_task(membership.task) for membership in memberships]
    except Experiment.DoesNotExist:
        raise CommandError(f"experiment {experiment} does not exist", returncode=UNUSABLE) from None
    except DatabaseError as exc:
        raise CommandError(f"cannot load experiment {experiment}: {exc}", returncode=UNUSABLE) from exc


def _critic_task(task: Task) -> CriticTask:
    files: dict[str, str] = {}
    if task.public_files is not None:
        for entry in tree_entries(tree=task.public_files):
            if entry.mode == MODE_SYMLINK:
                continue
            try:
                files[entry.path] = entry.data.decode("utf-8")
            except UnicodeDecodeError:
                continue  # binary files carry no text to match
    return CriticTask(id=task.external_id, instruction=task.instruction, expected=task.expected, files=files)


def _read_diff(name: str) -> str:
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
    except OSError as exc:
        raise CommandError(f"cannot read diff {name}: {exc}", returncode=UNUSABLE) from exc
    # git writes paths as raw bytes; keep invalid UTF-8 instead of failing.
    return data.decode("utf-8", errors="surrogateescape")


def _read_parent(name: str) -> dict[str, str]:
    try:
        entries = read_directory(
            Path(name), max_file_bytes=settings.RSI_MAX_FILE_BYTES, max_files=settings.RSI_MAX_TREE_FILES
        )
    except SnapshotError as exc:
        raise CommandError(f"cannot read parent directory: {exc}", returncode=UNUSABLE) from exc
    parent: dict[str, str] = {}
    for entry in entries:
        if entry.mode == MODE_SYMLINK:
            continue
        try:
            parent[entry.path] = entry.data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return parent
