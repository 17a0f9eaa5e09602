"""Read a Harbor-style benchmark folder into task inputs and evaluator files (no ORM).

Layout (one folder per task, as Harbor lays tasks out)::

    tasks/<id>/instruction.md            what the agent is told
    tasks/<id>/task.toml                 optional: [metadata], [verifier] timeout_sec, [agent] timeout_sec
    tasks/<id>/environment/workspace/**  optional: files the agent's workspace starts with
    tasks/<id>/tests/test.sh             grades the workspace, writes /logs/verifier/reward.txt
    tasks/<id>/tests/**                  anything else the tests need
    tasks/<id>/environment/Dockerfile    optional: the task's environment, built here from
                                         Debian packages (evolution/environments.py); files
                                         it copies into /app start the agent's workspace

The public part (instruction, ``workspace/`` files) reaches the agent; the
tests are private: they travel in the task's ``expected`` data, which the
trial runner writes for the verifier only after the agent has exited.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path
from typing import Any

from evolution import environments
from evolution.services.experiments import TaskInput
from evolution.trees import FileEntry, SnapshotError, open_inside

TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
MAX_TASK_FILES = 200


class HarborFolderError(ValueError):
    """The folder does not follow the layout; the message names the file."""


class HarborTaskRefused(HarborFolderError):
    """A task whose environment cannot be rebuilt from Debian here
    (evolution/environments.py); the message names the task and the reason."""


class HarborFolderRefused(HarborFolderError):
    """A symbolic link (or a file that is not a regular one) where the
    reader reads: refused, so nothing outside the folder is read."""


def _not_followed(path: Path) -> HarborFolderRefused:
    return HarborFolderRefused(f"{path}: a symbolic link (links are not followed)")


def _text(folder: Path, name: str) -> str | None:
    """The UTF-8 text of the file ``name`` in the task folder, None when it
    is missing; a link is refused, not followed (``open_inside``)."""
    try:
        with open_inside(folder, name) as stream:
            data = stream.read()
    except FileNotFoundError:
        return None
    except SnapshotError as exc:
        raise HarborFolderRefused(f"{folder}/{exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise HarborFolderError(f"{folder / name}: must be UTF-8 text") from None


def _files(folder: Path, relative: str) -> dict[str, bytes]:
    """The files under ``folder/relative``; a link there, or on the way there, is refused."""
    root = folder
    for part in relative.split("/"):
        root = root / part
        if root.is_symlink():
            raise _not_followed(root)
    if not root.is_dir():
        return {}
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise _not_followed(path)
        if path.is_file():
            found[path.relative_to(root).as_posix()] = path.read_bytes()
    if len(found) > MAX_TASK_FILES:
        raise HarborFolderError(f"{root}: more than {MAX_TASK_FILES} files")
    return found


def read_task(folder: Path) -> TaskInput:
    """One task folder; HarborFolderError naming the file at fault,
    HarborFolderRefused for a symbolic link (the folder, a file read, or a
    folder on the way to one), which is never followed."""
    task_id = folder.name
    if not TASK_ID.fullmatch(task_id):
        raise HarborFolderError(f"{folder}: task folder names use letters, digits, '.', '_' and '-'")
    if folder.is_symlink():
        raise _not_followed(folder)
    instruction = _text(folder, "instruction.md")
    if instruction is None:
        raise HarborFolderError(f"{folder / 'instruction.md'}: missing")
    config: dict[str, Any] = {}
    config_text = _text(folder, "task.toml")
    if config_text is not None:
        try:
            config = tomllib.loads(config_text)
        except tomllib.TOMLDecodeError as exc:
            raise HarborFolderError(f"{folder / 'task.toml'}: {exc}") from exc
    tests: dict[str, str] = {}
    for name, data in _files(folder, "tests").items():
        try:
            tests[name] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HarborFolderError(f"{folder / 'tests' / name}: test files must be UTF-8 text") from exc
    if "test.sh" not in tests:
        raise HarborFolderError(f"{folder / 'tests' / 'test.sh'}: missing")
    workspace = _files(folder, "environment/workspace")
    recipe = None
    dockerfile = _text(folder, "environment/Dockerfile")
    if dockerfile is not None:
        # A link in the build context is refused before the recipe reads it.
        _files(folder, "environment")
        try:
            recipe = environments.plan(dockerfile, context=folder / "environment")
            environments.check_test_scripts(tests)
            network = task_network(config)
        except environments.EnvironmentRefused as exc:
            raise HarborTaskRefused(f"{task_id}: {exc}") from None
        workspace = {**recipe.workspace, **workspace}
    verifier = config.get("verifier") or {}
    agent = config.get("agent") or {}
    expected: dict[str, Any] = {
        "tests": tests,
        "workspace_files": {name: hashlib.sha256(data).hexdigest() for name, data in workspace.items()},
        "timeout_seconds": float(verifier.get("timeout_sec", 30.0)),
    }
    metadata = {**(config.get("metadata") or {}), "format": "harbor"}
    if recipe is not None:
        # Private like the tests (it binds the task's digest); the screens show the summary in metadata.
        expected["environment"] = recipe.document()
        expected["network"] = network
        metadata["environment"] = {
            "digest": recipe.digest,
            "built_from": f"Debian {recipe.suite} ({environments.VARIANT}), {len(recipe.steps)} step(s) replayed",
            "notes": recipe.notes,
            "network": network,
        }
    if "timeout_sec" in agent:
        # Advice for the agent's own configuration; the evaluator's timeout is what is enforced.
        metadata["agent_timeout_sec"] = agent["timeout_sec"]
    return TaskInput(
        external_id=task_id,
        instruction=instruction,
        expected=expected,
        criteria=[{"id": "reward", "description": "tests/test.sh gives reward 1"}],
        files={f"workspace/{name}": data for name, data in workspace.items()},
        metadata=metadata,
    )


def task_network(config: dict[str, Any]) -> dict[str, bool]:
    """Whether the agent and the verifier may use the network, as Harbor
    reads ``task.toml`` (harbor/models/task/config.py): the baseline is
    ``[environment] network_mode`` when given, else ``allow_internet``,
    which defaults to true; ``[agent]`` and ``[verifier]`` may each set
    their own ``network_mode``. ``public`` is the host's network,
    ``no-network`` none; an ``allowlist`` of hosts cannot be enforced by
    our sandbox, so it is refused rather than widened or narrowed."""
    environment = config.get("environment") or {}
    allow = environment.get("allow_internet", True)
    if not isinstance(allow, bool):
        raise environments.EnvironmentRefused(f"task.toml: allow_internet must be true or false, not {allow!r}")
    baseline = environment.get("network_mode") or environment.get("allowed_hosts") and "allowlist"
    baseline = baseline or ("public" if allow else "no-network")
    found = {}
    for phase in ("agent", "verifier"):
        section = config.get(phase) or {}
        mode = section.get("network_mode") or (section.get("allowed_hosts") and "allowlist") or baseline
        if mode not in ("public", "no-network"):
            raise environments.EnvironmentRefused(
                f"task.toml: {phase} network_mode {mode!r} cannot be enforced here (only public or no-network)"
            )
        found[phase] = mode == "public"
    return found


def read_tasks(root: Path) -> list[TaskInput]:
    """Every task folder under ``root`` (sorted by id); a link to a folder
    is refused (HarborFolderRefused), not followed."""
    if not root.is_dir():
        raise HarborFolderError(f"{root}: no tasks folder")
    tasks = [read_task(folder) for folder in sorted(root.iterdir()) if folder.is_dir()]
    if not tasks:
        raise HarborFolderError(f"{root}: no task folders")
    return tasks


def evaluator_entries(base: Path, names: list[str]) -> list[FileEntry]:
    """The evaluator's files, each stored under its own file name."""
    entries = []
    for name in names:
        path = (base / name).resolve()
        if not path.is_file():
            raise HarborFolderError(f"evaluator file {path} is missing")
        entries.append(FileEntry(path=path.name, mode="100644", data=path.read_bytes()))
    return entries
