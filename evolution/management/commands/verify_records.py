"""Recompute every digest behind the certified records; exit 1 on any mismatch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.models import Experiment
from evolution.services.bundles import BundleError, bundle_read, bundle_verify
from evolution.services.records import records_verify


class Command(BaseCommand):
    help = "Verify certified records: chain links, signatures, trees, evaluator, task sets and trial rows."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--experiment", type=int, help="verify one experiment (default: all)")
        parser.add_argument(
            "--bundle", metavar="FILE", help="verify an exported bundle file instead, without using the database"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["bundle"]:
            self._verify_bundle(Path(options["bundle"]))
            return
        experiment = None
        if options["experiment"] is not None:
            experiment = Experiment.objects.filter(pk=options["experiment"]).first()
            if experiment is None:
                raise CommandError(f"no experiment with id {options['experiment']}", returncode=2)
        report = records_verify(experiment=experiment)
        for line in report.checked:
            self.stdout.write(f"checked  {line}")
        for problem in report.problems:
            self.stdout.write(f"MISMATCH {problem}")
        if report.ok:
            self.stdout.write(f"OK: {len(report.checked)} check(s), no mismatch")
            return
        self.stdout.write(f"FAILED: {len(report.problems)} mismatch(es)")
        raise SystemExit(1)

    def _verify_bundle(self, path: Path) -> None:
        """Recompute every digest and signature in a bundle; touches no database."""
        try:
            bundle = bundle_read(path)
        except BundleError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        problems = bundle_verify(bundle, key=settings.RSI_RECORDS_KEY)
        self.stdout.write(
            f"checked  bundle {path}: {len(bundle.get('records', []))} record(s), {len(bundle.get('trees', {}))} "
            f"tree(s), {len(bundle.get('blobs', {}))} blob(s), {len(bundle.get('tasks', []))} task(s)"
        )
        for problem in problems:
            self.stdout.write(f"MISMATCH {problem}")
        if not problems:
            self.stdout.write("OK: bundle verifies, no mismatch")
            return
        self.stdout.write(f"FAILED: {len(problems)} mismatch(es)")
        raise SystemExit(1)
