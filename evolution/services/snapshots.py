"""Content-addressed storage of harness trees (Blob, Tree, TreeEntry).

A blob is stored once per SHA-256 of its bytes and a tree once per Merkle
digest of its entries, so storing the same files twice is harmless and
candidates that share files share rows. Reading, validating and diffing
trees is pure and lives in ``evolution.trees``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from evolution import digests
from evolution.models import Blob, Tree, TreeEntry
from evolution.prepared import concrete_field, statement_cursor
from evolution.trees import (
    FileEntry,
    SnapshotError,
    diff_entries,
    materialize,
    read_directory,
    read_git,
    validate_entries,
)

# Blob rows can be megabytes each: keep one INSERT to a bounded size.
BLOB_BATCH_SIZE = 50
ENTRY_BATCH_SIZE = 1000


def tree_store(*, entries: Sequence[FileEntry]) -> Tree:
    """Store a tree and return it; safe to repeat and to run concurrently.

    The entries are validated first (SnapshotError, nothing written). Blobs
    already present are not sent again; a concurrent insert of the same blob
    or tree is absorbed by the primary key (ignore_conflicts / get_or_create).
    """
    checked = validate_entries(entries)
    blobs = {digests.blob_digest(entry.data): entry.data for entry in checked}
    digest = digests.tree_digest((entry.path, entry.mode, digests.blob_digest(entry.data)) for entry in checked)
    with transaction.atomic():
        existing = set(Blob.objects.filter(digest__in=list(blobs)).values_list("digest", flat=True))
        Blob.objects.bulk_create(
            [Blob(digest=key, size=len(data), content=data) for key, data in blobs.items() if key not in existing],
            batch_size=BLOB_BATCH_SIZE,
            ignore_conflicts=True,
        )
        tree, created = Tree.objects.get_or_create(
            digest=digest,
            defaults={"file_count": len(checked), "total_size": sum(len(entry.data) for entry in checked)},
        )
        if created:
            # Entries are written in the same transaction as their tree, so
            # an existing tree already has all of them.
            TreeEntry.objects.bulk_create(
                [
                    TreeEntry(tree=tree, path=entry.path, mode=entry.mode, blob_id=digests.blob_digest(entry.data))
                    for entry in checked
                ],
                batch_size=ENTRY_BATCH_SIZE,
            )
    return tree


def tree_entries(*, tree: Tree) -> list[FileEntry]:
    """The files of a stored tree, sorted by path, in one query (a trial
    worker reads every task's files: one query fewer for each). A blob at
    several paths of the tree is read once for each."""
    # Raw and prepared (evolution.prepared.statement_cursor): the queryset's
    # compiling and the server's planning of the join, for every task's files.
    with statement_cursor(connection) as cursor:
        cursor.execute(_tree_entries_sql(connection), [tree.pk])
        rows = cursor.fetchall()
    return [FileEntry(path=path, mode=mode, data=bytes(content)) for path, mode, content in rows]


def _tree_entries_sql(connection: Any) -> str:
    """``TreeEntry.objects.filter(tree=...).order_by("path").values_list("path", "mode", "blob__content")``."""
    quote = connection.ops.quote_name
    entry, blob = TreeEntry._meta, Blob._meta
    path, mode, blob_id, tree_id = (
        quote(concrete_field(TreeEntry, name).column) for name in ("path", "mode", "blob", "tree")
    )
    content, digest = quote(concrete_field(Blob, "content").column), quote(concrete_field(Blob, "digest").column)
    return (
        f"SELECT e.{path}, e.{mode}, b.{content} FROM {quote(entry.db_table)} e "
        f"INNER JOIN {quote(blob.db_table)} b ON e.{blob_id} = b.{digest} WHERE e.{tree_id} = %s ORDER BY e.{path}"
    )


def tree_import_directory(*, path: Path) -> Tree:
    """Snapshot a directory and store it. On bad input raises SnapshotError
    before anything is written. Safe to repeat."""
    entries = read_directory(path, max_file_bytes=settings.RSI_MAX_FILE_BYTES, max_files=settings.RSI_MAX_TREE_FILES)
    return tree_store(entries=entries)


def tree_import_git(*, repo: Path, ref: str) -> Tree:
    """Snapshot the tree at ``ref`` of a git repository and store it. On bad
    input raises SnapshotError before anything is written. Safe to repeat."""
    entries = read_git(repo, ref, max_file_bytes=settings.RSI_MAX_FILE_BYTES, max_files=settings.RSI_MAX_TREE_FILES)
    return tree_store(entries=entries)


def tree_materialize(*, tree: Tree, dest: Path) -> None:
    """Write a stored tree into ``dest`` (missing or empty). The entries are
    re-validated first, so a tampered unsafe tree is refused before any write."""
    materialize(tree_entries(tree=tree), dest)


def tree_verify(*, tree_digest: str) -> list[str]:
    """Recompute a stored tree from its rows; return the problems found
    (empty when intact).

    Detects blob content changed behind the ORM's back, a wrong blob size,
    entries repointed, added or removed (the tree digest no longer matches),
    stale counters, and entries that would be refused when written out.
    Reads only.
    """
    tree = Tree.objects.filter(digest=tree_digest).first()
    if tree is None:
        return [f"tree {tree_digest} is missing"]
    rows = list(
        TreeEntry.objects.filter(tree=tree)
        .order_by("path")
        .values_list("path", "mode", "blob_id", "blob__size", "blob__content")
    )
    problems: list[str] = []
    reported: set[str] = set()
    for path, _mode, blob, size, content in rows:
        if blob in reported:
            continue
        data = bytes(content)
        actual = digests.blob_digest(data)
        if actual != blob:
            reported.add(blob)
            problems.append(f"{path}: blob {blob} content hashes to {actual}")
        elif size != len(data):
            reported.add(blob)
            problems.append(f"{path}: blob {blob} records {size} bytes but holds {len(data)}")

    recomputed = digests.tree_digest((path, mode, blob) for path, mode, blob, _size, _content in rows)
    if recomputed != tree.digest:
        problems.append(f"tree {tree.digest}: entries hash to {recomputed}")
    total = sum(len(bytes(content)) for *_rest, content in rows)
    if tree.file_count != len(rows) or tree.total_size != total:
        problems.append(
            f"tree {tree.digest}: records {tree.file_count} files / {tree.total_size} bytes, "
            f"entries have {len(rows)} / {total}"
        )
    try:
        validate_entries(FileEntry(path=path, mode=mode, data=bytes(content)) for path, mode, _b, _s, content in rows)
    except SnapshotError as exc:
        problems.append(f"tree {tree.digest}: unsafe entry: {exc}")
    return problems


def tree_diff(*, old: Tree | None, new: Tree, binary_as_text: bool = False) -> str:
    """git-style diff from ``old`` (None: the empty tree) to ``new``; with
    ``binary_as_text``, files that are not UTF-8 are diffed as their
    decodable text (for the critic: see ``trees.diff_entries``)."""
    before = tree_entries(tree=old) if old is not None else []
    return diff_entries(before, tree_entries(tree=new), binary_as_text=binary_as_text)
