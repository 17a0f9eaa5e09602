"""Side-by-side and unified diffs of two harness trees, rendered as escaped HTML.

Pure functions and dataclasses, no ORM. The pipeline:

1. ``list_file_diffs`` pairs the files of two trees (``evolution.trees``
   decides statuses, renames and modes) without diffing their contents;
   ``count_file_diffs`` diffs the files it is given: it parses the git-style
   text of the same comparison with unidiff for the hunks, line numbers and
   +/- counts. ``build_file_diffs`` does both for every file.
2. ``plan_collapse`` decides which files are rendered on the first response,
   diffing only the files that may be: a file with more than
   ``COLLAPSE_LINES`` changed lines, or one that would take the page past
   ``PAGE_BUDGET`` rendered lines, is collapsed. A collapsed file is never
   cut short: its header offers to load it and its raw text, and says how
   many lines are hidden once they are counted (the page asks for the
   counts of the files it did not diff in a request of their own).
3. ``render_file`` turns one file into table rows (unified or split). Each
   line is highlighted by pygments (lexer guessed from the file name), with
   changed characters of paired -/+ lines wrapped in ``<span class="x">``
   and leakage evidence in ``<mark class="leak">``. Hidden and look-alike
   characters (``evolution.hidden_chars``) become visible markers
   (``review.hidden``), and a file holding any gets a warning banner.

Everything taken from the diff (file content, paths, hunk headers, flag
text) is untrusted. Line HTML is assembled here from ``escape()``-d pieces
and a fixed set of tags whose class names come from pygments' token table,
never from the content. Marks are placed by character positions in the raw
line and every piece between two positions is escaped on its own, so a mark
can never land inside an entity such as ``&lt;``.
"""

from __future__ import annotations

import difflib
import hashlib
import html
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate, zip_longest
from typing import Any, Protocol

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.token import STANDARD_TYPES, Token, _TokenType
from pygments.util import ClassNotFound
from unidiff import PatchSet
from unidiff.patch import Hunk as UnidiffHunk

from evolution import digests, hidden_chars
from evolution.trees import FileChange, FileEntry, diff_changes, diff_entries, is_binary
from review.hidden import escape_marked, reveal_html

# A file with more changed lines than this is collapsed behind a "Load diff" button.
COLLAPSE_LINES = 400
# The first response renders at most this many diff lines over all files.
PAGE_BUDGET = 2000
LAYOUTS = ("split", "unified")
DEFAULT_LAYOUT = "split"
# Files larger than this are highlighted line by line instead of as a whole
# (multi-line strings may then lose their colour; the text stays exact).
HIGHLIGHT_WHOLE_FILE_CHARS = 400_000
# Intra-line marks only for pairs that are alike enough to read as an edit
# of one line, and short enough for a character-level match.
INTRALINE_MIN_RATIO = 0.4
INTRALINE_MAX_CHARS = 2000

# Shown instead of a carriage return, one character for one, so positions in
# the raw line and in the display text stay the same.
CR_SYMBOL = "\u240d"


@dataclass(frozen=True)
class Side:
    """One side of a changed file."""

    path: str
    mode: str
    digest: str  # SHA-256 of the content (the Blob primary key)
    size: int


@dataclass(frozen=True)
class DiffLine:
    """One hunk line: ``kind`` is ``" "``, ``"+"``, ``"-"`` or ``"\\"`` (no
    newline at end of file); ``text`` is without its line ending."""

    kind: str
    old_no: int | None
    new_no: int | None
    text: str


@dataclass(frozen=True)
class DiffHunk:
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    section: str  # the function context git prints after "@@ ... @@"
    lines: tuple[DiffLine, ...]

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"


@dataclass
class FileDiff:
    """One changed file between two trees. ``old`` is None for an added
    file, ``new`` None for a deleted one. ``added`` and ``removed`` are None
    (and ``hunks`` empty) until the file is diffed: see ``counted``."""

    status: str  # added, deleted, modified, renamed
    old: Side | None
    new: Side | None
    binary: bool
    hunks: list[DiffHunk]
    added: int | None
    removed: int | None
    anchor: str = ""
    # Known without diffing: no diff of this file has fewer changed lines.
    least_changed: int = 0
    # The tree comparison's pair, kept to diff the file later (None once diffed).
    change: FileChange | None = field(default=None, repr=False, compare=False)
    # Set by plan_collapse: None (rendered), "large" or "budget".
    collapsed: str | None = None
    # Set by the view: this user marked these exact contents as viewed.
    viewed: bool = False
    # Set by render_file.
    rows: list[Row] | list[SplitRow] | None = None
    language: str = ""
    # Set by render_file: the table rows as HTML (see ``rows_html``).
    body_html: SafeString | None = None
    # Set by list_file_diffs: the hidden characters each side's whole text holds.
    hidden_old: hidden_chars.Summary | None = None
    hidden_new: hidden_chars.Summary | None = None
    # Set by list_file_diffs for a binary file: why it is no text ("the file holds 1 NUL byte").
    not_text: str = ""

    @property
    def path(self) -> str:
        side = self.new or self.old
        assert side is not None  # a change always has a side
        return side.path

    @property
    def old_path(self) -> str | None:
        return self.old.path if self.old is not None else None

    @property
    def renamed_from(self) -> str | None:
        return self.old.path if self.status == "renamed" and self.old is not None else None

    @property
    def old_digest(self) -> str:
        return self.old.digest if self.old is not None else ""

    @property
    def new_digest(self) -> str:
        return self.new.digest if self.new is not None else ""

    @property
    def mode_change(self) -> tuple[str, str] | None:
        if self.old is not None and self.new is not None and self.old.mode != self.new.mode:
            return self.old.mode, self.new.mode
        return None

    @property
    def counted(self) -> bool:
        """Whether the file was diffed: its hunks and counts are known."""
        return self.added is not None and self.removed is not None

    @property
    def changed(self) -> int | None:
        """Changed lines: added plus removed (None until counted)."""
        if self.added is None or self.removed is None:
            return None
        return self.added + self.removed

    @property
    def changed_display(self) -> str:
        changed = self.changed
        return "" if changed is None else f"{changed:,}"

    @property
    def least_line_count(self) -> int:
        """No fewer lines than this are rendered for the file: its least
        changed lines and one hunk header, if it has hunks at all."""
        if self.counted:
            return self.line_count
        return self.least_changed + 1

    @property
    def line_count(self) -> int:
        """Lines this file takes when rendered (hunk headers included)."""
        return sum(len(hunk.lines) + 1 for hunk in self.hunks)

    @property
    def content_changed(self) -> bool:
        return self.old_digest != self.new_digest

    @property
    def hidden_banners(self) -> list[str]:
        """The file's warnings about hidden characters (new side first)."""
        banners = []
        if self.hidden_new is not None:
            banners.append(self.hidden_new.message("file"))
        if self.hidden_old is not None:
            subject = "file's previous version" if self.new is not None else "deleted file"
            banners.append(self.hidden_old.message(subject))
        return banners

    @property
    def bidi(self) -> bool:
        return any(summary is not None and summary.bidi for summary in (self.hidden_new, self.hidden_old))

    @property
    def kinds(self) -> list[str]:
        """Every way the file changed, for badges: status first, then
        binary and mode change when they apply."""
        found = [self.status]
        if self.binary:
            found.append("binary")
        if self.mode_change is not None:
            found.append("mode")
        return found


@dataclass(frozen=True)
class Gap:
    """Unchanged lines a diff does not show: new-side lines ``first`` to
    ``first + count - 1``; the same lines are ``shift`` further on the old
    side. ``tail``: the lines after the last change, up to the end."""

    first: int
    count: int
    shift: int
    tail: bool = False

    @property
    def last(self) -> int:
        return self.first + self.count - 1


@dataclass(frozen=True)
class Row:
    """One row of the unified layout. ``kind``: hunk, ctx, add, del, eof."""

    kind: str
    old_no: int | None
    new_no: int | None
    html: SafeString
    gap: int | None = None  # hunk rows: unchanged lines skipped before it
    hidden: Gap | None = None  # hunk and tail rows: those lines, to expand


@dataclass(frozen=True)
class Cell:
    no: int | None
    kind: str  # ctx, add, del, eof, empty
    html: SafeString


@dataclass(frozen=True)
class SplitRow:
    """One row of the split layout: a hunk header (``kind`` "hunk", text in
    ``html``) or an old and a new cell side by side."""

    kind: str
    left: Cell | None = None
    right: Cell | None = None
    html: SafeString = SafeString("")
    gap: int | None = None
    hidden: Gap | None = None


@dataclass(frozen=True)
class LeakMark:
    """Text a leakage flag matched in ``path`` of the new side."""

    path: str
    matched: str
    title: str


@dataclass
class DiffSummary:
    files: list[FileDiff] = field(default_factory=list)

    @property
    def counted(self) -> bool:
        return all(f.counted for f in self.files)

    @property
    def uncounted(self) -> int:
        return sum(1 for f in self.files if not f.counted)

    @property
    def added(self) -> int | None:
        """Added lines over all files; None while a file is not counted."""
        counts = [f.added for f in self.files]
        return None if None in counts else sum(c for c in counts if c is not None)

    @property
    def removed(self) -> int | None:
        counts = [f.removed for f in self.files]
        return None if None in counts else sum(c for c in counts if c is not None)

    @property
    def collapsed(self) -> int:
        return sum(1 for f in self.files if f.collapsed)

    @property
    def viewed(self) -> int:
        return sum(1 for f in self.files if f.viewed)


# --- Building -------------------------------------------------------------------


def file_anchor(path: str) -> str:
    """A stable HTML id for a file of a diff (paths may hold any character)."""
    return "file-" + hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _side(entry: FileEntry | None) -> Side | None:
    if entry is None:
        return None
    return Side(path=entry.path, mode=entry.mode, digest=digests.blob_digest(entry.data), size=len(entry.data))


def _line_text(value: str) -> str:
    if value.endswith("\n"):
        value = value[:-1]
    return value.replace("\r", CR_SYMBOL)


def _hunk(hunk: UnidiffHunk) -> DiffHunk:
    lines = []
    for line in hunk:
        kind = line.line_type
        if kind == "\\":
            lines.append(DiffLine("\\", None, None, "No newline at end of file"))
        else:
            lines.append(DiffLine(kind, line.source_line_no, line.target_line_no, _line_text(line.value)))
    return DiffHunk(
        old_start=hunk.source_start,
        old_count=hunk.source_length,
        new_start=hunk.target_start,
        new_count=hunk.target_length,
        section=hunk.section_header or "",
        lines=tuple(lines),
    )


class ParsedMemo(Protocol):
    """Where parsed file diffs may be kept between requests (a Django cache
    fits): keys are digests of everything a file's diff depends on."""

    def get_many(self, keys: list[str]) -> dict[str, Any]: ...

    def set_many(self, data: dict[str, Any]) -> Any: ...


# Bump when the parsed shape changes, so memoized parses of the old shape are ignored.
PARSE_VERSION = 1
Parsed = tuple[tuple[DiffHunk, ...], bool, int, int]  # hunks, binary, added, removed


def _entry_key(entry: FileEntry | None) -> str:
    return "" if entry is None else f"{entry.path}\0{entry.mode}\0{digests.blob_digest(entry.data)}"


def _change_key(change: FileChange) -> str:
    """Everything one file's diff text depends on: the status, both paths,
    modes and content digests."""
    raw = "\0\0".join((str(PARSE_VERSION), change.status, _entry_key(change.old), _entry_key(change.new)))
    return "review-filediff:" + hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()


def _parse_changes(old: Sequence[FileEntry], new: Sequence[FileEntry], wanted: Sequence[FileChange]) -> list[Parsed]:
    """Hunks of each wanted change, from the git-style text of a comparison
    restricted to the wanted paths (both sides of each change stay, so a
    rename pairs up again): one file does not pay for the whole tree."""
    old_paths = {c.old.path for c in wanted if c.old is not None}
    new_paths = {c.new.path for c in wanted if c.new is not None}
    old = [entry for entry in old if entry.path in old_paths]
    new = [entry for entry in new if entry.path in new_paths]
    changes = diff_changes(old, new)
    patches = list(PatchSet(diff_entries(old, new)))
    if len(patches) != len(changes):
        raise ValueError(f"diff has {len(patches)} file blocks for {len(changes)} changed files")
    by_key: dict[str, Parsed] = {
        _change_key(change): (tuple(_hunk(h) for h in patch), bool(patch.is_binary_file), patch.added, patch.removed)
        for change, patch in zip(changes, patches, strict=True)
    }
    try:
        return [by_key[_change_key(change)] for change in wanted]
    except KeyError as exc:
        raise ValueError("a change of the tree comparison has no file block in its diff") from exc


def _line_counts(data: bytes) -> Counter[bytes]:
    """How many times each line of ``data`` occurs (lines split on LF as the
    diff splits them; a last line without its LF counts as another line)."""
    parts = data.split(b"\n")
    counts = Counter(parts[:-1])
    if parts[-1]:
        # No key above holds an LF, so this one cannot meet a line that has its LF.
        counts[parts[-1] + b"\n"] += 1
    return counts


def least_changed(before: bytes, after: bytes) -> int:
    """A lower bound of the changed lines of any line diff from ``before``
    to ``after`` (both text): a diff only pairs equal lines, so a line with
    no equal line left to pair with on the other side is removed or added.
    At least 1 when the contents differ. Linear, no matching."""
    if before == after:
        return 0
    old, new = _line_counts(before), _line_counts(after)
    return max(1, old.total() + new.total() - 2 * (old & new).total())


def _bytes_not_text(data: bytes) -> str:
    """``1 NUL byte and 2 bytes that are not UTF-8``, or "" for UTF-8 text."""
    nul = data.count(b"\0")
    invalid = sum(1 for char in hidden_chars.decode(data) if "\udc80" <= char <= "\udcff")
    parts = [f"{nul} NUL byte{'s' if nul != 1 else ''}"] if nul else []
    if invalid:
        parts.append(f"{invalid} byte{'s that are' if invalid != 1 else ' that is'} not UTF-8")
    return " and ".join(parts)


def _not_text(old: bytes | None, new: bytes | None) -> str:
    """Why a binary file is not text, for the page: what each side holds."""
    said = []
    if new is not None and (found := _bytes_not_text(new)):
        said.append(f"the file holds {found}")
    if old is not None and (found := _bytes_not_text(old)):
        said.append(f"{'its previous version' if new is not None else 'the deleted file'} held {found}")
    return "; ".join(said)


def list_file_diffs(
    old: Sequence[FileEntry], new: Sequence[FileEntry], *, only_path: str | None = None
) -> list[FileDiff]:
    """The changed files from ``old`` to ``new`` in ``git diff`` order,
    without diffing their contents: statuses, paths, modes and binary-ness
    come from the tree comparison. A file without hunks (same content,
    binary, or empty on both sides) is counted already, as its diff text has
    no lines; every other file gets ``least_changed`` and waits for
    ``count_file_diffs``. With ``only_path``, only the changes at that (old
    or new) path. Pure; linear in the size of the trees."""
    changes = diff_changes(old, new)
    if only_path is not None:
        changes = [c for c in changes if only_path in (c.old and c.old.path, c.new and c.new.path)]
    files: list[FileDiff] = []
    seen: dict[str, int] = {}
    for change in changes:
        old_data = change.old.data if change.old is not None else None
        new_data = change.new.data if change.new is not None else None
        before, after = old_data or b"", new_data or b""
        # The same cases as evolution.trees._format_change, in the same order.
        binary = old_data != new_data and (is_binary(before) or is_binary(after))
        fd = FileDiff(
            status=change.status,
            old=_side(change.old),
            new=_side(change.new),
            binary=binary,
            hunks=[],
            added=None,
            removed=None,
        )
        if before != after:
            # Whole files, as the code hosts warn: a collapsed file is warned about too, and so is
            # a binary one, from its decodable text (a NUL must not hide a bidi control).
            fd.hidden_old = hidden_chars.summarize(hidden_chars.bytes_hidden(before))
            fd.hidden_new = hidden_chars.summarize(hidden_chars.bytes_hidden(after))
        if binary:
            fd.not_text = _not_text(old_data, new_data)
        if binary or before == after:
            fd.added = fd.removed = 0
        else:
            fd.least_changed = least_changed(before, after)
            fd.change = change
        anchor = file_anchor(fd.path)
        # A file turned into a symlink is a deletion and an addition at one path.
        seen[anchor] = seen.get(anchor, 0) + 1
        fd.anchor = anchor if seen[anchor] == 1 else f"{anchor}-{seen[anchor]}"
        files.append(fd)
    return files


def count_file_diffs(
    files: Iterable[FileDiff], old: Sequence[FileEntry], new: Sequence[FileEntry], *, memo: ParsedMemo | None = None
) -> None:
    """Diff every file of ``files`` (from ``list_file_diffs(old, new)``) not
    counted yet: its hunks, line numbers and +/- counts from unidiff's parse
    of the git-style text of the same comparison, restricted to those files.
    With ``memo``, a file whose parse is there (same paths, modes and
    contents) is not diffed again, and fresh parses are put there: the
    page's "Load diff" requests reuse the diffs earlier requests computed.
    Safe to repeat (counted files are skipped); pure apart from the memo and
    the files; raises ValueError if the comparison and its text disagree."""
    todo = [(fd, fd.change) for fd in files if fd.change is not None]
    if not todo:
        return
    keys = [_change_key(change) for _, change in todo]
    parsed: dict[str, Parsed] = dict(memo.get_many(keys)) if memo is not None else {}
    missing = [(change, key) for (_, change), key in zip(todo, keys, strict=True) if key not in parsed]
    if missing:
        fresh = dict(zip((key for _, key in missing), _parse_changes(old, new, [c for c, _ in missing]), strict=True))
        parsed.update(fresh)
        if memo is not None:
            memo.set_many(fresh)
    for (fd, _), key in zip(todo, keys, strict=True):
        hunks, binary, added, removed = parsed[key]
        fd.hunks, fd.binary, fd.added, fd.removed = list(hunks), binary, added, removed
        fd.change = None


def build_file_diffs(
    old: Sequence[FileEntry],
    new: Sequence[FileEntry],
    *,
    only_path: str | None = None,
    memo: ParsedMemo | None = None,
) -> list[FileDiff]:
    """``list_file_diffs`` with every file diffed by ``count_file_diffs``."""
    files = list_file_diffs(old, new, only_path=only_path)
    count_file_diffs(files, old, new, memo=memo)
    return files


def plan_collapse(
    files: Iterable[FileDiff],
    *,
    count: Callable[[FileDiff], None] | None = None,
    collapse_lines: int = COLLAPSE_LINES,
    budget: int = PAGE_BUDGET,
) -> None:
    """Mark which files the first response leaves collapsed, diffing (with
    ``count``) only the files it may render, so its work is bounded by the
    budget, not by the number of files.

    A file with more than ``collapse_lines`` changed lines is "large"; a file
    that would take the rendered total past ``budget`` lines is "budget"
    (later, smaller files may still fit). Files without hunks (renames, mode
    changes, binaries) cost nothing. A file not counted yet is decided by
    its ``least_changed`` when that suffices; otherwise it is diffed, unless
    a file was already diffed in vain (diffed, then collapsed): from then on
    the page counts as full and such files are "budget" without a diff. The
    outcome does not depend on what ``count`` finds in a memo. Safe to repeat.
    """
    used = 0
    diffed_in_vain = False
    for fd in files:
        fd.collapsed = None
        diffed_here = False
        if not fd.counted:
            if fd.least_changed > collapse_lines:
                fd.collapsed = "large"
                continue
            if diffed_in_vain or used + fd.least_line_count > budget:
                fd.collapsed = "budget"
                continue
            if count is None:
                raise ValueError(f"{fd.path}: not counted, and plan_collapse was given no count")
            count(fd)
            diffed_here = True
        changed = fd.changed
        assert changed is not None  # counted above
        cost = fd.line_count
        if changed > collapse_lines:
            fd.collapsed = "large"
        elif used + cost > budget:
            fd.collapsed = "budget"
        else:
            used += cost
        if fd.collapsed is not None and diffed_here:
            diffed_in_vain = True


# --- Highlighting ---------------------------------------------------------------

Segment = tuple[str, str]  # (pygments short class or "", text)


@lru_cache(maxsize=256)
def _token_class(ttype: _TokenType) -> str:
    # Token.Other's short name is "x", which is our change mark: leave it plain.
    if ttype is Token.Other:
        return ""
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES[ttype]


def lexer_for(path: str) -> Lexer:
    """The pygments lexer for a file name; plain text when none fits."""
    options = {"stripnl": False, "stripall": False, "ensurenl": True}
    try:
        return get_lexer_for_filename(path.rsplit("/", 1)[-1], **options)
    except ClassNotFound:
        return TextLexer(**options)


def highlight_lines(text: str, lexer: Lexer) -> list[list[Segment]]:
    """Token segments per line of ``text`` (lines split on LF only, carriage
    returns shown as ``CR_SYMBOL``). A line whose segments do not add up to
    its exact text falls back to one plain segment, so highlighting can
    never change what is shown."""
    text = text.replace("\r", CR_SYMBOL)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    if len(text) > HIGHLIGHT_WHOLE_FILE_CHARS:
        return [_highlight_one(line, lexer) for line in lines]
    result: list[list[Segment]] = [[]]
    current = result[0]
    classes: dict[_TokenType, str] = {}
    for ttype, value in lexer.get_tokens(text):
        css = classes.get(ttype)
        if css is None:
            css = classes[ttype] = _token_class(ttype)
        if "\n" not in value:  # most tokens: no line break inside
            if value:
                current.append((css, value))
            continue
        for index, part in enumerate(value.split("\n")):
            if index:
                current = []
                result.append(current)
            if part:
                current.append((css, part))
    return [_checked(result[i] if i < len(result) else [], line) for i, line in enumerate(lines)]


def _highlight_one(line: str, lexer: Lexer) -> list[Segment]:
    segments = [(_token_class(t), v.rstrip("\n")) for t, v in lexer.get_tokens(line) if v.rstrip("\n")]
    return _checked(segments, line)


def _checked(segments: list[Segment], line: str) -> list[Segment]:
    if "".join(value for _, value in segments) != line:
        return [("", line)] if line else []
    return segments


# --- Line HTML ------------------------------------------------------------------

Span = tuple[int, int]


_WORD_RE = re.compile(r"\w+|\s+|[^\w\s]")


def intraline_spans(old: str, new: str) -> tuple[list[Span], list[Span]]:
    """Character ranges that differ between a removed and an added line,
    compared word by word (a changed word is marked whole, as a reader sees
    it), or nothing when the lines are too different (or too long) for marks
    to help the eye."""
    if not old or not new or len(old) > INTRALINE_MAX_CHARS or len(new) > INTRALINE_MAX_CHARS:
        return [], []
    old_words = _WORD_RE.findall(old)
    new_words = _WORD_RE.findall(new)
    matcher = difflib.SequenceMatcher(None, old_words, new_words, autojunk=False)
    if matcher.ratio() < INTRALINE_MIN_RATIO:
        return [], []
    old_starts = _offsets(old_words)
    new_starts = _offsets(new_words)
    old_spans: list[Span] = []
    new_spans: list[Span] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if i2 > i1:
            old_spans.append((old_starts[i1], old_starts[i2]))
        if j2 > j1:
            new_spans.append((new_starts[j1], new_starts[j2]))
    return old_spans, new_spans


def _offsets(words: list[str]) -> list[int]:
    """Start offset of each word, plus the end of the line."""
    return list(accumulate(map(len, words), initial=0))


def leak_spans(text: str, marks: Sequence[LeakMark]) -> list[tuple[int, int, str]]:
    """Every occurrence of each mark's matched text in ``text``; overlapping
    occurrences are merged into the first one's title."""
    found: list[tuple[int, int, str]] = []
    for mark in marks:
        needle = mark.matched
        if not needle:
            continue
        start = text.find(needle)
        while start != -1:
            found.append((start, start + len(needle), mark.title))
            start = text.find(needle, start + 1)
    found.sort()
    merged: list[tuple[int, int, str]] = []
    for start, end, title in found:
        if merged and start <= merged[-1][1]:
            previous = merged[-1]
            merged[-1] = (previous[0], max(previous[1], end), previous[2])
        else:
            merged.append((start, end, title))
    return merged


# What ``django.utils.html.escape`` returns (it calls ``html.escape``), without
# its lazy-string wrapper and SafeString: this runs once per token of every line.
_escape = html.escape


def line_html(
    segments: Sequence[Segment],
    changes: Sequence[Span] = (),
    leaks: Sequence[tuple[int, int, str]] = (),
    hidden: Sequence[hidden_chars.Hit] = (),
) -> SafeString:
    """One line as HTML: each segment's text escaped on its own, wrapped in
    its pygments class; changed ranges in ``<span class="x">`` and leak
    ranges in ``<mark class="leak" title=...>``, nested mark > x > token and
    reopened around every token boundary so the tags always balance.
    ``hidden`` (found in the whole line) become markers, never raw text."""
    if not leaks and not hidden:
        return _line_html_changes(segments, changes)
    cuts = {0}
    position = 0
    classes: list[tuple[int, int, str]] = []
    for css, value in segments:
        classes.append((position, position + len(value), css))
        position += len(value)
        cuts.add(position)
    length = position
    for start, end in changes:
        cuts.update((max(0, min(start, length)), max(0, min(end, length))))
    for start, end, _ in leaks:
        cuts.update((max(0, min(start, length)), max(0, min(end, length))))
    text = "".join(value for _, value in segments)
    points = sorted(cuts)
    out: list[str] = []
    open_leak: str | None = None
    open_change = False
    segment = 0  # pieces come in order: walk the segments alongside
    for start, end in zip(points, points[1:], strict=False):
        while classes[segment][1] <= start:
            segment += 1
        leak = next((title for s, e, title in leaks if s <= start and end <= e), None)
        change = any(s <= start and end <= e for s, e in changes)
        if leak != open_leak or change != open_change:
            if open_change:
                out.append("</span>")
            if leak != open_leak:
                if open_leak is not None:
                    out.append("</mark>")
                if leak is not None:
                    out.append(f'<mark class="leak" title="{escape(leak)}">')
            if change:
                out.append('<span class="x">')
            open_leak, open_change = leak, change
        css = classes[segment][2]
        piece = escape_marked(text, hidden, start, end) if hidden else _escape(text[start:end])
        # Class names come from pygments' fixed token table, never from the content.
        out.append(f'<span class="{css}">{piece}</span>' if css else piece)
    if open_change:
        out.append("</span>")
    if open_leak is not None:
        out.append("</mark>")
    return mark_safe("".join(out))  # every piece of content above went through escape()


def _line_html_changes(segments: Sequence[Segment], changes: Sequence[Span]) -> SafeString:
    """``line_html`` without leak marks (nearly every line), in one pass over
    the segments: the same pieces (tokens cut at every change boundary) and
    the same tags, without testing every piece against every span."""
    if not changes:
        # Nothing to mark: each token escaped and wrapped.
        pieces = (f'<span class="{css}">{_escape(v)}</span>' if css else _escape(v) for css, v in segments if v)
        return mark_safe("".join(pieces))  # every piece of content went through html.escape()
    length = sum(len(value) for _, value in segments)
    clamped = [(max(0, min(start, length)), max(0, min(end, length))) for start, end in changes]
    bounds = sorted({point for span in clamped for point in span})
    covered: list[list[int]] = []  # the union of the non-empty spans, in order
    for start, end in sorted(span for span in clamped if span[0] < span[1]):
        if covered and start <= covered[-1][1]:
            covered[-1][1] = max(covered[-1][1], end)
        else:
            covered.append([start, end])
    out: list[str] = []
    open_change = False
    bound = cover = 0
    position = 0
    for css, value in segments:
        segment_end = position + len(value)
        cursor = position
        while cursor < segment_end:
            while bound < len(bounds) and bounds[bound] <= cursor:
                bound += 1
            stop = min(segment_end, bounds[bound]) if bound < len(bounds) else segment_end
            while cover < len(covered) and covered[cover][1] <= cursor:
                cover += 1
            change = cover < len(covered) and covered[cover][0] <= cursor
            if change != open_change:
                out.append('<span class="x">' if change else "</span>")
                open_change = change
            piece = _escape(value[cursor - position : stop - position])
            # Class names come from pygments' fixed token table, never from the content.
            out.append(f'<span class="{css}">{piece}</span>' if css else piece)
            cursor = stop
        position = segment_end
    if open_change:
        out.append("</span>")
    return mark_safe("".join(out))  # every piece of content above went through html.escape()


# --- Rendering a file -------------------------------------------------------------


def _pairs(lines: Sequence[DiffLine]) -> dict[int, int]:
    """Index of each removed line -> index of the added line it pairs with:
    in a run of removals followed by a run of additions, the i-th of each
    ("no newline" markers inside a run are skipped, not a break)."""
    pairs: dict[int, int] = {}
    index = 0
    while index < len(lines):
        if lines[index].kind != "-":
            index += 1
            continue
        removed: list[int] = []
        while index < len(lines) and lines[index].kind in ("-", "\\"):
            if lines[index].kind == "-":
                removed.append(index)
            index += 1
        added: list[int] = []
        while index < len(lines) and lines[index].kind in ("+", "\\"):
            if lines[index].kind == "+":
                added.append(index)
            index += 1
        pairs.update(zip(removed, added, strict=False))
    return pairs


@dataclass
class _Highlighter:
    old_lines: list[list[Segment]] | None
    new_lines: list[list[Segment]] | None

    def segments(self, line: DiffLine, side: str) -> list[Segment]:
        source = self.old_lines if side == "old" else self.new_lines
        number = line.old_no if side == "old" else line.new_no
        if source is not None and number is not None and 0 < number <= len(source):
            found = source[number - 1]
            if "".join(v for _, v in found) == line.text:
                return found
        return [("", line.text)] if line.text else []


def _decode(data: bytes | None) -> str | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _line_hidden(line: DiffLine) -> list[hidden_chars.Hit]:
    """Hidden characters of one hunk line; a byte order mark opening line 1
    of its side is the file's own and is not marked."""
    number = line.old_no if line.kind == "-" else line.new_no
    return hidden_chars.find(line.text, file_start=number == 1)


def _line_cells(
    hunk: DiffHunk, hl: _Highlighter, marks: Sequence[LeakMark], scan: bool = False
) -> list[tuple[DiffLine, str, SafeString]]:
    """Each hunk line with its CSS kind and its HTML; with ``scan``, hidden
    characters are looked for (only files that hold some need it)."""
    pairs = _pairs(hunk.lines)
    changes: dict[int, list[Span]] = {}
    for old_index, new_index in pairs.items():
        old_spans, new_spans = intraline_spans(hunk.lines[old_index].text, hunk.lines[new_index].text)
        changes[old_index], changes[new_index] = old_spans, new_spans
    cells = []
    for index, line in enumerate(hunk.lines):
        if line.kind == "\\":
            cells.append((line, "eof", escape(line.text)))
            continue
        side = "old" if line.kind == "-" else "new"
        kind = {"-": "del", "+": "add"}.get(line.kind, "ctx")
        leaks = leak_spans(line.text, marks) if side == "new" and marks else []
        hidden = _line_hidden(line) if scan else []
        cells.append((line, kind, line_html(hl.segments(line, side), changes.get(index, ()), leaks, hidden)))
    return cells


def _gaps(hunks: Sequence[DiffHunk]) -> list[int | None]:
    """Unchanged lines skipped before each hunk (None when unknown: 0)."""
    gaps: list[int | None] = []
    next_old = 1
    for hunk in hunks:
        start = hunk.old_start if hunk.old_count else hunk.old_start + 1
        gaps.append(max(0, start - next_old) or None)
        next_old = start + hunk.old_count
    return gaps


@dataclass(frozen=True)
class TreeNode:
    """One line of the file tree beside a diff: a folder (``file`` None) or a file."""

    depth: int
    name: str
    file: FileDiff | None = None


def file_tree(files: Sequence[FileDiff]) -> list[TreeNode]:
    """The diff's files as an indented tree, folders first then files at each
    level, by name; a folder holding a single folder is shown as one line
    (``a/b``), as code hosts do."""
    root: dict[str, Any] = {}
    for fd in files:
        parts = fd.path.split("/")
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part + "/", {})
        node[parts[-1]] = fd
    out: list[TreeNode] = []

    def walk(node: dict[str, Any], depth: int) -> None:
        folders = sorted(k for k, v in node.items() if isinstance(v, dict))
        for name in folders:
            child, label = node[name], name[:-1]
            while len(child) == 1 and isinstance(next(iter(child.values())), dict):
                only = next(iter(child))
                label, child = f"{label}/{only[:-1]}", child[only]
            out.append(TreeNode(depth, label))
            walk(child, depth + 1)
        for name in sorted(k for k, v in node.items() if not isinstance(v, dict)):
            out.append(TreeNode(depth, name, node[name]))

    walk(root, 0)
    return out


def hidden_gaps(hunks: Sequence[DiffHunk], new_lines: int | None) -> list[Gap | None]:
    """The unchanged lines before each hunk (None where there are none),
    then those after the last hunk (``tail``; None without the new side's
    line count, ``new_lines``, or when nothing follows)."""
    found: list[Gap | None] = []
    next_new = next_old = 1
    for hunk in hunks:
        new_first = hunk.new_start if hunk.new_count else hunk.new_start + 1
        old_first = hunk.old_start if hunk.old_count else hunk.old_start + 1
        count = new_first - next_new
        found.append(Gap(next_new, count, old_first - new_first) if count > 0 else None)
        next_new = new_first + hunk.new_count
        next_old = old_first + hunk.old_count
    if not hunks or new_lines is None or new_lines < next_new:
        found.append(None)
    else:
        found.append(Gap(next_new, new_lines - next_new + 1, next_old - next_new, tail=True))
    return found


def line_total(data: bytes | None) -> int | None:
    """Lines of a file as the diff numbers them (split on LF), None when not UTF-8 text."""
    text = _decode(data)
    if text is None:
        return None
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def context_rows(
    *,
    new_data: bytes,
    path: str,
    layout: str,
    first: int,
    last: int,
    shift: int,
    anchor: str,
    marks: Sequence[LeakMark] = (),
) -> SafeString:
    """Rows of unchanged lines ``first`` to ``last`` (new-side numbers; the
    old side's are ``shift`` further), highlighted as in the file: what an
    "expand" of a gap fetches. Lines outside the file are left out."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    text = _decode(new_data)
    if text is None:
        return SafeString("")
    lines = highlight_lines(text, lexer_for(path))
    scan = hidden_chars.has_hidden(text)
    cells: list[tuple[DiffLine, str, SafeString]] = []
    for number in range(max(1, first), min(last, len(lines)) + 1):
        segments = lines[number - 1]
        raw = "".join(value for _, value in segments)
        line = DiffLine(" ", number + shift, number, raw)
        leaks = leak_spans(raw, marks) if marks else []
        hidden = _line_hidden(line) if scan else []
        cells.append((line, "ctx", line_html(segments, (), leaks, hidden)))
    if layout == "unified":
        return rows_html([Row("ctx", line.old_no, line.new_no, html) for line, _, html in cells], anchor=anchor)
    return rows_html(_split_rows(cells), anchor=anchor)


def render_file(
    fd: FileDiff,
    *,
    layout: str,
    old_data: bytes | None,
    new_data: bytes | None,
    marks: Sequence[LeakMark] = (),
) -> None:
    """Fill ``fd.rows`` for ``layout`` ("unified" or "split"). ``old_data``
    and ``new_data`` are the file's full contents, highlighted as a whole so
    multi-line tokens keep their colour. ``marks`` are leak marks for this
    file's new side. Pure apart from setting ``fd.rows`` and ``fd.language``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    lexer = lexer_for(fd.path)
    fd.language = lexer.name
    old_text, new_text = _decode(old_data), _decode(new_data)
    hl = _Highlighter(
        highlight_lines(old_text, lexer) if old_text is not None and fd.hunks else None,
        highlight_lines(new_text, lexer) if new_text is not None and fd.hunks else None,
    )
    gaps = _gaps(fd.hunks)
    # Only a file with both sides has unchanged lines to expand.
    spans = hidden_gaps(fd.hunks, line_total(new_data)) if old_text is not None and new_text is not None else []
    spans = spans or [None] * (len(fd.hunks) + 1)
    # One look at each whole side: most files hold nothing hidden and skip the per-line search.
    scan = any(text is not None and hidden_chars.has_hidden(text) for text in (old_text, new_text))
    if layout == "unified":
        unified: list[Row] = []
        for hunk, gap, span in zip(fd.hunks, gaps, spans, strict=False):
            unified.append(Row("hunk", None, None, _hunk_html(hunk), gap, span))
            for line, kind, html in _line_cells(hunk, hl, marks, scan):
                unified.append(Row(kind, line.old_no, line.new_no, html))
        if spans[-1] is not None:
            unified.append(Row("tail", None, None, SafeString(""), None, spans[-1]))
        fd.rows = unified
        fd.body_html = rows_html(unified, anchor=fd.anchor)
        return
    split: list[SplitRow] = []
    for hunk, gap, span in zip(fd.hunks, gaps, spans, strict=False):
        split.append(SplitRow("hunk", html=_hunk_html(hunk), gap=gap, hidden=span))
        split.extend(_split_rows(_line_cells(hunk, hl, marks, scan)))
    if spans[-1] is not None:
        split.append(SplitRow("tail", hidden=spans[-1]))
    fd.rows = split
    fd.body_html = rows_html(split, anchor=fd.anchor)


def _no(number: int | None, anchor: str = "", side: str = "") -> str:
    """A line number; with the file's ``anchor``, a permalink cell
    (``<anchor>-L<n>`` on the old side, ``<anchor>-R<n>`` on the new)."""
    if number is None:
        return ""
    if not anchor:
        return str(number)
    return f'<a href="#{anchor}-{side}{number}">{number}</a>'


def _number_cell(number: int | None, anchor: str, side: str) -> str:
    """The rest of a number cell's opening tag (its permalink id) and its content."""
    ident = f' id="{anchor}-{side}{number}"' if anchor and number is not None else ""
    return f"{ident}>{_no(number, anchor, side)}"


EXPAND_STEP = 20


def _expand_button(way: str, data: str, title: str, text: str) -> str:
    label = f'title="{title}" aria-label="expand {way}"'
    return f'<button type="button" class="expand expand-{way}" {data} {label}>{text}</button>'


def _gap_html(gap: int | None, hidden: Gap | None = None) -> str:
    """The words for hidden lines, and the buttons that fetch them (diff.js):
    up to ``EXPAND_STEP`` lines up or down, or all of them."""
    count = hidden.count if hidden is not None else gap
    if not count:
        return ""
    where = "below" if hidden is not None and hidden.tail else "above"
    words = f'<span class="gap">{count} unchanged line{"" if count == 1 else "s"} {where}</span>'
    if hidden is None:
        return words
    data = f'data-first="{hidden.first}" data-count="{hidden.count}" data-shift="{hidden.shift}"'
    buttons = []
    if not hidden.tail:
        buttons.append(_expand_button("up", data, f"show {EXPAND_STEP} more lines above the change", "↑"))
    if count > EXPAND_STEP:
        buttons.append(_expand_button("down", data, f"show {EXPAND_STEP} more lines below the previous change", "↓"))
    buttons.append(_expand_button("all", data, f"show all {count} lines", "↕ all"))
    return f'<span class="expanders">{"".join(buttons)}</span>{words}'


def rows_html(rows: Sequence[Row] | Sequence[SplitRow], *, anchor: str = "") -> SafeString:
    """The ``<tr>`` rows of a rendered file, built here rather than by a
    template loop (a file has thousands of cells). Row kinds and cell kinds
    are fixed words of this module, numbers are integers and every ``html``
    is already escaped line HTML, so nothing from the diff enters unescaped.
    With the file's ``anchor`` (a ``file_anchor``: hex digits), every line
    number is a permalink and hidden lines get their expand buttons."""
    out: list[str] = []
    items: Sequence[Row | SplitRow] = rows
    for index, row in enumerate(items):
        if row.kind in ("hunk", "tail"):
            cells = (
                '<td class="no"></td><td class="code" colspan="3">'
                if isinstance(row, SplitRow)
                else '<td class="no"></td><td class="no"></td><td class="code">'
            )
            hidden = row.hidden if anchor else None
            gap = f' data-gap="{index}"' if hidden is not None else ""
            words = _gap_html(row.gap, hidden)
            out.append(f'\n          <tr class="{row.kind}"{gap}>{cells}{row.html}{words}</td></tr>')
        elif isinstance(row, SplitRow):
            left, right = row.left, row.right
            assert left is not None and right is not None  # every line row has both cells
            old_no, new_no = _number_cell(left.no, anchor, "L"), _number_cell(right.no, anchor, "R")
            out.append(
                f'\n          <tr><td class="no {left.kind}"{old_no}</td>'
                f'<td class="code {left.kind}">{left.html}</td>'
                f'<td class="no {right.kind}"{new_no}</td>'
                f'<td class="code {right.kind}">{right.html}</td></tr>'
            )
        else:
            old_no, new_no = _number_cell(row.old_no, anchor, "L"), _number_cell(row.new_no, anchor, "R")
            out.append(
                f'\n          <tr class="{row.kind}"><td class="no"{old_no}</td>'
                f'<td class="no"{new_no}</td><td class="code">{row.html}</td></tr>'
            )
    return mark_safe("".join(out))  # fixed words, integers and already-escaped line HTML


def _hunk_html(hunk: DiffHunk) -> SafeString:
    header = escape(hunk.header)
    if hunk.section:
        section = reveal_html(hunk.section)
        return mark_safe(f'{header} <span class="section">{section}</span>')  # both parts escaped
    return header


def _split_rows(cells: list[tuple[DiffLine, str, SafeString]]) -> list[SplitRow]:
    """Context lines on both sides; a run of removals beside the run of
    additions that follows it, padded with empty cells."""
    rows: list[SplitRow] = []
    empty = Cell(None, "empty", SafeString(""))
    index = 0
    while index < len(cells):
        line, kind, html = cells[index]
        if kind == "ctx":
            rows.append(SplitRow("line", Cell(line.old_no, kind, html), Cell(line.new_no, kind, html)))
            index += 1
            continue
        if kind == "eof":
            # The marker belongs to the side of the line before it.
            previous = cells[index - 1][1] if index else "ctx"
            cell = Cell(None, "eof", html)
            rows.append(
                SplitRow(
                    "line",
                    cell if previous in ("del", "ctx") else empty,
                    cell if previous in ("add", "ctx") else empty,
                )
            )
            index += 1
            continue
        removed: list[Cell] = []
        added: list[Cell] = []
        while index < len(cells) and cells[index][1] in ("del", "eof"):
            line, kind, html = cells[index]
            removed.append(Cell(line.old_no, kind, html))
            index += 1
        while index < len(cells) and cells[index][1] in ("add", "eof"):
            line, kind, html = cells[index]
            added.append(Cell(line.new_no, kind, html))
            index += 1
        for left, right in zip_longest(removed, added):
            rows.append(SplitRow("line", left or empty, right or empty))
    return rows
