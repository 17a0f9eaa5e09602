"""Import a trajectory file into a trial, replacing the trial's trajectory.

The file is JSON or JSONL: ATIF (streaming JSONL too), mini-swe-agent,
SWE-agent, OpenHands (an event list, or an evaluation ``output.jsonl``),
tau2-bench results, a Claude Code or Codex CLI session, OpenAI Responses
API items or NeMo Gym rollouts, OpenAI chat messages or a tau-bench run. An ATIF
trajectory continued in other files (``continued_trajectory_ref``) is
joined from the files beside it, and the subagent trajectories its steps name are linked when they are
there too. A file holding several trajectories (a list of them, an
OpenHands ``output.jsonl``, tau2-bench results, NeMo Gym rollouts) is imported with
``--trials``, one trial per trajectory in order, all or nothing.

Exit codes: 0 imported, 1 invalid document (each error names the field, or
the line and column of a JSON syntax error; a list of trajectories without
``--trials``), 2 unusable input (unknown trial, unreadable file, trials not
matching the list, a file over ``RSI_MAX_TRAJECTORY_BYTES``, nested deeper
than ``RSI_MAX_INPUT_DEPTH`` or, as JSONL, longer than
``RSI_MAX_JSONL_LINES``).
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from evolution import inspect_logs, limits
from evolution.models import Trajectory, Trial
from evolution.services.trajectories import (
    TrajectoryBatchError,
    TrajectoryFormatError,
    TrajectoryListError,
    trajectories_import,
    trajectory_import,
)
from evolution.trajectory_formats import FORMATS, loads_text, trajectory_items

INVALID = 1
UNUSABLE = 2
LENIENT_HINT = "--lenient imports it, keeping each off-spec step's text and listing the deviations"


def _read(path: Path) -> Any:
    """The JSON value of the file at ``path`` (JSON or JSONL; an Inspect AI
    ``.eval`` zip as its log), read within the input limits: OSError,
    UnicodeDecodeError, JSONDecodeError, InspectLogError or InputLimitError."""
    data = limits.read_bytes(path, setting="RSI_MAX_TRAJECTORY_BYTES", what=str(path))
    if inspect_logs.is_zip(data):
        return inspect_logs.inspect_log_load(data, what=str(path))
    text = data.decode("utf-8")
    return loads_text(
        text,
        loads=lambda part: limits.json_loads(part, what=str(path)),
        count_lines=lambda count: limits.check_count(count, setting="RSI_MAX_JSONL_LINES", what=f"lines in {path}"),
    )


class FolderFiles(dict[str, Any]):
    """The files of one folder by name, read (as JSON) when first asked for;
    only plain names in the folder, so a reference cannot reach elsewhere."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def _path(self, name: object) -> Path | None:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            return None
        path = self.folder / name
        return path if path.is_file() else None

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or self._path(name) is not None

    def __missing__(self, name: str) -> Any:
        path = self._path(name)
        if path is None:
            raise KeyError(name)
        try:
            value = _read(path)
        except (OSError, UnicodeDecodeError, inspect_logs.InspectLogError) as exc:
            raise TrajectoryFormatError([f"{name}: cannot be read: {exc}"]) from None
        except json.JSONDecodeError as exc:
            raise TrajectoryFormatError(
                [f"{name}: line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}"]
            ) from None
        self[name] = value
        return value


class Command(BaseCommand):
    help = (
        "Import a trajectory file (ATIF v1.0-v1.7 JSON or JSONL, mini-swe-agent 1.x/2.x, SWE-agent 0.x/1.x, "
        "OpenHands events or output.jsonl, tau2-bench results, Claude Code or Codex sessions, OpenAI Responses "
        "items or NeMo Gym rollouts, OpenAI messages, a tau-bench run, an Inspect AI .eval or .json log) into a "
        "trial, replacing its trajectory; a file of several trajectories into --trials."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--trial", type=int, help="id of the trial")
        target.add_argument(
            "--trials", help="for a file holding a list of trajectories: the trials' ids, comma-separated, in order"
        )
        parser.add_argument("--format", default="auto", choices=("auto", *FORMATS), help="input format (default auto)")
        parser.add_argument(
            "--lenient",
            action="store_true",
            help="keep the text of off-spec steps and record each deviation on the trajectory (default: refuse)",
        )
        parser.add_argument("file", help="the trajectory file (JSON or JSONL)")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["file"])
        trials = self._trials(options)
        try:
            document = _read(path)
        except limits.InputLimitError as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=UNUSABLE) from exc
        except inspect_logs.InspectLogError as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=INVALID) from exc
        except UnicodeDecodeError as exc:
            raise CommandError(
                f"{path}: a binary file, not JSON or JSONL text (byte {exc.start} is not UTF-8); nothing was imported",
                returncode=UNUSABLE,
            ) from exc
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc}", returncode=UNUSABLE) from exc
        except json.JSONDecodeError as exc:
            raise CommandError(
                f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}", returncode=INVALID
            ) from exc
        if options["trials"] is not None:
            self._import_list(path, document, trials, options)
            return
        try:
            trajectory = trajectory_import(
                trial=trials[0],
                document=document,
                fmt=options["format"],
                lenient=options["lenient"],
                files=FolderFiles(path.parent),
            )
        except TrajectoryListError as exc:
            if inspect_logs.is_inspect_log(document):
                with path.open("rb") as stream:
                    kind = ".eval" if inspect_logs.is_zip(stream.read(4)) else ".json"
                what = inspect_logs.describe(document, kind=kind)
                raise CommandError(
                    f"{path}: this is {what}, not one trajectory; import its samples with --trials ID,ID,... "
                    f"({exc.count} trials, in order), or the whole log as a job with manage.py import_job; "
                    "nothing was imported",
                    returncode=INVALID,
                ) from exc
            what = f"a list of {exc.count} {exc.kind}"
            raise CommandError(
                f"{path}: this is {what}, not one trajectory; import them with "
                f"--trials ID,ID,... ({exc.count} trials, in order) or POST /api/v1/trajectories/; "
                "nothing was imported",
                returncode=INVALID,
            ) from exc
        except TrajectoryFormatError as exc:
            self._fail(path, exc.errors, lenient_imports=exc.lenient_imports and not options["lenient"])
        except limits.InputLimitError as exc:  # a continuation or subagent file beside it
            raise CommandError(f"{exc}; nothing was imported", returncode=UNUSABLE) from exc
        self._report([trajectory])

    def _trials(self, options: dict[str, Any]) -> list[Trial]:
        if options["trials"] is None:
            trial = Trial.objects.filter(pk=options["trial"]).first()
            if trial is None:
                raise CommandError(f"no trial with id {options['trial']}", returncode=UNUSABLE)
            return [trial]
        try:
            ids = [int(part) for part in options["trials"].split(",")]
        except ValueError:
            raise CommandError(f"--trials: not a list of ids: {options['trials']!r}", returncode=UNUSABLE) from None
        found = Trial.objects.in_bulk(ids)
        missing = [str(pk) for pk in ids if pk not in found]
        if missing:
            raise CommandError(f"no trial with id {', '.join(missing)}", returncode=UNUSABLE)
        if len(set(ids)) != len(ids):
            raise CommandError("--trials: a trial is named twice", returncode=UNUSABLE)
        return [found[pk] for pk in ids]

    def _import_list(self, path: Path, document: Any, trials: list[Trial], options: dict[str, Any]) -> None:
        items = trajectory_items(document)
        if items is None:
            raise CommandError(f"{path}: --trials needs a list of trajectories; this is one", returncode=UNUSABLE)
        if len(items) != len(trials):
            raise CommandError(
                f"{path}: this is a list of {len(items)} trajectories and {len(trials)} trials were given; "
                "nothing was imported",
                returncode=UNUSABLE,
            )
        try:
            imported = trajectories_import(
                [(trial, item, options["format"]) for trial, item in zip(trials, items, strict=True)],
                lenient=options["lenient"],
            )
        except TrajectoryBatchError as exc:
            self._fail(path, [f"[{index}] {error}" for index, errors in sorted(exc.errors.items()) for error in errors])
        self._report(imported)

    def _fail(self, path: Path, errors: list[str], *, lenient_imports: bool = False) -> None:
        for error in errors:
            self.stderr.write(f"{path}: {error}")
        hint = f"; {LENIENT_HINT}" if lenient_imports else ""
        raise CommandError(f"{len(errors)} error(s); nothing was imported{hint}", returncode=INVALID)

    def _report(self, trajectories: list[Trajectory]) -> None:
        for trajectory in trajectories:
            extra = trajectory.extra
            redactions = extra.get("redactions", {})
            summary = ", ".join(f"{kind}: {count}" for kind, count in redactions.items()) or "none"
            notes = ""
            if extra.get("continuation_files"):
                notes += f"; continued in {', '.join(extra['continuation_files'])}"
            if extra.get("subagent_trajectories"):
                notes += f"; {len(extra['subagent_trajectories'])} subagent trajectories linked"
            if extra.get("deviations"):
                notes += f"; lenient: {len(extra['deviations'])} deviation(s) recorded"
            self.stdout.write(
                f"imported {trajectory.step_count} steps ({extra.get('imported_format')}) into trial "
                f"{trajectory.trial_id}; redacted: {summary}{notes}"
            )
