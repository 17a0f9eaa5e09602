"""Tests for evolution.services.snapshots: content-addressed tree storage."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection
from pytest_django import DjangoAssertNumQueries, Settings
from unidiff import PatchSet

from evolution import digests
from evolution.models import Blob, Tree, TreeEntry
from evolution.services.snapshots import (
    tree_diff,
    tree_entries,
    tree_import_directory,
    tree_import_git,
    tree_materialize,
    tree_store,
    tree_verify,
)
from evolution.trees import FileEntry, SnapshotError, read_directory

pytestmark = pytest.mark.django_db


def f(path: str, data: bytes | str, mode: str = "100644") -> FileEntry:
    return FileEntry(path=path, mode=mode, data=data.encode() if isinstance(data, str) else data)


def link(path: str, target: str) -> FileEntry:
    return FileEntry(path=path, mode="120000", data=target.encode())


def row_counts() -> tuple[int, int, int]:
    return Blob.objects.count(), Tree.objects.count(), TreeEntry.objects.count()


def git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo),
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
    }
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, env=env, check=True).stdout.decode()


HARNESS = [
    f("prompts/system.md", "You are careful.\n"),
    f("tools/run.sh", "#!/bin/sh\nexec python agent.py\n", mode="100755"),
    link("current.md", "prompts/system.md"),
    f("config.toml", "max_steps = 30\n"),
]


# --- tree_store ----------------------------------------------------------------------


def test_tree_store_records_the_tree_and_its_entries() -> None:
    tree = tree_store(entries=HARNESS)

    expected_digest = digests.tree_digest((e.path, e.mode, digests.blob_digest(e.data)) for e in HARNESS)
    assert tree.digest == expected_digest
    assert (tree.file_count, tree.total_size) == (4, 17 + 31 + 17 + 15)
    assert list(TreeEntry.objects.filter(tree=tree).values_list("path", "mode", "blob_id")) == [
        ("config.toml", "100644", digests.blob_digest(b"max_steps = 30\n")),
        ("current.md", "120000", digests.blob_digest(b"prompts/system.md")),
        ("prompts/system.md", "100644", digests.blob_digest(b"You are careful.\n")),
        ("tools/run.sh", "100755", digests.blob_digest(b"#!/bin/sh\nexec python agent.py\n")),
    ]


def test_tree_store_stores_shared_content_once() -> None:
    first = tree_store(entries=[f("a.md", "shared\n"), f("b.md", "shared\n"), f("c.md", "only first\n")])
    second = tree_store(entries=[f("a.md", "shared\n"), f("d.md", "only second\n")])

    assert first.digest != second.digest
    assert sorted(bytes(content) for content in Blob.objects.values_list("content", flat=True)) == [
        b"only first\n",
        b"only second\n",
        b"shared\n",
    ]
    assert row_counts() == (3, 2, 5)


def test_tree_store_is_safe_to_repeat() -> None:
    first = tree_store(entries=HARNESS)
    counts = row_counts()

    again = tree_store(entries=list(reversed(HARNESS)))

    assert again.pk == first.pk
    assert row_counts() == counts == (4, 1, 4)


def test_tree_store_digest_does_not_depend_on_entry_order() -> None:
    forward = tree_store(entries=HARNESS)
    backward = tree_store(entries=[HARNESS[2], HARNESS[0], HARNESS[3], HARNESS[1]])
    assert forward.digest == backward.digest


def test_tree_store_gives_a_different_digest_for_a_mode_change() -> None:
    plain = tree_store(entries=[f("run.sh", "x\n")])
    executable = tree_store(entries=[f("run.sh", "x\n", mode="100755")])
    assert plain.digest != executable.digest
    assert row_counts() == (1, 2, 2)


def test_tree_store_stores_an_empty_tree() -> None:
    tree = tree_store(entries=[])
    assert tree.digest == digests.tree_digest([])
    assert (tree.file_count, tree.total_size) == (0, 0)
    assert row_counts() == (0, 1, 0)


def test_tree_store_refuses_unsafe_entries_and_writes_nothing() -> None:
    with pytest.raises(SnapshotError, match=r"^escape: symlink target '\.\./\.\./etc' points outside the tree$"):
        tree_store(entries=[f("ok.md", "fine\n"), link("escape", "../../etc")])
    assert row_counts() == (0, 0, 0)


# --- tree_entries --------------------------------------------------------------------


def test_tree_entries_returns_the_stored_files_in_one_query(
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    tree = tree_store(entries=HARNESS + [f("copy.md", "You are careful.\n")])

    with django_assert_num_queries(1):
        entries = tree_entries(tree=tree)

    assert entries == sorted(HARNESS + [f("copy.md", "You are careful.\n")], key=lambda e: e.path)


# --- imports ---------------------------------------------------------------------------


def test_tree_import_directory_stores_the_folder(tmp_path: Path) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "system.md").write_bytes(b"You are careful.\n")
    (tmp_path / "run.sh").write_bytes(b"#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    os.symlink("prompts/system.md", tmp_path / "current.md")

    tree = tree_import_directory(path=tmp_path)

    assert tree_entries(tree=tree) == [
        link("current.md", "prompts/system.md"),
        f("prompts/system.md", "You are careful.\n"),
        f("run.sh", "#!/bin/sh\n", mode="100755"),
    ]
    assert tree_import_directory(path=tmp_path).pk == tree.pk
    assert row_counts() == (3, 1, 3)


def _symlink_outside(root: Path) -> str:
    os.symlink("../outside", root / "escape")
    return r"^escape: symlink target '\.\./outside' points outside the tree$"


def _too_large(root: Path) -> str:
    (root / "big.bin").write_bytes(b"x" * 65)
    return r"^big\.bin: file is 65 bytes, over the 64-byte limit$"


def _too_many(root: Path) -> str:
    for name in ("c", "d", "e"):
        (root / name).write_bytes(b"1")
    return r"^e: the tree has more than 4 files$"


def _fifo(root: Path) -> str:
    os.mkfifo(root / "pipe")
    return r"^pipe: fifos cannot be snapshotted$"


def _bad_name(root: Path) -> str:
    with open(os.path.join(os.fsencode(root), b"z\xfe"), "wb") as handle:
        handle.write(b"x")
    return r"^z\\xfe: file name is not valid UTF-8$"


@pytest.mark.parametrize("make_bad", [_symlink_outside, _too_large, _too_many, _fifo, _bad_name])
def test_tree_import_directory_refuses_bad_input_and_writes_nothing(
    tmp_path: Path, settings: Settings, make_bad: Callable[[Path], str]
) -> None:
    settings.RSI_MAX_FILE_BYTES = 64
    settings.RSI_MAX_TREE_FILES = 4
    (tmp_path / "a").write_bytes(b"fine\n")
    (tmp_path / "b").write_bytes(b"also fine\n")
    pattern = make_bad(tmp_path)

    with pytest.raises(SnapshotError, match=pattern):
        tree_import_directory(path=tmp_path)
    assert row_counts() == (0, 0, 0)


def _repo_with_two_commits(repo: Path) -> tuple[str, str]:
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "prompt.md").write_bytes(b"one\ntwo\n")
    (repo / "run.sh").write_bytes(b"#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    first = git(repo, "rev-parse", "HEAD").strip()
    (repo / "prompt.md").write_bytes(b"one\n2\n")
    os.symlink("prompt.md", repo / "current.md")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "second")
    return first, git(repo, "rev-parse", "HEAD").strip()


def test_tree_import_git_stores_each_ref(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    first, second = _repo_with_two_commits(repo)

    old = tree_import_git(repo=repo, ref=first)
    new = tree_import_git(repo=repo, ref="main")

    assert tree_entries(tree=old) == [f("prompt.md", "one\ntwo\n"), f("run.sh", "#!/bin/sh\n", mode="100755")]
    assert tree_entries(tree=new) == [
        link("current.md", "prompt.md"),
        f("prompt.md", "one\n2\n"),
        f("run.sh", "#!/bin/sh\n", mode="100755"),
    ]
    assert tree_import_git(repo=repo, ref=second).pk == new.pk
    # run.sh is shared by both trees.
    assert row_counts() == (4, 2, 5)


def test_tree_import_git_matches_the_checked_out_directory(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _repo_with_two_commits(repo)
    assert tree_import_git(repo=repo, ref="HEAD").pk == tree_import_directory(path=repo).pk


def test_tree_import_git_refuses_unknown_ref_and_writes_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _repo_with_two_commits(repo)
    with pytest.raises(SnapshotError, match=r"^nope: no such commit or tree in "):
        tree_import_git(repo=repo, ref="nope")
    assert row_counts() == (0, 0, 0)


def test_tree_import_git_refuses_submodules_and_writes_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _, head = _repo_with_two_commits(repo)
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor")
    git(repo, "commit", "-q", "-m", "submodule")
    with pytest.raises(SnapshotError, match=r"^vendor: submodules \(gitlinks\) are not supported$"):
        tree_import_git(repo=repo, ref="HEAD")
    assert row_counts() == (0, 0, 0)


def test_tree_import_git_refuses_large_file_and_writes_nothing(tmp_path: Path, settings: Settings) -> None:
    # 9 bytes lets the symlink current.md (target "prompt.md") through.
    settings.RSI_MAX_FILE_BYTES = 9
    repo = tmp_path / "repo"
    _repo_with_two_commits(repo)
    with pytest.raises(SnapshotError, match=r"^run\.sh: file is 10 bytes, over the 9-byte limit$"):
        tree_import_git(repo=repo, ref="HEAD")
    assert row_counts() == (0, 0, 0)


# --- tree_materialize ------------------------------------------------------------------


def test_tree_materialize_round_trip_preserves_modes_and_symlinks(tmp_path: Path) -> None:
    tree = tree_store(entries=HARNESS)
    dest = tmp_path / "work" / "harness"

    tree_materialize(tree=tree, dest=dest)

    assert read_directory(dest, max_file_bytes=1000, max_files=10) == sorted(HARNESS, key=lambda e: e.path)
    assert os.stat(dest / "tools" / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(dest / "config.toml").st_mode & 0o777 == 0o644
    assert os.readlink(dest / "current.md") == "prompts/system.md"


def test_tree_materialize_refuses_a_tampered_symlink_and_writes_nothing(tmp_path: Path) -> None:
    tree = tree_store(entries=HARNESS)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE evolution_blob SET content = %s WHERE digest = %s",
            [b"../../../etc/passwd", digests.blob_digest(b"prompts/system.md")],
        )
    dest = tmp_path / "harness"

    with pytest.raises(SnapshotError, match=r"^current\.md: symlink target '\.\./\.\./\.\./etc/passwd' points outside"):
        tree_materialize(tree=tree, dest=dest)
    assert not dest.exists()


# --- tree_verify -----------------------------------------------------------------------


def test_tree_verify_finds_nothing_wrong_in_an_intact_tree() -> None:
    tree = tree_store(entries=HARNESS)
    assert tree_verify(tree_digest=tree.digest) == []


def test_tree_verify_reports_a_missing_tree() -> None:
    assert tree_verify(tree_digest="0" * 64) == [f"tree {'0' * 64} is missing"]


def test_tree_verify_detects_blob_content_replaced_with_raw_sql() -> None:
    tree = tree_store(entries=HARNESS)
    original = digests.blob_digest(b"max_steps = 30\n")
    forged = b"max_steps = 99\n"
    with connection.cursor() as cursor:
        cursor.execute("UPDATE evolution_blob SET content = %s WHERE digest = %s", [forged, original])

    assert tree_verify(tree_digest=tree.digest) == [
        f"config.toml: blob {original} content hashes to {digests.blob_digest(forged)}"
    ]


def test_tree_verify_detects_an_entry_pointing_to_another_blob() -> None:
    tree = tree_store(entries=HARNESS)
    other = digests.blob_digest(b"You are careful.\n")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE evolution_treeentry SET blob_id = %s WHERE tree_id = %s AND path = %s",
            [other, tree.digest, "config.toml"],
        )
    rows = [(e.path, e.mode, digests.blob_digest(e.data)) for e in tree_entries(tree=tree)]

    assert tree_verify(tree_digest=tree.digest) == [
        f"tree {tree.digest}: entries hash to {digests.tree_digest(rows)}",
        f"tree {tree.digest}: records 4 files / 80 bytes, entries have 4 / 82",
    ]


def test_tree_verify_detects_a_deleted_entry() -> None:
    tree = tree_store(entries=HARNESS)
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM evolution_treeentry WHERE tree_id = %s AND path = %s", [tree.digest, "tools/run.sh"]
        )
    problems = tree_verify(tree_digest=tree.digest)

    assert len(problems) == 2
    assert problems[0].startswith(f"tree {tree.digest}: entries hash to ")
    assert problems[1] == f"tree {tree.digest}: records 4 files / 80 bytes, entries have 3 / 49"


# --- tree_diff -------------------------------------------------------------------------


def test_tree_diff_from_nothing_adds_every_file() -> None:
    tree = tree_store(entries=HARNESS)
    patch = PatchSet(tree_diff(old=None, new=tree))
    assert [(p.path, p.is_added_file, p.added) for p in patch] == [
        ("config.toml", True, 1),
        ("current.md", True, 1),
        ("prompts/system.md", True, 1),
        ("tools/run.sh", True, 2),
    ]


def test_tree_diff_between_two_stored_trees() -> None:
    old = tree_store(entries=HARNESS)
    new = tree_store(entries=[*HARNESS[:3], f("config.toml", "max_steps = 40\n")])
    before, after = digests.blob_digest(b"max_steps = 30\n")[:7], digests.blob_digest(b"max_steps = 40\n")[:7]

    assert tree_diff(old=old, new=new) == (
        "diff --git a/config.toml b/config.toml\n"
        f"index {before}..{after} 100644\n"
        "--- a/config.toml\n"
        "+++ b/config.toml\n"
        "@@ -1 +1 @@\n"
        "-max_steps = 30\n"
        "+max_steps = 40\n"
    )
