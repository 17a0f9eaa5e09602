"""A stored comparison (``compare_recipes``): its page, its JSON download, the API, the experiment's link."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from html import escape
from typing import Any

import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from evolution.example.setup import example_experiment_create
from evolution.loop.compare import RULES, comparisons_reap, process_owner
from evolution.models import Experiment, RecipeComparison, SplitMembership
from review.pages.comparison import RULE_WORDS
from tests.review.comparison_world import small_comparison

pytestmark = pytest.mark.django_db(transaction=True)


def _splits(experiment_id: int) -> set[tuple[str, str]]:
    return set(SplitMembership.objects.filter(experiment_id=experiment_id).values_list("task__external_id", "split"))


def test_a_comparison_is_stored_shown_exported_and_linked(client_as: Callable[..., Client]) -> None:
    stored, printed = small_comparison()

    assert stored.status == RecipeComparison.Status.FINISHED and stored.finished_at is not None
    assert stored.result == printed
    assert stored.params["split_seeds"] == 2 and stored.params["seed_start"] == 3
    assert "--seed-start 3 --split-seeds 2" in stored.command and "--inline" in stored.command
    runs = [r for name in ("rrsi", "unregularized") for r in printed["recipes"][name]["runs"]]
    assert sorted((r["recipe"], r["seed"], r["split_draw"]) for r in runs) == [
        ("rrsi", 3, 0),
        ("rrsi", 3, 1),
        ("unregularized", 3, 0),
        ("unregularized", 3, 1),
    ]
    # The split draw is a factor: draw 0 keeps the experiment's splits, draw 1 cuts them anew.
    draw = {r["split_draw"]: r["experiment"] for r in runs if r["recipe"] == "rrsi"}
    assert _splits(draw[0]) == _splits(stored.experiment_id) != _splits(draw[1])
    assert set(printed["starts"]) == {"0", "1"}
    assert printed["recipes"]["rrsi"]["paired"] is None
    assert printed["recipes"]["unregularized"]["paired"]["sealed"]["n"] == 2.0
    assert set(printed["recipes"]["rrsi"]["rules"]) == set(RULES)

    viewer = client_as("viewer")
    page = viewer.get(f"/comparisons/{stored.pk}/")
    assert page.status_code == 200
    html = page.content.decode()
    for r in runs:
        assert f'href="/experiments/{r["experiment"]}/?run={r["run"]}"' in html
    assert "paired: unregularized − rrsi" in html and "mean, split draw 1" in html
    for words in RULE_WORDS.values():
        assert escape(words) in html
    assert stored.command.split(" ")[0] in html and f'href="/comparisons/{stored.pk}/json/"' in html

    download = viewer.get(f"/comparisons/{stored.pk}/json/")
    assert download["Content-Disposition"] == f'attachment; filename="comparison-{stored.pk}.json"'
    assert json.loads(download.content)["result"] == printed

    api: Any = viewer.get(f"/api/v1/comparisons/{stored.pk}/").json()
    assert (api["id"], api["status"], api["result"]) == (stored.pk, "finished", printed)

    dashboard = viewer.get(f"/experiments/{stored.experiment_id}/").content.decode()
    assert f'href="/comparisons/{stored.pk}/"' in dashboard
    assert not Experiment.objects.get(pk=draw[1]).comparisons.exists()  # linked from its start alone


def test_an_unknown_comparison_is_not_found(client_as: Callable[..., Client]) -> None:
    viewer = client_as("viewer")
    assert viewer.get("/comparisons/999999/").status_code == 404
    assert viewer.get("/comparisons/999999/json/").status_code == 404
    assert viewer.get("/api/v1/comparisons/999999/").status_code == 404


def test_a_comparison_whose_command_was_killed_shows_as_interrupted(client_as: Callable[..., Client]) -> None:
    experiment = example_experiment_create(name="compare-killed", task_limit=3)
    # A real process stands for the command: the comparison is its own while it lives.
    command = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        stored = RecipeComparison.objects.create(
            experiment=experiment,
            command="python manage.py compare_recipes --experiment 1",
            owner=process_owner(command.pid),
            heartbeat_at=timezone.now(),
        )
        assert comparisons_reap() == 0
        viewer = client_as("viewer")
        assert viewer.get(f"/api/v1/comparisons/{stored.pk}/").json()["status"] == "running"
    finally:
        command.kill()
        command.wait()

    page = viewer.get(f"/comparisons/{stored.pk}/").content.decode()
    stored.refresh_from_db()
    reason = f"interrupted: the command that ran it (pid {command.pid} on {socket.gethostname()}) stopped"
    assert stored.status == RecipeComparison.Status.INTERRUPTED and stored.error.startswith(reason)
    assert stored.finished_at is not None
    assert "Interrupted" in page and escape(reason) in page
    api: Any = viewer.get(f"/api/v1/comparisons/{stored.pk}/").json()
    assert (api["status"], api["error"], api["owner"]) == ("interrupted", stored.error, stored.owner)

    # From another host only the heartbeat tells: stale past RSI_COMPARISON_STALE_SECONDS, or not.
    stale = timezone.now() - timedelta(seconds=settings.RSI_COMPARISON_STALE_SECONDS + 1)
    elsewhere = [
        RecipeComparison.objects.create(experiment=experiment, owner="elsewhere:123:456", heartbeat_at=at)
        for at in (stale, timezone.now())
    ]
    assert comparisons_reap() == 1
    assert [RecipeComparison.objects.get(pk=c.pk).status for c in elsewhere] == ["interrupted", "running"]
    assert RecipeComparison.objects.get(pk=elsewhere[0].pk).error.startswith(
        "interrupted: no heartbeat from its command (elsewhere:123:456) since"
    )
