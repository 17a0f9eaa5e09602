"""Inspect AI eval logs: read a log, and convert each sample into an ATIF trajectory.

Pure: no ORM. Inspect (inspect_ai, ``inspect eval``) writes one log per
task run, as field names of ``inspect_ai.log._log`` (EvalLog, EvalSample)
and ``inspect_ai.model`` (ChatMessage*, ModelOutput, ModelUsage) have it:

- ``.eval`` (the default since inspect_ai 0.3.46): a zip holding
  ``header.json`` (the EvalLog without samples: ``version``, ``status``,
  ``eval``, ``plan``, ``results``, ``stats``, ``error``), one
  ``samples/<id>_epoch_<n>.json`` per sample, ``summaries.json`` and
  ``reductions.json``; a run that did not finish has
  ``_journal/start.json`` in place of the header. A sample written twice
  (requeued) keeps its last entry, as Inspect reads it.
- ``.json``: the whole EvalLog in one document, samples under ``samples``.

``inspect_log_load`` gives either as one dict (the ``.json`` shape), so one
conversion serves both. Each sample (``id``, ``epoch``, ``messages``,
``scores``, ``model_usage``, ``events``, ``error``) becomes one trajectory:
its messages the steps (system, user, assistant and tool messages; an
assistant's ``tool_calls`` ``{id, function, arguments}`` its tool calls,
each tool message the observation of the call it answers), each assistant
step's time and tokens from the model event that produced it (matched by
message id, or by text and tool call ids in logs older than message ids),
and the sample's scores, usage, error and times kept in the trajectory's
``extra["inspect"]``.
"""

from __future__ import annotations

import io
import math
import zipfile
from typing import Any

from evolution import limits

ZIP_MAGIC = b"PK\x03\x04"
HEADER = "header.json"
JOURNAL_START = "_journal/start.json"
SAMPLES_DIR = "samples/"
CONVERTED_VERSION = "ATIF-v1.5"
# inspect_ai.scorer value_to_float: the letters its scorers give.
_LETTERS = {"C": 1.0, "P": 0.5, "I": 0.0, "N": 0.0}


class InspectLogError(ValueError):
    """Not an Inspect AI log, or one that contradicts itself; one line."""


def is_zip(data: bytes) -> bool:
    return data[:4] == ZIP_MAGIC


def is_inspect_log(document: Any) -> bool:
    """Whether ``document`` is an EvalLog as Inspect writes it (a ``.json``
    log, or a ``.eval`` read by ``inspect_log_load``)."""
    return (
        isinstance(document, dict)
        and isinstance(document.get("eval"), dict)
        and "task" in document["eval"]
        and ("samples" in document or "status" in document or "plan" in document)
    )


def describe(document: dict[str, Any], *, kind: str = "") -> str:
    """A few words naming the log: ``an Inspect AI eval log (.eval, 12 samples)``."""
    samples = document.get("samples") or []
    count = f"{len(samples)} sample{'' if len(samples) == 1 else 's'}"
    return f"an Inspect AI eval log ({kind + ', ' if kind else ''}{count})"


def _sample_key(sample: Any) -> tuple[int, str]:
    """Inspect's own order (inspect_ai.log._log.sort_samples): epoch, then id."""
    if not isinstance(sample, dict):
        return (0, "")
    raw = sample.get("id")
    epoch = sample.get("epoch")
    return (epoch if isinstance(epoch, int) else 0, raw if isinstance(raw, str) else str(raw).zfill(20))


def inspect_log_load(data: bytes, *, what: str, setting: str = "RSI_MAX_TRAJECTORY_BYTES") -> dict[str, Any]:
    """The log in ``data`` (a ``.eval`` zip, or a ``.json`` log's bytes) as
    one dict with its samples under ``samples`` in Inspect's order.

    The uncompressed members together are held to the size limit
    ``setting`` (a small zip may inflate to much more).
    Raises InspectLogError naming ``what`` for a zip that is not an
    Inspect log or a member that is not JSON, InputLimitError over a limit.
    """
    if not is_zip(data):
        try:
            document = limits.json_loads(data, what=what, setting=setting)
        except ValueError as exc:
            if isinstance(exc, limits.InputLimitError):
                raise
            raise InspectLogError(f"{what}: not valid JSON ({exc})") from None
        if not is_inspect_log(document):
            raise InspectLogError(f"{what}: not an Inspect AI eval log (no eval.task)")
        return dict(document)
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        names = list(dict.fromkeys(archive.namelist()))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise InspectLogError(f"{what}: a damaged zip archive ({exc})") from None
    head = HEADER if HEADER in names else JOURNAL_START if JOURNAL_START in names else None
    if head is None:
        shown = ", ".join(names[:5]) or "nothing"
        raise InspectLogError(
            f"{what}: a zip archive without header.json or _journal/start.json (holds {shown}), "
            "not an Inspect AI eval log"
        )
    budget = limits.limit(setting)

    def member(name: str) -> Any:
        nonlocal budget
        try:
            with archive.open(name) as stream:
                raw = stream.read(budget + 1)
        except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError) as exc:
            raise InspectLogError(f"{what}: {name} cannot be read ({exc})") from None
        budget -= len(raw)
        if budget < 0:
            limits.check_size(limits.limit(setting) + 1, setting=setting, what=f"{what} uncompressed")
        try:
            return limits.json_loads(raw, what=f"{what}: {name}")
        except limits.InputLimitError:
            raise
        except ValueError as exc:
            raise InspectLogError(f"{what}: {name} is not valid JSON ({exc})") from None

    document = member(head)
    if not isinstance(document, dict) or not isinstance(document.get("eval"), dict):
        raise InspectLogError(f"{what}: {head} is not an Inspect AI log header (no eval)")
    samples = [member(name) for name in names if name.startswith(SAMPLES_DIR) and name.endswith(".json")]
    samples.sort(key=_sample_key)
    document = {**document, "samples": samples}
    if "reductions.json" in names and document.get("results") is not None:
        document["reductions"] = member("reductions.json")
    return document


# --- Scores -------------------------------------------------------------------


def score_value(value: Any) -> float | None:
    """A score value as a number, as inspect_ai.scorer.value_to_float maps
    it (C 1, P 0.5, I and N 0, yes/true 1, no/false 0, numeric text as its
    number); None for a list, an object or other text."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    if value in _LETTERS:
        return _LETTERS[value]
    lowered = value.lower()
    if lowered in ("yes", "true"):
        return 1.0
    if lowered in ("no", "false"):
        return 0.0
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def scorer_names(document: dict[str, Any]) -> list[str]:
    """The scorers' names in the order of the log's results (the first is the eval's main score)."""
    results = document.get("results") if isinstance(document.get("results"), dict) else {}
    assert results is not None
    names = []
    for entry in results.get("scores") or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"] not in names:
            names.append(entry["name"])
    return names


def sample_scores(sample: dict[str, Any]) -> dict[str, Any]:
    """scorer name -> Score object of a sample (``score`` of logs before ``scores``)."""
    scores = sample.get("scores")
    if isinstance(scores, dict):
        return {str(name): score for name, score in scores.items() if isinstance(score, dict)}
    if isinstance(sample.get("score"), dict):
        return {"score": sample["score"]}
    return {}


def sample_score(sample: dict[str, Any], scorers: list[str]) -> tuple[str, Any] | None:
    """(scorer, value) of the sample's main score: the first of ``scorers``
    it has, else its only score; None when it has no score."""
    scores = sample_scores(sample)
    for name in scorers:
        if name in scores:
            return name, scores[name].get("value")
    if len(scores) == 1:
        name, score = next(iter(scores.items()))
        return name, score.get("value")
    return None


def usage_tokens(usage: Any) -> tuple[int, int] | None:
    """(input, output) tokens summed over a ``model_usage`` map (model -> ModelUsage)."""
    if not isinstance(usage, dict) or not usage:
        return None
    total_in = total_out = 0
    for entry in usage.values():
        if not isinstance(entry, dict):
            return None
        for key in ("input_tokens", "output_tokens"):
            value = entry.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return None
        total_in += entry.get("input_tokens", 0)
        total_out += entry.get("output_tokens", 0)
    return total_in, total_out


# --- Conversion ---------------------------------------------------------------


def _content(content: Any) -> tuple[str, str | None]:
    """(text, reasoning) of a message's content: a string, or a list of
    Content parts (``text`` parts joined; ``reasoning`` parts as the
    reasoning; an image, audio or other part named in brackets)."""
    if content is None:
        return "", None
    if isinstance(content, str):
        return content, None
    texts: list[str] = []
    reasoning: list[str] = []
    for part in content if isinstance(content, list) else [content]:
        if not isinstance(part, dict):
            texts.append(str(part))
        elif part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") == "reasoning":
            text = part.get("reasoning") or part.get("summary")
            if isinstance(text, str) and text:
                reasoning.append(text)
        else:
            texts.append(f"[{part.get('type', 'content')}]")
    return "\n".join(texts), ("\n".join(reasoning) if reasoning else None)


def _resolve(value: Any, attachments: dict[str, Any]) -> Any:
    """``value`` with each ``attachment://<hash>`` (or the older ``tc://``)
    string replaced by the attachment it names, as Inspect reads it."""
    if isinstance(value, str):
        for prefix in ("attachment://", "tc://"):
            if value.startswith(prefix):
                found = attachments.get(value[len(prefix) :])
                return found if isinstance(found, str) else value
        return value
    if isinstance(value, list):
        return [_resolve(item, attachments) for item in value]
    if isinstance(value, dict):
        return {key: _resolve(item, attachments) for key, item in value.items()}
    return value


def _model_events(sample: dict[str, Any]) -> list[dict[str, Any]]:
    events = sample.get("events")
    if not isinstance(events, list):  # before ``events``: ``transcript.events``
        transcript = sample.get("transcript")
        events = transcript.get("events") if isinstance(transcript, dict) else None
    attachments = sample.get("attachments") if isinstance(sample.get("attachments"), dict) else {}
    assert attachments is not None
    # The output's text may be an attachment reference; only the output is read.
    return [
        {**e, "output": _resolve(e.get("output"), attachments)}
        for e in events or []
        if isinstance(e, dict) and e.get("event") == "model"
    ]


def _output_message(event: dict[str, Any]) -> dict[str, Any] | None:
    output = event.get("output")
    choices = output.get("choices") if isinstance(output, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None
    return None


def _call_ids(message: dict[str, Any]) -> tuple[str, ...]:
    calls = message.get("tool_calls")
    return tuple(str(call.get("id")) for call in calls if isinstance(call, dict)) if isinstance(calls, list) else ()


def _event_for(message: dict[str, Any], events: list[dict[str, Any]], used: set[int]) -> dict[str, Any] | None:
    """The model event whose output is ``message``: by message id, else the
    first unused one with the same text and tool call ids."""
    text = _content(message.get("content"))[0]
    for index, event in enumerate(events):
        output = _output_message(event)
        if index in used or output is None:
            continue
        if message.get("id") and output.get("id"):
            matched = output["id"] == message["id"]
        else:
            matched = _content(output.get("content"))[0] == text and _call_ids(output) == _call_ids(message)
        if matched:
            used.add(index)
            return event
    return None


def _event_metrics(event: dict[str, Any]) -> dict[str, Any]:
    output = event.get("output") if isinstance(event.get("output"), dict) else {}
    assert output is not None
    usage = output.get("usage")
    metrics: dict[str, Any] = {}
    if isinstance(usage, dict):
        for ours, theirs in (
            ("prompt_tokens", "input_tokens"),
            ("completion_tokens", "output_tokens"),
            ("cached_tokens", "input_tokens_cache_read"),
        ):
            value = usage.get(theirs)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                metrics[ours] = value
        if isinstance(usage.get("total_cost"), int | float) and usage["total_cost"] >= 0:
            metrics["cost_usd"] = usage["total_cost"]
    return metrics


def _as_openai(message: dict[str, Any]) -> dict[str, Any]:
    """An Inspect ChatMessage as an OpenAI-style message: text content,
    ``reasoning_content``, and tool calls ``{id, function: {name, arguments}}``;
    every other field is kept (it ends in the step's or result's ``extra``)."""
    text, reasoning = _content(message.get("content"))
    converted = {key: value for key, value in message.items() if key not in ("content", "tool_calls")}
    converted["content"] = text
    if reasoning is not None:
        converted["reasoning_content"] = reasoning
    if message.get("role") == "assistant" and isinstance(message.get("tool_calls"), list):
        converted["tool_calls"] = [
            {
                "id": call.get("id"),
                "function": {"name": call.get("function"), "arguments": call.get("arguments")},
                **{k: v for k, v in call.items() if k not in ("id", "function", "arguments", "view")},
            }
            if isinstance(call, dict)
            else call
            for call in message["tool_calls"]
        ]
    if message.get("role") == "user" and "tool_call_id" in converted:
        converted["inspect_tool_call_id"] = converted.pop("tool_call_id")
    return converted


def sample_messages(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The sample's messages as OpenAI-style messages (attachments resolved);
    a sample without messages (it errored first) gives its input."""
    attachments = sample.get("attachments") if isinstance(sample.get("attachments"), dict) else {}
    assert attachments is not None
    messages = sample.get("messages")
    if not messages:
        raw = sample.get("input")
        messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    return [_as_openai(_resolve(m, attachments)) if isinstance(m, dict) else m for m in messages or []]


def sample_times(sample: dict[str, Any], steps: list[dict[str, Any]], messages: list[dict[str, Any]]) -> None:
    """Set each agent step's time, model and tokens from the model event that
    produced its message (``steps`` converted from ``messages``: one agent
    step per assistant message, in order)."""
    events = _model_events(sample)
    used: set[int] = set()
    assistants = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    for step, message in zip([s for s in steps if s.get("source") == "agent"], assistants, strict=False):
        event = _event_for(message, events, used)
        if event is None:
            continue
        when = event.get("completed") or event.get("timestamp")
        if isinstance(when, str) and when:
            step["timestamp"] = when
        metrics = _event_metrics(event)
        if metrics:
            step["metrics"] = {**step.get("metrics", {}), **metrics}
        if isinstance(event.get("model"), str) and event["model"]:
            step["model_name"] = event["model"]


def sample_extra(sample: dict[str, Any]) -> dict[str, Any]:
    """What the trajectory keeps of a sample beside its steps."""
    keep = (
        "id",
        "epoch",
        "uuid",
        "target",
        "scores",
        "model_usage",
        "started_at",
        "completed_at",
        "total_time",
        "working_time",
        "error",
        "limit",
        "metadata",
    )
    extra = {key: sample[key] for key in keep if sample.get(key) not in (None, {}, [])}
    if "scores" not in extra and isinstance(sample.get("score"), dict):
        extra["scores"] = {"score": sample["score"]}
    return extra


def log_extra(document: dict[str, Any]) -> dict[str, Any]:
    """What each sample's trajectory keeps of its log: the task, model and run."""
    spec = document.get("eval") if isinstance(document.get("eval"), dict) else {}
    assert spec is not None
    keep = ("task", "task_version", "task_id", "run_id", "eval_id", "model", "created", "packages", "dataset")
    extra = {key: spec[key] for key in keep if spec.get(key) is not None}
    extra["log_version"] = document.get("version")
    extra["status"] = document.get("status")
    return extra


def one_per_sample(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The log as one log per sample (in the log's order), each a whole trajectory document."""
    return [{**document, "samples": [sample]} for sample in document.get("samples") or []]
