"""Harness file trees as plain values: read, validate, write out and diff.

Pure module, no ORM: storage lives in ``evolution.services.snapshots``. A
tree is a list of ``FileEntry`` (path, git-style mode, bytes); a symlink is an
entry of mode 120000 whose data is the link target, as git stores it.

Every reader validates the whole tree before returning, so a caller that
stores what a reader returns never stores half of a bad tree. ``materialize``
validates again before writing anything (defence in depth: the entries may
come from a database someone edited).
"""

from __future__ import annotations

import difflib
import os
import posixpath
import stat
import subprocess
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from evolution.digests import blob_digest

MODE_FILE = "100644"
MODE_EXECUTABLE = "100755"
MODE_SYMLINK = "120000"
MODES = frozenset({MODE_FILE, MODE_EXECUTABLE, MODE_SYMLINK})

# TreeEntry.path is a CharField(max_length=1024); most filesystems cap a
# name at 255 bytes, so a longer segment could be stored but never written.
MAX_PATH_CHARS = 1024
MAX_SEGMENT_BYTES = 255
# Same bound as the kernel's: deeper symlink chains fail with ELOOP anyway.
MAX_SYMLINK_HOPS = 40
GIT_TIMEOUT_SECONDS = 300
# git abbreviates object ids to 7 hex digits by default.
ABBREV = 7
DIFF_CONTEXT = 3


class SnapshotError(ValueError):
    """A tree (or one of its paths) that cannot be snapshotted or written."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    mode: str
    data: bytes


# --- Paths ----------------------------------------------------------------------


def _display(raw: str | bytes) -> str:
    """A printable form of a possibly undecodable name, for error messages."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    return raw.decode("utf-8", "backslashreplace")


def normalize_path(path: str | bytes) -> str:
    """Validate a relative POSIX path and return it as a ``str``.

    Accepts ``bytes`` (as read from the filesystem or git) or ``str`` (possibly
    surrogate-escaped by ``os.fsdecode``). Nothing is rewritten: a valid path
    comes back unchanged, anything ambiguous is refused, so one file always
    has exactly one spelling and therefore one tree digest.
    """
    if isinstance(path, bytes):
        try:
            text = path.decode("utf-8")
        except UnicodeDecodeError:
            raise SnapshotError(f"{_display(path)}: file name is not valid UTF-8") from None
    else:
        text = path
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise SnapshotError(f"{_display(path)}: file name is not valid UTF-8") from None
    if not text:
        raise SnapshotError("empty path")
    if len(text) > MAX_PATH_CHARS:
        raise SnapshotError(f"{text[:80]}...: path is longer than {MAX_PATH_CHARS} characters")
    if text.startswith("/"):
        raise SnapshotError(f"{text}: absolute paths are not allowed")
    if "\\" in text:
        raise SnapshotError(f"{text}: backslashes are not allowed in paths")
    if any(unicodedata.category(ch) == "Cc" for ch in text):
        # NUL, newlines, escapes and C1 controls: they break tools and
        # terminals, and can hide one name behind another when printed.
        raise SnapshotError(f"{text!r}: control characters are not allowed in paths")
    for segment in text.split("/"):
        if segment in ("", ".", ".."):
            raise SnapshotError(f"{text}: empty, '.' and '..' path segments are not allowed")
        # Case-insensitive: on macOS and Windows ".GIT" is the same folder.
        if segment.lower() == ".git":
            raise SnapshotError(f"{text}: '.git' path segments are not allowed")
        if len(segment.encode("utf-8")) > MAX_SEGMENT_BYTES:
            raise SnapshotError(f"{text}: a path segment is longer than {MAX_SEGMENT_BYTES} bytes")
    return text


# --- Validation -----------------------------------------------------------------


def _symlink_target(entry: FileEntry) -> str:
    try:
        target = entry.data.decode("utf-8")
    except UnicodeDecodeError:
        raise SnapshotError(f"{entry.path}: symlink target is not valid UTF-8") from None
    if not target or "\0" in target:
        raise SnapshotError(f"{entry.path}: symlink target is empty or contains NUL")
    if target.startswith("/"):
        raise SnapshotError(f"{entry.path}: symlink target {target!r} is absolute")
    return target


def _check_symlink_inside(path: str, links: Mapping[str, str]) -> None:
    """Resolve the symlink at ``path`` against the tree's own symlinks and
    refuse it if any step climbs above the root.

    A lexical check alone is not enough: with ``up -> .`` at the root,
    ``x -> up/..`` looks harmless but leaves the tree. Components that are
    not symlinks in the tree are taken literally (a dangling link stays
    inside). Loops are refused, since they can never be resolved.
    """
    stack = path.split("/")[:-1]
    pending = list(reversed(links[path].split("/")))
    hops = 0
    while pending:
        segment = pending.pop()
        if segment in ("", "."):
            continue
        if segment == "..":
            if not stack:
                raise SnapshotError(f"{path}: symlink target {links[path]!r} points outside the tree")
            stack.pop()
            continue
        candidate = "/".join([*stack, segment])
        if candidate in links:
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                raise SnapshotError(f"{path}: symlink loop")
            # The target of the link at ``candidate`` is relative to its own
            # directory, which is ``stack``: leave the stack as it is.
            pending.extend(reversed(links[candidate].split("/")))
        else:
            stack.append(segment)


def validate_entries(entries: Iterable[FileEntry]) -> list[FileEntry]:
    """Check a whole tree and return its entries sorted by path.

    Refuses invalid paths and modes, duplicate paths, a path under another
    entry (which would write through a file or a symlink), and symlinks that
    are absolute, not UTF-8 or resolve outside the tree. Pure and repeatable.
    """
    by_path: dict[str, FileEntry] = {}
    for entry in entries:
        if normalize_path(entry.path) != entry.path:
            raise SnapshotError(f"{entry.path}: path is not normalized")
        if entry.mode not in MODES:
            raise SnapshotError(f"{entry.path}: unsupported mode {entry.mode!r}")
        if entry.path in by_path:
            raise SnapshotError(f"{entry.path}: duplicate path")
        by_path[entry.path] = entry
    for path in by_path:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in by_path:
                raise SnapshotError(f"{path}: {parent} is a file or symlink, not a directory")
    links = {path: _symlink_target(entry) for path, entry in by_path.items() if entry.mode == MODE_SYMLINK}
    for path in sorted(links):
        _check_symlink_inside(path, links)
    return [by_path[path] for path in sorted(by_path)]


# --- Reading a directory --------------------------------------------------------


def _special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _open_nofollow(name: bytes | str, *, dir_fd: int | None = None) -> tuple[BinaryIO, os.stat_result]:
    """Open a file for reading without following a symlink (O_NOFOLLOW: one
    swapped in after a scan fails with ELOOP) and without blocking on a fifo
    (O_NONBLOCK); the open file and its fstat. OSError as ``os.open`` raises it."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    handle = os.fdopen(fd, "rb")
    return handle, os.fstat(fd)


def _not_followed(error: OSError, where: str, mode: int) -> SnapshotError:
    if stat.S_ISLNK(mode):
        return SnapshotError(f"{where}: a symbolic link (links are not followed)")
    return SnapshotError(f"{where}: cannot open ({error.strerror})")


def open_inside(root: Path, relative: str) -> BinaryIO:
    """Open the regular file at ``relative`` (a path ``normalize_path``
    takes: no ``..``, not absolute) under the folder ``root``, following no
    symbolic link below ``root``: each folder on the way is opened with
    O_NOFOLLOW relative to the one before, so a link swapped in meanwhile is
    refused as well, and the file as ``read_directory`` opens one.

    SnapshotError naming ``relative`` for a link or anything that is not a
    folder or a regular file; FileNotFoundError when a part is missing. The
    caller closes the file. Reads nothing.
    """
    parts = normalize_path(relative).split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for depth, part in enumerate(parts[:-1]):
            where = "/".join(parts[: depth + 1])
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise _not_followed(exc, where, os.lstat(part, dir_fd=fd).st_mode) from None
            os.close(fd)
            fd = child
        try:
            handle, info = _open_nofollow(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _not_followed(exc, relative, os.lstat(parts[-1], dir_fd=fd).st_mode) from None
        if not stat.S_ISREG(info.st_mode):
            handle.close()
            raise SnapshotError(f"{relative}: a {_special_kind(info.st_mode)}, not a regular file")
        return handle
    finally:
        os.close(fd)


def _read_regular(full: bytes, path: str, max_file_bytes: int) -> tuple[bytes, bool]:
    """Read a regular file without following a symlink swapped in after the
    scan, and without blocking on a fifo swapped in; returns (data, executable)."""
    try:
        handle, info = _open_nofollow(full)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot open ({exc.strerror})") from None
    with handle:
        if not stat.S_ISREG(info.st_mode):
            raise SnapshotError(f"{path}: changed into a {_special_kind(info.st_mode)} while being read")
        # One byte more than allowed tells a file that grew since the scan.
        data = handle.read(max_file_bytes + 1)
    if len(data) > max_file_bytes:
        raise SnapshotError(f"{path}: file is larger than the {max_file_bytes}-byte limit")
    return data, bool(info.st_mode & stat.S_IXUSR)


def read_directory(root: Path, *, max_file_bytes: int, max_files: int) -> list[FileEntry]:
    """Snapshot the files under ``root`` (sorted by path).

    A top-level ``.git`` is skipped; empty directories are not represented
    (as in git). The executable bit is kept as mode 100755. Symlinks are
    stored, not followed, and must stay inside the tree. Raises SnapshotError
    naming the first offending path; reads only, safe to repeat.
    """
    root_bytes = os.fsencode(root)
    try:
        root_mode = os.stat(root_bytes).st_mode
    except OSError as exc:
        raise SnapshotError(f"{root}: cannot read directory ({exc.strerror})") from None
    if not stat.S_ISDIR(root_mode):
        raise SnapshotError(f"{root}: not a directory")

    entries: list[FileEntry] = []
    pending: list[bytes] = [b""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(os.path.join(root_bytes, rel_dir) if rel_dir else root_bytes) as scan:
            items = sorted(scan, key=lambda item: item.name)
        subdirs: list[bytes] = []
        for item in items:
            if not rel_dir and item.name == b".git":
                continue
            rel = rel_dir + b"/" + item.name if rel_dir else item.name
            path = normalize_path(rel)
            info = item.stat(follow_symlinks=False)
            mode = info.st_mode
            if stat.S_ISDIR(mode):
                subdirs.append(rel)
                continue
            if stat.S_ISLNK(mode):
                entry = FileEntry(path=path, mode=MODE_SYMLINK, data=os.readlink(item.path))
                _symlink_target(entry)
                # The target is the blob git stores, so the same limit applies.
                if len(entry.data) > max_file_bytes:
                    raise SnapshotError(
                        f"{path}: file is {len(entry.data)} bytes, over the {max_file_bytes}-byte limit"
                    )
            elif stat.S_ISREG(mode):
                size = info.st_size
                if size > max_file_bytes:
                    raise SnapshotError(f"{path}: file is {size} bytes, over the {max_file_bytes}-byte limit")
                data, executable = _read_regular(item.path, path, max_file_bytes)
                entry = FileEntry(path=path, mode=MODE_EXECUTABLE if executable else MODE_FILE, data=data)
            else:
                raise SnapshotError(f"{path}: {_special_kind(mode)}s cannot be snapshotted")
            if len(entries) >= max_files:
                raise SnapshotError(f"{path}: the tree has more than {max_files} files")
            entries.append(entry)
        # Depth first in name order, so the first error reported is stable.
        pending.extend(reversed(subdirs))
    return validate_entries(entries)


# --- Reading a git tree ---------------------------------------------------------


def _git(repo: Path, args: Sequence[str], *, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    # Drop inherited GIT_* variables (GIT_DIR from a hook would silently
    # point us at another repository) and stop discovery at ``repo`` so a
    # plain folder inside some checkout is not read as that checkout.
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(
        GIT_CEILING_DIRECTORIES=str(repo.resolve().parent),
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
    )
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            input=stdin,
            capture_output=True,
            env=env,
            timeout=GIT_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapshotError(f"{repo}: git {args[0]} failed ({exc})") from None


def _git_error(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode("utf-8", "replace").strip() or f"exit status {result.returncode}"


def _parse_cat_file_batch(output: bytes, oids: Sequence[bytes]) -> dict[bytes, bytes]:
    contents: dict[bytes, bytes] = {}
    offset = 0
    for oid in oids:
        newline = output.find(b"\n", offset)
        header = output[offset:newline].split(b" ") if newline >= 0 else []
        if len(header) != 3 or header[0] != oid or header[1] != b"blob" or not header[2].isdigit():
            raise SnapshotError(f"git object {oid.decode()} is missing or not a blob")
        size = int(header[2])
        start = newline + 1
        if start + size > len(output):
            raise SnapshotError(f"git object {oid.decode()} was cut short")
        contents[oid] = output[start : start + size]
        # Each object is followed by a single LF.
        offset = start + size + 1
    return contents


def read_git(repo: Path, ref: str, *, max_file_bytes: int, max_files: int) -> list[FileEntry]:
    """Snapshot the tree at ``ref`` (a commit, tag or tree) in the git
    repository ``repo``, with the same rules as ``read_directory``.

    Submodules (gitlinks) are refused: their files are not in this
    repository. Reads only, safe to repeat.
    """
    if not ref or ref.startswith("-") or any(unicodedata.category(ch) == "Cc" for ch in ref):
        raise SnapshotError(f"{ref!r}: not a usable git ref")
    resolved = _git(repo, ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{tree}}"])
    if resolved.returncode != 0:
        raise SnapshotError(f"{ref}: no such commit or tree in {repo} ({_git_error(resolved)})")
    tree_oid = resolved.stdout.strip().decode()

    listing = _git(repo, ["ls-tree", "-r", "-z", "-l", "--full-tree", tree_oid])
    if listing.returncode != 0:
        raise SnapshotError(f"{ref}: cannot list the tree in {repo} ({_git_error(listing)})")
    rows: list[tuple[str, str, bytes]] = []
    for record in listing.stdout.split(b"\0"):
        if not record:
            continue
        meta, raw_path = record.split(b"\t", 1)
        mode, _kind, oid, size = meta.split()
        if mode == b"160000":
            raise SnapshotError(f"{_display(raw_path)}: submodules (gitlinks) are not supported")
        path = normalize_path(raw_path)
        if mode.decode() not in MODES:
            raise SnapshotError(f"{path}: unsupported git mode {mode.decode()}")
        if int(size) > max_file_bytes:
            raise SnapshotError(f"{path}: file is {int(size)} bytes, over the {max_file_bytes}-byte limit")
        if len(rows) >= max_files:
            raise SnapshotError(f"{path}: the tree has more than {max_files} files")
        rows.append((path, mode.decode(), oid))

    oids = list(dict.fromkeys(oid for _, _, oid in rows))
    contents: dict[bytes, bytes] = {}
    if oids:
        batch = _git(repo, ["cat-file", "--batch"], stdin=b"".join(oid + b"\n" for oid in oids))
        if batch.returncode != 0:
            raise SnapshotError(f"{ref}: cannot read blobs from {repo} ({_git_error(batch)})")
        contents = _parse_cat_file_batch(batch.stdout, oids)
    return validate_entries(FileEntry(path=path, mode=mode, data=contents[oid]) for path, mode, oid in rows)


# --- Writing a tree out ---------------------------------------------------------


def materialize(entries: Iterable[FileEntry], dest: Path) -> None:
    """Write a tree into ``dest``, which must be missing or an empty directory.

    Everything is validated before the first write, so a refused tree leaves
    ``dest`` untouched. Files get exactly mode 0o644 or 0o755 whatever the
    umask. Not safe to repeat into the same ``dest`` (it is no longer empty).
    """
    checked = validate_entries(entries)
    if dest.is_symlink():
        raise SnapshotError(f"{dest}: destination is a symlink")
    if dest.exists():
        if not dest.is_dir():
            raise SnapshotError(f"{dest}: destination is not a directory")
        if any(dest.iterdir()):
            raise SnapshotError(f"{dest}: destination is not empty")
    dest.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(dest)

    # Regular files first: no symlink exists yet, so no parent directory
    # created here can be a link pointing elsewhere.
    for entry in checked:
        if entry.mode == MODE_SYMLINK:
            continue
        target = dest.joinpath(*entry.path.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o755 if entry.mode == MODE_EXECUTABLE else 0o644
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(entry.data)
            os.fchmod(handle.fileno(), mode)
    for entry in checked:
        if entry.mode != MODE_SYMLINK:
            continue
        link = dest.joinpath(*entry.path.split("/"))
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(entry.data.decode("utf-8"), link)
    # Second line of defence: ask the filesystem where each link lands.
    for entry in checked:
        if entry.mode != MODE_SYMLINK:
            continue
        landed = os.path.realpath(dest.joinpath(*entry.path.split("/")))
        if os.path.commonpath([root, landed]) != root:
            raise SnapshotError(f"{entry.path}: symlink resolves outside {dest}")


# --- Diff -----------------------------------------------------------------------

ChangeStatus = Literal["added", "deleted", "modified", "renamed"]


@dataclass(frozen=True)
class FileChange:
    """One file pair of a diff; ``old`` is None when added, ``new`` when deleted."""

    status: ChangeStatus
    old: FileEntry | None
    new: FileEntry | None

    @property
    def path(self) -> str:
        entry = self.new if self.new is not None else self.old
        assert entry is not None
        return entry.path


@dataclass(frozen=True)
class DiffStat:
    path: str
    old_path: str | None
    status: ChangeStatus
    added: int
    removed: int
    binary: bool


def _by_path(entries: Sequence[FileEntry], side: str) -> dict[str, FileEntry]:
    found: dict[str, FileEntry] = {}
    for entry in entries:
        if entry.path in found:
            raise SnapshotError(f"{entry.path}: duplicate path in the {side} tree")
        found[entry.path] = entry
    return found


def _exact_renames(
    old: Mapping[str, FileEntry], new: Mapping[str, FileEntry], deleted: list[str], added: list[str]
) -> dict[str, str]:
    """Pair added paths with deleted paths of identical content, as git's
    exact rename detection does: destinations in path order each take the
    first unused source, preferring one with the same file name; a symlink
    only pairs with a symlink."""
    sources: dict[str, list[str]] = {}
    for path in deleted:
        sources.setdefault(blob_digest(old[path].data), []).append(path)
    used: set[str] = set()
    renames: dict[str, str] = {}
    for dest in added:
        target = new[dest]
        best, best_score = None, -1
        for src in sources.get(blob_digest(target.data), []):
            source = old[src]
            if MODE_SYMLINK in (source.mode, target.mode) and source.mode != target.mode:
                continue
            if src in used:
                continue
            score = 1 + (posixpath.basename(src) == posixpath.basename(dest))
            if score > best_score:
                best, best_score = src, score
                if score == 2:
                    break
        if best is not None:
            used.add(best)
            renames[dest] = best
    return renames


def diff_changes(old: Sequence[FileEntry], new: Sequence[FileEntry]) -> list[FileChange]:
    """The changed file pairs between two trees, in the order ``git diff``
    prints them (by path; a rename sits at its new path; a change between
    file and symlink is a deletion followed by an addition)."""
    old_map = _by_path(old, "old")
    new_map = _by_path(new, "new")
    deleted = sorted(path for path in old_map if path not in new_map)
    added = sorted(path for path in new_map if path not in old_map)
    renames = _exact_renames(old_map, new_map, deleted, added)
    renamed_from = set(renames.values())

    keyed: list[tuple[str, FileChange]] = []
    for path in deleted:
        if path not in renamed_from:
            keyed.append((path, FileChange("deleted", old_map[path], None)))
    for path in added:
        if path in renames:
            keyed.append((path, FileChange("renamed", old_map[renames[path]], new_map[path])))
        else:
            keyed.append((path, FileChange("added", None, new_map[path])))
    for path in sorted(old_map.keys() & new_map.keys()):
        before, after = old_map[path], new_map[path]
        if before == after:
            continue
        if (before.mode == MODE_SYMLINK) != (after.mode == MODE_SYMLINK):
            keyed.append((path, FileChange("deleted", before, None)))
            keyed.append((path, FileChange("added", None, after)))
        else:
            keyed.append((path, FileChange("modified", before, after)))
    # Stable sort: the deletion half of a type change stays first.
    keyed.sort(key=lambda item: item[0])
    return [change for _, change in keyed]


def _quote(name: str) -> str:
    """Quote a path the way git does with core.quotePath (the default)."""
    escapes = {7: "a", 8: "b", 9: "t", 10: "n", 11: "v", 12: "f", 13: "r", 34: '"', 92: "\\"}
    raw = name.encode("utf-8")
    if not any(byte < 0x20 or byte >= 0x7F or byte in (34, 92) for byte in raw):
        return name
    out = []
    for byte in raw:
        if byte in escapes:
            out.append("\\" + escapes[byte])
        elif byte < 0x20 or byte >= 0x7F:
            out.append(f"\\{byte:03o}")
        else:
            out.append(chr(byte))
    return '"' + "".join(out) + '"'


def is_binary(data: bytes) -> bool:
    """Whether ``diff_entries`` reports content as binary: a NUL byte, or not UTF-8."""
    if b"\0" in data:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _split_lines(text: str) -> list[str]:
    # Only LF ends a line for git; str.splitlines would also split on CR,
    # form feeds and Unicode separators.
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _function_name(line: str) -> str | None:
    """git's default hunk-header function line: a line starting with an
    ASCII letter, '_' or '$', cut to 80 bytes, trailing whitespace removed."""
    if not line or not (line[0].isascii() and (line[0].isalpha() or line[0] in "_$")):
        return None
    raw = line.encode("utf-8", "surrogateescape")[:80].rstrip(b" \t\r\n")
    # A cut in the middle of a character drops the partial character.
    return raw.decode("utf-8", "ignore")


def _range(start: int, count: int) -> str:
    if count == 1:
        return str(start + 1)
    return f"{start + 1 if count else start},{count}"


def _hunks(before: list[str], after: list[str]) -> list[str]:
    """Unified hunks with git's hunk headers and no-newline markers.

    difflib's SequenceMatcher groups the changes exactly like
    ``difflib.unified_diff`` (3 lines of context, hunks closer than 6 lines
    merged, as git does); we format the groups ourselves to add git's
    function context and ``\\ No newline at end of file``. autojunk is off so
    frequent lines in long files are not ignored when matching.
    """
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    out: list[str] = []
    function = ""
    previous_start = -1
    for group in matcher.get_grouped_opcodes(DIFF_CONTEXT):
        first, last = group[0], group[-1]
        a_start, a_end, b_start, b_end = first[1], last[2], first[3], last[4]
        # Search upwards from the line above the hunk, but not past the
        # previous hunk's search start; if nothing is found git keeps the
        # previous hunk's function line.
        for index in range(a_start - 1, previous_start, -1):
            name = _function_name(before[index])
            if name is not None:
                function = name
                break
        previous_start = a_start - 1
        header = f"@@ -{_range(a_start, a_end - a_start)} +{_range(b_start, b_end - b_start)} @@"
        out.append(f"{header} {function}\n" if function else header + "\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines = [(" ", line) for line in before[i1:i2]]
            else:
                lines = [("-", line) for line in before[i1:i2]] + [("+", line) for line in after[j1:j2]]
            for prefix, line in lines:
                out.append(prefix + line)
                if not line.endswith("\n"):
                    out.append("\n\\ No newline at end of file\n")
    return out


def _abbrev(data: bytes | None) -> str:
    return blob_digest(data)[:ABBREV] if data is not None else "0" * ABBREV


def _label(prefix: str, entry: FileEntry | None) -> str:
    if entry is None:
        return "/dev/null"
    return _quote(prefix + entry.path)


def decodable_text(data: bytes) -> str:
    """The text of file contents as UTF-8, each byte that is not UTF-8 kept
    as a lone surrogate U+DC80-U+DCFF (``surrogateescape``): lossless, and
    ``evolution.hidden_chars`` reports those bytes and NULs. Not encodable
    or storable as it is (``hidden_chars.storable``)."""
    return data.decode("utf-8", "surrogateescape")


def _format_change(change: FileChange, binary_as_text: bool = False) -> list[str]:
    old, new = change.old, change.new
    a_path = old.path if old is not None else change.path
    b_path = new.path if new is not None else change.path
    out = [f"diff --git {_quote('a/' + a_path)} {_quote('b/' + b_path)}\n"]
    if old is None and new is not None:
        out.append(f"new file mode {new.mode}\n")
    elif new is None and old is not None:
        out.append(f"deleted file mode {old.mode}\n")
    elif old is not None and new is not None and old.mode != new.mode:
        out += [f"old mode {old.mode}\n", f"new mode {new.mode}\n"]
    if change.status == "renamed":
        out += ["similarity index 100%\n", f"rename from {_quote(a_path)}\n", f"rename to {_quote(b_path)}\n"]

    old_data = old.data if old is not None else None
    new_data = new.data if new is not None else None
    if old_data == new_data:
        # A pure rename or mode change: no index line, no content.
        return out
    index = f"index {_abbrev(old_data)}..{_abbrev(new_data)}"
    if old is not None and new is not None and old.mode == new.mode:
        index += f" {new.mode}"
    out.append(index + "\n")

    a_label, b_label = _label("a/", old), _label("b/", new)
    before, after = old_data or b"", new_data or b""
    if not binary_as_text and (is_binary(before) or is_binary(after)):
        out.append(f"Binary files {a_label} and {b_label} differ\n")
        return out
    hunks = _hunks(_split_lines(decodable_text(before)), _split_lines(decodable_text(after)))
    if hunks:
        # git ends a file label containing a space with a tab, so the name
        # cannot be mistaken for name plus timestamp.
        out.append(f"--- {a_label}{_tab_if_space(a_label)}\n")
        out.append(f"+++ {b_label}{_tab_if_space(b_label)}\n")
        out += hunks
    return out


def _tab_if_space(label: str) -> str:
    return "\t" if " " in label else ""


def diff_entries(old: Sequence[FileEntry], new: Sequence[FileEntry], *, binary_as_text: bool = False) -> str:
    """A unified diff of two trees in ``git diff`` format (default options:
    exact renames detected, paths quoted like core.quotePath).

    Index lines carry abbreviated SHA-256 blob digests, not git's SHA-1 ids.
    Content with a NUL byte or that is not UTF-8 is reported as binary,
    unless ``binary_as_text``: then it is diffed as its ``decodable_text``,
    so the leakage critic and the hidden-character check read what it holds
    (one byte must not hide a file from them). That text may hold NULs and
    lone surrogates: read it, never store it. Hunks come from difflib, so for
    tangled edits they can differ from git's Myers diff while describing the
    same change. Pure and deterministic.
    """
    changes = diff_changes(old, new)
    return "".join(line for change in changes for line in _format_change(change, binary_as_text))


def diff_stat(old: Sequence[FileEntry], new: Sequence[FileEntry]) -> list[DiffStat]:
    """Per-file added/removed line counts, in diff order."""
    stats: list[DiffStat] = []
    for change in diff_changes(old, new):
        old_data = change.old.data if change.old is not None else b""
        new_data = change.new.data if change.new is not None else b""
        binary = is_binary(old_data) or is_binary(new_data)
        added = removed = 0
        if not binary and old_data != new_data:
            before, after = _split_lines(old_data.decode("utf-8")), _split_lines(new_data.decode("utf-8"))
            matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
            for tag, i1, i2, j1, j2 in matcher.get_opcodes():
                if tag != "equal":
                    removed += i2 - i1
                    added += j2 - j1
        stats.append(
            DiffStat(
                path=change.path,
                old_path=change.old.path if change.status == "renamed" and change.old is not None else None,
                status=change.status,
                added=added,
                removed=removed,
                binary=binary,
            )
        )
    return stats
