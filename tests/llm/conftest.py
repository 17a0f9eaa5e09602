"""The local model (``RSI_LLM=local``): its server, started once a test session by ``manage.py llm_serve``.

Skips where RSI_LLM is unset (a laptop without the optional install); CI sets RSI_LLM=local, and there a
missing install or a server that does not come up fails the tests instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from evolution import llm_local
from tests.conftest import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL (``http://127.0.0.1:PORT/v1``) of the local model's server."""
    if os.environ.get("RSI_LLM") != "local":
        pytest.skip("the local model is optional: RSI_LLM=local installs and tests it (CI sets it)")
    port = _free_port()
    log: Path = tmp_path_factory.mktemp("llm") / "llm_serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "manage.py", "llm_serve", "--port", str(port)],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = llm_local.base_url(port)
    try:
        llm_local.wait_ready(url, timeout=180, alive=lambda: server.poll() is None)
    except llm_local.LocalModelError as exc:
        server.kill()
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-3000:]}")
    yield url
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


# The screens' fixtures, for the browser check of a real model's run.
from tests.review.conftest import make_user  # noqa: E402, F401
from tests.review.test_browser import browser  # noqa: E402, F401
