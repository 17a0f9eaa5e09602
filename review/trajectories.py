"""Display model of trajectory steps, and the alignment of two trajectories.

Pure functions and frozen dataclasses, no ORM: a step comes in as a mapping
with the fields of ``TrajectoryStep`` (what ``QuerySet.values()`` returns, or
an ATIF step dictionary). Every value here is untrusted text from an agent
run; these functions never build HTML, they only decide what is shown and
how (collapsed or not, which step is an error, which hidden characters it
holds), so templates can escape it and mark those characters (``reveal``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import re
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from evolution import hidden_chars, limits, pricing

__all__ = [
    "AlignedRow",
    "Metrics",
    "Observation",
    "StepView",
    "Text",
    "ToolCall",
    "DivergenceSummary",
    "ContentPair",
    "WordPiece",
    "align",
    "align_by_content",
    "align_window",
    "call_signature",
    "divergence_summary",
    "first_divergence",
    "pretty_json",
    "step_error",
    "step_signature",
    "step_view",
    "text_block",
    "word_diff",
]

# Content longer than either limit is collapsed behind <details>.
COLLAPSE_LINES = 40
COLLAPSE_CHARS = 4000
PREVIEW_LINES = 6
PREVIEW_CHARS = 600
# Beyond this one block is cut, and the page says how much is not shown: a
# single runaway tool output must not make a page of 100 steps unreadable.
SHOW_LIMIT = 200_000

# Metric keys shown in their own columns; other scalar metrics are listed by name.
TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "cached_tokens")
COST_KEY = "cost_usd"

_ERROR_PREFIXES = ("error:", "error ", "traceback (most recent call last)", "exception:", "fatal:")


@dataclass(frozen=True)
class Text:
    """A block of untrusted text and how to show it.

    ``shown`` is the text to render (the whole text unless it exceeds
    ``SHOW_LIMIT``; then ``hidden_chars`` says how much is cut); ``collapsed``
    means it goes behind an expander with ``preview`` visible.
    """

    shown: str
    lines: int
    chars: int
    collapsed: bool
    preview: str
    hidden_chars: int = 0


def text_block(
    value: str,
    *,
    max_lines: int = COLLAPSE_LINES,
    max_chars: int = COLLAPSE_CHARS,
    preview_lines: int = PREVIEW_LINES,
    limit: int = SHOW_LIMIT,
) -> Text:
    """How to show ``value``: collapsed when longer than ``max_lines`` lines or
    ``max_chars`` characters, cut (and said so) beyond ``limit`` characters."""
    chars = len(value)
    lines = value.count("\n") + (1 if value and not value.endswith("\n") else 0)
    collapsed = lines > max_lines or chars > max_chars
    preview = ""
    if collapsed:
        preview = "\n".join(value.splitlines()[:preview_lines])[:PREVIEW_CHARS]
    shown = value if chars <= limit else value[:limit]
    return Text(
        shown=shown, lines=lines, chars=chars, collapsed=collapsed, preview=preview, hidden_chars=chars - len(shown)
    )


def pretty_json(value: Any) -> str:
    """Indented JSON of ``value``; a string holding JSON is decoded first
    (tool-call arguments often arrive as an encoded string). A string nested
    past the input limit is shown as it is: decoding it would recurse."""
    if isinstance(value, str):
        try:
            value = limits.json_loads(value, what="the value")
        except ValueError:
            return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class ToolCall:
    call_id: str
    function_name: str
    arguments: Text


@dataclass(frozen=True)
class Observation:
    """One result of a step's observation; ``refs`` names subagent trajectories."""

    source_call_id: str
    content: Text | None
    error: bool
    refs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Metrics:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    # Other metrics as (name, shown value): scalars as they are, lists by length.
    other: tuple[tuple[str, str], ...] = ()

    @property
    def total_tokens(self) -> int | None:
        if self.prompt_tokens is None and self.completion_tokens is None:
            return None
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    @property
    def empty(self) -> bool:
        return self.total_tokens is None and self.cost_usd is None and not self.other


@dataclass(frozen=True)
class StepView:
    step_id: int
    timestamp: str
    source: str
    model_name: str
    message: Text | None
    reasoning: Text | None
    tool_calls: tuple[ToolCall, ...]
    observations: tuple[Observation, ...]
    metrics: Metrics
    extra: Text | None
    error: str  # why this step counts as an error, "" when it does not
    position: int = 0  # 1-based ordinal in its trajectory, 0 when unknown
    # Hidden and look-alike characters in any text of the step, for its warning.
    hidden: hidden_chars.Summary | None = None
    # Seconds from this step's timestamp to the next step's; None when either is missing or unreadable.
    duration: float | None = None
    # The tokens' money cost at the model's list prices, or why there is none ("" when the step has no tokens).
    priced: pricing.Cost | None = None
    unpriced: str = ""

    @property
    def source_label(self) -> str:
        return self.source or "unknown"

    @property
    def hidden_banner(self) -> str:
        return self.hidden.message("step") if self.hidden is not None else ""

    @property
    def duration_text(self) -> str:
        return duration_text(self.duration) if self.duration is not None else ""


def duration_text(seconds: float) -> str:
    """A duration as people read it: "0.42 s", "12.3 s", "2 min 05 s", "1 h 02 min"."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _moment(timestamp: str) -> datetime | None:
    """The timestamp as an aware datetime, or None (missing, unreadable, or without a time zone)."""
    try:
        moment = datetime.fromisoformat(timestamp.strip())
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def with_durations(steps: Sequence[StepView], *, following: str = "") -> list[StepView]:
    """``steps`` (consecutive, in order) each with the time to the next step; ``following`` is the timestamp
    of the step after the last one ("" when there is none or it is unknown). A step whose own or next
    timestamp is missing or unreadable, or whose next step is earlier, gets no duration."""
    stamps = [_moment(step.timestamp) for step in steps] + [_moment(following) if following else None]
    shown = []
    for index, step in enumerate(steps):
        start, end = stamps[index], stamps[index + 1]
        seconds = (end - start).total_seconds() if start is not None and end is not None else None
        shown.append(dataclasses.replace(step, duration=seconds if seconds is not None and seconds >= 0 else None))
    return shown


def _step_price(model: str, metrics: Metrics) -> tuple[pricing.Cost | None, str]:
    if metrics.total_tokens is None:
        return None, ""
    if not model:
        return None, "the step names no model: no price"
    cost = pricing.token_cost(
        model=model, prompt_tokens=metrics.prompt_tokens, completion_tokens=metrics.completion_tokens
    )
    return cost, "" if cost is not None else f"no price for {model} in the price table"


def _content_text(content: Any) -> str:
    """ATIF observation content: a string, or a list of parts (text, image)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, Mapping) and part.get("type") == "image":
                source = part.get("source") or {}
                where = source.get("path") or source.get("url") if isinstance(source, Mapping) else ""
                parts.append(f"[image{': ' + str(where) if where else ''}]")
            else:
                parts.append(pretty_json(part))
        return "\n".join(parts)
    return pretty_json(content)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _metrics(raw: Any) -> Metrics:
    if not isinstance(raw, Mapping):
        return Metrics()
    other: list[tuple[str, str]] = []
    for key, value in raw.items():
        if key in TOKEN_KEYS or key == COST_KEY:
            continue
        if isinstance(value, list | tuple):
            # Token ids and log-probabilities: thousands of numbers nobody reads.
            other.append((str(key), f"{len(value)} values"))
        elif isinstance(value, Mapping):
            other.append((str(key), json.dumps(value, ensure_ascii=False)[:200]))
        else:
            other.append((str(key), str(value)[:200]))
    cost = raw.get(COST_KEY)
    return Metrics(
        prompt_tokens=_int(raw.get("prompt_tokens")),
        completion_tokens=_int(raw.get("completion_tokens")),
        cached_tokens=_int(raw.get("cached_tokens")),
        cost_usd=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
        other=tuple(other),
    )


def _looks_like_error(text: str) -> bool:
    return text.lstrip()[:40].lower().startswith(_ERROR_PREFIXES)


def _first_line(text: str, limit: int = 200) -> str:
    stripped = text.strip()
    return (stripped.splitlines()[0] if stripped else "")[:limit]


def _results(observation: Any) -> list[Mapping[str, Any]]:
    if not isinstance(observation, Mapping):
        return []
    results = observation.get("results")
    return [r for r in results if isinstance(r, Mapping)] if isinstance(results, list) else []


def step_error(step: Mapping[str, Any]) -> str:
    """Why ``step`` counts as an error ("" when it does not): an ``error`` or
    ``is_error`` in its extra fields or in a tool result, or a message or tool
    output that starts like an error report."""
    extra = step.get("extra")
    if isinstance(extra, Mapping):
        if extra.get("error"):
            return _first_line(str(extra["error"])) or "error"
        if extra.get("is_error"):
            return "the step is marked as an error"
    for result in _results(step.get("observation")):
        if result.get("is_error") or result.get("error"):
            detail = result.get("error")
            return _first_line(str(detail)) if isinstance(detail, str) and detail else "a tool result is an error"
        content = _content_text(result.get("content"))
        if _looks_like_error(content):
            return _first_line(content)
    message = step.get("message")
    if isinstance(message, str) and _looks_like_error(message):
        return _first_line(message)
    return ""


def step_view(step: Mapping[str, Any], *, position: int = 0) -> StepView:
    """The display model of one step (a ``TrajectoryStep`` as values() or an ATIF dict)."""
    message = step.get("message")
    message_text = message if isinstance(message, str) else _content_text(message)
    reasoning = step.get("reasoning_content") or ""
    calls = []
    for call in step.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        calls.append(
            ToolCall(
                call_id=str(call.get("tool_call_id") or ""),
                function_name=str(call.get("function_name") or call.get("name") or "?"),
                arguments=text_block(pretty_json(call.get("arguments", {}))),
            )
        )
    observations = []
    for result in _results(step.get("observation")):
        content = _content_text(result.get("content"))
        refs = []
        for ref in result.get("subagent_trajectory_ref") or []:
            if isinstance(ref, Mapping):
                refs.append(str(ref.get("trajectory_path") or ref.get("session_id") or "?"))
        observations.append(
            Observation(
                source_call_id=str(result.get("source_call_id") or ""),
                content=text_block(content) if content else None,
                error=bool(result.get("is_error") or result.get("error")) or _looks_like_error(content),
                refs=tuple(refs),
            )
        )
    extra = step.get("extra")
    view = StepView(
        step_id=int(step.get("step_id") or 0),
        timestamp=str(step.get("timestamp") or ""),
        source=str(step.get("source") or ""),
        model_name=str(step.get("model_name") or ""),
        message=text_block(message_text) if message_text else None,
        reasoning=text_block(str(reasoning)) if reasoning else None,
        tool_calls=tuple(calls),
        observations=tuple(observations),
        metrics=_metrics(step.get("metrics")),
        extra=text_block(pretty_json(extra)) if isinstance(extra, Mapping) and extra else None,
        error=step_error(step),
        position=position,
    )
    priced, unpriced = _step_price(view.model_name, view.metrics)
    return dataclasses.replace(
        view, hidden=hidden_chars.summarize_texts(_step_texts(view)), priced=priced, unpriced=unpriced
    )


def _step_texts(view: StepView) -> Iterator[str]:
    """Every text of a step the page shows (what its warning counts)."""
    yield from (view.timestamp, view.source, view.model_name, view.error)
    for block in (view.message, view.reasoning, view.extra):
        if block is not None:
            yield block.shown
    for call in view.tool_calls:
        yield from (call.call_id, call.function_name, call.arguments.shown)
    for observation in view.observations:
        yield observation.source_call_id
        yield from observation.refs
        if observation.content is not None:
            yield observation.content.shown
    for name, value in view.metrics.other:
        yield from (name, value)


# --- Alignment of two trajectories ---------------------------------------------


def call_signature(tool_calls: Any) -> tuple[tuple[str, str], ...]:
    """What a step's tool calls did: function names and canonical arguments.
    Call ids are left out: providers make them up afresh on every run."""
    signature = []
    for call in tool_calls or []:
        if not isinstance(call, Mapping):
            continue
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = limits.json_loads(arguments, what="the arguments")
        try:
            canonical = json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError):
            canonical = repr(arguments)
        signature.append((str(call.get("function_name") or call.get("name") or ""), canonical))
    return tuple(signature)


def step_signature(step: Mapping[str, Any]) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    """Two steps are "the same" when source, message and tool calls agree
    (timestamps, metrics and call ids may differ)."""
    message = step.get("message")
    return (
        str(step.get("source") or ""),
        message if isinstance(message, str) else _content_text(message),
        call_signature(step.get("tool_calls")),
    )


T = TypeVar("T")


@dataclass(frozen=True)
class AlignedRow(Generic[T]):
    """Position ``position`` (1-based) of both trajectories; a side is None
    when its trajectory is shorter."""

    position: int
    left: T | None
    right: T | None
    differs: bool
    first: bool = False  # the first divergence of the two trajectories
    # Aligned by content: same, changed, deleted or inserted; a changed step's word diff.
    kind: str = ""
    words: list[WordPiece] | None = None

    @property
    def one_sided(self) -> bool:
        return self.left is None or self.right is None


def first_divergence(left_keys: Sequence[Hashable], right_keys: Sequence[Hashable]) -> int | None:
    """1-based position of the first step whose keys differ, counting a step
    present on one side only; None when the trajectories are the same."""
    for position, (left, right) in enumerate(zip(left_keys, right_keys, strict=False), start=1):
        if left != right:
            return position
    if len(left_keys) != len(right_keys):
        return min(len(left_keys), len(right_keys)) + 1
    return None


def differing_positions(left_keys: Sequence[Hashable], right_keys: Sequence[Hashable]) -> list[int]:
    """1-based positions whose keys differ, step by step (a step on one side only differs)."""
    longest = max(len(left_keys), len(right_keys))
    return [
        position
        for position in range(1, longest + 1)
        if position > min(len(left_keys), len(right_keys)) or left_keys[position - 1] != right_keys[position - 1]
    ]


def align_window(
    left: Sequence[T],
    right: Sequence[T],
    *,
    start: int,
    left_keys: Sequence[Hashable],
    right_keys: Sequence[Hashable],
) -> list[AlignedRow[T]]:
    """Align a window of both trajectories by position.

    ``left`` and ``right`` are the steps at positions ``start``,
    ``start + 1``, ... of each trajectory (a side may run out first);
    ``left_keys`` / ``right_keys`` are the signatures of the WHOLE
    trajectories, so the first divergence is marked even when the window
    starts after it (then no row of the window is marked first).
    """
    first = first_divergence(left_keys, right_keys)
    rows = []
    for offset in range(max(len(left), len(right))):
        position = start + offset
        index = position - 1
        left_step = left[offset] if offset < len(left) else None
        right_step = right[offset] if offset < len(right) else None
        left_key = left_keys[index] if index < len(left_keys) else None
        right_key = right_keys[index] if index < len(right_keys) else None
        differs = left_step is None or right_step is None or left_key != right_key
        rows.append(AlignedRow(position, left_step, right_step, differs, first=position == first))
    return rows


def align(left: Sequence[T], right: Sequence[T], *, key: Callable[[T], Hashable]) -> list[AlignedRow[T]]:
    """Align two whole trajectories by position (see ``align_window``)."""
    return align_window(
        left, right, start=1, left_keys=[key(step) for step in left], right_keys=[key(step) for step in right]
    )


@dataclass(frozen=True)
class DivergenceSummary:
    first: int | None
    differing: int  # positions that differ, one-sided ones included
    positions: int  # max(len(left), len(right))
    left_steps: int
    right_steps: int


def divergence_summary(left_keys: Sequence[Hashable], right_keys: Sequence[Hashable]) -> DivergenceSummary:
    """How much two whole trajectories differ, position by position."""
    common = sum(1 for a, b in zip(left_keys, right_keys, strict=False) if a != b)
    one_sided = abs(len(left_keys) - len(right_keys))
    return DivergenceSummary(
        first=first_divergence(left_keys, right_keys),
        differing=common + one_sided,
        positions=max(len(left_keys), len(right_keys)),
        left_steps=len(left_keys),
        right_steps=len(right_keys),
    )


# --- Alignment by content ----------------------------------------------------------


@dataclass(frozen=True)
class ContentPair:
    """One row of two trajectories aligned by content: 0-based step indexes
    (None on the side that has no such step) and how the row compares:
    ``same`` (equal signatures), ``changed`` (a step on each side that
    differs), ``deleted`` (left only) or ``inserted`` (right only)."""

    left: int | None
    right: int | None
    kind: str

    @property
    def differs(self) -> bool:
        return self.kind != "same"


def _loose(key: Hashable) -> Hashable:
    """What makes two differing steps "the same step, changed": the source
    and the names of the tools called (a signature is source, message, calls)."""
    if isinstance(key, tuple) and len(key) == 3:
        source, _message, calls = key
        names = tuple(call[0] for call in calls) if isinstance(calls, tuple) else ()
        return (source, names)
    return key


def align_by_content(left_keys: Sequence[Hashable], right_keys: Sequence[Hashable]) -> list[ContentPair]:
    """Align two trajectories by their steps' signatures as a text diff
    aligns lines (``difflib.SequenceMatcher``): equal runs pair up, a step
    only one side has becomes a gap on the other. Inside a run that differs,
    steps are paired again by source and tool names, so an edited step faces
    its counterpart and the rest stay one-sided."""
    pairs: list[ContentPair] = []
    matcher = difflib.SequenceMatcher(None, list(left_keys), list(right_keys), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            pairs.extend(ContentPair(i1 + k, j1 + k, "same") for k in range(i2 - i1))
        elif tag == "delete":
            pairs.extend(ContentPair(i, None, "deleted") for i in range(i1, i2))
        elif tag == "insert":
            pairs.extend(ContentPair(None, j, "inserted") for j in range(j1, j2))
        else:
            loose = difflib.SequenceMatcher(
                None,
                [_loose(k) for k in left_keys[i1:i2]],
                [_loose(k) for k in right_keys[j1:j2]],
                autojunk=False,
            )
            for sub, a1, a2, b1, b2 in loose.get_opcodes():
                if sub in ("equal", "replace"):
                    for k in range(min(a2 - a1, b2 - b1)):
                        pairs.append(ContentPair(i1 + a1 + k, j1 + b1 + k, "changed"))
                    common = min(a2 - a1, b2 - b1)
                    pairs.extend(ContentPair(i1 + i, None, "deleted") for i in range(a1 + common, a2))
                    pairs.extend(ContentPair(None, j1 + j, "inserted") for j in range(b1 + common, b2))
                elif sub == "delete":
                    pairs.extend(ContentPair(i1 + i, None, "deleted") for i in range(a1, a2))
                else:
                    pairs.extend(ContentPair(None, j1 + j, "inserted") for j in range(b1, b2))
    return pairs


@dataclass(frozen=True)
class WordPiece:
    """A piece of a word diff: ``kind`` is ``same``, ``del`` or ``ins``."""

    text: str
    kind: str


_WORDS = re.compile(r"\w+|\s+|[^\w\s]")
WORD_DIFF_MAX_CHARS = 20_000


def word_diff(old: str, new: str) -> list[WordPiece] | None:
    """The words that differ between two texts, in reading order (removed
    words before the added ones that replace them); None when either text is
    too long to diff usefully. Pieces are plain text for the template to escape."""
    if len(old) > WORD_DIFF_MAX_CHARS or len(new) > WORD_DIFF_MAX_CHARS:
        return None
    a, b = _WORDS.findall(old), _WORDS.findall(new)
    pieces: list[WordPiece] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            pieces.append(WordPiece("".join(a[i1:i2]), "same"))
            continue
        if i2 > i1:
            pieces.append(WordPiece("".join(a[i1:i2]), "del"))
        if j2 > j1:
            pieces.append(WordPiece("".join(b[j1:j2]), "ins"))
    return pieces


def step_text(view: StepView) -> str:
    """A step's message and tool calls as one text, what a word diff compares."""
    parts = [view.message.shown] if view.message is not None else []
    parts.extend(f"{call.function_name}({call.arguments.shown})" for call in view.tool_calls)
    return "\n".join(parts)


def content_summary(pairs: Sequence[ContentPair], *, left_steps: int, right_steps: int) -> DivergenceSummary:
    """How much two trajectories aligned by content differ: ``first`` and
    ``positions`` count rows of the alignment (1-based), not step positions."""
    first = next((row for row, pair in enumerate(pairs, start=1) if pair.differs), None)
    return DivergenceSummary(
        first=first,
        differing=sum(1 for pair in pairs if pair.differs),
        positions=len(pairs),
        left_steps=left_steps,
        right_steps=right_steps,
    )
