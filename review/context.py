"""Template context for every page: what the signed-in user may do."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from evolution import access as rules


def access(request: HttpRequest) -> dict[str, Any]:
    """``can.view``, ``can.review``, ``can.operate``, ``can.annotate`` and
    ``can.sealed`` for the templates (permissions are cached per request)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"can": {}}
    return {
        "can": {
            "view": user.has_perm(rules.VIEW),
            "review": user.has_perm(rules.REVIEW),
            "operate": user.has_perm(rules.OPERATE),
            "annotate": user.has_perm(rules.ANNOTATE),
            "sealed": user.has_perm(rules.SEALED),
        }
    }
