"""Run several recipes from the same start with several proposer seeds and print what each one's final harness
scores on train, gate and the transfer splits (evolution.loop.compare)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.loop.compare import CompareError, comparison_table, recipes_compare
from evolution.loop.lifecycle import LoopError
from evolution.models import Experiment
from evolution.recipes import RecipeError

DEFAULT_RECIPES = "rrsi,unregularized,rrsi-no-selection,rrsi-no-proposal"


class Command(BaseCommand):
    help = (
        "Run each recipe with N proposer seeds (each run in a twin of the experiment, driven in this process), "
        "evaluate every final harness on the transfer splits with several trial seeds, and print a table of "
        "train, gate, sealed, cost and leaky edits accepted: per seed, mean and 95% interval."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--experiment", type=int, required=True, help="experiment id (the start)")
        parser.add_argument("--recipes", default=DEFAULT_RECIPES, help=f"comma-separated presets ({DEFAULT_RECIPES})")
        parser.add_argument("--seeds", type=int, default=5, help="proposer seeds per recipe (default 5)")
        parser.add_argument("--rounds", type=int, help="rounds per run (default: the recipe's)")
        parser.add_argument("--candidates", type=int, help="candidates per round (default: the recipe's)")
        parser.add_argument("--k", type=int, help="trials per task (default: the recipe's)")
        parser.add_argument("--proposer", help="proposal operator (default: the example's offline one on the example)")
        parser.add_argument(
            "--transfer-seeds", type=int, default=3, help="trial seeds for each final harness on sealed/held-out"
        )
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        experiment = Experiment.objects.filter(pk=options["experiment"]).first()
        if experiment is None:
            raise CommandError(f"no experiment with id {options['experiment']}", returncode=2)
        recipes = [name.strip() for name in options["recipes"].split(",") if name.strip()]
        quiet = options["json"]
        try:
            comparison = recipes_compare(
                experiment=experiment,
                recipes=recipes,
                seeds=options["seeds"],
                rounds=options["rounds"],
                candidates=options["candidates"],
                k=options["k"],
                proposer=options["proposer"],
                transfer_seeds=options["transfer_seeds"],
                on_progress=None if quiet else (lambda text: self.stderr.write(text)),
            )
        except (CompareError, RecipeError, LoopError) as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if quiet:
            self.stdout.write(json.dumps(comparison.to_json(), indent=2, sort_keys=True))
            return
        for line in comparison_table(comparison):
            self.stdout.write(line)
