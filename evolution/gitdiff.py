"""Parse the output of ``git diff`` into file changes.

Pure functions, no ORM. ``unidiff`` handles hunks well but not the extended
git headers this project depends on (modes, renames and copies, quoted paths
with C-style escapes, binary patches), and silently guessing a path is worse
than refusing the diff, so this is a small strict parser instead. Anything it
does not recognise raises :class:`DiffParseError` with a 1-based line number.

Paths are returned without the ``a/`` / ``b/`` prefixes, decoded as UTF-8;
bytes that are not valid UTF-8 are kept as surrogate escapes so a caller can
reject them instead of seeing a silently replaced character.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

STATUSES = ("added", "deleted", "modified", "renamed", "copied")

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_MODE_RE = re.compile(r"^[0-7]{6}$")
_HEX_RE = re.compile(r"^[0-9a-f]+$")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: ([0-7]{6}))?$")
_BINARY_FILES_RE = re.compile(r"^Binary files (.+) and (.+) differ$")
_BINARY_SIZE_RE = re.compile(r"^(?:literal|delta) \d+$")
# One line of git's base85 binary patch: a length character then base85 data.
_BASE85_LINE_RE = re.compile(r"^[A-Za-z][0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]+$")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
# Full-length blob ids: SHA-1 and SHA-256 repositories.
_FULL_HASH_LENGTHS = (40, 64)


class DiffParseError(ValueError):
    """The text is not a git diff this parser understands."""

    def __init__(self, line_number: int, message: str) -> None:
        super().__init__(f"line {line_number}: {message}")
        self.line_number = line_number
        self.message = message


@dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk. ``lines`` keep their first character: ``' '``
    context, ``'+'`` added, ``'-'`` removed, ``'\\'`` the "No newline at end
    of file" marker for the line before it."""

    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[str] = field(default_factory=list)

    @property
    def added(self) -> list[str]:
        return [line[1:] for line in self.lines if line.startswith("+")]

    @property
    def removed(self) -> list[str]:
        return [line[1:] for line in self.lines if line.startswith("-")]


@dataclass(frozen=True)
class FileChange:
    """One file entry of a git diff. ``old_path`` is None for an added file,
    ``new_path`` None for a deleted one. Modes are git's six octal digits or
    None when the diff does not say (a pure rename prints no mode)."""

    old_path: str | None
    new_path: str | None
    old_mode: str | None
    new_mode: str | None
    status: str
    binary: bool = False
    hunks: list[Hunk] = field(default_factory=list)
    old_hash: str | None = None
    new_hash: str | None = None

    @property
    def path(self) -> str:
        """The path after the change, or before it for a deletion."""
        path = self.new_path if self.new_path is not None else self.old_path
        assert path is not None  # the parser never builds a change without a path
        return path

    @property
    def added_lines(self) -> list[str]:
        return [line for hunk in self.hunks for line in hunk.added]

    @property
    def removed_lines(self) -> list[str]:
        return [line for hunk in self.hunks for line in hunk.removed]


def parse_git_diff(text: str) -> list[FileChange]:
    """Parse ``git diff`` output (with or without ``-M``/``-C``/``--binary``/
    ``--full-index``). An empty or blank text is an empty diff. Pure and safe
    to repeat."""
    if not text.strip():
        return []
    # Split on "\n" only: str.splitlines() would also split on \r, \x0b, \x1c
    # or U+2028 inside file content and shift every following line.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    changes: list[FileChange] = []
    index = 0
    while index < len(lines):
        change, index = _parse_file(lines, index)
        changes.append(change)
    return changes


def whole_file_texts(change: FileChange) -> tuple[str | None, str | None]:
    """The complete old and new text of a file when the diff provably
    contains all of it, else None for that side.

    Proof is: an added file (old side empty) or deleted file (new side
    empty); or hunks that are contiguous from line 1 and reach the end of the
    file, shown by a "No newline at end of file" marker or by a *full-length*
    ``index`` blob id matching the reconstructed text. Abbreviated ids are not
    trusted: 28 bits can be brute-forced by whoever writes the file.
    """
    if change.binary:
        return None, None
    old_side, new_side = _side_texts(change.hunks)
    if change.status == "added":
        return "", new_side if _contiguous(change.hunks) else None
    if change.status == "deleted":
        return old_side if _contiguous(change.hunks) else None, ""
    if not change.hunks:
        return None, None
    if not _contiguous(change.hunks):
        return None, None
    first = change.hunks[0]
    if first.old_start == 0 and first.old_count == 0:
        # The old file was empty, so every new line is in the hunk.
        return old_side, new_side
    if (
        _reaches_eof(change.hunks[-1])
        or _hash_matches(change.old_hash, old_side)
        or _hash_matches(change.new_hash, new_side)
    ):
        return old_side, new_side
    return None, None


def git_blob_id(data: bytes, *, length: int = 40) -> str:
    """Git's blob object id of ``data`` (SHA-1, or SHA-256 for length 64)."""
    header = b"blob %d\0" % len(data)
    digest = hashlib.sha256 if length == 64 else hashlib.sha1
    return digest(header + data).hexdigest()


# --- Internals ----------------------------------------------------------------


@dataclass
class _Headers:
    header_names: tuple[str, str] | None = None
    old_mode: str | None = None
    new_mode: str | None = None
    new_file_mode: str | None = None
    deleted_file_mode: str | None = None
    index_mode: str | None = None
    old_hash: str | None = None
    new_hash: str | None = None
    rename_from: str | None = None
    rename_to: str | None = None
    copy_from: str | None = None
    copy_to: str | None = None
    minus_path: str | None = None
    plus_path: str | None = None
    has_minus_plus: bool = False
    binary: bool = False


def _parse_file(lines: list[str], start: int) -> tuple[FileChange, int]:
    line = lines[start]
    if not line.startswith("diff --git "):
        raise DiffParseError(start + 1, f"expected a 'diff --git' header, got {line[:60]!r}")
    headers = _Headers(header_names=_parse_header_names(line[len("diff --git ") :], start + 1))
    index = _parse_extended_headers(lines, start + 1, headers)
    hunks: list[Hunk] = []
    if index < len(lines):
        line = lines[index]
        if line.startswith("Binary files "):
            if not _BINARY_FILES_RE.match(line):
                raise DiffParseError(index + 1, "malformed 'Binary files ... differ' line")
            headers.binary = True
            index += 1
        elif line == "GIT binary patch":
            headers.binary = True
            index = _skip_binary_patch(lines, index + 1)
        elif line.startswith("--- "):
            index = _parse_minus_plus(lines, index, headers)
            hunks, index = _parse_hunks(lines, index)
        elif line.startswith("@@"):
            raise DiffParseError(index + 1, "hunk without '---'/'+++' file lines")
    if index < len(lines) and not lines[index].startswith("diff --git "):
        raise DiffParseError(index + 1, f"unexpected line {lines[index][:60]!r}")
    return _build_change(headers, hunks, start + 1), index


def _parse_extended_headers(lines: list[str], index: int, headers: _Headers) -> int:
    while index < len(lines):
        line = lines[index]
        number = index + 1
        if line.startswith(("diff --git ", "--- ", "Binary files ", "@@")) or line == "GIT binary patch":
            break
        if line.startswith("old mode "):
            headers.old_mode = _mode(line[len("old mode ") :], number)
        elif line.startswith("new mode "):
            headers.new_mode = _mode(line[len("new mode ") :], number)
        elif line.startswith("new file mode "):
            headers.new_file_mode = _mode(line[len("new file mode ") :], number)
        elif line.startswith("deleted file mode "):
            headers.deleted_file_mode = _mode(line[len("deleted file mode ") :], number)
        elif line.startswith(("similarity index ", "dissimilarity index ")):
            if not re.fullmatch(r"(?:dis)?similarity index \d{1,3}%", line):
                raise DiffParseError(number, "malformed similarity index")
        elif line.startswith("rename from "):
            headers.rename_from = _parse_bare_path(line[len("rename from ") :], number)
        elif line.startswith("rename to "):
            headers.rename_to = _parse_bare_path(line[len("rename to ") :], number)
        elif line.startswith("copy from "):
            headers.copy_from = _parse_bare_path(line[len("copy from ") :], number)
        elif line.startswith("copy to "):
            headers.copy_to = _parse_bare_path(line[len("copy to ") :], number)
        elif line.startswith("index "):
            match = _INDEX_RE.match(line)
            if not match:
                raise DiffParseError(number, "malformed index line")
            headers.old_hash, headers.new_hash, headers.index_mode = match.groups()
        else:
            raise DiffParseError(number, f"unexpected extended header line {line[:60]!r}")
        index += 1
    return index


def _parse_minus_plus(lines: list[str], index: int, headers: _Headers) -> int:
    headers.minus_path = _parse_side_path(lines[index][len("--- ") :], "a/", index + 1)
    if index + 1 >= len(lines) or not lines[index + 1].startswith("+++ "):
        raise DiffParseError(index + 2, "expected a '+++' line after '---'")
    headers.plus_path = _parse_side_path(lines[index + 1][len("+++ ") :], "b/", index + 2)
    headers.has_minus_plus = True
    return index + 2


def _parse_hunks(lines: list[str], index: int) -> tuple[list[Hunk], int]:
    hunks: list[Hunk] = []
    if index >= len(lines) or not lines[index].startswith("@@"):
        raise DiffParseError(index + 1, "expected a hunk header after '+++'")
    while index < len(lines) and lines[index].startswith("@@"):
        hunk, index = _parse_hunk(lines, index)
        hunks.append(hunk)
    return hunks, index


def _parse_hunk(lines: list[str], index: int) -> tuple[Hunk, int]:
    header = lines[index]
    match = _HUNK_RE.match(header)
    if not match:
        raise DiffParseError(index + 1, f"malformed hunk header {header[:60]!r}")
    old_start, new_start = int(match.group(1)), int(match.group(3))
    old_count = int(match.group(2)) if match.group(2) is not None else 1
    new_count = int(match.group(4)) if match.group(4) is not None else 1
    old_left, new_left = old_count, new_count
    body: list[str] = []
    index += 1
    # Consume exactly as many lines as the header announces (as git apply
    # does), so a content line that looks like a header cannot end the hunk.
    while old_left > 0 or new_left > 0:
        if index >= len(lines):
            raise DiffParseError(index + 1, "hunk is shorter than its header says")
        line = lines[index]
        # Some editors strip the single space of an empty context line.
        kind = line[:1] or " "
        if kind == " ":
            old_left, new_left = old_left - 1, new_left - 1
            line = line or " "
        elif kind == "-":
            old_left -= 1
        elif kind == "+":
            new_left -= 1
        elif kind == "\\":
            if not body:
                raise DiffParseError(index + 1, "'\\' marker before any hunk line")
        else:
            raise DiffParseError(index + 1, f"unexpected line in hunk {line[:60]!r}")
        if old_left < 0 or new_left < 0:
            raise DiffParseError(index + 1, "hunk is longer than its header says")
        body.append(line)
        index += 1
    if index < len(lines) and lines[index].startswith("\\"):
        body.append(lines[index])
        index += 1
    return Hunk(header, old_start, old_count, new_start, new_count, body), index


def _skip_binary_patch(lines: list[str], index: int) -> int:
    if index >= len(lines) or not _BINARY_SIZE_RE.match(lines[index]):
        raise DiffParseError(index + 1, "expected 'literal N' or 'delta N' after 'GIT binary patch'")
    while index < len(lines) and not lines[index].startswith("diff --git "):
        line = lines[index]
        if line and not _BINARY_SIZE_RE.match(line) and not _BASE85_LINE_RE.match(line):
            raise DiffParseError(index + 1, "malformed binary patch line")
        index += 1
    return index


def _build_change(headers: _Headers, hunks: list[Hunk], number: int) -> FileChange:
    status = _status(headers, number)
    old_path, new_path = _paths(headers, status, number)
    if status == "modified" and old_path != new_path:
        # Only a rename or copy may change the name; anything else would let
        # a diff edit one path while claiming another.
        raise DiffParseError(number, f"file name changes from {old_path!r} to {new_path!r} without a rename")
    old_mode = headers.old_mode or headers.deleted_file_mode or headers.index_mode
    new_mode = headers.new_mode or headers.new_file_mode or headers.index_mode
    if (headers.old_mode is None) != (headers.new_mode is None):
        raise DiffParseError(number, "'old mode' and 'new mode' must come together")
    if status == "added":
        old_mode = None
    if status == "deleted":
        new_mode = None
    if status in ("added", "deleted") and (headers.old_mode or headers.new_mode):
        raise DiffParseError(number, "mode change on an added or deleted file")
    return FileChange(
        old_path=old_path,
        new_path=new_path,
        old_mode=old_mode,
        new_mode=new_mode,
        status=status,
        binary=headers.binary,
        hunks=hunks,
        old_hash=headers.old_hash,
        new_hash=headers.new_hash,
    )


def _status(headers: _Headers, number: int) -> str:
    flags = {
        "added": headers.new_file_mode is not None,
        "deleted": headers.deleted_file_mode is not None,
        "renamed": headers.rename_from is not None or headers.rename_to is not None,
        "copied": headers.copy_from is not None or headers.copy_to is not None,
    }
    present = [name for name, on in flags.items() if on]
    if len(present) > 1:
        raise DiffParseError(number, f"contradictory headers: {' and '.join(present)}")
    if flags["renamed"] and (headers.rename_from is None or headers.rename_to is None):
        raise DiffParseError(number, "'rename from' and 'rename to' must come together")
    if flags["copied"] and (headers.copy_from is None or headers.copy_to is None):
        raise DiffParseError(number, "'copy from' and 'copy to' must come together")
    return present[0] if present else "modified"


def _paths(headers: _Headers, status: str, number: int) -> tuple[str | None, str | None]:
    """Old and new path, cross-checked between every place that names them
    (git apply likewise refuses a diff whose names disagree)."""
    if headers.has_minus_plus:
        if (headers.minus_path is None) != (status == "added"):
            raise DiffParseError(number, "'--- /dev/null' must go with 'new file mode'")
        if (headers.plus_path is None) != (status == "deleted"):
            raise DiffParseError(number, "'+++ /dev/null' must go with 'deleted file mode'")
    header_old, header_new = headers.header_names or (None, None)
    if status == "added":
        # git names an added file on both sides of its 'diff --git' header.
        sources = {"new": [headers.plus_path, header_new, header_old]}
    elif status == "deleted":
        sources = {"old": [headers.minus_path, header_old, header_new]}
    else:
        sources = {
            "old": [headers.rename_from or headers.copy_from, headers.minus_path, header_old],
            "new": [headers.rename_to or headers.copy_to, headers.plus_path, header_new],
        }
    resolved: dict[str, str | None] = {"old": None, "new": None}
    for side, names in sources.items():
        known = [name for name in names if name is not None]
        if not known:
            raise DiffParseError(number, "cannot tell the file names apart in the 'diff --git' header")
        if any(name != known[0] for name in known):
            raise DiffParseError(number, f"inconsistent {side} file names: {sorted(set(known))!r}")
        resolved[side] = known[0]
    return resolved["old"], resolved["new"]


def _parse_header_names(rest: str, number: int) -> tuple[str, str] | None:
    """The two names of ``diff --git a/X b/Y``, or None when unquoted names
    with spaces make the split ambiguous (rename/copy or ---/+++ lines then
    decide, as in git)."""
    if rest.startswith('"'):
        first, end = _unquote(rest, 0, number)
        if rest[end : end + 1] != " ":
            raise DiffParseError(number, "malformed 'diff --git' header")
        second_raw = rest[end + 1 :]
        second = _unquote_whole(second_raw, number) if second_raw.startswith('"') else second_raw
        return _strip_prefix(first, "a/", number), _strip_prefix(second, "b/", number)
    if rest.endswith('"'):
        # Unquoted first name, quoted second: find where a complete quoted
        # name starts that runs to the end of the line.
        for position in range(len(rest) - 1, 0, -1):
            if rest[position] == '"' and rest[position - 1] == " ":
                try:
                    second, end = _unquote(rest, position, number)
                except DiffParseError:
                    continue
                if end == len(rest):
                    first = rest[: position - 1]
                    return _strip_prefix(first, "a/", number), _strip_prefix(second, "b/", number)
        raise DiffParseError(number, "malformed quoted name in 'diff --git' header")
    if len(rest) % 2 == 1:
        middle = len(rest) // 2
        first, second = rest[:middle], rest[middle + 1 :]
        if rest[middle] == " " and first.startswith("a/") and second.startswith("b/") and first[2:] == second[2:]:
            return first[2:], second[2:]
    if rest.count(" b/") == 1 and rest.startswith("a/"):
        first, second = rest.split(" b/")
        return first[2:], second
    if not rest.startswith("a/") or " b/" not in rest:
        raise DiffParseError(number, "'diff --git' header names must start with 'a/' and 'b/'")
    return None


def _parse_side_path(raw: str, prefix: str, number: int) -> str | None:
    if raw == "/dev/null":
        return None
    if raw.startswith('"'):
        return _strip_prefix(_unquote_whole(raw, number), prefix, number)
    # git appends a tab to a name containing a space; a name with a real tab
    # would have been quoted.
    if raw.endswith("\t"):
        raw = raw[:-1]
    return _strip_prefix(raw, prefix, number)


def _parse_bare_path(raw: str, number: int) -> str:
    path = _unquote_whole(raw, number) if raw.startswith('"') else raw
    if not path:
        raise DiffParseError(number, "empty path")
    return path


def _strip_prefix(name: str, prefix: str, number: int) -> str:
    if not name.startswith(prefix) or len(name) == len(prefix):
        raise DiffParseError(number, f"file name {name[:60]!r} does not start with {prefix!r}")
    return name[len(prefix) :]


def _unquote_whole(raw: str, number: int) -> str:
    value, end = _unquote(raw, 0, number)
    if end != len(raw):
        raise DiffParseError(number, "text after a quoted file name")
    return value


def _unquote(text: str, start: int, number: int) -> tuple[str, int]:
    """Decode git's C-style quoted name starting at ``text[start] == '"'``;
    return it and the index just past the closing quote."""
    out = bytearray()
    index = start + 1
    while index < len(text):
        char = text[index]
        if char == '"':
            return out.decode("utf-8", errors="surrogateescape"), index + 1
        if char != "\\":
            out += char.encode("utf-8", errors="surrogateescape")
            index += 1
            continue
        escape = text[index + 1 : index + 2]
        if escape in _ESCAPES:
            out.append(_ESCAPES[escape])
            index += 2
        elif re.fullmatch(r"[0-3][0-7]{2}", text[index + 1 : index + 4]):
            out.append(int(text[index + 1 : index + 4], 8))
            index += 4
        else:
            raise DiffParseError(number, f"bad escape in quoted file name: \\{escape}")
    raise DiffParseError(number, "unterminated quoted file name")


def _mode(raw: str, number: int) -> str:
    if not _MODE_RE.match(raw):
        raise DiffParseError(number, f"malformed file mode {raw!r}")
    return raw


def _side_texts(hunks: list[Hunk]) -> tuple[str, str]:
    old: list[str] = []
    new: list[str] = []
    last: list[list[str]] = []
    for hunk in hunks:
        for line in hunk.lines:
            kind, content = line[:1], line[1:]
            if kind == "\\":
                # The previous line has no newline at the end of the file.
                for side in last:
                    side[-1] = side[-1][:-1]
                continue
            last = []
            if kind in (" ", "-"):
                old.append(content + "\n")
                last.append(old)
            if kind in (" ", "+"):
                new.append(content + "\n")
                last.append(new)
    return "".join(old), "".join(new)


def _contiguous(hunks: list[Hunk]) -> bool:
    """Hunks start at line 1 and leave no gap of unchanged lines between
    them (an empty old or new side starts at 0)."""
    expected_old = expected_new = None
    for hunk in hunks:
        old_start = hunk.old_start if hunk.old_count else hunk.old_start + 1
        new_start = hunk.new_start if hunk.new_count else hunk.new_start + 1
        if expected_old is None:
            if old_start != 1 or new_start != 1:
                return False
        elif old_start != expected_old or new_start != expected_new:
            return False
        expected_old = old_start + hunk.old_count
        expected_new = new_start + hunk.new_count
    return True


def _reaches_eof(hunk: Hunk) -> bool:
    """A "No newline at end of file" marker proves the hunk ends at the end
    of the file on that side, so no unchanged tail follows on either side."""
    return any(line.startswith("\\") for line in hunk.lines)


def _hash_matches(blob_id: str | None, text: str) -> bool:
    if blob_id is None or len(blob_id) not in _FULL_HASH_LENGTHS or not _HEX_RE.match(blob_id):
        return False
    data = text.encode("utf-8", errors="surrogateescape")
    return git_blob_id(data, length=len(blob_id)) == blob_id
