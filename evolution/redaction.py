"""Redact secrets from trajectories before they are stored.

Pure: no ORM, no I/O. ``redact(value)`` walks nested JSON (dicts, lists,
strings) and replaces each secret it recognizes with ``[REDACTED:<kind>]``,
returning the cleaned copy and a count per kind. Dictionary keys are kept;
numbers, booleans and null pass through.

The patterns are deliberately specific (a known prefix and a minimum
length of key material), so prose that merely resembles a key ("task-sk-1",
a lone "AKIA") is kept. Redacting an already-redacted value finds nothing
more, so importing twice counts nothing twice.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

PLACEHOLDER = "[REDACTED:{kind}]"

KINDS = (
    "private_key",
    "bearer_token",
    "anthropic_api_key",
    "openai_api_key",
    "aws_access_key_id",
    "aws_secret_access_key",
    "github_token",
    "slack_token",
    "google_api_key",
    "url_password",
)


def _has_digit_and_letter(text: str) -> bool:
    return any(c.isdigit() for c in text) and any(c.isalpha() for c in text)


def _looks_random(text: str) -> bool:
    """Key material: digits, lower- and upper-case letters (prose hyphenated words are not)."""
    return _has_digit_and_letter(text) and any(c.islower() for c in text) and any(c.isupper() for c in text)


# (kind, pattern, group whose text is the secret, predicate on that text).
# Order matters: a private key block may contain anything; sk-ant- before sk-.
_RULES: tuple[tuple[str, re.Pattern[str], int, Callable[[str], bool] | None], ...] = (
    (
        "private_key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
            r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|[\s\S]*\Z)"
        ),
        0,
        None,
    ),
    (
        "bearer_token",
        re.compile(r"(?i)\bauthorization\b[\"']?\s*[:=]\s*[\"']?\s*bearer\s+([A-Za-z0-9\-._~+/]{8,}=*)"),
        1,
        None,
    ),
    # A bare "Bearer <token>" (a header value on its own): only token-like material.
    ("bearer_token", re.compile(r"\bBearer\s+([A-Za-z0-9\-._~+/]{20,}=*)"), 1, _has_digit_and_letter),
    ("anthropic_api_key", re.compile(r"(?<![A-Za-z0-9_\-])sk-ant-[A-Za-z0-9_\-]{20,}"), 0, None),
    (
        "openai_api_key",
        re.compile(r"(?<![A-Za-z0-9_\-])sk-(?:proj-|svcacct-|admin-)?([A-Za-z0-9_\-]{20,})"),
        0,
        lambda key: _looks_random(key.split("-", 1)[1]),
    ),
    ("aws_access_key_id", re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"), 0, None),
    (
        "aws_secret_access_key",
        re.compile(r"(?i)\baws_secret_access_key\b[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"),
        1,
        None,
    ),
    ("github_token", re.compile(r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{36,}(?![A-Za-z0-9_])"), 0, None),
    ("github_token", re.compile(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{22,}"), 0, None),
    ("slack_token", re.compile(r"(?<![A-Za-z0-9_\-])xox[abposr]-[A-Za-z0-9\-]{10,}"), 0, _has_digit_and_letter),
    ("google_api_key", re.compile(r"(?<![A-Za-z0-9_\-])AIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])"), 0, None),
    # ?password=... (or &passwd=, ;pwd=) in a URL query.
    ("url_password", re.compile(r"(?i)[?&;](?:password|passwd|pwd|pass)=([^&#\s\"'<>]+)"), 1, None),
    # scheme://user:password@host
    ("url_password", re.compile(r"(?i)\b[a-z][a-z0-9+.\-]*://[^/\s:@\"']+:([^@/\s\"']+)@"), 1, None),
)


# Something every rule above needs in the text it matches, lower-cased (so a
# superset): a string holding none of these holds no secret, and a few
# substring searches spare it the thirteen substitutions.
_TRIGGERS: tuple[str, ...] = ("-----begin", "bearer", "sk-", "akia", "asia", "aws_secret_access_key", "github_pat_")
_TRIGGERS += ("xox", "aiza", "pass", "pwd", "://")
_GITHUB_PREFIX = re.compile(r"gh[pousr]_")


# The two non-ASCII letters a case-insensitive rule matches to an ASCII one
# but whose lower case is not it: DOTLESS I ("i") and LONG S ("s").
_CASE_FOLDS = str.maketrans({"\u0131": "i", "\u017f": "s"})


def _maybe_secret(text: str) -> bool:
    lowered = text.lower()
    if not lowered.isascii():
        lowered = lowered.translate(_CASE_FOLDS)
    return any(trigger in lowered for trigger in _TRIGGERS) or (
        "gh" in lowered and _GITHUB_PREFIX.search(lowered) is not None
    )


def _is_placeholder(text: str) -> bool:
    return text.startswith("[REDACTED:")


def redact_text(text: str) -> tuple[str, Counter[str]]:
    """``text`` with every recognized secret replaced, and the count per kind."""
    counts: Counter[str] = Counter()
    if not _maybe_secret(text):
        return text, counts
    for kind, pattern, group, predicate in _RULES:

        def replace(match: re.Match[str], kind: str = kind, group: int = group, predicate: Any = predicate) -> str:
            secret = match.group(group)
            if _is_placeholder(secret) or (predicate is not None and not predicate(secret)):
                return match.group(0)
            counts[kind] += 1
            start, end = match.start(group) - match.start(0), match.end(group) - match.start(0)
            whole = match.group(0)
            return whole[:start] + PLACEHOLDER.format(kind=kind) + whole[end:]

        text = pattern.sub(replace, text)
    return text, counts


# The only non-ASCII characters a case-insensitive rule matches to an ASCII
# letter (KELVIN SIGN "k", LATIN CAPITAL LETTER I WITH DOT ABOVE and DOTLESS
# I "i", LONG S "s"), as ``json.dumps`` escapes them: ASCII JSON text without
# them holds a trigger wherever ``_maybe_secret`` would see one in a string of it.
_ASCII_LOWERING_ESCAPES = ("\\u212a", "\\u0130", "\\u0131", "\\u017f")


def _maybe_secret_in_json(text: str) -> bool:
    """``_maybe_secret`` of any string inside ``text``, JSON in ASCII (a superset)."""
    return _maybe_secret(text) or any(escape in text for escape in _ASCII_LOWERING_ESCAPES)


def redact(value: Any, *, ascii_json: str | None = None) -> tuple[Any, dict[str, int]]:
    """A copy of the JSON value ``value`` with secrets redacted, and {kind: count}
    (only kinds that occurred, sorted by kind). When its JSON text shows
    nothing any rule could match, ``value`` itself is returned, unchanged:
    walking every string of a long trajectory costs more than storing it.

    ``ascii_json``, when given, must be ``json.dumps(value)`` (ASCII, the
    default): a caller that has it spares dumping the value again.
    """
    text = ascii_json
    if text is None:
        try:
            text = json.dumps(value, check_circular=False)
        except (TypeError, ValueError, RecursionError):
            text = None
    # ASCII text rather than the characters themselves: lower-casing and
    # searching a non-ASCII string of 70 KB costs as much as dumping it.
    # JSON escaping never touches the characters of a trigger, so a trigger
    # inside any string or key is still one in the whole text.
    if text is not None and not _maybe_secret_in_json(text):
        return value, {}
    counts: Counter[str] = Counter()

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            cleaned, found = redact_text(item)
            counts.update(found)
            return cleaned
        if isinstance(item, dict):
            return {key: walk(child) for key, child in item.items()}
        if isinstance(item, list | tuple):
            return [walk(child) for child in item]
        return item

    cleaned = walk(value)
    return cleaned, dict(sorted(counts.items()))
