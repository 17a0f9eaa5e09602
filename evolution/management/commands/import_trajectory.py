"""Import a trajectory file into a trial, replacing the trial's trajectory.

Exit codes: 0 imported, 1 invalid document (each error names the field, or
the line and column of a JSON syntax error), 2 unusable input (unknown
trial, unreadable file, a file over ``RSI_MAX_TRAJECTORY_BYTES`` or nested
deeper than ``RSI_MAX_INPUT_DEPTH``).
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from evolution import limits
from evolution.models import Trial
from evolution.services.trajectories import TrajectoryFormatError, trajectory_import
from evolution.trajectory_formats import FORMATS

INVALID = 1
UNUSABLE = 2


class Command(BaseCommand):
    help = "Import an ATIF, mini-swe-agent or OpenAI-messages trajectory file into a trial (replacing its trajectory)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--trial", type=int, required=True, help="id of the trial")
        parser.add_argument("--format", default="auto", choices=("auto", *FORMATS), help="input format (default auto)")
        parser.add_argument("file", help="the trajectory JSON file")

    def handle(self, *args: Any, **options: Any) -> None:
        trial = Trial.objects.filter(pk=options["trial"]).first()
        if trial is None:
            raise CommandError(f"no trial with id {options['trial']}", returncode=UNUSABLE)
        path = Path(options["file"])
        try:
            text = limits.read_bytes(path, setting="RSI_MAX_TRAJECTORY_BYTES", what=str(path)).decode("utf-8")
            document = limits.json_loads(text, what=str(path))
        except limits.InputLimitError as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=UNUSABLE) from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"cannot read {path}: {exc}", returncode=UNUSABLE) from exc
        except json.JSONDecodeError as exc:
            raise CommandError(
                f"{path}: line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}", returncode=INVALID
            ) from exc
        try:
            trajectory = trajectory_import(trial=trial, document=document, fmt=options["format"])
        except TrajectoryFormatError as exc:
            for error in exc.errors:
                self.stderr.write(f"{path}: {error}")
            raise CommandError(f"{len(exc.errors)} error(s); nothing was imported", returncode=INVALID) from exc
        redactions = trajectory.extra.get("redactions", {})
        summary = ", ".join(f"{kind}: {count}" for kind, count in redactions.items()) or "none"
        fmt = trajectory.extra.get("imported_format")
        self.stdout.write(f"imported {trajectory.step_count} steps ({fmt}) into trial {trial.pk}; redacted: {summary}")
