from __future__ import annotations

from rest_framework.pagination import CursorPagination


class Cursor(CursorPagination):
    """Stable cursor pages by primary key (newest last); ``page_size`` up to 500."""

    ordering = "pk"
    page_size_query_param = "page_size"
    max_page_size = 500
