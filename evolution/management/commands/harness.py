"""Harness snapshots from the shell: import, export and diff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution.models import Candidate, Tree
from evolution.services.snapshots import tree_diff, tree_import_directory, tree_import_git, tree_materialize
from evolution.trees import SnapshotError


def _tree(ref: str) -> Tree:
    """A tree by digest (or unique prefix of 8+ characters) or by ``candidate:ID``."""
    if ref.startswith("candidate:"):
        candidate = Candidate.objects.filter(pk=ref.split(":", 1)[1]).select_related("tree").first()
        if candidate is None:
            raise CommandError(f"no candidate {ref.split(':', 1)[1]}", returncode=2)
        return candidate.tree
    if len(ref) < 8:
        raise CommandError("give at least 8 characters of a tree digest, or candidate:ID", returncode=2)
    matches = list(Tree.objects.filter(digest__startswith=ref.lower())[:2])
    if len(matches) != 1:
        raise CommandError(f"{'no' if not matches else 'more than one'} tree matches {ref!r}", returncode=2)
    return matches[0]


class Command(BaseCommand):
    help = "Import a harness (directory or git ref), export one into a folder, or diff two."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        imp = sub.add_parser("import", help="store a harness and print its tree digest")
        imp.add_argument("--dir", type=Path)
        imp.add_argument("--git", type=Path, help="repository path")
        imp.add_argument("--ref", default="HEAD")
        exp = sub.add_parser("export", help="write a tree's files into a new folder")
        exp.add_argument("tree", help="tree digest (prefix) or candidate:ID")
        exp.add_argument("dest", type=Path)
        diff = sub.add_parser("diff", help="git-style unified diff between two trees")
        diff.add_argument("old", help="tree digest (prefix) or candidate:ID")
        diff.add_argument("new", help="tree digest (prefix) or candidate:ID")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        try:
            if action == "import":
                if bool(options["dir"]) == bool(options["git"]):
                    raise CommandError("give exactly one of --dir or --git", returncode=2)
                if options["dir"]:
                    tree = tree_import_directory(path=options["dir"])
                else:
                    tree = tree_import_git(repo=options["git"], ref=options["ref"])
                self.stdout.write(f"{tree.digest}  {tree.file_count} files, {tree.total_size} bytes")
            elif action == "export":
                tree = _tree(options["tree"])
                tree_materialize(tree=tree, dest=options["dest"])
                self.stdout.write(f"wrote {tree.file_count} files to {options['dest']}")
            else:
                self.stdout.write(tree_diff(old=_tree(options["old"]), new=_tree(options["new"])), ending="")
        except SnapshotError as exc:
            raise CommandError(str(exc), returncode=2) from exc
