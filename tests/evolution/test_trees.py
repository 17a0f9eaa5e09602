"""Unit tests for evolution.trees: pure functions on files, git and diffs, no database."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from unidiff import PatchSet

from evolution.digests import blob_digest
from evolution.trees import (
    DiffStat,
    FileEntry,
    SnapshotError,
    diff_entries,
    diff_stat,
    materialize,
    normalize_path,
    open_inside,
    read_directory,
    read_git,
    validate_entries,
)

LIMITS = {"max_file_bytes": 1000, "max_files": 50}


def f(path: str, data: bytes | str, mode: str = "100644") -> FileEntry:
    return FileEntry(path=path, mode=mode, data=data.encode() if isinstance(data, str) else data)


def link(path: str, target: str) -> FileEntry:
    return FileEntry(path=path, mode="120000", data=target.encode())


def short(data: bytes | str) -> str:
    return blob_digest(data.encode() if isinstance(data, str) else data)[:7]


# --- git helpers ------------------------------------------------------------------


def git(repo: Path, *args: str) -> str:
    # Isolated from the user's and the system's git configuration, so the
    # diff format and the identity are the same on every machine.
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
        "LC_ALL": "C",
    }
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env=env, check=True)
    return result.stdout.decode()


def write_entries(root: Path, entries: list[FileEntry]) -> None:
    for entry in entries:
        target = root / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.mode == "120000":
            os.symlink(entry.data.decode(), target)
        else:
            target.write_bytes(entry.data)
            target.chmod(0o755 if entry.mode == "100755" else 0o644)


def commit(repo: Path, entries: list[FileEntry]) -> str:
    """Replace the work tree of ``repo`` with ``entries`` and commit it."""
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q", "-b", "main")
    for child in repo.iterdir():
        if child.name == ".git":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    write_entries(repo, entries)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "snapshot")
    return git(repo, "rev-parse", "HEAD").strip()


def git_diff(tmp_path: Path, old: list[FileEntry], new: list[FileEntry]) -> str:
    repo = tmp_path / "diffrepo"
    first = commit(repo, old)
    second = commit(repo, new)
    return git(repo, "diff", "--no-color", "--no-ext-diff", first, second)


def without_index_ids(diff: str) -> str:
    # git names blobs by SHA-1, we by SHA-256: compare everything else.
    return re.sub(r"(?m)^index [0-9a-f]+\.\.[0-9a-f]+", "index X..Y", diff)


def summary(diff: str) -> list[tuple[str, str, int, int]]:
    rows = []
    for patched in PatchSet(diff):
        if patched.is_binary_file:
            kind = "binary"
        elif patched.is_rename:
            kind = "renamed"
        elif patched.is_added_file:
            kind = "added"
        elif patched.is_removed_file:
            kind = "removed"
        else:
            kind = "modified"
        rows.append((patched.path, kind, patched.added, patched.removed))
    return rows


# --- normalize_path ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["a", "dir/sub/file.txt", "caf\u00e9.md", ".gitignore", ".github/workflows/x.yml"])
def test_normalize_path_returns_valid_paths_unchanged(path: str) -> None:
    assert normalize_path(path) == path


def test_normalize_path_decodes_utf8_bytes() -> None:
    assert normalize_path("caf\u00e9/x".encode()) == "caf\u00e9/x"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "empty path"),
        ("/etc/passwd", "/etc/passwd: absolute paths are not allowed"),
        ("a/../b", "a/../b: empty, '.' and '..' path segments are not allowed"),
        ("./a", "./a: empty, '.' and '..' path segments are not allowed"),
        ("a/./b", "a/./b: empty, '.' and '..' path segments are not allowed"),
        ("a//b", "a//b: empty, '.' and '..' path segments are not allowed"),
        ("a/", "a/: empty, '.' and '..' path segments are not allowed"),
        ("..", "..: empty, '.' and '..' path segments are not allowed"),
        ("a\\b", "a\\b: backslashes are not allowed in paths"),
        ("a\0b", "'a\\x00b': control characters are not allowed in paths"),
        ("a\nb", "'a\\nb': control characters are not allowed in paths"),
        ("a\x1b[31mb", "'a\\x1b[31mb': control characters are not allowed in paths"),
        (".git/config", ".git/config: '.git' path segments are not allowed"),
        ("sub/.git/HEAD", "sub/.git/HEAD: '.git' path segments are not allowed"),
        (".GIT/hooks", ".GIT/hooks: '.git' path segments are not allowed"),
        (b"bad\xff.txt", "bad\\xff.txt: file name is not valid UTF-8"),
        (os.fsdecode(b"bad\xff.txt"), "bad\\xff.txt: file name is not valid UTF-8"),
        ("x" * 256, f"{'x' * 256}: a path segment is longer than 255 bytes"),
    ],
)
def test_normalize_path_rejects_unsafe_paths(path: str | bytes, message: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        normalize_path(path)
    assert str(caught.value) == message


# --- validate_entries ---------------------------------------------------------------


def test_validate_entries_sorts_by_path() -> None:
    entries = [f("b", "2"), f("a/z", "1"), link("a/l", "z")]
    assert validate_entries(entries) == [link("a/l", "z"), f("a/z", "1"), f("b", "2")]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([f("a", "1"), f("a", "2")], "a: duplicate path"),
        ([f("a", "1"), f("a/b", "2")], "a/b: a is a file or symlink, not a directory"),
        ([link("d", "real"), f("d/x", "2")], "d/x: d is a file or symlink, not a directory"),
        ([f("a", "1", mode="100664")], "a: unsupported mode '100664'"),
        ([link("l", "/etc/passwd")], "l: symlink target '/etc/passwd' is absolute"),
        ([link("l", "")], "l: symlink target is empty or contains NUL"),
        ([FileEntry("l", "120000", b"\xff")], "l: symlink target is not valid UTF-8"),
        ([link("l", "../x")], "l: symlink target '../x' points outside the tree"),
        ([link("d/l", "../../x")], "d/l: symlink target '../../x' points outside the tree"),
        # Each link stays inside on its own; followed together they escape.
        ([link("up", "."), link("x", "up/..")], "x: symlink target 'up/..' points outside the tree"),
        ([link("a", "b"), link("b", "a")], "a: symlink loop"),
    ],
)
def test_validate_entries_rejects_unsafe_trees(entries: list[FileEntry], message: str) -> None:
    with pytest.raises(SnapshotError) as caught:
        validate_entries(entries)
    assert str(caught.value) == message


def test_validate_entries_accepts_links_that_stay_inside() -> None:
    entries = [f("a.txt", "1"), link("d/up", "../a.txt"), link("d/self", "."), link("dangling", "missing/x")]
    assert [entry.path for entry in validate_entries(entries)] == ["a.txt", "d/self", "d/up", "dangling"]


# --- read_directory ---------------------------------------------------------------


def test_read_directory_reads_files_modes_and_symlinks(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "run.sh").write_bytes(b"#!/bin/sh\n")
    (tmp_path / "bin" / "run.sh").chmod(0o755)
    (tmp_path / "prompt.md").write_bytes(b"be brief\n")
    (tmp_path / "prompt.md").chmod(0o644)
    (tmp_path / "empty").mkdir()
    os.symlink("prompt.md", tmp_path / "alias.md")
    os.symlink("../prompt.md", tmp_path / "bin" / "up.md")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_bytes(b"ref: refs/heads/main\n")

    assert read_directory(tmp_path, **LIMITS) == [
        link("alias.md", "prompt.md"),
        f("bin/run.sh", "#!/bin/sh\n", mode="100755"),
        link("bin/up.md", "../prompt.md"),
        f("prompt.md", "be brief\n"),
    ]


def test_read_directory_accepts_files_at_the_limits(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "b").write_bytes(b"y")

    assert read_directory(tmp_path, max_file_bytes=10, max_files=2) == [f("a", "x" * 10), f("b", "y")]


def test_read_directory_refuses_symlink_outside_the_tree(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    os.symlink("../../secret", tmp_path / "d" / "l")
    with pytest.raises(SnapshotError, match=r"^d/l: symlink target '\.\./\.\./secret' points outside the tree$"):
        read_directory(tmp_path, **LIMITS)


def test_read_directory_refuses_absolute_symlink(tmp_path: Path) -> None:
    os.symlink("/etc/passwd", tmp_path / "pw")
    with pytest.raises(SnapshotError, match=r"^pw: symlink target '/etc/passwd' is absolute$"):
        read_directory(tmp_path, **LIMITS)


def test_read_directory_refuses_escape_through_a_chain_of_symlinks(tmp_path: Path) -> None:
    os.symlink(".", tmp_path / "up")
    os.symlink("up/..", tmp_path / "x")
    with pytest.raises(SnapshotError, match=r"^x: symlink target 'up/\.\.' points outside the tree$"):
        read_directory(tmp_path, **LIMITS)


def test_read_directory_refuses_file_over_the_size_limit(tmp_path: Path) -> None:
    (tmp_path / "big.bin").write_bytes(b"x" * 11)
    with pytest.raises(SnapshotError, match=r"^big\.bin: file is 11 bytes, over the 10-byte limit$"):
        read_directory(tmp_path, max_file_bytes=10, max_files=5)


def test_read_directory_applies_the_size_limit_to_symlink_targets(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1")
    os.symlink("a" * 11, tmp_path / "l")
    with pytest.raises(SnapshotError, match=r"^l: file is 11 bytes, over the 10-byte limit$"):
        read_directory(tmp_path, max_file_bytes=10, max_files=5)


def test_read_directory_refuses_too_many_files(tmp_path: Path) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).write_bytes(b"1")
    with pytest.raises(SnapshotError, match=r"^c: the tree has more than 2 files$"):
        read_directory(tmp_path, max_file_bytes=10, max_files=2)


def test_read_directory_refuses_non_utf8_file_name(tmp_path: Path) -> None:
    (tmp_path / "ok").mkdir()
    with open(os.path.join(os.fsencode(tmp_path / "ok"), b"bad\xff.txt"), "wb") as handle:
        handle.write(b"x")
    with pytest.raises(SnapshotError, match=r"^ok/bad\\xff\.txt: file name is not valid UTF-8$"):
        read_directory(tmp_path, **LIMITS)


def test_read_directory_refuses_nested_git_folder(tmp_path: Path) -> None:
    (tmp_path / "vendor" / ".git").mkdir(parents=True)
    with pytest.raises(SnapshotError, match=r"^vendor/\.git: '\.git' path segments are not allowed$"):
        read_directory(tmp_path, **LIMITS)


def test_read_directory_refuses_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(SnapshotError, match=r"^pipe: fifos cannot be snapshotted$"):
        read_directory(tmp_path, **LIMITS)


def test_read_directory_refuses_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # AF_UNIX paths are limited to ~108 bytes: bind relative to the folder.
    monkeypatch.chdir(tmp_path)
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind("sock")
        with pytest.raises(SnapshotError, match=r"^sock: sockets cannot be snapshotted$"):
            read_directory(tmp_path, **LIMITS)
    finally:
        server.close()


def test_read_directory_refuses_missing_root(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match=r"nope: cannot read directory \(No such file or directory\)$"):
        read_directory(tmp_path / "nope", **LIMITS)


# --- read_git -------------------------------------------------------------------------


def test_read_git_reads_the_tree_at_each_ref(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    first = commit(repo, [f("prompt.md", "v1\n"), f("tools/run.sh", "#!/bin/sh\n", mode="100755")])
    second = commit(
        repo,
        [f("prompt.md", "v2\n"), f("tools/run.sh", "#!/bin/sh\n", mode="100755"), link("current", "prompt.md")],
    )
    git(repo, "tag", "v1", first)

    assert read_git(repo, "v1", **LIMITS) == [f("prompt.md", "v1\n"), f("tools/run.sh", "#!/bin/sh\n", mode="100755")]
    assert read_git(repo, second, **LIMITS) == [
        link("current", "prompt.md"),
        f("prompt.md", "v2\n"),
        f("tools/run.sh", "#!/bin/sh\n", mode="100755"),
    ]
    assert read_git(repo, "HEAD", **LIMITS) == read_directory(repo, **LIMITS)


def test_read_git_reads_an_empty_tree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [])
    assert read_git(repo, "HEAD", **LIMITS) == []


def test_read_git_refuses_unknown_ref(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [f("a", "1")])
    with pytest.raises(SnapshotError, match=r"^no-such-branch: no such commit or tree in "):
        read_git(repo, "no-such-branch", **LIMITS)


def test_read_git_refuses_option_like_ref(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [f("a", "1")])
    with pytest.raises(SnapshotError, match=r"^'--output=x': not a usable git ref$"):
        read_git(repo, "--output=x", **LIMITS)
    assert not (repo / "x").exists()


def test_read_git_refuses_a_folder_inside_another_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [f("a", "1")])
    (repo / "plain").mkdir()
    with pytest.raises(SnapshotError, match=r"^HEAD: no such commit or tree in .*not a git repository"):
        read_git(repo / "plain", "HEAD", **LIMITS)


def test_read_git_refuses_submodules(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    head = commit(repo, [f("a", "1")])
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor/lib")
    git(repo, "commit", "-q", "-m", "add submodule")
    with pytest.raises(SnapshotError, match=r"^vendor/lib: submodules \(gitlinks\) are not supported$"):
        read_git(repo, "HEAD", **LIMITS)


def test_read_git_refuses_symlink_outside_the_tree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [link("d/l", "../../etc/passwd")])
    with pytest.raises(SnapshotError, match=r"^d/l: symlink target '\.\./\.\./etc/passwd' points outside the tree$"):
        read_git(repo, "HEAD", **LIMITS)


def test_read_git_refuses_absolute_symlink(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [link("pw", "/etc/passwd")])
    with pytest.raises(SnapshotError, match=r"^pw: symlink target '/etc/passwd' is absolute$"):
        read_git(repo, "HEAD", **LIMITS)


def test_read_git_refuses_file_over_the_size_limit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [f("big.bin", "x" * 11)])
    with pytest.raises(SnapshotError, match=r"^big\.bin: file is 11 bytes, over the 10-byte limit$"):
        read_git(repo, "HEAD", max_file_bytes=10, max_files=5)


def test_read_git_refuses_too_many_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [f("a", "1"), f("b", "1"), f("c", "1")])
    with pytest.raises(SnapshotError, match=r"^c: the tree has more than 2 files$"):
        read_git(repo, "HEAD", max_file_bytes=10, max_files=2)


def test_read_git_refuses_non_utf8_file_name(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit(repo, [f("ok", "1")])
    with open(os.path.join(os.fsencode(repo), b"bad\xff.txt"), "wb") as handle:
        handle.write(b"x")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "bad name")
    with pytest.raises(SnapshotError, match=r"^bad\\xff\.txt: file name is not valid UTF-8$"):
        read_git(repo, "HEAD", **LIMITS)


# --- materialize --------------------------------------------------------------------


def test_materialize_round_trip_preserves_modes_and_symlinks(tmp_path: Path) -> None:
    entries = [
        link("alias", "docs/readme.md"),
        f("bin/run", "#!/bin/sh\necho hi\n", mode="100755"),
        f("docs/readme.md", "hello\n"),
        link("docs/up", "../bin"),
        f("empty", ""),
    ]
    dest = tmp_path / "out" / "harness"
    previous = os.umask(0o077)
    try:
        materialize(entries, dest)
    finally:
        os.umask(previous)

    assert read_directory(dest, **LIMITS) == entries
    assert stat.S_IMODE(os.stat(dest / "bin" / "run").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dest / "docs" / "readme.md").st_mode) == 0o644
    assert os.readlink(dest / "docs" / "up") == "../bin"
    assert (dest / "alias").read_text() == "hello\n"


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([f("ok", "1"), link("l", "../outside")], "l: symlink target '../outside' points outside the tree"),
        ([f("ok", "1"), link("l", "/etc")], "l: symlink target '/etc' is absolute"),
        ([f("ok", "1"), f("../escape", "x")], "../escape: empty, '.' and '..' path segments are not allowed"),
        ([link("d", "elsewhere"), f("d/x", "2")], "d/x: d is a file or symlink, not a directory"),
        ([f("a/.git/hooks/pre-commit", "x")], "a/.git/hooks/pre-commit: '.git' path segments are not allowed"),
    ],
)
def test_materialize_refuses_unsafe_trees_and_writes_nothing(
    tmp_path: Path, entries: list[FileEntry], message: str
) -> None:
    dest = tmp_path / "out"
    with pytest.raises(SnapshotError) as caught:
        materialize(entries, dest)
    assert str(caught.value) == message
    assert not dest.exists()
    assert sorted(os.listdir(tmp_path)) == []


def test_materialize_refuses_a_non_empty_destination(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_bytes(b"mine")
    with pytest.raises(SnapshotError, match=r"destination is not empty$"):
        materialize([f("keep.txt", "theirs")], tmp_path)
    assert (tmp_path / "keep.txt").read_bytes() == b"mine"


# --- diff_entries -------------------------------------------------------------------

TEXT = "".join(f"line {n}\n" for n in range(1, 21))
FUNC_OLD = (
    "def first():\n"
    + "".join(f"    a{n}\n" for n in range(10))
    + "class Second:\n"
    + "".join(f"    b{n}\n" for n in range(10))
)

# A function line longer than git's 80-byte cut, then only indented lines:
# the second hunk finds no new function line and repeats the first one.
LONG_FUNC = "def " + "very_long_name_" * 6 + "(self):\n" + "".join(f"    x{n} = {n}\n" for n in range(30))

DIFF_CASES = {
    "add": (
        [f("keep", "k\n")],
        [f("keep", "k\n"), f("new.txt", "one\ntwo\n")],
        [("new.txt", "added", 2, 0)],
    ),
    "add-empty-file": ([], [f("empty", "")], [("empty", "added", 0, 0)]),
    "delete": (
        [f("gone.txt", "one\ntwo\nthree\n"), f("keep", "k\n")],
        [f("keep", "k\n")],
        [("gone.txt", "removed", 0, 3)],
    ),
    "modify": (
        [f("notes.txt", TEXT)],
        [f("notes.txt", TEXT.replace("line 3\n", "line three\n").replace("line 17\n", ""))],
        [("notes.txt", "modified", 1, 2)],
    ),
    "modify-with-function-context": (
        [f("code.py", FUNC_OLD)],
        [f("code.py", FUNC_OLD.replace("    a7\n", "    A7\n").replace("    b8\n", "    B8\n"))],
        [("code.py", "modified", 2, 2)],
    ),
    "modify-reuses-function-line": (
        [f("long.py", LONG_FUNC)],
        [f("long.py", LONG_FUNC.replace("    x3 = 3\n", "    x3 = 33\n").replace("    x25 = 25\n", ""))],
        [("long.py", "modified", 1, 2)],
    ),
    "exact-rename": (
        [f("old/name.md", "same\ncontent\n")],
        [f("new/name.md", "same\ncontent\n")],
        [("new/name.md", "renamed", 0, 0)],
    ),
    "mode-change": (
        [f("run.sh", "#!/bin/sh\n")],
        [f("run.sh", "#!/bin/sh\n", mode="100755")],
        [("run.sh", "modified", 0, 0)],
    ),
    "mode-and-content-change": (
        [f("run.sh", "#!/bin/sh\n")],
        [f("run.sh", "#!/bin/sh\nexit 0\n", mode="100755")],
        [("run.sh", "modified", 1, 0)],
    ),
    "binary-modify": (
        [f("data.bin", b"\x00\x01\x02")],
        [f("data.bin", b"\x00\x01\x03")],
        [("data.bin", "binary", 0, 0)],
    ),
    "binary-add-and-delete": (
        [f("old.bin", b"\x00old")],
        [f("new.bin", b"\x00new")],
        [("new.bin", "binary", 0, 0), ("old.bin", "binary", 0, 0)],
    ),
    "symlink-add": ([f("a", "x\n")], [f("a", "x\n"), link("l", "a")], [("l", "added", 1, 0)]),
    "symlink-retarget": (
        [f("a", "x\n"), f("b", "y\n"), link("l", "a")],
        [f("a", "x\n"), f("b", "y\n"), link("l", "b")],
        [("l", "modified", 1, 1)],
    ),
    "file-becomes-symlink": (
        [f("a", "x\n"), f("l", "was a file\n")],
        [f("a", "x\n"), link("l", "a")],
        [("l", "removed", 0, 1), ("l", "added", 1, 0)],
    ),
    "no-newline-at-end": (
        [f("a.txt", "one\ntwo"), f("b.txt", "x\ny\n")],
        [f("a.txt", "one\ntwo\n"), f("b.txt", "x\ny")],
        [("a.txt", "modified", 1, 1), ("b.txt", "modified", 1, 1)],
    ),
    "unicode-and-space-names": (
        [f("caf\u00e9 menu.txt", "a\n"), f('quo"te', "b\n")],
        [f("caf\u00e9 menu.txt", "a\nb\n"), f('quo"te', "c\n")],
        [('"caf\\303\\251 menu.txt"', "modified", 1, 0), ('"quo\\"te"', "modified", 1, 1)],
    ),
}


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
def test_diff_entries_matches_git_diff(tmp_path: Path, case: str) -> None:
    old, new, _expected = DIFF_CASES[case]
    ours = diff_entries(old, new)
    assert without_index_ids(ours) == without_index_ids(git_diff(tmp_path, old, new))


@pytest.mark.parametrize("case", sorted(DIFF_CASES))
def test_diff_entries_parses_with_unidiff(case: str) -> None:
    old, new, expected = DIFF_CASES[case]
    assert summary(diff_entries(old, new)) == expected


def test_diff_entries_writes_an_added_file_exactly() -> None:
    content = "one\ntwo\n"
    diff = diff_entries([], [f("new.txt", content)])
    assert diff == (
        "diff --git a/new.txt b/new.txt\n"
        "new file mode 100644\n"
        f"index 0000000..{short(content)}\n"
        "--- /dev/null\n"
        "+++ b/new.txt\n"
        "@@ -0,0 +1,2 @@\n"
        "+one\n"
        "+two\n"
    )


def test_diff_entries_writes_a_deleted_file_without_trailing_newline_exactly() -> None:
    diff = diff_entries([f("gone", "last")], [])
    assert diff == (
        "diff --git a/gone b/gone\n"
        "deleted file mode 100644\n"
        f"index {short('last')}..0000000\n"
        "--- a/gone\n"
        "+++ /dev/null\n"
        "@@ -1 +0,0 @@\n"
        "-last\n"
        "\\ No newline at end of file\n"
    )


def test_diff_entries_writes_rename_and_mode_change_headers_exactly() -> None:
    diff = diff_entries([f("a.sh", "x\n")], [f("b.sh", "x\n", mode="100755")])
    assert diff == (
        "diff --git a/a.sh b/b.sh\n"
        "old mode 100644\n"
        "new mode 100755\n"
        "similarity index 100%\n"
        "rename from a.sh\n"
        "rename to b.sh\n"
    )


def test_diff_entries_writes_binary_and_modified_index_lines_exactly() -> None:
    text_old, text_new, bin_old, bin_new = "1\n", "2\n", b"\x00a", b"\x00b"
    diff = diff_entries([f("x.bin", bin_old), f("t", text_old)], [f("x.bin", bin_new), f("t", text_new)])
    assert diff == (
        "diff --git a/t b/t\n"
        f"index {short(text_old)}..{short(text_new)} 100644\n"
        "--- a/t\n"
        "+++ b/t\n"
        "@@ -1 +1 @@\n"
        "-1\n"
        "+2\n"
        "diff --git a/x.bin b/x.bin\n"
        f"index {short(bin_old)}..{short(bin_new)} 100644\n"
        "Binary files a/x.bin and b/x.bin differ\n"
    )


def test_diff_entries_treats_non_utf8_content_as_binary() -> None:
    diff = diff_entries([], [f("latin1.txt", "caf\u00e9\n".encode("latin-1"))])
    assert diff.endswith("Binary files /dev/null and b/latin1.txt differ\n")
    assert summary(diff) == [("latin1.txt", "binary", 0, 0)]


def test_diff_entries_prefers_a_rename_source_with_the_same_file_name() -> None:
    old = [f("a/x.md", "same\n"), f("b/y.md", "same\n")]
    new = [f("c/y.md", "same\n"), f("d/z.md", "same\n")]
    assert [(p.source_file, p.target_file) for p in PatchSet(diff_entries(old, new))] == [
        ("a/b/y.md", "b/c/y.md"),
        ("a/a/x.md", "b/d/z.md"),
    ]


def test_diff_entries_is_empty_for_identical_trees() -> None:
    entries = [f("a", "1\n"), link("l", "a")]
    assert diff_entries(entries, list(reversed(entries))) == ""


def test_diff_entries_does_not_depend_on_input_order() -> None:
    old = [f("b", "1\n"), f("a", "1\n"), f("c", "x\n")]
    new = [f("d", "1\n"), f("a", "2\n"), f("c", "x\n", mode="100755")]
    assert diff_entries(old, new) == diff_entries(list(reversed(old)), list(reversed(new)))


def test_diff_entries_refuses_duplicate_paths() -> None:
    with pytest.raises(SnapshotError, match=r"^a: duplicate path in the new tree$"):
        diff_entries([], [f("a", "1"), f("a", "2")])


def test_diff_stat_counts_lines_per_file() -> None:
    old = [f("a", "1\n2\n3\n"), f("bin", b"\x00"), f("r1", "same\n")]
    new = [f("a", "1\ntwo\n3\n4\n"), f("bin", b"\x01\x00"), f("r2", "same\n")]
    assert diff_stat(old, new) == [
        DiffStat(path="a", old_path=None, status="modified", added=2, removed=1, binary=False),
        DiffStat(path="bin", old_path=None, status="modified", added=0, removed=0, binary=True),
        DiffStat(path="r2", old_path="r1", status="renamed", added=0, removed=0, binary=False),
    ]


def test_open_inside_reads_only_regular_files_reached_without_links(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "file.json").write_text("{}")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "file.json").write_text("secret")
    (root / "a" / "up").symlink_to(tmp_path / "outside")
    (root / "a" / "linked.json").symlink_to(tmp_path / "outside" / "file.json")
    os.mkfifo(root / "a" / "pipe")
    with open_inside(root, "a/b/file.json") as stream:
        assert stream.read() == b"{}"
    refused = {}
    for relative in ("a/up/file.json", "a/linked.json", "a/pipe", "a/b/file.json/x", "../outside/file.json"):
        with pytest.raises(SnapshotError) as error:
            open_inside(root, relative)
        refused[relative] = str(error.value)
    assert refused == {
        "a/up/file.json": "a/up: a symbolic link (links are not followed)",
        "a/linked.json": "a/linked.json: a symbolic link (links are not followed)",
        "a/pipe": "a/pipe: a fifo, not a regular file",
        "a/b/file.json/x": "a/b/file.json: cannot open (Not a directory)",
        "../outside/file.json": "../outside/file.json: empty, '.' and '..' path segments are not allowed",
    }
    with pytest.raises(FileNotFoundError):
        open_inside(root, "a/missing.json")
