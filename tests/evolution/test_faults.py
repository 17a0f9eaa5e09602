"""The fault points the crash tests and the trust suite use."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evolution import faults
from lab.processes import process_state
from tests.conftest import wait_until


@pytest.fixture
def hold_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    marker = tmp_path / "fault"
    monkeypatch.setenv("RSI_FAULT_POINT", "agent:start")
    monkeypatch.setenv("RSI_FAULT_MARKER", str(marker))
    monkeypatch.setenv("RSI_FAULT_SKIP", "1")
    return marker


def test_hold_argv_holds_only_the_hit_after_the_skipped_ones(hold_point: Path) -> None:
    argv = [sys.executable, "-c", "pass"]
    assert faults.hold_argv("agent:start", argv) == argv
    assert not hold_point.exists()
    held = faults.hold_argv("agent:start", argv)
    assert held[-3:] == argv and faults.HOLD_NAME in held
    assert hold_point.read_text().startswith("agent:start ")
    assert faults.hold_argv("agent:start", argv) == argv, "a second command was held"
    assert faults.hold_argv("trial:finished", argv) == argv


def test_a_held_command_waits_stopped_until_killed_or_continued(hold_point: Path, tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    for continued in (False, True):
        for hit in hold_point.parent.glob("fault.hit-*"):
            hit.unlink()
        faults.hold_argv("agent:start", ["true"])
        command = faults.hold_argv("agent:start", [sys.executable, "-c", f"open({str(ran)!r}, 'w')"])
        process = subprocess.Popen(command)
        try:

            def stopped(pid: int = process.pid) -> bool:
                return process_state(pid) == "T"

            wait_until(stopped, timeout=30, what="the held command to stop")
            assert not ran.exists(), "the held command ran before it was let go"
            process.send_signal(signal.SIGCONT if continued else signal.SIGKILL)
            returncode = process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if continued:
            assert (returncode, ran.exists()) == (0, True)
        else:
            assert (returncode, ran.exists()) == (-signal.SIGKILL, False)
