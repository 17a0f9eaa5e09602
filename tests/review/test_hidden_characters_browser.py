"""Hidden characters as a reviewer sees them, in real Chromium: each is a
visible marker in the diff and in a trajectory step, the warnings show, and
the line reads in the order it is stored (nothing reordered by bidi
controls). Screenshots go where the other browser tests put theirs."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from evolution import selectors
from evolution.models import Experiment
from review import diffs
from tests.review.test_browser import Journey, browser  # noqa: F401 (the fixture)
from tests.review.test_candidates import child
from tests.review.test_results import _child_trial, _give_trajectory, _plain_steps

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TROJAN = 'access = "user"\n/*\u202e } \u2066if (isAdmin)\u2069 \u2066 begin admins only */\n'


def login(journey: Journey, base_url: str, username: str) -> None:
    page = journey.page
    page.goto(base_url + "/")
    page.fill("#id_username", username)
    page.fill("#id_password", f"pw-{username}")
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")


def test_a_reviewer_sees_every_hidden_character_as_a_marker(
    browser: Any,  # noqa: F811 (the fixture imported above)
    live_server: Any,
    example_world: Experiment,
    make_user: Any,
) -> None:
    make_user("reviewer", username="rita")
    cand = child(
        selectors.experiment_seed(example_world), {"prompts/trojan.c": TROJAN, "prompts/zw.md": "is\u200bAdmin\n"}
    )
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    journey = Journey(context.new_page(), live_server.url)
    page = journey.page
    login(journey, live_server.url, "rita")

    journey.go(reverse("review:candidate_diff", args=[cand.pk]) + "?layout=unified")
    section = page.locator(f"#{diffs.file_anchor('prompts/trojan.c')}")
    banner = section.locator(".notice.hidden-chars")
    assert banner.is_visible()
    assert banner.inner_text().startswith("This file contains bidirectional Unicode text that may be interpreted")
    line = section.locator("tr.add td.code").nth(1)
    # Read in stored order, every control a marker: what the compiler sees.
    assert line.inner_text() == "/*<U+202E> } <U+2066>if (isAdmin)<U+2069> <U+2066> begin admins only */"
    marker = line.locator(".uc.uc-bidi").first
    assert marker.is_visible()
    box = marker.bounding_box()
    assert box is not None and box["width"] > 20 and box["height"] > 8
    # Its own text stays inside its box (a cell's text-indent must not shift it onto the code).
    inside = marker.evaluate(
        "m => { const r = document.createRange(); r.selectNodeContents(m); const t = r.getBoundingClientRect();"
        " const b = m.getBoundingClientRect(); return t.left >= b.left - 0.5 && t.right <= b.right + 0.5; }"
    )
    assert inside is True
    assert marker.get_attribute("title") == (
        "U+202E RIGHT-TO-LEFT OVERRIDE: bidirectional control: it can reorder how the text around it is shown"
    )
    # The marker is styled apart from the code around it.
    colours = marker.evaluate(
        "m => [getComputedStyle(m).backgroundColor, getComputedStyle(m.parentElement).backgroundColor]"
    )
    assert colours[0] != colours[1]
    zero = page.locator(f"#{diffs.file_anchor('prompts/zw.md')} tr.add td.code")
    assert zero.inner_text() == "is<U+200B>Admin"
    section.scroll_into_view_if_needed()
    journey.shot("20-hidden-characters-diff")

    trial = _child_trial(example_world)
    _give_trajectory(trial, _plain_steps(2, s2={"message": "All done.\u202e (admin mode on)"}))
    journey.go(reverse("review:trial", args=[trial.pk]))
    step = page.locator("#step-2")
    assert step.locator(".notice.hidden-chars").inner_text().startswith("This step contains bidirectional Unicode")
    assert step.locator(".msg pre").inner_text() == "All done.<U+202E> (admin mode on)"
    step.scroll_into_view_if_needed()
    journey.shot("21-hidden-characters-step")
    assert journey.errors == []
    context.close()
