"""``manage.py run_experiment`` on the bundled example, as a separate process.

The presets name the ``llm`` proposer, which needs a model endpoint; the
example experiment runs every preset with its own offline proposer unless
told otherwise, and where an ``llm`` operator is asked for and not
configured, the command says both ways forward and creates nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management import call_command

from evolution.loop import lifecycle
from evolution.models import Experiment, Run
from evolution.recipes import PRESET_NAMES
from tests.conftest import REPO_ROOT, database_url_for_subprocess
from tests.factories import make_tiny_experiment

pytestmark = pytest.mark.django_db(transaction=True)


def run_experiment(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url_for_subprocess()}
    for name in ("RSI_LLM_BASE_URL", "RSI_LLM_MODEL", "RSI_LLM_API_KEY"):
        env.pop(name, None)  # no model endpoint, as on a fresh clone
    return subprocess.run(
        [sys.executable, "manage.py", "run_experiment", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def example() -> Experiment:
    call_command("load_example", verbosity=0)
    return Experiment.objects.get(name="example-routing")


def test_every_preset_runs_on_the_example_with_its_offline_proposer() -> None:
    experiment = example()
    for preset in PRESET_NAMES:
        result = run_experiment(str(experiment.pk), "--recipe", preset, "--rounds", "1")
        assert result.returncode == 0, (preset, result.stderr)
        run = Run.objects.filter(experiment=experiment).latest("pk")
        assert result.stdout.splitlines() == [
            "proposer example: the example's offline proposer (--proposer llm for the preset's own)",
            f"run {run.pk} of 'example-routing' with recipe {preset} ({run.recipe.digest[:12]})",
        ]
        assert run.recipe.name == preset
        assert run.recipe.spec["proposal"]["operator"] == "example"
        assert run.status == Run.Status.RUNNING and run.rounds == 1
        assert lifecycle.run_cancel(run=run)  # one active run per experiment: room for the next preset
    assert Run.objects.filter(experiment=experiment).count() == len(PRESET_NAMES)


def test_a_proposer_asked_for_is_used_on_the_example() -> None:
    experiment = example()
    result = run_experiment(str(experiment.pk), "--recipe", "unregularized", "--proposer", "example", "--rounds", "2")
    assert result.returncode == 0, result.stderr
    run = Run.objects.get(experiment=experiment)
    assert result.stdout.splitlines() == [
        f"run {run.pk} of 'example-routing' with recipe unregularized ({run.recipe.digest[:12]})"
    ]
    assert run.recipe.spec["proposal"]["operator"] == "example" and run.rounds == 2


@pytest.mark.parametrize("where", ["example, told to use llm", "another experiment"])
def test_an_unconfigured_llm_proposer_names_both_ways_forward_and_creates_nothing(where: str) -> None:
    if where == "another experiment":
        experiment, extra = make_tiny_experiment(), []
    else:
        experiment, extra = example(), ["--proposer", "llm"]
    result = run_experiment(str(experiment.pk), "--recipe", "rrsi", *extra)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        'CommandError: the llm proposal operator is not configured (no endpoint: set params "base_url" or '
        "RSI_LLM_BASE_URL to an http(s) URL (got '')): configure its endpoint (RSI_LLM_BASE_URL and "
        "RSI_LLM_MODEL, or the recipe's proposal params; docs/llm.md), or run an offline proposer instead "
        "(--proposer example on the bundled example, the proposer field on the dashboard)\n"
    )
    assert not Run.objects.exists()
