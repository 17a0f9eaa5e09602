"""The API's permissions are the screens' (evolution.access): the same roles."""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from evolution import access


class CanView(BasePermission):
    """Authenticated, with the viewer permission (every role has it)."""

    message = f"you need the {access.VIEW} permission"

    def has_permission(self, request: Any, view: Any) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.has_perm(access.VIEW))


def requires(perm: str) -> type[BasePermission]:
    """A permission class: viewer, plus ``perm`` for unsafe methods (POST, PUT, PATCH, DELETE)."""

    class Requires(CanView):
        message = f"you need the {perm} permission"

        def has_permission(self, request: Any, view: Any) -> bool:
            if not super().has_permission(request, view):
                return False
            return request.method in ("GET", "HEAD", "OPTIONS") or request.user.has_perm(perm)

    Requires.__name__ = f"Requires_{perm.split('.')[-1]}"
    return Requires
