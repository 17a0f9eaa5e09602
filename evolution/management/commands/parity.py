"""Run an evaluator's commands directly and through the platform, and compare (docs/loop.md, "Parity").

Exit status: 0 when the verdict passes, 1 when it fails, 2 for unusable input.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.models import Candidate, Experiment
from evolution.services.parity import ParityError, parity_check, parity_json, parity_table

BAD_INPUT = 2


class Command(BaseCommand):
    help = (
        "Parity: run the experiment's evaluator directly (A), through the platform (P) and directly again (B), "
        "with the platform's trial seeds, and say whether the platform disagrees with direct runs more than they "
        "disagree among themselves. Stores the result for the dashboard."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--experiment", type=int, required=True, help="experiment id")
        parser.add_argument("--candidate", type=int, help="candidate id (default: the experiment's seed)")
        parser.add_argument("--iterations", type=int, default=3, help="times to repeat A, P, B (default 3)")
        parser.add_argument("--splits", help="comma-separated splits to run (default: all of the experiment's)")
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        experiment = Experiment.objects.select_related("evaluator", "seed_candidate").filter(pk=options["experiment"])
        found = experiment.first()
        if found is None:
            raise CommandError(f"no experiment with id {options['experiment']}", returncode=BAD_INPUT)
        candidate = None
        if options["candidate"] is not None:
            candidate = Candidate.objects.filter(pk=options["candidate"]).first()
            if candidate is None:
                raise CommandError(f"no candidate with id {options['candidate']}", returncode=BAD_INPUT)
        splits = [s.strip() for s in options["splits"].split(",") if s.strip()] if options["splits"] else None

        def progress(message: str) -> None:
            if options["verbosity"] > 0:
                # On stderr, so that stdout stays the table or the JSON document alone.
                self.stderr.write(message, style_func=lambda text: text)

        try:
            check = parity_check(
                experiment=found,
                candidate=candidate,
                iterations=options["iterations"],
                splits=splits,
                progress=progress,
            )
        except ParityError as exc:
            raise CommandError(str(exc), returncode=BAD_INPUT) from exc
        if options["json"]:
            self.stdout.write(parity_json(check))
        else:
            for line in parity_table(check.numbers):
                self.stdout.write(line)
            self.stdout.write(f"stored as parity check {check.pk}")
        if check.verdict != check.Verdict.PASS:
            raise SystemExit(1)
