"""Fixtures of the security tests, shared with the screens' and the API's tests:
``api_world`` (a tiny evaluated experiment whose sealed trial, trajectory and
flag evidence carry ``tests.api.conftest.CANARY``), ``make_user`` and
``client_as`` of the screens' tests."""

from __future__ import annotations

from tests.api.conftest import api_world, api_world_rows  # noqa: F401  (fixtures)
from tests.review.conftest import client_as, make_user  # noqa: F401  (fixtures)
