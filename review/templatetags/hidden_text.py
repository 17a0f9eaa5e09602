"""``{% load hidden_text %}``: show hidden characters as markers.

``{{ text|reveal }}`` is ``text`` escaped as usual, with every hidden or
look-alike character (``evolution.hidden_chars``) replaced by a visible
marker (``review.hidden``). Text with nothing hidden is returned untouched
for the template's autoescape; nothing here trusts the content.
"""

from __future__ import annotations

from django import template

from review import hidden

register = template.Library()


@register.filter
def reveal(value: object) -> object:
    return hidden.reveal(value)
