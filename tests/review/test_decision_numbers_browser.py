"""The candidate page labels a decided candidate's numbers "at decision" and the current estimate beside them,
in real Chromium (issue 39, item 2)."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from evolution.loop import load
from review.pages.candidate import interval_text
from tests.review.test_browser import Journey, browser  # noqa: F401 (the fixture)
from tests.review.test_decision_numbers import decided_then_remeasured

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_candidate_page_labels_the_numbers_at_decision_and_the_current_estimate(
    browser: Any,  # noqa: F811
    live_server: Any,
    make_user: Any,
) -> None:
    make_user("viewer", username="vera")
    decision, kept = decided_then_remeasured(check=False)
    now = load.candidate_delta(decision.candidate)
    assert now is not None and now.moved
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    journey = Journey(context.new_page(), live_server.url)
    journey.page.goto(live_server.url + "/login/")
    journey.page.fill("#id_username", "vera")
    journey.page.fill("#id_password", "pw-vera")
    journey.page.click("button[type=submit]")
    journey.page.wait_for_url(live_server.url + "/")
    journey.go(reverse("review:candidate", args=[decision.candidate_id]))
    results = journey.page.locator("section[aria-labelledby=results] p").first
    at_decision = interval_text(kept["dS"], kept["dS_low"], kept["dS_high"], kept["paired_tasks"], 0.95)
    current = interval_text(now.estimate.delta, now.estimate.low, now.estimate.high, now.estimate.pairs, 0.95)
    assert results.locator("strong").all_inner_texts() == ["At decision:", "Current estimate"]
    assert results.locator("[data-delta=at-decision]").inner_text().startswith(at_decision)
    assert results.locator("[data-delta=current]").inner_text().startswith(current)
    text = results.inner_text()
    assert f"At decision: {at_decision}" in text
    assert f"dC = {kept['dC'] * 100:+.1f}%" in text
    assert "Current estimate (the trials as measured now): " + current in text
    # The decision's own card shows the interval it kept, labelled.
    assert journey.page.get_by_text("lower end of dS's paired bootstrap interval, at decision").count() >= 1
    journey.shot("candidate-at-decision")
    assert journey.errors == []
    context.close()
