"""Page builders: one per screen, reads only.

A builder takes what the view parsed from the request (the user, a primary
key, query parameters already checked) and returns a frozen dataclass of
everything its template shows, formatted. Views parse, call one builder and
render (``Page.context``); the formatting helpers live beside the builder of
the page that shows them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlencode

from evolution.models import SplitName

# The order the pages list splits in.
SPLIT_ORDER = (SplitName.TRAIN, SplitName.GATE, SplitName.SEALED, SplitName.HELDOUT)
# An external evaluation's source is shown cut at this many characters.
SOURCE_SHOWN_CHARS = 300


class BadInput(Exception):
    """A request the page cannot show, which the user can fix; the view answers 400 with the message."""


@dataclass(frozen=True)
class Page:
    """What a template is rendered with: every field by name."""

    def context(self) -> dict[str, Any]:
        """The fields as a template context; a field that is itself a ``Page`` (a part a partial renders on its
        own) also gives its fields at the top level, as the whole page's template reads them."""
        context: dict[str, Any] = {}
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Page):
                context.update(value.context())
            context[field.name] = value
        return context


def external_source_text(source: Any, *, limit: int = SOURCE_SHOWN_CHARS) -> str:
    """An external evaluation's ``source`` as one line of JSON, cut at
    ``limit`` characters. Plain text: the templates escape it."""
    if not source:
        return "none given"
    text = json.dumps(source, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def query_url(base: str, **params: Any) -> str:
    """``base`` with the parameters that have a value as its query string."""
    kept = {key: value for key, value in params.items() if value not in (None, "")}
    return f"{base}?{urlencode(kept)}" if kept else base
