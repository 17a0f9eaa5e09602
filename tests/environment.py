"""Loaded with ``-p`` before Django settings are read (see pyproject.toml).

Gives each test session its own broker folder, trial work folder and SQLite
test database, so a development worker running from the same checkout never
consumes the test suite's messages, and two test sessions never see each
other's.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_session_dir = tempfile.mkdtemp(prefix="rsiweb-tests-")
# Trial workspaces live below; an unprivileged trial user must traverse it.
os.chmod(_session_dir, 0o711)
os.environ["RSI_BROKER_DIR"] = os.path.join(_session_dir, "broker")
os.environ["RSI_WORK_DIR"] = os.path.join(_session_dir, "work")
os.environ.setdefault("RSI_TEST_SESSION_DIR", _session_dir)
# Each session its own SQLite test database (PostgreSQL test databases are
# named by Django and not affected).
os.environ["RSI_TEST_DB_SUFFIX"] = f"-{os.getpid()}"
atexit.register(shutil.rmtree, _session_dir, ignore_errors=True)
# Review decisions take effect at once in tests (and their workers), as they did
# before the undo window; the tests of the window set their own.
os.environ.setdefault("RSI_REVIEW_UNDO_SECONDS", "0")
