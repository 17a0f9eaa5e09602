"""Serve the optional local model (SmolLM2-135M-Instruct, llama.cpp) in the foreground."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from evolution import llm_local


class Command(BaseCommand):
    help = (
        "Serve the local model on an OpenAI-compatible endpoint (http://127.0.0.1:PORT/v1) until stopped. "
        "Needs RSI_LLM=local's install (requirements-llm.txt)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=llm_local.DEFAULT_PORT, help="port (default %(default)s)")
        parser.add_argument(
            "--threads", type=int, default=llm_local.DEFAULT_THREADS, help="CPU threads (default %(default)s)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        port, threads = options["port"], options["threads"]
        if not 0 < port < 65536 or threads < 1:
            raise CommandError("--port must be 1 to 65535 and --threads at least 1")
        try:
            command = llm_local.server_command(port=port, threads=threads)
            weights = llm_local.weights_path()
        except llm_local.LocalModelError as exc:
            raise CommandError(str(exc)) from exc
        url = llm_local.base_url(port)
        self.stdout.write(f"serving {weights.name} as {llm_local.MODEL_ALIAS!r} on {url} ({threads} thread(s))")
        self.stdout.flush()
        server = subprocess.Popen(command)
        # Stopped as a whole: a signal to this command reaches the server, which it then waits for.
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda signum, _frame: server.send_signal(signum))
        try:
            llm_local.wait_ready(url, timeout=120, alive=lambda: server.poll() is None)
            self.stdout.write(f"ready: RSI_LLM_BASE_URL={url} RSI_LLM_MODEL={llm_local.MODEL_ALIAS}")
            self.stdout.flush()
        except llm_local.LocalModelError as exc:
            server.terminate()
            server.wait()
            raise CommandError(str(exc)) from exc
        code = server.wait()
        if code not in (0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP):
            raise CommandError(f"the local model's server exited with status {code}")
