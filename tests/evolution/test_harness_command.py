"""The harness command: import, export, diff; bad input exits 2 and stores nothing."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from evolution.models import Blob, Tree
from tests.factories import write_file

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("harness", *args, stdout=out)
    return out.getvalue()


def test_import_export_and_diff_round_trip(tmp_path: Path) -> None:
    write_file(tmp_path / "v1" / "prompts" / "system.md", "Be brief.\n")
    write_file(tmp_path / "v2" / "prompts" / "system.md", "Be brief and verify.\n")
    first = run("import", "--dir", str(tmp_path / "v1")).split()[0]
    second = run("import", "--dir", str(tmp_path / "v2")).split()[0]
    diff = run("diff", first[:12], second[:12])
    assert "-Be brief.\n+Be brief and verify.\n" in diff
    assert diff.startswith("diff --git a/prompts/system.md b/prompts/system.md\n")
    run("export", first, str(tmp_path / "out"))
    assert (tmp_path / "out" / "prompts" / "system.md").read_text() == "Be brief.\n"


def test_import_refuses_a_symlink_out_of_the_tree_and_stores_nothing(tmp_path: Path) -> None:
    write_file(tmp_path / "h" / "ok.md", "fine\n")
    os.symlink("/etc/passwd", tmp_path / "h" / "escape")
    with pytest.raises(CommandError) as excinfo:
        run("import", "--dir", str(tmp_path / "h"))
    assert excinfo.value.returncode == 2
    assert "escape" in str(excinfo.value)
    assert Blob.objects.count() == 0 and Tree.objects.count() == 0


def test_unknown_tree_is_a_usage_error() -> None:
    with pytest.raises(CommandError, match="no tree matches") as excinfo:
        run("diff", "deadbeefdeadbeef", "cafebabecafebabe")
    assert excinfo.value.returncode == 2
