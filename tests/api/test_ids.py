"""Every API route with an id in its path answers 404 for an id that is not
one (not a number, negative, beyond any integer column), never a 500.

The routes are read from the URL patterns, so a route added later is covered
without touching this file."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from api import v1

pytestmark = pytest.mark.django_db

METHODS = ("get", "post", "put", "patch", "delete")
# The one plain function among the patterns: it dispatches a GET and a POST (api/v1.py).
FUNCTION_VIEW_METHODS = {"trial_trajectory": ("get", "post")}
NOT_IDS = ("abc", "-1", "99999999999999999999")


def _methods(callback: Any) -> tuple[str, ...]:
    if getattr(callback, "actions", None):  # a viewset's route: its method -> action map
        return tuple(callback.actions)
    view_class = getattr(callback, "view_class", None)
    if view_class is not None:
        return tuple(method for method in METHODS if hasattr(view_class, method))
    return FUNCTION_VIEW_METHODS[callback.__name__]


def _routes() -> Iterator[tuple[str, str]]:
    """(method, path) for every route of /api/v1/ with a ``pk``, the id written ``{id}``."""
    for pattern in v1.urlpatterns:
        if "pk" not in pattern.pattern.regex.groupindex:
            continue
        route = str(pattern.pattern).removeprefix("^").removesuffix("$")
        route = re.sub(r"\(\?P<pk>[^)]*\)|<(?:\w+:)?pk>", "{id}", route).replace("(?P<path>.+)", "README.md")
        for method in _methods(pattern.callback):
            yield method, f"/api/v1/{route}"


ROUTES = sorted(set(_routes()))


def test_the_routes_include_the_candidate_actions_that_gave_500s() -> None:
    """The premise of the test below: the routes really are read from the patterns."""
    assert {
        ("get", "/api/v1/candidates/{id}/diff/"),
        ("get", "/api/v1/candidates/{id}/tree/"),
        ("post", "/api/v1/candidates/{id}/evaluate/"),
        ("post", "/api/v1/trials/{id}/trajectory/"),
        ("delete", "/api/v1/annotations/{id}/"),
    } <= set(ROUTES)
    assert len(ROUTES) == 25


@pytest.mark.parametrize("not_id", NOT_IDS)
@pytest.mark.parametrize(("method", "route"), ROUTES, ids=[f"{method} {route}" for method, route in ROUTES])
def test_a_route_with_an_id_answers_404_for_an_id_that_is_not_one(
    method: str, route: str, not_id: str, make_user: Callable[..., User]
) -> None:
    client = APIClient(raise_request_exception=False)
    # Every permission, so that no route refuses (403) before it looks the id up.
    client.force_authenticate(make_user("admin", username="ada"))
    response = getattr(client, method)(route.format(id=not_id), {}, format="json")
    assert response.status_code == 404, response.content[:300]
    assert response["Content-Type"] == "application/json"  # the API's 404, not the site's page
    assert list(response.json()) == ["detail"]
