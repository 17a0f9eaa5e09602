"""``python -m lab.trust.web_process loop|evaluation <experiment id>``:
what a web request does to start work, in a process of its own.

The lost-publish scenario runs it with a fault point between the commit and
the message (``publish:run_advance`` or ``publish:trials``) and SIGKILLs it
there, as if the web server died at that instant.
"""

from __future__ import annotations

import os
import sys


def main(what: str, experiment_id: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rsiweb.settings")
    import django

    django.setup()
    from rsiweb.celery import queue_everything_to

    queue = os.environ.get("RSI_TRUST_QUEUE")
    if queue:
        queue_everything_to(queue)
    from evolution import selectors
    from evolution.loop import lifecycle
    from evolution.models import Evaluation, Experiment
    from evolution.services.evaluation import evaluation_start
    from lab.trust.context import EVAL_SPLITS, experiment_benchmark, loop_recipe

    experiment = Experiment.objects.get(pk=experiment_id)
    benchmark = experiment_benchmark(experiment)
    if what == "loop":
        lifecycle.run_create(experiment=experiment, recipe=loop_recipe(benchmark))
    else:
        evaluation_start(
            candidate=selectors.experiment_seed(experiment),
            splits=EVAL_SPLITS[benchmark],
            k=1,
            purpose=Evaluation.Purpose.BASELINE,
        )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
