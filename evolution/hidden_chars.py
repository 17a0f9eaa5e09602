"""Hidden and look-alike characters: what a reader cannot see in a text.

Pure functions and dataclasses, standard library only (``unicodedata``). The
screens, the leakage critic and the surface check share this one definition,
so what a reviewer sees marked is exactly what the critic flags and what a
surface with ``refuse_hidden_characters`` refuses.

A character is *hidden* when it changes how text is read or run without
showing itself (the "Trojan Source" attacks, CVE-2021-42574 and -42694):

- ``bidi``: the bidirectional controls U+202A-U+202E, U+2066-U+2069, the
  marks U+200E, U+200F and U+061C; they reorder the text shown around them,
  so a line that reads as a comment can hold code;
- ``zero-width``: U+200B-U+200D, U+2060, U+180E and U+FEFF (a byte order
  mark is left alone at the very start of a file, where editors write it and
  compilers skip it; anywhere else it is hidden);
- ``tag``: the tag characters U+E0000-U+E007F (invisible ASCII "smuggling");
- ``variation selector``: U+FE00-U+FE0F, U+E0100-U+E01EF and the Mongolian
  ones, except U+FE0E/U+FE0F right after a symbol (how emoji are written)
  or in a keycap sequence;
- ``control``: C0 and C1 control characters other than tab, line feed and
  carriage return (escape sequences, backspace, NEL);
- ``line separator``: U+2028 and U+2029, a line break for some tools and
  none for others;
- ``blank``: fillers that draw nothing (Hangul fillers, U+034F, U+17B4/5);
- ``format``: every other format character (Unicode category Cf, such as
  the soft hyphen U+00AD or the invisible operators U+2061-U+2064) and the
  remaining default-ignorable code points.

Zero-width joiners and non-joiners between two non-ASCII letters (Persian,
Indic scripts) or two symbols (emoji sequences) are how those scripts are
written and are not hidden; next to ASCII they are.

A character is a *look-alike* (``look-alike``) when it stands inside a word
that also holds ASCII letters and looks like an ASCII letter or digit: a
compatibility form that NFKC folds to ASCII (fullwidth ``ｔ``, mathematical
``𝐚``), one of the common Greek and Latin homoglyphs listed in
``LOOK_ALIKES``, a small capital (``ᴀ``), a click letter (``ǀ``), a digit
of another script (``١``), or any letter of the scripts built from Latin or
Greek shapes (``HOMOGLYPH_SCRIPTS``: Cyrillic, Armenian, Cherokee, Lisu,
Coptic, Osage), whose letters have no business inside an ASCII word. A word
with no ASCII letter is a look-alike too when NFKC folds it whole to an
ASCII word (``𝐞𝐱𝐞𝐜`` is ``exec`` to Python, which folds identifiers so).
A punctuation look-alike (the Greek question mark U+037E for ``;``, the
division slash U+2215 for ``/``) counts when it touches an ASCII letter or
digit. Words written wholly in another script (a Greek or Russian sentence,
CJK text) are left alone, and so are fullwidth punctuation and ``μs``.

Two kinds are about what a reader's font shows rather than hidden meaning:
``no glyph`` (U+2800 BRAILLE PATTERN BLANK, U+FFFC OBJECT REPLACEMENT
CHARACTER, private-use and unassigned code points) when one touches an
ASCII letter or digit, and ``not UTF-8``: a file that is not valid UTF-8 is
read with each byte that is not (``0xFF``) kept as Python's surrogate escape
U+DC80-U+DCFF (:func:`decode`), so its decodable text is checked like any
text and each such byte is itself reported (a NUL byte is a ``control``).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from evolution.gitdiff import FileChange

BIDI = "bidi"
ZERO_WIDTH = "zero-width"
TAG = "tag"
VARIATION = "variation selector"
CONTROL = "control"
SEPARATOR = "line separator"
BLANK = "blank"
FORMAT = "format"
LOOK_ALIKE = "look-alike"
NO_GLYPH = "no glyph"
NOT_UTF8 = "not UTF-8"
KINDS = (BIDI, ZERO_WIDTH, TAG, VARIATION, CONTROL, SEPARATOR, BLANK, FORMAT, LOOK_ALIKE, NO_GLYPH, NOT_UTF8)

KIND_WORDS = {
    BIDI: "bidirectional control: it can reorder how the text around it is shown",
    ZERO_WIDTH: "zero-width character: it takes no space",
    TAG: "tag character: invisible, it can carry hidden text",
    VARIATION: "variation selector: invisible, it can carry hidden data",
    CONTROL: "control character: not shown in a browser",
    SEPARATOR: "line or paragraph separator: some tools break the line here, others do not",
    BLANK: "filler character: it draws nothing",
    FORMAT: "invisible formatting character",
    LOOK_ALIKE: "looks like an ASCII character in a word of ASCII letters",
    NO_GLYPH: "no glyph of its own (blank, placeholder, private use, unassigned): a font shows anything or nothing",
    NOT_UTF8: "a byte that is not UTF-8: the file is not valid text",
}

BIDI_CHARS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
ZERO_WIDTH_CHARS = frozenset("\u180e\u200b\u200c\u200d\u2060\ufeff")
BOM = "\ufeff"
JOINERS = frozenset("\u200c\u200d")
EMOJI_SELECTORS = frozenset("\ufe0e\ufe0f")
KEYCAP = "\u20e3"
BLANK_CHARS = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0")

# Every candidate in one class, for a fast first look: the C0/C1 controls
# but tab, LF and CR, every format (Cf) character of Unicode 14 and the other
# default-ignorable code points. A test checks it against unicodedata.
_CANDIDATES = (
    "\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164"
    "\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff"
    # Lone surrogates: only a byte that is not UTF-8, surrogate-escaped by decode(), puts one in a str.
    "\ud800-\udfff"
)
CANDIDATE_RE = re.compile(f"[{_CANDIDATES}]")
_CANDIDATE_BYTES_RE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_WORD_RE = re.compile(r"\w+")
# Characters that are not word characters but can stand inside an ASCII word
# unseen or as something else: punctuation look-alikes and code points
# without a glyph (blank Braille, object placeholder, private use, unassigned).
_NON_WORD_RE = re.compile(r"[^\w\s\x00-\x7f]")

# Look-alikes of ASCII letters that NFKC leaves alone (Unicode's
# confusables.txt, the common Cyrillic, Greek and Armenian entries).
LOOK_ALIKES: dict[str, str] = {
    # Cyrillic
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ј": "j",
    "ԁ": "d", "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ү": "y", "ь": "b",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T",
    "Х": "X", "У": "Y", "І": "I", "Ј": "J", "Ѕ": "S", "Ԛ": "Q", "Ԝ": "W", "Ӏ": "I", "Ү": "Y",
    # Greek
    "α": "a", "ο": "o", "ν": "v", "ι": "i", "κ": "k", "ρ": "p", "υ": "u", "χ": "x", "ϲ": "c", "ϳ": "j",
    "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M", "Ν": "N", "Ο": "O",
    "Ρ": "P", "Τ": "T", "Υ": "Y", "Χ": "X",
    # Armenian
    "օ": "o", "ս": "u", "հ": "h", "ո": "n", "ց": "g",
    # Latin letters outside ASCII that read as ASCII ones
    "ı": "i", "ɑ": "a", "ɡ": "g", "ʏ": "y", "ȷ": "j",
}  # fmt: skip

# Scripts (the first word of a character's Unicode name) whose letters were
# drawn from Latin or Greek ones: any of them inside an ASCII word is taken
# for a look-alike. Greek is not here: "μs" and "Δt" are ordinary.
HOMOGLYPH_SCRIPTS = frozenset({"CYRILLIC", "ARMENIAN", "CHEROKEE", "LISU", "COPTIC", "OSAGE"})
# Punctuation that passes for ASCII punctuation and NFKC leaves alone
# (U+037E GREEK QUESTION MARK is folded to ";" by NFKC, so it needs no entry).
PUNCTUATION_LOOK_ALIKES: dict[str, str] = {
    "\u2215": "/",  # DIVISION SLASH
    "\u2216": "\\",  # SET MINUS
    "\u2236": ":",  # RATIO
    "\u01c3": "!",  # LATIN LETTER RETROFLEX CLICK
    "\u201a": ",",  # SINGLE LOW-9 QUOTATION MARK
}
NO_GLYPH_CHARS = frozenset("\u2800\ufffc")


@dataclass(frozen=True)
class Hit:
    """One hidden or look-alike character: ``index`` in the text scanned,
    1-based ``line`` and ``column`` (in characters) in that text."""

    index: int
    char: str
    kind: str
    line: int = 1
    column: int = 1
    looks_like: str = ""

    @property
    def code(self) -> str:
        """``U+202E``; a byte that is not UTF-8 is shown as the byte, ``0xFF``."""
        escaped = _escaped_byte(self.char)
        return f"0x{escaped:02X}" if escaped is not None else f"U+{ord(self.char):04X}"

    @property
    def name(self) -> str:
        return char_name(self.char)

    @property
    def label(self) -> str:
        """What is shown instead of the character: ``<U+202E>``."""
        return f"<{self.code}>"

    @property
    def title(self) -> str:
        """The marker's tooltip: code point, name and what it does."""
        words = KIND_WORDS[self.kind]
        if self.looks_like:
            words = f"looks like the ASCII {self.looks_like!r} in a word of ASCII letters"
        return f"{self.code} {self.name}: {words}"

    @property
    def evidence(self) -> str:
        return f"{self.code} {self.name} ({self.kind}) at line {self.line}, column {self.column}"


def _escaped_byte(char: str) -> int | None:
    """The byte a surrogate escape stands for (``decode``), or None."""
    code = ord(char)
    return code - 0xDC00 if 0xDC80 <= code <= 0xDCFF else None


def decode(data: bytes) -> str:
    """The decodable text of file contents: UTF-8, each byte that is not
    UTF-8 kept as a lone surrogate U+DC80-U+DCFF (``surrogateescape``), so
    nothing is lost and :func:`find` reports every such byte. Such a str
    cannot be encoded or stored as it is: see :func:`storable`."""
    return data.decode("utf-8", "surrogateescape")


def storable(text: str) -> str:
    """``text`` with NUL and lone surrogates (bytes that were not UTF-8)
    replaced by U+FFFD, so a database and a UTF-8 encoder accept it."""
    if text.isascii() and "\0" not in text:
        return text
    return _UNSTORABLE_RE.sub("\ufffd", text)


_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")


def char_name(char: str) -> str:
    name = unicodedata.name(char, "")
    if name:
        return name
    if char == "\0":
        return "NULL"
    category = unicodedata.category(char)
    if category == "Cc":
        return "CONTROL CHARACTER"
    if category == "Cs":
        return "UNDECODABLE BYTE" if _escaped_byte(char) is not None else "LONE SURROGATE"
    if category == "Co":
        return "PRIVATE USE CHARACTER"
    return "UNASSIGNED CHARACTER" if category == "Cn" else "UNNAMED CHARACTER"


@lru_cache(maxsize=4096)
def char_kind(char: str) -> str | None:
    """The kind of a hidden character taken alone (neighbours not
    considered: see :func:`find`), or None when it shows itself."""
    code = ord(char)
    if char in BIDI_CHARS:
        return BIDI
    if char in ZERO_WIDTH_CHARS:
        return ZERO_WIDTH
    if 0xE0000 <= code <= 0xE007F:
        return TAG
    if 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF or 0x180B <= code <= 0x180D or code == 0x180F:
        return VARIATION
    if char in "\u2028\u2029":
        return SEPARATOR
    if char in BLANK_CHARS:
        return BLANK
    category = unicodedata.category(char)
    if category == "Cs":
        return NOT_UTF8
    if category == "Cc":
        return None if char in "\t\n\r" else CONTROL
    if category == "Cf" or CANDIDATE_RE.fullmatch(char):
        return FORMAT
    return None


def _symbol(char: str) -> bool:
    return not char.isascii() and unicodedata.category(char) in ("So", "Sk", "Sm")


def _script_letter(char: str) -> bool:
    return not char.isascii() and unicodedata.category(char)[0] in "LM"


def _allowed_in_context(text: str, index: int, char: str) -> bool:
    """Joiners and emoji selectors where a script or an emoji needs them."""
    before = text[index - 1] if index > 0 else ""
    after = text[index + 1] if index + 1 < len(text) else ""
    if char in EMOJI_SELECTORS:
        return bool(before) and (_symbol(before) or (before in "0123456789#*" and after == KEYCAP))
    if char in JOINERS:
        # Skip a selector or skin-tone modifier before the joiner: "👍🏽‍" still joins symbols.
        back = index - 1
        while back > 0 and (text[back] in EMOJI_SELECTORS or "\U0001f3fb" <= text[back] <= "\U0001f3ff"):
            back -= 1
        before = text[back] if back >= 0 and index > 0 else ""
        if not before or not after:
            return False
        return (_script_letter(before) and _script_letter(after)) or (_symbol(before) and _symbol(after))
    return False


def _script(char: str) -> str:
    """The script of a character, as the first word of its name ("" when unnamed)."""
    return unicodedata.name(char, "").split(" ", 1)[0]


def _folds_to_ascii(char: str) -> str:
    """The ASCII letter or digit NFKC folds ``char`` to, or ""."""
    if unicodedata.decomposition(char).startswith(("<super>", "<sub>")):
        return ""  # m², H₂O: written so on purpose, and they do not pass for the plain digit
    folded = unicodedata.normalize("NFKC", char)
    return folded if len(folded) == 1 and folded.isascii() and folded.isalnum() else ""


def _look_alike(char: str) -> str | None:
    """What ``char`` passes for inside an ASCII word: the ASCII character,
    "" when it is a look-alike of no one character in particular (a letter
    of a script in ``HOMOGLYPH_SCRIPTS``), or None when it is no look-alike."""
    if char.isascii():
        return None
    found = LOOK_ALIKES.get(char) or _folds_to_ascii(char)
    if found:
        return found
    category = unicodedata.category(char)
    if category == "Nd":
        return str(unicodedata.digit(char))  # another script's digit: int() reads it as the ASCII one
    name = unicodedata.name(char, "")
    if name.startswith("LATIN LETTER SMALL CAPITAL "):
        return name.rsplit(" ", 1)[-1].lower()
    if "\u01c0" <= char <= "\u01c2":
        return "l"  # the click letters ǀ ǁ ǂ
    if category[0] == "L" and name.split(" ", 1)[0] in HOMOGLYPH_SCRIPTS:
        return ""
    return None


_CJK_FORMS = ("<wide>", "<narrow>", "<small>", "<vertical>")


def _non_word_kind(char: str) -> tuple[str, str] | None:
    """(kind, what it passes for) of a non-word character that is suspect
    next to an ASCII letter or digit, or None."""
    if char in NO_GLYPH_CHARS or unicodedata.category(char) in ("Co", "Cn"):
        return NO_GLYPH, ""
    looks = PUNCTUATION_LOOK_ALIKES.get(char)
    if looks is None and not unicodedata.decomposition(char).startswith(_CJK_FORMS):
        # Fullwidth and small forms are how CJK text writes punctuation: only canonical or plain
        # compatibility folds (U+037E -> ";", U+2024 -> ".") are look-alikes.
        folded = unicodedata.normalize("NFKC", char)
        if len(folded) == 1 and folded.isascii() and not folded.isalnum() and not folded.isspace():
            looks = folded
    return (LOOK_ALIKE, looks) if looks else None


def _ascii_alnum(char: str) -> bool:
    return char.isascii() and char.isalnum()


def find(text: str, *, file_start: bool = False, fragment: bool = False) -> list[Hit]:
    """Every hidden and look-alike character of ``text``, in order.

    ``file_start``: ``text`` begins a file, so a byte order mark at index 0
    is not hidden. ``fragment``: ``text`` was cut out of a longer line (the
    text a flag matched), so a word made only of look-alikes ("а" alone)
    counts as an ASCII word too. Lines are counted on LF alone (as git
    counts them).
    Linear in the text; the common case (nothing found) is one regular
    expression search, plus a word scan when the text is not ASCII.
    """
    found: list[tuple[int, str, str, str]] = []
    for match in CANDIDATE_RE.finditer(text):
        index = match.start()
        char = match.group()
        if file_start and index == 0 and char == BOM:
            continue
        kind = char_kind(char)
        if kind is None or _allowed_in_context(text, index, char):
            continue
        found.append((index, char, kind, ""))
    if not text.isascii():
        for word in _WORD_RE.finditer(text):
            value = word.group()
            if value.isascii():
                continue
            ascii_word = any("a" <= c <= "z" or "A" <= c <= "Z" for c in value)
            if ascii_word or (fragment and all(c.isascii() or _look_alike(c) is not None for c in value)):
                looks_of = [_look_alike(c) for c in value]
            else:
                # No ASCII letter: a look-alike only when NFKC folds the whole word to an ASCII word.
                folds = [c if c.isascii() else _folds_to_ascii(c) for c in value]
                if not all(folds) or not any(f.isalpha() for f in folds):
                    continue
                looks_of = [None if c.isascii() else f for c, f in zip(value, folds, strict=True)]
            for offset, (char, looks) in enumerate(zip(value, looks_of, strict=True)):
                if looks is not None:
                    found.append((word.start() + offset, char, LOOK_ALIKE, looks))
        for match in _NON_WORD_RE.finditer(text):
            index = match.start()
            before = text[index - 1] if index > 0 else ""
            after = text[index + 1] if index + 1 < len(text) else ""
            if not (_ascii_alnum(before) or _ascii_alnum(after)):
                continue
            suspect = _non_word_kind(match.group())
            if suspect is not None and char_kind(match.group()) is None:
                found.append((index, match.group(), *suspect))
    if not found:
        return []
    found.sort()
    return _positioned(text, found)


def _positioned(text: str, found: list[tuple[int, str, str, str]]) -> list[Hit]:
    hits: list[Hit] = []
    line, line_start, cursor = 1, 0, 0
    for index, char, kind, looks in found:
        newlines = text.count("\n", cursor, index)
        if newlines:
            line += newlines
            line_start = text.rfind("\n", cursor, index) + 1
        cursor = index
        hits.append(Hit(index, char, kind, line, index - line_start + 1, looks))
    return hits


def has_hidden(text: str, *, fragment: bool = False) -> bool:
    """Whether :func:`find` would find anything (cheaper when nothing is)."""
    if text.isascii() and not CANDIDATE_RE.search(text):
        return False
    return bool(find(text, fragment=fragment))


def bytes_hidden(data: bytes, *, file_start: bool = True) -> list[Hit]:
    """:func:`find` on file contents, decoded by :func:`decode`: a NUL byte
    and each byte that is not UTF-8 are found too, with the hidden
    characters of the rest. ASCII contents are checked as bytes, without
    decoding."""
    if data.isascii() and not _CANDIDATE_BYTES_RE.search(data):
        return []
    return find(decode(data), file_start=file_start)


# --- Summaries and banners ---------------------------------------------------------------


@dataclass(frozen=True)
class Summary:
    """What a text holds, for a warning banner: counts per code point in
    order of first appearance."""

    counts: tuple[tuple[str, str, int], ...]  # (code, kind, count)
    total: int
    bidi: bool

    def describe(self, limit: int = 6) -> str:
        """``2 × U+202E (bidi), 1 × U+200B (zero-width)``, at most ``limit`` code points."""
        shown = [f"{count} × {code} ({kind})" for code, kind, count in self.counts[:limit]]
        more = len(self.counts) - limit
        if more > 0:
            shown.append(f"{more} more code point{'s' if more > 1 else ''}")
        return ", ".join(shown)

    @property
    def headline(self) -> str:
        """The banner's first sentence, in the words the large code hosts use."""
        if self.bidi:
            return (
                "This text contains bidirectional Unicode text that may be interpreted or compiled "
                "differently than what appears below."
            )
        return "This text contains hidden or look-alike Unicode characters."

    def message(self, subject: str = "text") -> str:
        """The whole banner: headline (about ``subject``), what was found, and how it is shown."""
        headline = self.headline.replace("This text", f"This {subject}", 1)
        return (
            f"{headline} {self.total} character{'s' if self.total != 1 else ''}: {self.describe()}. "
            "Each is shown as a marker such as <U+202E>; hover a marker for its name."
        )


def summarize(hits: Iterable[Hit]) -> Summary | None:
    """A summary of ``hits``, or None when there are none."""
    counts: Counter[tuple[str, str]] = Counter()
    for hit in hits:
        counts[(hit.code, hit.kind)] += 1
    if not counts:
        return None
    return Summary(
        counts=tuple((code, kind, count) for (code, kind), count in counts.items()),
        total=sum(counts.values()),
        bidi=any(kind == BIDI for _, kind in counts),
    )


def summarize_texts(texts: Iterable[str]) -> Summary | None:
    """One summary over several texts (a trajectory step's fields)."""
    hits: list[Hit] = []
    for text in texts:
        if text and has_hidden(text):
            hits += find(text)
    return summarize(hits)


# --- What an edit adds ---------------------------------------------------------------------


@dataclass(frozen=True)
class Added:
    """A hidden character an edit adds, on one added line (``line`` is the
    1-based line of the new file, None for a file name)."""

    line: int | None
    text: str
    hit: Hit

    @property
    def evidence(self) -> str:
        where = "in the file name" if self.line is None else f"on line {self.line}, column {self.hit.column}"
        return f"{self.hit.code} {self.hit.name} ({self.hit.kind}) {where}"


def introduced(added: Sequence[tuple[int | None, str]], removed: Sequence[tuple[int | None, str]]) -> list[Added]:
    """The hidden characters an edit introduces: every one on an added line,
    except on a line the edit only moves (a removed line with the very same
    text; each removed line excuses one added line). So a character moved to
    another line, or kept on a line rewritten around it, is introduced: what
    it hides or reorders changed. Lines are (1-based line number or None,
    text); line 1 starts the file (a byte order mark there is not hidden).
    Pure."""
    moved = Counter(text for _, text in removed)
    found: list[Added] = []
    for number, text in added:
        if moved[text] > 0:
            moved[text] -= 1
            continue
        found += [Added(number, text, hit) for hit in find(text, file_start=number == 1)]
    return found


def introduced_by(change: FileChange) -> list[Added]:
    """:func:`introduced` for one file of a parsed git diff: its added and
    removed hunk lines with their line numbers, and a new name (added,
    renamed or copied file) as a line without a number. A change git calls
    binary has no text in the diff and adds none here: diff the decodable
    text instead (``evolution.trees.diff_entries(..., binary_as_text=True)``).
    Pure."""
    if change.binary:
        return []
    added: list[tuple[int | None, str]] = []
    removed: list[tuple[int | None, str]] = []
    for hunk in change.hunks:
        old_number, new_number = hunk.old_start, hunk.new_start
        for line in hunk.lines:
            kind, text = line[:1], line[1:]
            if kind == "+":
                added.append((new_number, text))
                new_number += 1
            elif kind == "-":
                removed.append((old_number, text))
                old_number += 1
            elif kind == " ":
                old_number += 1
                new_number += 1
    if change.status in ("added", "renamed", "copied"):
        added.append((None, change.path))
        if change.old_path is not None:
            removed.append((None, change.old_path))
    return introduced(added, removed)
