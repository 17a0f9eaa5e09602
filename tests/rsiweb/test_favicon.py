"""The site icon at /favicon.ico, which browsers ask for on pages that name
none (the admin's): a redirect to the review screens' icon, not a 404."""

from __future__ import annotations

from django.test import Client
from django.urls import reverse


def test_favicon_ico_redirects_to_the_icon() -> None:
    response = Client().get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("review/favicon.svg")
    assert reverse("favicon") == "/favicon.ico"
