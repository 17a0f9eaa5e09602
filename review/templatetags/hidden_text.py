"""``{% load hidden_text %}``: show hidden characters as markers.

``{{ text|reveal }}`` (``reveal_matched`` for a flag's matched text) is ``text`` escaped as usual, with every hidden or
look-alike character (``evolution.hidden_chars``) replaced by a visible
marker (``review.hidden``). Text with nothing hidden is returned untouched
for the template's autoescape; nothing here trusts the content.

``{{ text|reveal_text }}`` is for places that take no markup (an attribute,
the page title, an ``<option>``, SVG text): each such character becomes the
plain text ``<U+202E>``, which autoescape then escapes like the rest.
"""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeData

from review import hidden

register = template.Library()


@register.filter
def reveal(value: object) -> object:
    return hidden.reveal(value)


@register.filter
def reveal_matched(value: object) -> object:
    """``reveal`` for text a flag matched inside a line: a look-alike standing
    alone there ("а") lost the ASCII word around it, and is marked anyway."""
    return hidden.reveal(value, fragment=True)


@register.filter
def reveal_text(value: object) -> object:
    """``reveal`` without markup, for attributes, titles and options.
    Already-safe HTML is returned as it is (its markup is not text)."""
    if value is None or isinstance(value, SafeData):
        return value
    text = str(value)
    shown = hidden.reveal_text(text)
    return value if shown == text else shown
