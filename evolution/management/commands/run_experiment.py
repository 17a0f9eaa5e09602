"""Start an evolution run; with --wait, print progress per round and a summary table."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution import limits, operators
from evolution.loop import lifecycle
from evolution.loop.state import RunState
from evolution.models import Experiment, Run
from evolution.recipes import PRESET_NAMES, RecipeError, parse_recipe
from evolution.recipes import Recipe as RecipeSpec


def summary_table(run: Run) -> list[str]:
    """One line per round: parent, budget, proposed, flagged, rejected by
    surface, evaluated, accepted, train/gate/sealed scores of the current
    harness after the round, tokens per trial."""
    header = (
        f"{'round':>5} {'parent':>6} {'budget':>6} {'proposed':>8} {'flagged':>7} {'surface':>7} "
        f"{'evaluated':>9} {'accepted':>8} {'train':>6} {'gate':>6} {'sealed':>6} {'tokens':>8}"
    )
    lines = [header]
    state = RunState.of(run)
    final = state.final or {}
    for key in sorted(state.rounds):
        r = state.rounds[key]
        scores = dict(r.get("scores", {}))
        if key == state.last_gated_round and final.get("scores"):
            scores = final["scores"]

        def fmt(split: str, scores: dict[str, float] = scores) -> str:
            return f"{scores[split]:6.3f}" if split in scores else f"{'-':>6}"

        tokens = r.get("tokens_per_trial")
        lines.append(
            f"{key:>5} {r.get('parent') or '-':>6} {r.get('budget') or '-':>6} {r.get('proposed', 0):>8} "
            f"{r.get('flagged', 0):>7} {r.get('rejected_surface', 0):>7} {r.get('evaluated', 0):>9} "
            f"{r.get('accepted', 0):>8} {fmt('train')} {fmt('gate')} {fmt('sealed')} "
            f"{tokens if tokens is None else round(tokens):>8}"
        )
    return lines


def _recipe_file(path: Path) -> bytes:
    """The recipe file's bytes, refused past ``RSI_MAX_RECIPE_BYTES`` before it is read whole."""
    try:
        return limits.read_bytes(path, setting="RSI_MAX_RECIPE_BYTES", what=f"recipe {path}")
    except limits.InputLimitError as exc:
        raise CommandError(str(exc), returncode=2) from exc
    except OSError as exc:
        raise CommandError(f"cannot read recipe {path}: {exc}", returncode=2) from exc


class Command(BaseCommand):
    help = "Run an evolution loop on an experiment (through the Celery workers)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("experiment", type=int, help="experiment id")
        parser.add_argument(
            "--recipe",
            default="rrsi",
            help=f"preset ({', '.join(PRESET_NAMES)}), run-<id> (an earlier run's), own (the experiment's) "
            "or a YAML/JSON file",
        )
        parser.add_argument("--rounds", type=int)
        parser.add_argument("--k", type=int, help="trials per task")
        parser.add_argument("--proposer", help="proposal operator (e.g. example, command); default: the recipe's")
        parser.add_argument(
            "--from",
            dest="start",
            type=int,
            metavar="CANDIDATE",
            help="candidate id to start from (the seed or an accepted candidate); default: the experiment's best",
        )
        parser.add_argument("--wait", action="store_true", help="print progress until the run ends, then a summary")
        parser.add_argument("--timeout", type=float, default=6 * 3600)

    def handle(self, *args: Any, **options: Any) -> None:
        experiment = Experiment.objects.filter(pk=options["experiment"]).first()
        if experiment is None:
            raise CommandError(f"no experiment with id {options['experiment']}", returncode=2)
        name = options["recipe"]
        try:
            recipe: str | RecipeSpec = name
            if name not in PRESET_NAMES and Path(name).is_file():
                recipe = parse_recipe(_recipe_file(Path(name)), known_operators=operators.known_operators())
            run = lifecycle.run_start(
                experiment=experiment,
                recipe=recipe,
                rounds=options["rounds"],
                k=options["k"],
                proposer=options["proposer"],
                start=options["start"],
            )
        except (RecipeError, lifecycle.LoopError) as exc:
            raise CommandError(str(exc), returncode=2) from exc
        default = lifecycle.default_proposer(experiment=experiment, recipe=recipe)
        if not options["proposer"] and default is not None:
            self.stdout.write(
                f"proposer {default}: the example's offline proposer (--proposer llm for the preset's own)"
            )
        self.stdout.write(
            f"run {run.pk} of {experiment.name!r} with recipe {run.recipe.name} ({run.recipe.digest[:12]})"
        )
        if run.start_candidate_id != experiment.seed_candidate_id:
            self.stdout.write(f"starting from candidate {run.start_candidate_id} (its gains are measured from it)")
        if not options["wait"]:
            return
        deadline = time.monotonic() + options["timeout"]
        seen_events = 0
        while True:
            run.refresh_from_db()
            events = RunState.of(run).events
            for event in events[seen_events:]:
                self.stdout.write(f"  [round {event.get('round', 0)}] {event.get('text', '')}")
            seen_events = len(events)
            if run.status not in {Run.Status.RUNNING, Run.Status.PENDING, Run.Status.PAUSED}:
                break
            if time.monotonic() > deadline:
                raise CommandError("timed out waiting for the run (is a worker running?)")
            time.sleep(1)
        self.stdout.write(f"run {run.pk}: {run.status} ({run.stop_reason or run.error})")
        for line in summary_table(run):
            self.stdout.write(line)
        if run.status == Run.Status.FAILED:
            raise CommandError(run.error)
