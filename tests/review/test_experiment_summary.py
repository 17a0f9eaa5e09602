"""The dashboard across runs: the best harness so far, each run's outcome, and a cancelled empty run that
never hides earlier evidence (issue 19)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from evolution.access import roles_ensure
from evolution.loop import lifecycle, load
from evolution.models import Run
from tests.evolution.test_loop import start, tiny_recipe
from tests.evolution.test_run_start import certified_pass_rates
from tests.loop_driver import drive

pytestmark = pytest.mark.django_db


def viewer() -> Client:
    roles_ensure()
    user = User.objects.create_user("vera")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    return client


def test_a_cancelled_empty_run_never_hides_the_best_harness_or_the_earlier_run() -> None:
    first = drive(start("unregularized"))
    assert first.status == Run.Status.FINISHED, first.error
    experiment = first.experiment
    empty = lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("unregularized"))
    assert lifecycle.run_cancel(run=empty)
    best = load.best_candidate(experiment)
    assert best is not None and best.run_id == first.pk

    client = viewer()
    page = client.get(reverse("review:experiment", args=[experiment.pk]))

    assert page.status_code == 200
    assert page.context["run"].pk == first.pk  # the default view: the newest run with evidence
    summary = page.context["best"]
    assert summary["candidate"].pk == best.pk and summary["run_id"] == first.pk
    assert summary["scores"] == pytest.approx(certified_pass_rates(best))
    html = page.content.decode()
    assert "Best harness so far" in html
    assert f'href="{reverse("review:candidate", args=[best.pk])}">#{best.pk}' in html
    rows = {row["run"].pk: row["outcome"] for row in page.context["run_rows"]}
    assert rows[empty.pk]["empty"] and rows[empty.pk]["gained"] == ""
    state_gain = first.state["best_by_round"][-1] - first.state["best_by_round"][0]
    assert rows[first.pk]["gained"] == f"{state_gain:+.3f}" and not rows[first.pk]["empty"]
    assert "no round gated" in html
    # S_best of each run overlaid: the finished run drawn, the empty one not.
    assert f'data-run="run 1 (#{first.pk})"' in html and f"(#{empty.pk})" not in str(page.context["runs_chart"])
    # The experiments list follows the same run.
    home = client.get(reverse("review:home"))
    row = next(r for r in home.context["rows"] if r["experiment"].pk == experiment.pk)
    assert row["progress"].run.pk == first.pk
    # The cancelled run stays one click away.
    chosen = client.get(reverse("review:experiment", args=[experiment.pk]), {"run": empty.pk})
    assert chosen.context["run"].pk == empty.pk
