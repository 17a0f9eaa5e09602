"""The one classifier of hidden and look-alike characters (no database)."""

from __future__ import annotations

import unicodedata

import pytest

from evolution import hidden_chars as hc


def found(text: str, **kwargs: bool) -> list[tuple[str, str, int, int]]:
    return [(hit.code, hit.kind, hit.line, hit.column) for hit in hc.find(text, **kwargs)]


@pytest.mark.parametrize(
    ("char", "kind"),
    [
        ("\u202a", hc.BIDI),
        ("\u202b", hc.BIDI),
        ("\u202c", hc.BIDI),
        ("\u202d", hc.BIDI),
        ("\u202e", hc.BIDI),
        ("\u2066", hc.BIDI),
        ("\u2067", hc.BIDI),
        ("\u2068", hc.BIDI),
        ("\u2069", hc.BIDI),
        ("\u200e", hc.BIDI),
        ("\u200f", hc.BIDI),
        ("\u061c", hc.BIDI),
        ("\u200b", hc.ZERO_WIDTH),
        ("\u200c", hc.ZERO_WIDTH),
        ("\u200d", hc.ZERO_WIDTH),
        ("\u2060", hc.ZERO_WIDTH),
        ("\ufeff", hc.ZERO_WIDTH),
        ("\U000e0041", hc.TAG),
        ("\U000e0001", hc.TAG),
        ("\ufe01", hc.VARIATION),
        ("\U000e0100", hc.VARIATION),
        ("\x1b", hc.CONTROL),
        ("\x08", hc.CONTROL),
        ("\x85", hc.CONTROL),
        ("\u2028", hc.SEPARATOR),
        ("\u2029", hc.SEPARATOR),
        ("\u3164", hc.BLANK),
        ("\u00ad", hc.FORMAT),
        ("\u2062", hc.FORMAT),
        ("\u2065", hc.FORMAT),
    ],
)
def test_each_hidden_character_is_found_between_ascii_letters(char: str, kind: str) -> None:
    assert found(f"ab{char}cd") == [(f"U+{ord(char):04X}", kind, 1, 3)]


@pytest.mark.parametrize("text", ["plain ascii", "tab\tand\r\n", "café naïve Straße", "привет мир", "m² H₂O", "日本語"])
def test_ordinary_text_finds_nothing(text: str) -> None:
    assert hc.find(text) == []
    assert hc.has_hidden(text) is False


def test_every_format_character_of_unicode_is_a_candidate() -> None:
    """The fast first look must never miss a character the classifier
    would call hidden: every Cf and every non-whitespace control."""
    missed = [
        f"U+{code:04X}"
        for code in range(0x110000)
        if unicodedata.category(chr(code)) in ("Cf", "Cc")
        and chr(code) not in "\t\n\r"
        and not hc.CANDIDATE_RE.match(chr(code))
    ]
    assert missed == []


def test_trojan_source_line_reports_each_control_with_line_and_column() -> None:
    text = "ok = True\n/*\u202e } \u2066if (isAdmin)\u2069 \u2066 begin admins only */\n"
    assert found(text) == [
        ("U+202E", hc.BIDI, 2, 3),
        ("U+2066", hc.BIDI, 2, 7),
        ("U+2069", hc.BIDI, 2, 20),
        ("U+2066", hc.BIDI, 2, 22),
    ]


def test_byte_order_mark_is_hidden_except_at_the_start_of_a_file() -> None:
    assert found("\ufeffimport os", file_start=True) == []
    assert found("\ufeffimport os") == [("U+FEFF", hc.ZERO_WIDTH, 1, 1)]
    assert found("x\ufeffy", file_start=True) == [("U+FEFF", hc.ZERO_WIDTH, 1, 2)]


def test_look_alikes_inside_ascii_words_only() -> None:
    hits = hc.find("p\u0430ypal = \uff54oken; \u03bf\u03ba")
    assert [(hit.code, hit.kind, hit.looks_like, hit.column) for hit in hits] == [
        ("U+0430", hc.LOOK_ALIKE, "a", 2),
        ("U+FF54", hc.LOOK_ALIKE, "t", 10),
    ]
    assert hits[0].title == "U+0430 CYRILLIC SMALL LETTER A: looks like the ASCII 'a' in a word of ASCII letters"


def test_joiners_and_selectors_where_scripts_and_emoji_need_them() -> None:
    assert found("\U0001f468\u200d\U0001f469 family, \U0001f44d\ufe0f, 1\ufe0f\u20e3") == []
    assert found("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645") == []  # Persian: ZWNJ between letters
    assert found("is\u200dAdmin") == [("U+200D", hc.ZERO_WIDTH, 1, 3)]
    assert found("A\ufe0f") == [("U+FE0F", hc.VARIATION, 1, 2)]


def test_summary_uses_the_code_hosts_words_for_bidi_text() -> None:
    summary = hc.summarize(hc.find("a\u202eb\u202ec\u200bd"))
    assert summary is not None
    assert summary.bidi is True
    assert summary.total == 3
    assert summary.message("file") == (
        "This file contains bidirectional Unicode text that may be interpreted or compiled differently than "
        "what appears below. 3 characters: 2 × U+202E (bidi), 1 × U+200B (zero-width). Each is shown as a "
        "marker such as <U+202E>; hover a marker for its name."
    )
    other = hc.summarize(hc.find("a\u200bb"))
    assert other is not None and other.headline == "This text contains hidden or look-alike Unicode characters."
    assert hc.summarize([]) is None


def test_introduced_counts_the_net_increase_per_code_point() -> None:
    # A line moved with its zero-width space adds nothing; a new RLO does.
    added = [(3, "x = 1\u200b"), (7, "# note \u202e")]
    removed = [(9, "x = 1\u200b")]
    result = hc.introduced(added, removed)
    assert [(a.line, a.hit.code, a.evidence) for a in result] == [
        (7, "U+202E", "U+202E RIGHT-TO-LEFT OVERRIDE (bidi) on line 7, column 8")
    ]
    assert hc.introduced([(1, "\ufeffimport os")], []) == []
    assert hc.introduced([(None, "pr\u200bompts/a.md")], [])[0].evidence == (
        "U+200B ZERO WIDTH SPACE (zero-width) in the file name"
    )


def test_bytes_hidden_skips_binary_and_decodes_text() -> None:
    assert hc.bytes_hidden(b"\xff\xfe\x00binary") == []
    assert hc.bytes_hidden(b"plain\n") == []
    assert [hit.code for hit in hc.bytes_hidden("a\u202eb".encode())] == ["U+202E"]
    assert [hit.code for hit in hc.bytes_hidden(b"a\x1bb")] == ["U+001B"]
