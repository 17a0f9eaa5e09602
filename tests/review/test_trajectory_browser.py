"""Trajectory pages in real Chromium (issue 40, defect 8): a transcript search marks its matches, and the money
cost of the tokens, from the price table per model, is shown beside them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse

from evolution.models import Experiment, Trial
from tests.review.test_browser import browser
from tests.review.test_keys_browser import Screen, screen

__all__ = ["browser", "screen"]  # the fixtures, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _trial(experiment: Experiment) -> Trial:
    trial = (
        Trial.objects.filter(
            candidate__experiment=experiment, trajectory__step_count__gte=3, evaluation__external=False
        )
        .exclude(split="sealed")
        .order_by("pk")
        .first()
    )
    assert trial is not None
    return trial


def test_a_transcript_search_marks_its_matches(screen: Screen, example_world: Experiment, make_user: Any) -> None:
    make_user("viewer", username="vera")
    trial = _trial(example_world)
    screen.login("vera")
    page = screen.page
    screen.go(reverse("review:trial", args=[trial.pk]) + "?q=order")
    page.wait_for_selector("ol.steps.matches li.step")
    hits = page.locator("ol.steps.matches mark.search-hit")
    assert hits.count() > 0
    assert {text.lower() for text in hits.all_inner_texts()} == {"order"}
    # Every matching step shows at least one mark.
    steps = page.locator("ol.steps.matches li.step")
    assert steps.count() == page.locator("ol.steps.matches li.step:has(mark.search-hit)").count()
    screen.check()


def test_the_money_cost_of_the_tokens_is_shown_from_the_price_table(
    screen: Screen, example_world: Experiment, make_user: Any, settings: Any, tmp_path: Path
) -> None:
    make_user("viewer", username="vera")
    trial = _trial(example_world)
    model = trial.trajectory.agent["model_name"]
    final = trial.trajectory.final_metrics
    # An operator's price table for the example's model (the bundled table has real providers' models only).
    table = tmp_path / "prices.json"
    table.write_text(
        json.dumps(
            {
                "models": {
                    model: {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "source": "test table", "as_of": "now"}
                }
            }
        )
    )
    settings.RSI_PRICE_TABLE = str(table)
    expected = (final["total_prompt_tokens"] * 3.0 + final["total_completion_tokens"] * 15.0) / 1e6
    screen.login("vera")
    screen.go(reverse("review:trial", args=[trial.pk]))
    page = screen.page
    shown = page.locator(".money-cost")
    assert shown.count() == 2  # beside the policy tokens and beside the trajectory's tokens
    text = " ".join(shown.all_inner_texts())
    assert f"${expected:.4f}" in text and "test table" in text and "per million prompt tokens" in text
    screen.check()
