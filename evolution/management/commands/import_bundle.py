"""Import an experiment bundle (written by export_experiment) into this database.

Exit codes: 0 imported (or already here), 1 the bundle conflicts with what
is here, 2 an unreadable file, one over an input limit (size, decompression
ratio, depth, counts: docs/security.md), or a bundle that does not verify
(the checks of ``verify_records --bundle``, which lists every problem).
Nothing is written unless the import succeeds.
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from evolution.services.bundles import BundleError, bundle_import, bundle_read


class Command(BaseCommand):
    help = "Verify a bundle and recreate its experiment and certified records here; safe to repeat."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", help="the bundle file")
        parser.add_argument("--name", help="experiment name here (default: the exported name)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            bundle = bundle_read(Path(options["file"]))
        except BundleError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        try:
            experiment = bundle_import(bundle=bundle, key=settings.RSI_RECORDS_KEY, name=options["name"])
        except BundleError as exc:
            if exc.problems:  # it does not verify: one line, the full list is verify_records --bundle's
                more = f" and {len(exc.problems) - 1} more" if len(exc.problems) > 1 else ""
                raise CommandError(
                    f"{options['file']}: the bundle does not verify ({exc.problems[0]}{more}); nothing was imported",
                    returncode=2,
                ) from exc
            raise CommandError(str(exc), returncode=1) from exc
        self.stdout.write(
            f"experiment {experiment.pk} {experiment.name!r} ({experiment.uid}): "
            f"{experiment.chain_length} certified record(s)"
        )
