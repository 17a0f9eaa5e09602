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


def test_introduced_excuses_only_lines_moved_intact() -> None:
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


def test_a_hidden_character_moved_to_another_line_is_introduced() -> None:
    # The file keeps one RLO, but it now reorders another line.
    removed = [(1, "ok = True  # \u202e note"), (2, "if user.isAdmin:")]
    added = [(1, "ok = True  # note"), (2, "if user.\u202eisAdmin:")]
    assert [(a.line, a.hit.code, a.hit.column) for a in hc.introduced(added, removed)] == [(2, "U+202E", 9)]


def test_bytes_hidden_reads_the_decodable_text_of_binary_data() -> None:
    data = "a\u202eb\n".encode() + b"#\xff\x00\n"
    hits = hc.bytes_hidden(data)
    assert [(hit.code, hit.kind, hit.line, hit.column, hit.name) for hit in hits] == [
        ("U+202E", hc.BIDI, 1, 2, "RIGHT-TO-LEFT OVERRIDE"),
        ("0xFF", hc.NOT_UTF8, 2, 2, "UNDECODABLE BYTE"),
        ("U+0000", hc.CONTROL, 2, 3, "NULL"),
    ]
    assert hits[1].label == "<0xFF>"
    assert hits[1].title == "0xFF UNDECODABLE BYTE: a byte that is not UTF-8: the file is not valid text"
    assert hc.bytes_hidden(b"plain\n") == []
    assert [hit.code for hit in hc.bytes_hidden(b"a\x1bb")] == ["U+001B"]


def test_storable_replaces_nul_and_undecodable_bytes() -> None:
    text = hc.decode(b"ok\x00\xff \xe2\x80\xae.")
    assert text == "ok\x00\udcff \u202e."
    assert hc.storable(text) == "ok\ufffd\ufffd \u202e."
    assert hc.storable(text).encode("utf-8") == b"ok\xef\xbf\xbd\xef\xbf\xbd \xe2\x80\xae."
    assert hc.storable("plain") == "plain"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\u13aadmin", [("U+13AA", hc.LOOK_ALIKE, 1, "")]),  # Cherokee GO: "A"
        ("\ua4eedmin", [("U+A4EE", hc.LOOK_ALIKE, 1, "")]),  # Lisu A
        ("p\u2c9fst", [("U+2C9F", hc.LOOK_ALIKE, 2, "")]),  # Coptic small O
        ("l\U000104eag", [("U+104EA", hc.LOOK_ALIKE, 2, "")]),  # Osage small O
        ("\u1d00dmin", [("U+1D00", hc.LOOK_ALIKE, 1, "a")]),  # small capital A
        ("\u01c0ogin", [("U+01C0", hc.LOOK_ALIKE, 1, "l")]),  # dental click
        ("user\u0661", [("U+0661", hc.LOOK_ALIKE, 5, "1")]),  # Arabic-Indic one
        ("v\u09e6", [("U+09E6", hc.LOOK_ALIKE, 2, "0")]),  # Bengali zero
        ("x = 1\u037e", [("U+037E", hc.LOOK_ALIKE, 6, ";")]),  # Greek question mark
        ("etc\u2215passwd", [("U+2215", hc.LOOK_ALIKE, 4, "/")]),  # division slash
        ("pass\u2800word", [("U+2800", "no glyph", 5, "")]),  # blank Braille pattern
        ("admin\ufffc", [("U+FFFC", "no glyph", 6, "")]),  # object replacement
        ("ex\ue000ec", [("U+E000", "no glyph", 3, "")]),  # private use
        ("ab\u0378cd", [("U+0378", "no glyph", 3, "")]),  # unassigned
    ],
)
def test_look_alikes_and_glyphless_code_points_of_other_scripts_inside_ascii_words(
    text: str, expected: list[tuple[str, str, int, str]]
) -> None:
    assert [(hit.code, hit.kind, hit.column, hit.looks_like) for hit in hc.find(text)] == expected


def test_a_word_nfkc_folds_to_ascii_is_a_look_alike_though_it_has_no_ascii_letter() -> None:
    # Python folds identifiers with NFKC: this line runs exec(payload).
    hits = hc.find("\U0001d41e\U0001d431\U0001d41e\U0001d41c(payload)")
    assert [(hit.code, hit.looks_like, hit.column) for hit in hits] == [
        ("U+1D41E", "e", 1),
        ("U+1D431", "x", 2),
        ("U+1D41E", "e", 3),
        ("U+1D41C", "c", 4),
    ]
    assert [hit.looks_like for hit in hc.find("\uff45\uff58\uff45\uff43(x)")] == ["e", "x", "e", "c"]


@pytest.mark.parametrize(
    "text",
    [
        "Le c\u0153ur a ses raisons que la raison ne conna\u00eet point ; "
        "na\u00efve fa\u00e7ade, \u00ab d\u00e9j\u00e0 \u00bb.",
        "\u0397 \u03b3\u03c1\u03ae\u03b3\u03bf\u03c1\u03b7 \u03ba\u03b1\u03c6\u03ad "
        "\u03b1\u03bb\u03b5\u03c0\u03bf\u03cd "
        "\u03c0\u03b7\u03b4\u03ac\u03b5\u03b9\u037e \u039d\u03b1\u03b9, \u0391\u0392\u0393.",
        "\u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 "
        "\u0431\u0443\u043b\u043e\u043a, API-\u043a\u043b\u044e\u0447.",
        "\u4f7f\u7528Python\u5f00\u53d1\uff0c\u7136\u540e\u90e8\u7f72\uff08\u751f\u4ea7\uff09\uff1a\u5b8c\u6210\uff01",
        "PC\u3092\u4f7f\u3046\u3002\u4fa1\u683c\u306f\uff11\uff12\uff13\u5186\u3067\u3059\u3002 "
        "\uff12\uff10\uff12\uff14",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8API\ub97c \uc0ac\uc6a9",
        "\U0001f44d\U0001f3fd ok \U0001f389 1\ufe0f\u20e3 \U0001f468\u200d\U0001f469\u200d\U0001f467 done\u2705",
        "10\u03bcs, \u0394t = 5 ms, m\u00b2, H\u2082O, x\u22121, 50 \u00b0C, "
        "\u201cquoted\u201d \u2014 wait\u2026 it\u2019s",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0967\u0968\u0969",
    ],
)
def test_generic_text_in_ordinary_languages_is_not_a_look_alike(text: str) -> None:
    assert hc.find(text) == []
