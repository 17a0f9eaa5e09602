"""Evaluate a candidate (the seed by default) through the Celery workers."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution import selectors
from evolution.models import Candidate, Evaluation, Experiment
from evolution.services import evaluation as evaluation_services
from evolution.services.records import result_certify


class Command(BaseCommand):
    help = "Evaluate a candidate on some splits; with --wait, print progress and the per-split summary."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--experiment", type=int, required=True)
        parser.add_argument("--candidate", type=int, help="candidate id (default: the experiment's seed)")
        parser.add_argument("--splits", default="train,gate,sealed")
        parser.add_argument("--k", type=int, help="trials per task (default: the experiment's)")
        parser.add_argument("--wait", action="store_true", help="wait for certification and print the summary")
        parser.add_argument(
            "--inline", action="store_true", help="run the trials in this process instead of on the workers"
        )
        parser.add_argument("--timeout", type=float, default=3600)

    def handle(self, *args: Any, **options: Any) -> None:
        experiment = Experiment.objects.filter(pk=options["experiment"]).first()
        if experiment is None:
            raise CommandError(f"no experiment with id {options['experiment']}", returncode=2)
        if options["candidate"]:
            candidate = Candidate.objects.filter(pk=options["candidate"], experiment=experiment).first()
            if candidate is None:
                raise CommandError(f"experiment {experiment.pk} has no candidate {options['candidate']}", returncode=2)
        elif experiment.seed_candidate is not None:
            candidate = experiment.seed_candidate
        else:
            raise CommandError(f"experiment {experiment.pk} has no seed candidate", returncode=2)
        splits = [name.strip() for name in options["splits"].split(",") if name.strip()]
        try:
            evaluation = evaluation_services.evaluation_start(candidate=candidate, splits=splits, k=options["k"])
        except evaluation_services.EvaluationError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        self.stdout.write(f"evaluation {evaluation.pk}: {evaluation.trials_total} trials of candidate {candidate.pk}")
        if options["inline"]:
            for trial_id in evaluation.trials.order_by("pk").values_list("pk", flat=True):
                evaluation_services.trial_execute_in_process(trial_id=trial_id)
            result_certify(evaluation_id=evaluation.pk)
        elif not options["wait"]:
            return
        deadline = time.monotonic() + options["timeout"]
        last = -1
        while True:
            evaluation.refresh_from_db()
            if evaluation.trials_finished != last:
                last = evaluation.trials_finished
                self.stdout.write(f"  {last}/{evaluation.trials_total} trials finished")
            if evaluation.state in {Evaluation.State.CERTIFIED, Evaluation.State.FAILED}:
                break
            if time.monotonic() > deadline:
                raise CommandError("timed out waiting for the evaluation (is a worker running?)")
            time.sleep(1)
        if evaluation.state == Evaluation.State.FAILED:
            raise CommandError(f"evaluation failed: {evaluation.error}")
        self.stdout.write(f"certified as record #{evaluation.certified_result.seq}")
        self.stdout.write(
            f"{'split':8} {'tasks':>5} {'rate':>6} {'contrib':>7} {'pass@k':>6} {'pass^k':>6} {'tokens':>8}"
        )
        for name, s in selectors.evaluation_summary(evaluation=evaluation).items():
            tokens = f"{s.mean_tokens:8.0f}" if s.mean_tokens is not None else f"{'-':>8}"
            self.stdout.write(
                f"{name:8} {s.tasks:5d} {s.rate:6.3f} {s.contribution:7.3f} "
                f"{s.pass_at_k:6.3f} {s.pass_hat_k:6.3f} {tokens}"
            )
