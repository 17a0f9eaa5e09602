"""A small client for OpenAI-compatible chat-completions endpoints.

Standard library only (urllib), no ORM. Works with any server that speaks
``POST {base_url}/chat/completions``: hosted APIs, vLLM, Ollama, llama.cpp.

Configuration comes from the recipe's operator params, then the environment:

- ``base_url`` / ``RSI_LLM_BASE_URL`` (e.g. ``http://127.0.0.1:11434/v1``),
- ``model`` / ``RSI_LLM_MODEL``,
- the key from ``RSI_LLM_API_KEY`` (or the variable named by ``api_key_env``;
  ``api_key`` in params works too, but a recipe is stored and shown, so keep
  secrets out of it).

Transient failures (connection errors, timeouts, 408, 429, 5xx) are retried
with exponential back-off; a 429 or 503 with ``Retry-After`` waits what the
server asks (capped by ``max_backoff_seconds``). Other 4xx answers are
permanent and raise at once. Every call returns the tokens it used.
"""

from __future__ import annotations

import email.utils
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from evolution import limits

ENV_BASE_URL = "RSI_LLM_BASE_URL"
ENV_API_KEY = "RSI_LLM_API_KEY"
ENV_MODEL = "RSI_LLM_MODEL"

TRANSIENT_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
# Characters of an error body quoted in an exception.
ERROR_BODY_CHARS = 500


class LLMError(RuntimeError):
    """Base class. ``usage`` holds the tokens spent before the failure."""

    def __init__(self, message: str, *, usage: Mapping[str, int] | None = None) -> None:
        super().__init__(message)
        self.usage: dict[str, int] = dict(usage or {})


class LLMConfigError(LLMError):
    """The configuration is missing or invalid (names the setting)."""


class LLMPermanentError(LLMError):
    """The server refused the request for good (401, 403, 404, 400...)."""

    def __init__(self, message: str, *, status: int | None = None, usage: Mapping[str, int] | None = None) -> None:
        super().__init__(message, usage=usage)
        self.status = status


class LLMTransientError(LLMError):
    """Transient errors persisted through every retry."""


class LLMResponseError(LLMError):
    """The server answered 200 but not with a usable completion."""


@dataclass(frozen=True)
class LLMConfig:
    base_url: str
    model: str
    api_key: str = ""
    timeout_seconds: float = 120.0
    max_retries: int = 4  # retries after the first attempt
    backoff_seconds: float = 1.0  # first wait; doubles each retry
    max_backoff_seconds: float = 60.0
    temperature: float | None = 0.2
    max_tokens: int | None = None
    json_mode: bool = True  # response_format {"type": "json_object"}
    # How an operator's answer schema is sent (JSON_SCHEMA_STYLES): "" none (the prompt describes it), "openai"
    # response_format json_schema, "llama.cpp" json_object with a "schema" (llama.cpp's server then holds the
    # answer to it, which a small local model needs).
    json_schema: str = ""
    # Optional prices for the cost in usage ("cost_micro_usd"), per million tokens.
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


def _number(params: Mapping[str, Any], name: str, default: float | None, *, minimum: float = 0.0) -> float | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise LLMConfigError(f'params "{name}" must be a number of at least {minimum:g}, not {value!r}')
    return float(value)


JSON_SCHEMA_STYLES = ("", "openai", "llama.cpp")


def _schema_style(params: Mapping[str, Any]) -> str:
    style = params.get("json_schema", "")
    if style not in JSON_SCHEMA_STYLES:
        raise LLMConfigError(f'params "json_schema" must be one of "openai", "llama.cpp" or "", not {style!r}')
    return str(style)


def response_format(config: LLMConfig, schema: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """What ``response_format`` asks of the server: nothing, any JSON object, or ``schema`` in the server's
    own way (``config.json_schema``)."""
    if not config.json_mode:
        return None
    if schema is None or not config.json_schema:
        return {"type": "json_object"}
    if config.json_schema == "openai":
        return {"type": "json_schema", "json_schema": {"name": "answer", "schema": dict(schema)}}
    return {"type": "json_object", "schema": dict(schema)}


def config_from(params: Mapping[str, Any] | None = None, *, environ: Mapping[str, str] | None = None) -> LLMConfig:
    """The client configuration from operator params, then the environment.

    Raises LLMConfigError naming the missing or invalid setting.
    """
    params = params or {}
    env = os.environ if environ is None else environ
    base_url = params.get("base_url") or env.get(ENV_BASE_URL, "")
    model = params.get("model") or env.get(ENV_MODEL, "")
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise LLMConfigError(
            f'no endpoint: set params "base_url" or {ENV_BASE_URL} to an http(s) URL (got {base_url!r})'
        )
    if not isinstance(model, str) or not model:
        raise LLMConfigError(f'no model: set params "model" or {ENV_MODEL}')
    key_env = params.get("api_key_env", ENV_API_KEY)
    if not isinstance(key_env, str):
        raise LLMConfigError('params "api_key_env" must be the name of an environment variable')
    api_key = params.get("api_key") or env.get(key_env, "")
    headers = params.get("headers", {})
    if not isinstance(headers, Mapping) or not all(isinstance(v, str) for v in headers.values()):
        raise LLMConfigError('params "headers" must map header names to strings')
    retries = params.get("max_retries", 4)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise LLMConfigError(f'params "max_retries" must be a non-negative integer, not {retries!r}')
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise LLMConfigError(f'params "max_tokens" must be a positive integer, not {max_tokens!r}')
    timeout = _number(params, "timeout_seconds", 120.0, minimum=0.001)
    return LLMConfig(
        base_url=base_url,
        model=model,
        api_key=str(api_key),
        timeout_seconds=timeout if timeout is not None else 120.0,
        max_retries=retries,
        backoff_seconds=_number(params, "backoff_seconds", 1.0) or 0.0,
        max_backoff_seconds=_number(params, "max_backoff_seconds", 60.0) or 0.0,
        temperature=_number(params, "temperature", 0.2),
        max_tokens=max_tokens,
        json_mode=bool(params.get("json_mode", True)),
        json_schema=_schema_style(params),
        price_input_per_mtok=_number(params, "price_input_per_mtok", None),
        price_output_per_mtok=_number(params, "price_output_per_mtok", None),
        headers=dict(headers),
    )


@dataclass(frozen=True)
class ChatResult:
    content: str
    usage: dict[str, int]
    model: str = ""


def add_usage(total: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """Sum two usage mappings in place (``total``) and return it."""
    for key, value in more.items():
        total[key] = total.get(key, 0) + int(value)
    return total


def _usage(config: LLMConfig, raw: Any) -> dict[str, int]:
    raw = raw if isinstance(raw, Mapping) else {}

    def count(name: str) -> int:
        value = raw.get(name, 0)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    prompt, completion = count("prompt_tokens"), count("completion_tokens")
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": count("total_tokens") or prompt + completion,
        "requests": 1,
    }
    if config.price_input_per_mtok is not None or config.price_output_per_mtok is not None:
        # Prices are per million tokens, so millionths of a dollar are tokens times price.
        micro = prompt * (config.price_input_per_mtok or 0.0) + completion * (config.price_output_per_mtok or 0.0)
        usage["cost_micro_usd"] = round(micro)
    return usage


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def _post(config: LLMConfig, body: bytes) -> tuple[int, Mapping[str, str], bytes]:
    headers = {"Content-Type": "application/json", "Accept": "application/json", **config.headers}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    request = urllib.request.Request(config.url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=config.timeout_seconds) as response:  # noqa: S310 (http(s) only)
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()) if exc.headers else {}, exc.read() or b""


def chat(
    config: LLMConfig,
    messages: Sequence[Mapping[str, str]],
    *,
    json_mode: bool | None = None,
    schema: Mapping[str, Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ChatResult:
    """One chat completion, retried on transient errors.

    Raises LLMPermanentError (a 4xx other than 408/409/425/429),
    LLMTransientError (retries exhausted; the message names the last error)
    or LLMResponseError (a 200 without a message). Safe to repeat: it only
    reads from the server.
    """
    payload: dict[str, Any] = {"model": config.model, "messages": [dict(m) for m in messages]}
    if config.temperature is not None:
        payload["temperature"] = config.temperature
    if config.max_tokens is not None:
        payload["max_tokens"] = config.max_tokens
    if json_mode is not None:
        config = replace(config, json_mode=json_mode)
    if (answer_format := response_format(config, schema)) is not None:
        payload["response_format"] = answer_format
    body = json.dumps(payload).encode("utf-8")
    last = ""
    for attempt in range(config.max_retries + 1):
        wait = min(config.max_backoff_seconds, config.backoff_seconds * 2**attempt)
        try:
            status, headers, data = _post(config, body)
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            last = f"cannot reach {config.url}: {type(reason).__name__}: {reason}"
        else:
            if status == 200:
                return _completion(config, data)
            text = data.decode("utf-8", errors="replace")[:ERROR_BODY_CHARS]
            last = f"HTTP {status} from {config.url}: {text}"
            if status not in TRANSIENT_STATUSES:
                raise LLMPermanentError(last, status=status)
            lower = {k.lower(): v for k, v in headers.items()}
            asked = retry_after_seconds(lower.get("retry-after"))
            if asked is not None:
                wait = min(config.max_backoff_seconds, asked)
        if attempt < config.max_retries:
            sleep(wait)
    raise LLMTransientError(f"gave up after {config.max_retries + 1} attempt(s): {last}")


def _completion(config: LLMConfig, data: bytes) -> ChatResult:
    try:
        document = limits.json_loads(data, what="the answer")
        message = document["choices"][0]["message"]
        content = message.get("content")
    except (UnicodeDecodeError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise LLMResponseError(
            f"the server's answer is not a chat completion ({type(exc).__name__}): "
            f"{data[:ERROR_BODY_CHARS].decode('utf-8', errors='replace')}"
        ) from None
    usage = _usage(config, document.get("usage"))
    if not isinstance(content, str):
        raise LLMResponseError("the completion has no text content", usage=usage)
    return ChatResult(content=content, usage=usage, model=str(document.get("model", "")))


def parse_json_content(content: str) -> Any:
    """The JSON document in a completion, tolerating a Markdown code fence
    around it (some servers ignore JSON mode). Raises ValueError."""
    text = content.strip()
    if text.startswith("```"):
        first_newline = text.find("\n")
        text = text[first_newline + 1 :] if first_newline >= 0 else ""
        if text.rstrip().endswith("```"):
            text = text.rstrip()[:-3]
    return limits.json_loads(text, what="the answer")


def chat_json(
    config: LLMConfig,
    messages: Sequence[Mapping[str, str]],
    *,
    check: Callable[[Any], Any] = lambda document: document,
    repair_attempts: int = 1,
    schema: Mapping[str, Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Any, dict[str, int]]:
    """Ask for a JSON answer and return ``(check(document), usage)``.

    When the answer is not JSON, or ``check`` raises ValueError, the model is
    told what was wrong and asked again, ``repair_attempts`` times; then
    LLMResponseError names the last problem. ``usage`` sums every request,
    and a raised LLMError carries it too. ``schema``: the answer's JSON schema, sent as the config's
    ``json_schema`` style says (``check`` still checks every answer).
    """
    conversation = [dict(m) for m in messages]
    usage: dict[str, int] = {}
    problem = ""
    for _attempt in range(repair_attempts + 1):
        try:
            result = chat(config, conversation, schema=schema, sleep=sleep)
        except LLMError as exc:
            raise type(exc)(str(exc), usage=add_usage(usage, exc.usage)) from None
        add_usage(usage, result.usage)
        try:
            document = parse_json_content(result.content)
        except ValueError as exc:
            problem = f"the answer is not valid JSON ({exc})"
        else:
            try:
                return check(document), usage
            except ValueError as exc:
                problem = str(exc)
        conversation += [
            {"role": "assistant", "content": result.content},
            {"role": "user", "content": f"Your answer was rejected: {problem}. Answer again with the JSON only."},
        ]
    raise LLMResponseError(f"no usable answer after {repair_attempts + 1} attempt(s): {problem}", usage=usage)
