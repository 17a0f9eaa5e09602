"""Import a Harbor dataset folder (one folder per task) as a benchmark with
an evaluator, a surface and an experiment; each task runs in an environment
built here from Debian packages out of its ``environment/Dockerfile``.

Exit codes: 0 imported (refused tasks are listed, each with its reason), 1 a
folder that does not follow Harbor's layout or holds no task that can run
here, 2 a symbolic link where a task is read; nothing is written on error.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.agents import harbor
from evolution.agents.setup import EXAMPLE_DIR, harbor_tasks_import
from evolution.services.experiments import ExperimentError


class Command(BaseCommand):
    help = "Import Harbor tasks (task.toml, instruction.md, environment/Dockerfile, tests/), environments built here."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("folder", type=Path, help="a Harbor dataset folder: one folder per task")
        parser.add_argument("--name", help="benchmark and experiment name (default: the folder's name)")
        parser.add_argument(
            "--harness",
            type=Path,
            default=EXAMPLE_DIR / "harness",
            help="seed harness (an agent.toml for cli_runner.py)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        folder: Path = options["folder"]
        name = options["name"] or folder.resolve().name
        try:
            report = harbor_tasks_import(folder=folder, name=name, harness=options["harness"])
        except harbor.HarborFolderRefused as exc:
            raise CommandError(f"cannot import {folder}: {exc}", returncode=2) from exc
        except (harbor.HarborFolderError, ExperimentError, OSError, KeyError, tomllib.TOMLDecodeError) as exc:
            raise CommandError(f"cannot import {folder}: {exc}") from exc
        for reason in report.refused:
            self.stdout.write(f"refused {reason}")
        experiment = report.experiment
        for task in experiment.benchmark.tasks.order_by("external_id"):
            built = (task.metadata.get("environment") or {}).get("digest", "")
            where = f"Debian-built environment {built[:12]}" if built else "the host's system"
            self.stdout.write(f"task {task.external_id}: {where}")
        self.stdout.write(
            f"imported experiment {name!r} (id {experiment.pk}): {experiment.benchmark.tasks.count()} task(s), "
            f"{len(report.refused)} refused; build the environments ahead with: manage.py environment_build {name}"
        )
