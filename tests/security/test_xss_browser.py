"""The XSS payloads of xss_world.py are inert in real Chromium: no script
runs (``window.__xss`` stays undefined), no ``javascript:`` link exists, and
the payload text is visible as text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.api.conftest import World
from tests.review.test_browser import Journey, browser  # noqa: F401  (fixture)
from tests.security.xss_world import SCRIPT, plant_xss

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_xss_payloads_are_inert_in_chromium(
    browser: Any,  # noqa: F811
    live_server: Any,
    api_world: World,
    make_user: Callable[..., User],
) -> None:
    user = make_user("admin", username="xena")
    world = plant_xss(api_world, user)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    journey = Journey(context.new_page(), live_server.url)
    page = journey.page
    page.goto(live_server.url + "/login/")
    page.fill("#id_username", "xena")
    page.fill("#id_password", "pw-xena")
    page.click("button[type=submit]")
    page.wait_for_url(live_server.url + "/")
    for path in world.pages():
        journey.go(path)
        page.wait_for_load_state("networkidle")
        assert page.evaluate("typeof window.__xss") == "undefined", path
        assert page.locator('a[href^="javascript:" i]').count() == 0, path
        assert page.locator("img[src=x]").count() == 0, path
        assert SCRIPT in page.inner_text("body"), f"{path}: the payload is not shown as text"
    # Fold-outs and partial loads of the steps page too.
    journey.go(f"/trials/{world.trial}/steps/")
    for summary in page.locator("details > summary").all()[:20]:
        summary.click()
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert not [e for e in journey.errors if "__xss" in e or "Content Security Policy" in e], journey.errors
    context.close()
