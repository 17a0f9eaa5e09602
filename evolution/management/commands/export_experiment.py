"""Export an experiment's certified results as a self-contained bundle file."""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from evolution.models import Experiment
from evolution.services.bundles import bundle_build, bundle_write


class Command(BaseCommand):
    help = "Write a bundle (records, chain head, trees, blobs, tasks, splits, evaluator, surface, recipes) to FILE."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("experiment", type=int, help="id of the experiment")
        parser.add_argument("file", help="the bundle file to write (.json, or .json.gz for gzip)")

    def handle(self, *args: Any, **options: Any) -> None:
        experiment = Experiment.objects.filter(pk=options["experiment"]).first()
        if experiment is None:
            raise CommandError(f"no experiment with id {options['experiment']}", returncode=2)
        path = Path(options["file"])
        bundle = bundle_build(experiment=experiment)
        try:
            bundle_write(bundle=bundle, path=path)
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc}", returncode=2) from exc
        self.stdout.write(
            f"exported experiment {experiment.pk} {experiment.name!r}: {len(bundle['records'])} record(s), "
            f"{len(bundle['trees'])} tree(s), {len(bundle['blobs'])} blob(s) to {path}"
        )
