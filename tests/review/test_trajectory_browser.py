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
from tests.review.test_results import _give_trajectory, _parent_trial_of, _plain_steps

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
    page.click(".trial-details > summary")  # the facts in full are folded below the glance
    shown = page.locator(".trial-details .money-cost")
    assert shown.count() == 2  # beside the policy tokens and beside the trajectory's tokens
    text = " ".join(shown.all_inner_texts())
    assert f"${expected:.4f}" in text and "test table" in text and "per million prompt tokens" in text
    # At a glance above the transcript, and beside every step's tokens.
    assert page.locator(".trial-strip .money-cost").inner_text() == f"≈ ${expected:.4f}"
    with_tokens = page.locator("ol.steps li.step:has(.metrics [title='prompt tokens'])")
    assert with_tokens.count() > 0
    assert with_tokens.count() == page.locator("ol.steps li.step:has(.metrics .money-cost)").count()
    screen.check()


def test_the_first_step_shows_in_the_first_screen_with_its_duration(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("annotator", username="vera")
    trial = _trial(example_world)
    screen.login("vera")
    page = screen.page
    page.set_viewport_size({"width": 1280, "height": 800})
    screen.go(reverse("review:trial", args=[trial.pk]))
    first = page.locator("ol.steps li.step").first
    box = first.bounding_box()
    assert box is not None and box["y"] + 60 < 800, box  # its head and first lines, without scrolling
    # The example's steps are two seconds apart: each step shows the time to the next one, the last none.
    steps = list(trial.trajectory.steps.order_by("step_id").values_list("timestamp", flat=True))
    assert first.locator(".step-duration").inner_text() == "took 2.00 s", steps[:2]
    assert page.locator("ol.steps li.step").last.locator(".step-duration").count() == 0
    screen.check()


def test_the_compare_views_keys_move_to_the_next_and_previous_difference(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("viewer", username="vera")
    trials = Trial.objects.filter(
        candidate__experiment=example_world, candidate__parent__isnull=False, trajectory__step_count__gte=3
    ).exclude(split="sealed")
    screen.login("vera")
    page = screen.page
    page.set_viewport_size({"width": 1280, "height": 800})
    differing = page.locator("table.compare tbody tr.differs")
    for trial in trials.order_by("pk")[:20]:  # the first child trial whose run differs from its parent's twice
        screen.go(reverse("review:trial_compare", args=[trial.pk]))
        if differing.count() >= 2:
            break
    assert differing.count() >= 2
    ids = [differing.nth(i).get_attribute("id") for i in range(differing.count())]

    def current() -> list[Any]:
        return page.evaluate(
            """() => { const row = document.querySelector('table.compare tr.is-current');
                       const link = document.activeElement;
                       return [row && row.id, link && link.getAttribute('href'),
                               row ? row.getBoundingClientRect().top : -1]; }"""
        )

    # Not while the focus is on a control: n on the "compare with" drop-down moves nothing.
    page.focus("select[name=with]")
    screen.key("n")
    assert page.locator("table.compare tr.is-current").count() == 0
    screen.key("Escape")
    screen.key("n")
    row, focused, top = current()
    assert [row, focused] == [ids[0], f"#{ids[0]}"] and 0 <= top < 800
    screen.key("j")
    row, focused, top = current()
    assert [row, focused] == [ids[1], f"#{ids[1]}"] and 0 <= top < 800
    screen.key("p")
    assert current()[:2] == [ids[0], f"#{ids[0]}"]
    screen.key("?")
    overlay = page.locator("#keys-overlay")
    assert "Next difference" in overlay.inner_text() and "Previous difference" in overlay.inner_text()
    screen.key("Escape")
    screen.check()

    # Past the page's 100 rows: n goes on to the next page's first difference, p back, as a person expects.
    # 260 rows: nothing differs on page 1, row 180 on page 2, rows 251-260 (inserted) on page 3.
    _give_trajectory(_parent_trial_of(trial), _plain_steps(250))
    _give_trajectory(trial, _plain_steps(260, s180={"message": "a different thought"}))
    url = reverse("review:trial_compare", args=[trial.pk])
    screen.go(url)
    assert differing.count() == 0
    with page.expect_navigation():
        screen.key("n")
    page.wait_for_selector("table.compare tr.is-current")  # marked once the page has gone to the row
    assert page.url.endswith(f"{url}?page=2#pos-180") and current()[:2] == ["pos-180", "#pos-180"]
    with page.expect_navigation():
        screen.key("n")
    page.wait_for_selector("table.compare tr.is-current")
    assert page.url.endswith(f"{url}?page=3#pos-251") and current()[:2] == ["pos-251", "#pos-251"]
    screen.key("n")
    assert current()[:2] == ["pos-252", "#pos-252"]
    screen.key("p")
    with page.expect_navigation():
        screen.key("p")
    page.wait_for_selector("table.compare tr.is-current")
    assert page.url.endswith(f"{url}?page=2#pos-180") and current()[:2] == ["pos-180", "#pos-180"]
    screen.check()
