"""Import an existing evolution workspace (RSIHub layout) as an experiment.

Exit codes: 0 imported (or nothing new), 1 invalid workspace (the message
names the archive line), 2 refused by an input limit (size, depth, lines,
tasks: docs/security.md); nothing is written on error.
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from evolution.services.workspaces import WorkspaceError, WorkspaceRefused, workspace_import


class Command(BaseCommand):
    help = "Import an evolution workspace (git repo with gen/<id> tags and archive.jsonl); safe to repeat."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("path", help="the workspace folder (a git repository holding archive.jsonl)")
        parser.add_argument("--name", help="experiment name (default: the folder name)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = workspace_import(path=Path(options["path"]), name=options["name"])
        except WorkspaceRefused as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=2) from exc
        except WorkspaceError as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=1) from exc
        experiment = report.experiment
        verb = "created" if report.created else "updated"
        self.stdout.write(
            f"{verb} experiment {experiment.pk} {experiment.name!r}: {len(report.imported)} generation(s) imported"
            f"{', ' + str(len(report.skipped)) + ' already present' if report.skipped else ''}"
        )
        for note in report.notes:
            self.stdout.write(f"note: {note}")
