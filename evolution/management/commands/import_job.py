"""Import the run of another tool as an external evaluation: a Harbor job
folder, a terminal-bench 1.x run folder (``tb run``) or an Inspect AI eval
log (``.eval`` or ``.json``); see evolution/services/job_imports.py.
``import_harbor_job`` is the same command under its first name.

Exit codes: 0 imported (or imported before), 1 not such a run, or one that
contradicts itself (the message names the file), 2 refused: over an input
limit (docs/security.md), a symbolic link, or an experiment that job imports
did not make; nothing is written on error.
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from evolution.services.harbor_jobs import HarborJobError, HarborJobRefused
from evolution.services.job_imports import job_import, report_lines


class Command(BaseCommand):
    help = (
        "Import a Harbor job folder, a terminal-bench 1.x run folder or an Inspect AI log (.eval, .json) as an "
        "external evaluation; safe to repeat."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("path", help="the job folder (Harbor, terminal-bench) or the log file (Inspect AI)")
        parser.add_argument(
            "--experiment",
            help="experiment name (created when missing; default: the Harbor job's name, the terminal-bench "
            "dataset, the Inspect task)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = job_import(path=Path(options["path"]), experiment=options["experiment"])
        except HarborJobRefused as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=2) from exc
        except HarborJobError as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=1) from exc
        for line in report_lines(report):
            self.stdout.write(line)
