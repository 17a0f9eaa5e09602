"""The API's JSON parser: every request body goes through evolution.limits.

DRF's parser catches ValueError only: a body nested about 950 levels deep
made ``json.loads`` raise RecursionError, a 500 on every write endpoint.
Here the depth is checked before parsing (``RSI_MAX_INPUT_DEPTH``), and the
numbers too: DRF refuses NaN and Infinity, but Python reads 1e999 as
infinity, which no database stores as JSON. Either is a 400 with one line,
like any parse error. The body's size is Django's ``RSI_MAX_BODY_BYTES``
(a 413). Settings name this parser first in ``DEFAULT_PARSER_CLASSES``.
"""

from __future__ import annotations

import codecs
import math
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding  # type: ignore[attr-defined]  # DRF's; not in its stubs
from rest_framework.utils.json import strict_constant

from evolution import limits


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is too large for JSON's range")
    return value


def loads(text: str, *, strict: bool = True, what: str = "the JSON body") -> Any:
    """JSON text parsed within the input limits, refusing NaN and Infinity
    (when ``strict``) and numbers out of range; ValueError otherwise."""
    return limits.json_loads(text, what=what, parse_constant=strict_constant if strict else None, parse_float=_finite)


class LimitedJSONParser(JSONParser):
    """DRF's JSON parser with the depth limit and finite numbers."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        encoding = get_encoding(parser_context or {})
        try:
            return loads(codecs.getreader(encoding)(stream).read(), strict=self.strict)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc
