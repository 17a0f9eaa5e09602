"""Hidden characters as visible markers in escaped HTML.

Pure functions, no ORM. :mod:`evolution.hidden_chars` decides which
characters are hidden or look-alikes; this module only shows them: each
becomes ``<span class="uc uc-bidi" title="U+202E RIGHT-TO-LEFT OVERRIDE:
...">&lt;U+202E&gt;</span>`` and never reaches the page raw. Every other
piece of text goes through ``html.escape``; the marker's class comes from the
fixed kind names and its text from the code point, never from the content.
Where markup cannot go (an attribute, the page title, an option, a CSV
cell), ``reveal_text`` writes the label ``<U+202E>`` as plain text instead.
"""

from __future__ import annotations

import html
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from django.utils.safestring import SafeData, SafeString, mark_safe

from evolution import hidden_chars
from evolution.hidden_chars import Hit

_KIND_CLASS = {kind: "uc-" + kind.replace(" ", "-") for kind in hidden_chars.KINDS}


def marker_html(hit: Hit) -> str:
    """The marker standing in for one hidden character."""
    return f'<span class="uc {_KIND_CLASS[hit.kind]}" title="{html.escape(hit.title)}">{html.escape(hit.label)}</span>'


def escape_marked(text: str, hits: Sequence[Hit], start: int = 0, end: int | None = None) -> str:
    """``text[start:end]`` escaped, each character of ``hits`` (sorted by
    index, found in the whole ``text``) replaced by its marker."""
    end = len(text) if end is None else end
    first = bisect_left(hits, start, key=lambda hit: hit.index)
    out: list[str] = []
    cursor = start
    for hit in hits[first:]:
        if hit.index >= end:
            break
        out.append(html.escape(text[cursor : hit.index]))
        out.append(marker_html(hit))
        cursor = hit.index + 1
    out.append(html.escape(text[cursor:end]))
    return "".join(out)


def marked_spans(text: str, spans: Iterable[tuple[int, int]]) -> SafeString:
    """``text`` escaped, each of the ``spans`` (sorted, not overlapping) in
    ``<mark>``, and hidden characters (found in the whole text) as markers."""
    hits = hidden_chars.find(text) if hidden_chars.has_hidden(text) else []
    out: list[str] = []
    position = 0
    for start, end in spans:
        out.append(escape_marked(text, hits, position, start))
        out.append(f"<mark>{escape_marked(text, hits, start, end)}</mark>")
        position = end
    out.append(escape_marked(text, hits, position))
    return mark_safe("".join(out))  # every piece of the text went through html.escape


def reveal(value: object, *, fragment: bool = False) -> object:
    """``value`` for a template: unchanged when it holds nothing hidden (the
    template's autoescape handles it), else escaped HTML with markers.
    ``fragment``: the text was cut out of a line (see ``hidden_chars.find``).
    Already-safe HTML is returned as it is (its markup is not text)."""
    if value is None or isinstance(value, SafeData):
        return value
    text = str(value)
    if not hidden_chars.has_hidden(text, fragment=fragment):
        return value
    return mark_safe(escape_marked(text, hidden_chars.find(text, fragment=fragment)))  # escaped above


def reveal_text(text: str) -> str:
    """``text`` with each hidden character replaced by its label
    (``<U+202E>``) as plain text, for places that take no markup: an
    attribute, the page title, an ``<option>``, SVG text, a CSV cell. Not
    escaped: the template's autoescape, ``html.escape`` or the CSV writer
    does that. ``text`` itself when it holds nothing hidden."""
    if not hidden_chars.has_hidden(text):
        return text
    out: list[str] = []
    cursor = 0
    for hit in hidden_chars.find(text):
        out.append(text[cursor : hit.index])
        out.append(hit.label)
        cursor = hit.index + 1
    out.append(text[cursor:])
    return "".join(out)


def reveal_html(text: str) -> SafeString:
    """``text`` as escaped HTML with markers, always a SafeString."""
    hits = hidden_chars.find(text) if hidden_chars.has_hidden(text) else []
    return mark_safe(escape_marked(text, hits))  # every piece went through html.escape
