"""A small real comparison (``compare_recipes`` in this process) for the comparison page's tests."""

from __future__ import annotations

import io
import json
from typing import Any

from django.core.management import call_command

from evolution.example.setup import example_experiment_create
from evolution.models import RecipeComparison


def small_comparison(name: str = "compare-page") -> tuple[RecipeComparison, dict[str, Any]]:
    """rrsi and unregularized, one proposer seed (3), two split draws, one round of one candidate, on the
    first 9 tasks of the example: the stored comparison and the JSON the command printed."""
    import evolution.proposers  # noqa: F401  (registers the example proposer)

    experiment = example_experiment_create(name=name, task_limit=9)
    out = io.StringIO()
    call_command(
        "compare_recipes",
        experiment=experiment.pk,
        recipes="rrsi,unregularized",
        seeds=1,
        seed_start=3,
        split_seeds=2,
        rounds=1,
        candidates=1,
        k=1,
        proposer="example",
        transfer_seeds=1,
        inline=True,
        json=True,
        stdout=out,
    )
    printed = json.loads(out.getvalue())
    return RecipeComparison.objects.get(pk=printed["comparison"]), printed
