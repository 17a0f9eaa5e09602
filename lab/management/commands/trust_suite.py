"""Run the trust suite: every scenario, N trials on each benchmark, each trial
on a fresh experiment in a throwaway database (never the user's data).

Prints one line per scenario and benchmark, then ``N passed, N failed`` (and
``, N inapplicable`` when a scenario could not be injected on this host).
Exits 1 when any trial failed.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from lab.trust import BENCHMARKS, Inapplicable, TrustFailure, load_scenarios


class Command(BaseCommand):
    help = "Inject faults for real and check the platform ends in a safe state (see docs/security.md)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--trials", type=int, default=2, help="trials per scenario and benchmark (default 2)")
        parser.add_argument(
            "--scenario", action="append", default=[], help="run only this scenario (name or number; repeatable)"
        )
        parser.add_argument(
            "--benchmark", action="append", default=[], choices=BENCHMARKS, help="run only on this benchmark"
        )
        parser.add_argument("--list", action="store_true", help="list the scenarios and exit")

    def handle(self, *args: Any, **options: Any) -> None:
        from lab.trust.context import Suite

        scenarios = load_scenarios()
        if options["list"]:
            for scenario in scenarios.values():
                self.stdout.write(f"{scenario.name:28} {scenario.title}")
            return
        wanted = options["scenario"]
        if wanted:
            unknown = [
                w for w in wanted if w not in scenarios and not any(str(s.number) == w for s in scenarios.values())
            ]
            if unknown:
                raise CommandError(f"unknown scenario(s): {', '.join(unknown)} (see --list)")
            scenarios = {n: s for n, s in scenarios.items() if n in wanted or str(s.number) in wanted}
        if options["trials"] < 1:
            raise CommandError("--trials must be at least 1")
        benchmarks = options["benchmark"] or list(BENCHMARKS)
        totals = {"passed": 0, "failed": 0, "inapplicable": 0}
        started = time.monotonic()
        with Suite(log=self.stdout.write) as suite:
            self.stdout.write(f"trust suite: database {suite.database_name}, broker {suite.broker_kind}")
            for scenario in scenarios.values():
                for benchmark in benchmarks:
                    counts, first, began = {"passed": 0, "failed": 0, "inapplicable": 0}, "", time.monotonic()
                    for trial in range(options["trials"]):
                        outcome, message = self.run_trial(suite, scenario, benchmark, trial)
                        if options["verbosity"] >= 2:
                            self.stdout.write(f"    trial {trial + 1}: {outcome}: {message.strip()[:300]}")
                        counts[outcome] += 1
                        if outcome != "passed" and not first:
                            first = message
                    for key in totals:
                        totals[key] += counts[key]
                    self.stdout.write(self.line(scenario.name, benchmark, counts, first, time.monotonic() - began))
                    self.stdout.flush()
        closing = f"{totals['passed']} passed, {totals['failed']} failed"
        if totals["inapplicable"]:
            closing += f", {totals['inapplicable']} inapplicable"
        self.stdout.write(f"({time.monotonic() - started:.1f} s)")
        self.stdout.write(closing)
        if totals["failed"]:
            raise SystemExit(1)

    def run_trial(self, suite: Any, scenario: Any, benchmark: str, trial: int) -> tuple[str, str]:
        try:
            context = suite.trial_context(benchmark, trial, scenario.name)
            detail = scenario.run(context)
            return "passed", detail or ""
        except Inapplicable as exc:
            return "inapplicable", str(exc)
        except TrustFailure as exc:
            return "failed", str(exc) + self.kept(suite, scenario.name, benchmark, trial)
        except Exception as exc:  # a scenario that breaks is a failure, never a pass
            detail = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
            return "failed", detail + self.kept(suite, scenario.name, benchmark, trial)
        finally:
            suite.end_trial()

    @staticmethod
    def kept(suite: Any, name: str, benchmark: str, trial: int) -> str:
        try:
            folder = suite.keep_logs(f"{name}-{benchmark}-{trial + 1}")
        except OSError as exc:
            return f"\n(could not keep the worker logs: {exc})"
        return f"\n(the trial's worker logs are kept in {folder})" if folder else ""

    @staticmethod
    def line(name: str, benchmark: str, counts: dict[str, int], first: str, seconds: float) -> str:
        total = sum(counts.values())
        if counts["inapplicable"] == total:
            return f"  {name:28} {benchmark:8} inapplicable: {first}"
        text = f"  {name:28} {benchmark:8} {counts['passed']}/{total} passed  ({seconds:.1f} s)"
        if counts["inapplicable"]:
            text += f"  {counts['inapplicable']} inapplicable"
        if first:
            text += f"\n      first {'failure' if counts['failed'] else 'note'}: {first.strip()}"
        return text
