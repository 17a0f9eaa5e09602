"""Fault-injection checkpoints for the crash tests.

``checkpoint("name")`` does nothing unless ``RSI_FAULT_POINT`` names this
point: then (after ``RSI_FAULT_SKIP`` hits) it writes ``RSI_FAULT_MARKER``
and blocks, so a test can SIGKILL the worker exactly there (inside the open
transaction, before its commit). ``hold_argv("name", argv)`` is the same for
a sandboxed command, at hit ``RSI_FAULT_SKIP`` + 1 only: it writes the marker
and returns ``argv`` behind a shell that stops itself (SIGSTOP) before it
execs the command, so a test can find the stopped process and SIGKILL it
without racing a command that may finish first.
Never set these variables outside tests.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD_NAME = "rsi-fault-hold"


def _hit(name: str, *, once: bool = False) -> bool:
    """Whether this call of point ``name`` is one to act on: hit number
    skip + 1 and, unless ``once``, every later one."""
    if os.environ.get("RSI_FAULT_POINT") != name:
        return False
    marker = os.environ.get("RSI_FAULT_MARKER")
    skip = int(os.environ.get("RSI_FAULT_SKIP", "0"))
    if marker and (skip or once):
        hit = _number_this_hit(marker)
        if hit <= skip or (once and hit > skip + 1):
            return False
    if marker:
        Path(marker).write_text(f"{name} {os.getpid()}\n")
    return True


def _number_this_hit(marker: str) -> int:
    """1 for the first hit, 2 for the second... counted across the worker's
    processes: each hit creates the first free ``<marker>.hit-<n>`` file,
    and O_EXCL makes the creation atomic."""
    number = 1
    while True:
        try:
            os.close(os.open(f"{marker}.hit-{number}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            number += 1
        else:
            return number


def checkpoint(name: str) -> None:
    if not _hit(name):
        return
    # Wait to be killed; never resume from here.
    while True:
        time.sleep(60)


def hold_argv(name: str, argv: list[str]) -> list[str]:
    if not _hit(name, once=True):
        return argv
    # $0 names the stopped shell in /proc/<pid>/cmdline; it execs the command
    # unchanged if it is ever continued instead of killed.
    return ["/bin/sh", "-c", 'kill -STOP $$ && exec "$@"', HOLD_NAME, *argv]
