"""Build the Debian root filesystems of a benchmark's task environments ahead
of the trials (evolution/environments.py), printing each step as it goes.

    manage.py environment_build BENCHMARK [BENCHMARK ...]

Environments built before are reused (stored by their recipe's digest under
RSI_ENVIRONMENTS_DIR). Exit codes: 0 every environment is built, 1 an
unknown benchmark or a build that failed (the message names the step), 2
debootstrap or bubblewrap is missing (the message says how to install it).
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution import environments
from evolution.models import Benchmark


class Command(BaseCommand):
    help = "Build the Debian-built environments of the named benchmarks' tasks (reused when built before)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("benchmarks", nargs="+", help="benchmark names (an imported Harbor folder's name)")

    def handle(self, *args: Any, **options: Any) -> None:
        recipes: dict[str, tuple[dict[str, Any], list[str]]] = {}
        for name in options["benchmarks"]:
            benchmark = Benchmark.objects.filter(name=name).first()
            if benchmark is None:
                raise CommandError(f"no benchmark named {name!r}")
            for task in benchmark.tasks.order_by("external_id"):
                recipe = task.expected.get("environment") if isinstance(task.expected, dict) else None
                if isinstance(recipe, dict):
                    digest = environments.recipe_digest(recipe)
                    recipes.setdefault(digest, (recipe, []))[1].append(f"{name}/{task.external_id}")
        if not recipes:
            self.stdout.write("no task of these benchmarks has a Debian-built environment; nothing to build")
            return
        try:
            environments.builder()
        except environments.EnvironmentBuildError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        root = settings.RSI_ENVIRONMENTS_DIR
        started = time.monotonic()
        for number, (digest, (recipe, tasks)) in enumerate(sorted(recipes.items()), start=1):
            self.stdout.write(f"[{number}/{len(recipes)}] environment {digest[:12]} for {', '.join(tasks)}")
            try:
                path = environments.environment_build(
                    recipe, root=root, bases=settings.RSI_ENVIRONMENT_BASES_DIR, progress=self._progress
                )
            except environments.EnvironmentBuildError as exc:
                raise CommandError(f"environment {digest[:12]}: {exc}") from exc
            self.stdout.write(f"  ready at {path}")
        self.stdout.write(f"{len(recipes)} environment(s) ready in {time.monotonic() - started:.1f} s under {root}")

    def _progress(self, message: str) -> None:
        self.stdout.write(f"  {message}")
        self.stdout.flush()
