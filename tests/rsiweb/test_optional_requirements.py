"""The reasoning-gym benchmark's package is optional (requirements-rgym.txt): ``dev.py test`` installs it
where it can, a failed install is said in one line and not retried until a requirement file changes, and
without the package the benchmark is refused with how to install it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO_ROOT
from tests.rsiweb.test_dev_run import _dev_module


def _dev_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    dev = _dev_module()
    venv = tmp_path / ".venv"
    venv.mkdir()
    monkeypatch.setattr(dev, "ROOT", tmp_path)
    monkeypatch.setattr(dev, "VENV", venv)
    monkeypatch.setattr(dev, "PYTHON", Path(sys.executable))
    return dev


def test_a_failed_optional_install_is_said_once_and_tried_again_when_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dev = _dev_in(tmp_path, monkeypatch)
    requirements = tmp_path / "requirements-x.txt"
    requirements.write_text("./no-such-package-folder\n")  # pip refuses it at once, offline

    assert dev.ensure_optional("requirements-x.txt") is False
    said = capsys.readouterr().out
    assert "installing requirements-x.txt" in said and "could not install requirements-x.txt" in said
    assert (tmp_path / ".venv" / ".failed-requirements-x.txt").exists()

    assert dev.ensure_optional("requirements-x.txt") is False
    assert capsys.readouterr().out == ""  # not tried again

    requirements.write_text("pytest\n")  # already installed here: pip has nothing to fetch
    assert dev.ensure_optional("requirements-x.txt") is True
    assert "installing requirements-x.txt" in capsys.readouterr().out
    assert dev.venv_current("requirements-x.txt")
    assert not (tmp_path / ".venv" / ".failed-requirements-x.txt").exists()


def test_without_the_package_the_benchmark_says_how_to_install_it() -> None:
    # -S: no site-packages, so the package is not there (evolution.rgym.tasks needs the standard library only).
    code = "from evolution.rgym.tasks import package_version\npackage_version()"
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)

    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ValueError: the reasoning-gym package is not installed; install it with "
        ".venv/bin/pip install -r requirements-rgym.txt"
    )
