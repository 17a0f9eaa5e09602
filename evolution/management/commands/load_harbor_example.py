"""Load the Harbor-style worked example (benchmark, evaluator, surface, experiment). Idempotent.

Exit codes: 0 loaded (or there already), 1 a folder that does not follow the
layout, 2 a symbolic link where a task is read (refused, not followed); the
message names the file, and nothing is written on error.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.agents import harbor
from evolution.agents.setup import EXAMPLE_DIR, EXPERIMENT_NAME, harbor_experiment_create
from evolution.models import Experiment
from evolution.services.experiments import ExperimentError


class Command(BaseCommand):
    help = "Create the Harbor-style worked example: a command-line agent run by cli_runner.py on four tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default=EXPERIMENT_NAME, help="experiment name")
        parser.add_argument("--folder", type=Path, default=EXAMPLE_DIR, help="a Harbor-style benchmark folder")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        existing = Experiment.objects.filter(name=name).first()
        if existing is not None:
            self.stdout.write(f"experiment {name!r} exists (id {existing.pk}); nothing to do")
            return
        try:
            experiment = harbor_experiment_create(folder=options["folder"], name=name)
        except harbor.HarborFolderRefused as exc:
            raise CommandError(f"cannot load {options['folder']}: {exc}", returncode=2) from exc
        except (harbor.HarborFolderError, ExperimentError, OSError, KeyError, tomllib.TOMLDecodeError) as exc:
            raise CommandError(f"cannot load {options['folder']}: {exc}") from exc
        counts = {
            split: experiment.split_memberships.filter(split=split).count()
            for split in sorted(experiment.split_digests)
        }
        self.stdout.write(
            f"loaded Harbor example experiment {name!r} (id {experiment.pk}): "
            f"{experiment.benchmark.tasks.count()} tasks ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
            f"seed candidate {experiment.seed_candidate_id}"
        )
