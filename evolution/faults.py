"""Fault-injection checkpoints for the crash tests.

``checkpoint("name")`` does nothing unless ``RSI_FAULT_POINT`` names this
point: then (after ``RSI_FAULT_SKIP`` hits) it writes ``RSI_FAULT_MARKER`` and blocks, so a test can SIGKILL
the worker exactly there (inside the open transaction, before its commit).
Never set these variables outside tests.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def checkpoint(name: str) -> None:
    if os.environ.get("RSI_FAULT_POINT") != name:
        return
    marker = os.environ.get("RSI_FAULT_MARKER")
    skip = int(os.environ.get("RSI_FAULT_SKIP", "0"))
    if marker and skip:
        # Count hits across the worker's processes: one byte per hit, appended
        # atomically; block only from hit number skip + 1 on.
        with open(marker + ".count", "ab") as counter:
            counter.write(b".")
        if Path(marker + ".count").stat().st_size <= skip:
            return
    if marker:
        Path(marker).write_text(f"{name} {os.getpid()}\n")
    # Wait to be killed; never resume from here.
    while True:
        time.sleep(60)
