"""Run several recipes from the same start with several proposer seeds and split draws, through the workers,
and print what each one's final harness scores on train, gate and the transfer splits (evolution.loop.compare)."""

from __future__ import annotations

import json
import shlex
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.loop.compare import CompareError, comparison_table, recipes_compare
from evolution.loop.lifecycle import LoopError
from evolution.models import Experiment
from evolution.recipes import RecipeError
from evolution.services.experiments import ExperimentError

DEFAULT_RECIPES = "rrsi,unregularized,rrsi-no-selection,rrsi-no-proposal"


class Command(BaseCommand):
    help = (
        "Run each recipe with N proposer seeds on each split draw (each run in a twin of the experiment, driven by "
        "the workers, or in this process with --inline), evaluate every accepted harness on the transfer splits "
        "with several trial seeds, and print a table of train, gate, sealed, cost and leaky edits accepted: per "
        "run, mean and 95% interval, and the paired difference against the first recipe."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--experiment", type=int, help="experiment id (the start)")
        parser.add_argument(
            "--benchmark", help="instead of --experiment: the first experiment on the benchmark of this name"
        )
        parser.add_argument("--recipes", default=DEFAULT_RECIPES, help=f"comma-separated presets ({DEFAULT_RECIPES})")
        parser.add_argument("--seeds", type=int, default=5, help="proposer seeds per recipe (default 5)")
        parser.add_argument("--seed-start", type=int, default=0, help="the first proposer seed (default 0)")
        parser.add_argument(
            "--split-seeds", type=int, default=1, help="split draws (default 1: the experiment's own splits)"
        )
        parser.add_argument("--rounds", type=int, help="rounds per run (default: the recipe's)")
        parser.add_argument("--candidates", type=int, help="candidates per round (default: the recipe's)")
        parser.add_argument("--k", type=int, help="trials per task (default: the recipe's)")
        parser.add_argument(
            "--proposer", help="proposal operator (default: the offline one of the example or reasoning-gym)"
        )
        parser.add_argument(
            "--transfer-seeds", type=int, default=3, help="trial seeds for each final harness on sealed/held-out"
        )
        parser.add_argument(
            "--case-recall-similarity",
            type=float,
            help="the example agent's CASE_RECALL_SIMILARITY for every trial (default: the agent's own, 0.5)",
        )
        parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
        parser.add_argument("--inline", action="store_true", help="drive the runs and trials in this process")
        parser.add_argument("--timeout", type=float, default=6 * 3600, help="seconds to wait for the workers")

    def handle(self, *args: Any, **options: Any) -> None:
        experiment = self._experiment(options["experiment"], options["benchmark"])
        recipes = [name.strip() for name in options["recipes"].split(",") if name.strip()]
        quiet = options["json"]
        try:
            comparison = recipes_compare(
                experiment=experiment,
                recipes=recipes,
                seeds=options["seeds"],
                seed_start=options["seed_start"],
                split_seeds=options["split_seeds"],
                inline=options["inline"],
                timeout=options["timeout"],
                rounds=options["rounds"],
                candidates=options["candidates"],
                k=options["k"],
                proposer=options["proposer"],
                transfer_seeds=options["transfer_seeds"],
                on_progress=None if quiet else (lambda text: self.stderr.write(text)),
                command=_command_line(experiment, options),
                case_recall_similarity=options["case_recall_similarity"],
            )
        except (CompareError, RecipeError, LoopError, ExperimentError) as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if quiet:
            self.stdout.write(json.dumps(comparison.to_json(), indent=2, sort_keys=True))
            return
        for line in comparison_table(comparison):
            self.stdout.write(line)

    def _experiment(self, pk: int | None, benchmark: str | None) -> Experiment:
        if (pk is None) == (benchmark is None):
            raise CommandError("give --experiment ID or --benchmark NAME (one of them)", returncode=2)
        if pk is not None:
            experiment = Experiment.objects.filter(pk=pk).first()
            if experiment is None:
                raise CommandError(f"no experiment with id {pk}", returncode=2)
            return experiment
        # The first one: the experiment load_example made (a comparison's twins share its benchmark).
        experiment = Experiment.objects.filter(benchmark__name=benchmark).order_by("pk").first()
        if experiment is None:
            raise CommandError(
                f"no experiment on a benchmark named {benchmark!r} (manage.py load_example --benchmark {benchmark})",
                returncode=2,
            )
        return experiment


def _command_line(experiment: Experiment, options: dict[str, Any]) -> str:
    """The command that reruns this comparison (every option spelled out; --json left to the reader)."""
    words = ["python", "manage.py", "compare_recipes", "--experiment", str(experiment.pk)]
    for name in ("recipes", "seeds", "seed_start", "split_seeds", "rounds", "candidates", "k", "proposer"):
        if options.get(name) is not None:
            words += ["--" + name.replace("_", "-"), str(options[name])]
    words += ["--transfer-seeds", str(options["transfer_seeds"])]
    if options.get("case_recall_similarity") is not None:
        words += ["--case-recall-similarity", f"{options['case_recall_similarity']:g}"]
    if options.get("inline"):
        words.append("--inline")
    return shlex.join(words)
