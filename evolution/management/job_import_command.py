"""The one command behind ``import_job`` and ``import_harbor_job`` (its first name): both import a Harbor job
folder, a terminal-bench 1.x run folder or an Inspect AI log as an external evaluation
(evolution/services/job_imports.py) and differ only in their help."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from evolution.services.harbor_jobs import HarborJobError, HarborJobRefused
from evolution.services.job_imports import job_import, report_lines


class JobImportCommand(BaseCommand):
    path_help = "the job folder (Harbor, terminal-bench) or the log file (Inspect AI)"
    experiment_help = (
        "experiment name (created when missing; default: the Harbor job's name, the terminal-bench dataset, "
        "the Inspect task)"
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("path", help=self.path_help)
        parser.add_argument("--experiment", help=self.experiment_help)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = job_import(path=Path(options["path"]), experiment=options["experiment"])
        except HarborJobRefused as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=2) from exc
        except HarborJobError as exc:
            raise CommandError(f"{exc}; nothing was imported", returncode=1) from exc
        for line in report_lines(report):
            self.stdout.write(line)
