"""The OpenAI-compatible client against a stub server started by each test (no network)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from evolution import llm
from evolution.llm import (
    LLMConfigError,
    LLMPermanentError,
    LLMResponseError,
    LLMTransientError,
    chat,
    chat_json,
    config_from,
    retry_after_seconds,
)


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON, str/bytes as is
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


def completion(content: str, *, prompt_tokens: int = 11, completion_tokens: int = 7) -> Reply:
    return Reply(
        body={
            "id": "x",
            "model": "stub-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


class Stub:
    """A chat-completions server on 127.0.0.1. ``replies`` are served in order
    (the last one repeats), or ``responder(request_json)`` decides."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.responder: Callable[[dict[str, Any]], Reply] | None = None
        self.requests: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                with stub._lock:
                    stub.raw.append(raw)
                    stub.paths.append(self.path)
                    stub.headers.append(dict(self.headers.items()))
                    request = json.loads(raw)
                    stub.requests.append(request)
                    if stub.responder is not None:
                        reply = stub.responder(request)
                    else:
                        reply = stub.replies[min(len(stub.requests), len(stub.replies)) - 1]
                if reply.delay:
                    time.sleep(reply.delay)
                body = reply.body
                data = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
                data = data.encode() if isinstance(data, str) else data
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def params(self, **extra: Any) -> dict[str, Any]:
        return {"base_url": self.base_url, "model": "stub-model", "backoff_seconds": 0.01, **extra}

    def everything_sent(self) -> str:
        return b"\n".join(self.raw).decode("utf-8")


@contextmanager
def serving() -> Iterator[Stub]:
    """A running stub, shut down on exit (also used by test_llm_operators)."""
    server = Stub()
    server.thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()


@pytest.fixture
def stub() -> Iterator[Stub]:
    with serving() as server:
        yield server


def no_sleep() -> tuple[list[float], Callable[[float], None]]:
    waits: list[float] = []
    return waits, waits.append


def test_chat_returns_content_and_usage_and_sends_model_key_and_json_mode(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RSI_LLM_API_KEY", "sk-test-123")
    stub.replies = [completion('{"ok": true}', prompt_tokens=40, completion_tokens=9)]
    result = chat(config_from(stub.params()), [{"role": "user", "content": "hi"}])
    assert result.content == '{"ok": true}'
    assert result.usage == {"prompt_tokens": 40, "completion_tokens": 9, "total_tokens": 49, "requests": 1}
    assert stub.paths == ["/v1/chat/completions"]
    assert stub.headers[0]["Authorization"] == "Bearer sk-test-123"
    assert stub.requests[0]["model"] == "stub-model"
    assert stub.requests[0]["response_format"] == {"type": "json_object"}
    assert stub.requests[0]["messages"] == [{"role": "user", "content": "hi"}]


def test_params_override_the_environment_and_missing_settings_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"RSI_LLM_BASE_URL": "http://env:1/v1", "RSI_LLM_MODEL": "env-model", "RSI_LLM_API_KEY": "k"}
    assert config_from({}, environ=env).model == "env-model"
    config = config_from({"model": "recipe-model", "base_url": "http://recipe:2/v1"}, environ=env)
    assert (config.model, config.base_url, config.api_key) == ("recipe-model", "http://recipe:2/v1", "k")
    with pytest.raises(LLMConfigError, match="RSI_LLM_BASE_URL"):
        config_from({}, environ={"RSI_LLM_MODEL": "m"})
    with pytest.raises(LLMConfigError, match="RSI_LLM_MODEL"):
        config_from({}, environ={"RSI_LLM_BASE_URL": "http://x/v1"})
    with pytest.raises(LLMConfigError, match="max_retries"):
        config_from({"max_retries": -1}, environ=env)
    assert config_from({"json_mode": False}, environ=env).json_mode is False


def test_rate_limit_waits_what_retry_after_asks_then_succeeds(stub: Stub) -> None:
    stub.replies = [Reply(429, {"error": "slow down"}, {"Retry-After": "3"}), completion("fine")]
    waits, sleep = no_sleep()
    result = chat(config_from(stub.params()), [{"role": "user", "content": "x"}], sleep=sleep)
    assert result.content == "fine"
    assert waits == [3.0]
    assert len(stub.requests) == 2


def test_server_errors_are_retried_with_exponential_backoff(stub: Stub) -> None:
    stub.replies = [Reply(500, "boom"), Reply(502, "bad gateway"), completion("ok")]
    waits, sleep = no_sleep()
    result = chat(config_from(stub.params(backoff_seconds=0.5)), [{"role": "user", "content": "x"}], sleep=sleep)
    assert result.content == "ok"
    assert waits == [0.5, 1.0]


def test_retries_run_out_with_the_last_error_named(stub: Stub) -> None:
    stub.replies = [Reply(503, "overloaded")]
    waits, sleep = no_sleep()
    with pytest.raises(LLMTransientError, match=r"gave up after 3 attempt\(s\): HTTP 503 .*overloaded"):
        chat(config_from(stub.params(max_retries=2)), [{"role": "user", "content": "x"}], sleep=sleep)
    assert len(stub.requests) == 3
    assert len(waits) == 2


def test_a_permanent_error_is_not_retried(stub: Stub) -> None:
    stub.replies = [Reply(401, {"error": "bad key"}), completion("never")]
    with pytest.raises(LLMPermanentError, match="HTTP 401") as caught:
        chat(config_from(stub.params()), [{"role": "user", "content": "x"}], sleep=lambda s: None)
    assert caught.value.status == 401
    assert len(stub.requests) == 1


def test_a_timeout_is_retried_then_reported(stub: Stub) -> None:
    stub.replies = [Reply(delay=1.0, body={"late": True})]
    started = time.monotonic()
    with pytest.raises(LLMTransientError, match="gave up after 2 attempt"):
        chat(config_from(stub.params(timeout_seconds=0.2, max_retries=1)), [{"role": "user", "content": "x"}])
    assert len(stub.requests) == 2
    assert time.monotonic() - started < 2.0


def test_an_unreachable_server_is_a_transient_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    params = {"base_url": f"http://127.0.0.1:{port}/v1", "model": "m", "max_retries": 1}
    waits, sleep = no_sleep()
    with pytest.raises(LLMTransientError, match="cannot reach"):
        chat(config_from(params), [{"role": "user", "content": "x"}], sleep=sleep)
    assert waits == [1.0]


def test_a_200_that_is_not_a_completion_is_a_response_error(stub: Stub) -> None:
    stub.replies = [Reply(200, "<html>proxy login</html>")]
    with pytest.raises(LLMResponseError, match="proxy login"):
        chat(config_from(stub.params()), [{"role": "user", "content": "x"}])


def test_malformed_json_is_sent_back_once_then_a_clear_error_with_the_usage(stub: Stub) -> None:
    stub.replies = [completion("Sure! Here it is: {edits: oops"), completion("still {not json")]
    with pytest.raises(LLMResponseError, match=r"no usable answer after 2 attempt\(s\): the answer is not valid JSON"):
        chat_json(config_from(stub.params()), [{"role": "user", "content": "x"}])
    assert len(stub.requests) == 2
    repair = stub.requests[1]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "Sure! Here it is: {edits: oops"}
    assert "not valid JSON" in repair[-1]["content"]


def test_a_100000_deep_answer_or_completion_is_a_response_error_not_a_crash(stub: Stub) -> None:
    """Issue 16 item 2: json.loads raised RecursionError on a hostile server's answer."""
    deep = "[" * 100_000 + "]" * 100_000
    stub.replies = [completion(deep), completion(deep)]
    with pytest.raises(LLMResponseError, match=r"the answer is nested more than 100 levels deep"):
        chat_json(config_from(stub.params()), [{"role": "user", "content": "x"}])
    stub.replies = [Reply(200, '{"choices": ' + deep + "}")]
    with pytest.raises(LLMResponseError, match=r"^the server's answer is not a chat completion \(InputLimitError\)"):
        chat(config_from(stub.params()), [{"role": "user", "content": "x"}])


def test_malformed_json_then_a_good_answer_sums_the_usage(stub: Stub) -> None:
    stub.replies = [completion("nope", prompt_tokens=5, completion_tokens=1), completion('```json\n{"a": 1}\n```')]
    document, usage = chat_json(config_from(stub.params(price_input_per_mtok=2.0, price_output_per_mtok=10.0)), [])
    assert document == {"a": 1}
    assert usage == {
        "prompt_tokens": 16,
        "completion_tokens": 8,
        "total_tokens": 24,
        "requests": 2,
        "cost_micro_usd": 16 * 2 + 8 * 10,
    }


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    in_ten = retry_after_seconds(formatdate(time.time() + 10, usegmt=True))
    assert in_ten is not None and 8 <= in_ten <= 10


def test_retry_after_is_capped_by_max_backoff(stub: Stub) -> None:
    stub.replies = [Reply(429, "", {"Retry-After": "3600"}), completion("ok")]
    waits, sleep = no_sleep()
    chat(config_from(stub.params(max_backoff_seconds=5)), [], sleep=sleep)
    assert waits == [5.0]
    assert {429, 500, 503} <= llm.TRANSIENT_STATUSES


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        ("", {"type": "json_object"}),
        ("llama.cpp", {"type": "json_object", "schema": {"type": "object", "required": ["edits"]}}),
        (
            "openai",
            {
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": {"type": "object", "required": ["edits"]}},
            },
        ),
    ],
)
def test_an_answer_schema_is_sent_in_the_style_the_params_name(stub: Stub, style: str, expected: Any) -> None:
    stub.replies = [completion('{"edits": []}')]
    schema = {"type": "object", "required": ["edits"]}
    chat_json(config_from(stub.params(json_schema=style)), [{"role": "user", "content": "hi"}], schema=schema)
    assert stub.requests[0]["response_format"] == expected


def test_an_unknown_schema_style_is_named_and_json_mode_off_sends_no_format(stub: Stub) -> None:
    with pytest.raises(LLMConfigError, match='"json_schema" must be one of'):
        config_from(stub.params(json_schema="xml"))
    stub.replies = [completion("{}")]
    chat(config_from(stub.params(json_mode=False, json_schema="openai")), [{"role": "user", "content": "hi"}])
    assert "response_format" not in stub.requests[0]
