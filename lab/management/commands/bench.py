"""Run the platform's benchmarks: each prints its figures and a last line with
its ratio against a baseline measured in the same run, and PASS or FAIL."""

from __future__ import annotations

import platform
import traceback
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor

from lab.bench import load_benchmarks, load_meter


class Command(BaseCommand):
    help = "Run the benchmarks (all, or the ones named); exit 1 when one misses its target."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
        parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
        parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
        parser.add_argument(
            "--keep-data",
            action="store_true",
            help="keep the generated database and print its name (one benchmark that generates data, e.g. pages)",
        )
        parser.add_argument(
            "--reuse-data",
            metavar="DATABASE",
            default="",
            help="measure in a database an earlier --keep-data run kept, migrated first, instead of generating one",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        registry = load_benchmarks()
        if options["list"]:
            for bench in registry.values():
                self.stdout.write(f"{bench.name:<16} {bench.title}")
            return
        names = options["names"] or list(registry)
        unknown = [name for name in names if name not in registry]
        if unknown:
            raise CommandError(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(registry)}")
        data = {"keep": options["keep_data"], "reuse": options["reuse_data"]}
        if any(data.values()):
            if len(names) != 1 or not registry[names[0]].reusable:
                reusable = ", ".join(b.name for b in registry.values() if b.reusable)
                raise CommandError(f"--keep-data and --reuse-data take one benchmark that generates data: {reusable}")
            if options["quick"] and data["reuse"]:
                raise CommandError("--reuse-data measures the data it is given: --quick does not apply")
        shared = [name for name in names if not registry[name].own_database]
        if shared:
            _require_migrated(shared)
        self.stdout.write(
            f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {platform.node()}; {platform.machine()}, "
            f"{_cpu_count()} cores; Python {platform.python_version()}; database {connection.vendor}"
            + ("; --quick (smoke sizes, not a measurement)" if options["quick"] else "")
            + (f"; reusing the data in {options['reuse_data']}" if options["reuse_data"] else "")
        )
        failed = []
        for name in names:
            bench = registry[name]
            self.stdout.write(f"\n== {bench.name}: {bench.title}")
            self.stdout.flush()
            sizes = bench.quick if options["quick"] else {}
            extra = {key: value for key, value in data.items() if value}
            try:
                with load_meter() as load:
                    result = bench.run(**sizes, **extra)
            except Exception:  # noqa: BLE001  (one broken benchmark must not hide the others)
                self.stdout.write(traceback.format_exc())
                self.stdout.write(f"{bench.name}: ERROR")
                failed.append(name)
                continue
            for line in result.lines:
                self.stdout.write(f"  {line}")
            # The machines are shared: every verdict is printed with the load it was measured under.
            self.stdout.write(f"  the whole benchmark: {load[0].text()}")
            self.stdout.write(result.verdict())
            if not result.passed:
                failed.append(name)
        self.stdout.write(f"\n{len(names) - len(failed)} passed, {len(failed)} failed")
        if failed:
            raise CommandError(f"missed: {', '.join(failed)}")


def unapplied_migrations() -> int:
    """How many migrations the configured database still lacks."""
    executor = MigrationExecutor(connection)
    return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))


def _require_migrated(names: list[str]) -> None:
    """A clear error instead of a traceback per benchmark when the configured
    database cannot be used: these benchmarks make their throwaway
    experiment there (and remove it)."""
    name = connection.settings_dict["NAME"]
    try:
        missing = unapplied_migrations()
    except DatabaseError as exc:
        raise CommandError(f"cannot use the database {name}: {exc}".strip()) from exc
    if missing:
        raise CommandError(
            f"the database {name} lacks {missing} migration(s): run `python manage.py migrate` first "
            f"({', '.join(names)} make and remove a throwaway experiment there)"
        )


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
