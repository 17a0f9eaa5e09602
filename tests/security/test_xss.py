"""XSS payloads in diffs, task text, trajectories and annotations are
rendered as text: escaped in the HTML (here) and inert in Chromium
(test_xss_browser.py)."""

from __future__ import annotations

import html
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.api.conftest import World
from tests.security.xss_world import FILE_NAME, IMG, PAYLOAD, SCRIPT, plant_xss

pytestmark = pytest.mark.django_db


def test_payloads_are_escaped_on_every_page(api_world: World, make_user: Callable[..., User]) -> None:
    user = make_user("admin", username="xavier")
    world = plant_xss(api_world, user)
    client = Client()
    client.force_login(user)
    shown: dict[str, bool] = {}
    for path in world.pages():
        response = client.get(path)
        assert response.status_code == 200, path
        body = response.content.decode()
        assert SCRIPT not in body, path
        assert IMG not in body, path
        assert 'href="javascript:' not in body.lower(), path
        shown[path] = html.escape(SCRIPT, quote=False) in body or html.escape(SCRIPT) in body
    # The payload is there as text on the pages that show the planted fields.
    assert all(shown.values()), shown
    diff = client.get(f"/candidates/{world.candidate}/diff/").content.decode()
    assert html.escape(FILE_NAME) in diff or html.escape(FILE_NAME, quote=False) in diff
    steps = client.get(f"/trials/{world.trial}/steps/").content.decode()
    assert steps.count("window.__xss=1") >= 3  # message, tool call arguments, observation
    assert "&lt;script&gt;" in steps and PAYLOAD not in steps
