"""Import a Harbor job folder (``harbor run`` output) as an external evaluation.

``import_job`` under the name it first had: it takes a terminal-bench run
folder or an Inspect AI log as well (evolution/services/job_imports.py).
Exit codes: 0 imported (or imported before), 1 not a valid job (the message
names the file), 2 refused: over an input limit (docs/security.md), a
symbolic link in the folder, or an experiment that job imports did not
make; nothing is written on error.
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from evolution.services.harbor_jobs import HarborJobError, HarborJobRefused
from evolution.services.job_imports import job_import, report_lines


class Command(BaseCommand):
    help = "Import a Harbor job folder (config.json, result.json, one folder per trial), or what import_job takes."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("path", help="the job folder Harbor wrote (jobs/<job name>)")
        parser.add_argument("--experiment", help="experiment name (created when missing; default: the job's name)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = job_import(path=Path(options["path"]), experiment=options["experiment"])
        except HarborJobRefused as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=2) from exc
        except HarborJobError as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=1) from exc
        for line in report_lines(report):
            self.stdout.write(line)
