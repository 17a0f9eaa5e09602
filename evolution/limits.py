"""Limits on structured input, and the readers that enforce them.

Every JSON, JSONL, YAML or gzip document that reaches rsiweb from outside
(an API body, a file given to a command, a bundle, a workspace's archive, a
recipe, a surface) is read through this module, so one set of limits
applies everywhere. Each limit is a setting (``RSI_MAX_*``, from the
environment, see docs/security.md) with the default below.

The checks run before, or while, the parser does the expensive part:

- JSON: the text's size, then its nesting depth by a linear scan of the
  text (strings skipped), before ``json.loads`` would recurse once per
  level: Python's parser raises RecursionError about 950 levels down,
  which no caller expected (a 500, a traceback).
- YAML: the text's size, then depth, the number of nodes and the bytes of
  its scalars *after* alias expansion (the last within the same size limit
  as the text), counted as the composer builds the node graph (each node's
  expanded size is computed once), so "billion laughs" is refused while
  it is still a few hundred nodes, before anything walks the expansion.
- Integers, in JSON and YAML: over Python's digit limit for converting
  text to int (``sys.get_int_max_str_digits()``, 4,300) they are refused
  like any other limit instead of raising a bare ValueError.
- JSONL: the same JSON limits per line, and a limit on the lines.
- gzip: decompressed in a stream that stops at the size limit, and at a
  ratio of the compressed size (past a floor), instead of decompressing
  a bomb whole.

A refusal raises ``InputLimitError``, a ``ValueError`` whose message is one
line naming the input, the limit and the setting. Pure: no ORM; the
settings are read when a reader runs, so ``override_settings`` applies.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

# Setting name -> default. docs/security.md has the table; a test keeps the two equal.
DEFAULTS: dict[str, int] = {
    # Nesting depth of any JSON or YAML document (objects and arrays, mappings and sequences).
    "RSI_MAX_INPUT_DEPTH": 100,
    # Nodes of a YAML document once its aliases are expanded.
    "RSI_MAX_YAML_NODES": 10_000,
    # Sizes in bytes, per kind of input.
    "RSI_MAX_RECIPE_BYTES": 256 * 1024,
    "RSI_MAX_SURFACE_BYTES": 256 * 1024,
    "RSI_MAX_TRAJECTORY_BYTES": 20 * 1024 * 1024,
    "RSI_MAX_ARCHIVE_BYTES": 64 * 1024 * 1024,
    "RSI_MAX_TASKS_FILE_BYTES": 64 * 1024 * 1024,
    "RSI_MAX_BUNDLE_BYTES": 256 * 1024 * 1024,
    # Counts.
    "RSI_MAX_SURFACE_PATTERNS": 1_000,
    "RSI_MAX_PATTERN_CHARS": 4_096,
    "RSI_MAX_JSONL_LINES": 100_000,
    "RSI_MAX_TASKS": 10_000,
    "RSI_MAX_BUNDLE_FILES": 1_000_000,
    # Decompression: output over this many times the compressed size is refused
    # once it is past the floor (a small file may compress very well).
    "RSI_MAX_DECOMPRESSION_RATIO": 100,
    "RSI_DECOMPRESSION_RATIO_FLOOR_BYTES": 1024 * 1024,
}


class InputLimitError(ValueError):
    """Input refused by a limit; the message is one line naming the limit and its setting."""


def limit(name: str) -> int:
    """The value of the limit ``name``: the setting when Django is configured, else the default."""
    from django.conf import settings

    if settings.configured:
        return int(getattr(settings, name, DEFAULTS[name]))
    return DEFAULTS[name]


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} bytes"


def check_size(data: str | bytes | int, *, setting: str, what: str) -> None:
    """Refuse ``data`` (text, bytes, or a size in bytes) over the byte limit
    ``setting``; text is measured in UTF-8, and only when its length in
    characters is not over the limit already."""
    maximum = limit(setting)
    size = data if isinstance(data, int) else len(data)
    if isinstance(data, str) and size <= maximum:
        size = len(data.encode("utf-8", "surrogatepass"))
    if size > maximum:
        raise InputLimitError(f"{what} is larger than the limit of {_size(maximum)} ({setting})")


def check_count(count: int, *, setting: str, what: str) -> None:
    """Refuse ``count`` items (``what`` names them, plural) when over the limit ``setting``."""
    maximum = limit(setting)
    if count > maximum:
        raise InputLimitError(f"{count} {what}, over the limit of {maximum} ({setting})")


def read_bytes(path: Path | BinaryIO, *, setting: str, what: str) -> bytes:
    """The bytes of a file (or an open binary stream), refused past the limit
    ``setting`` without reading more than one byte beyond it. OSError as usual."""
    maximum = limit(setting)
    if isinstance(path, Path):
        with path.open("rb") as stream:
            data = stream.read(maximum + 1)
    else:
        data = path.read(maximum + 1)
    if len(data) > maximum:
        raise InputLimitError(f"{what} is larger than the limit of {_size(maximum)} ({setting})")
    return data


# --- JSON ---------------------------------------------------------------------------

# A JSON string from its opening quote to its closing one, or to the end of the
# text when it is not closed (json.loads fails there without going deeper).
# Possessive, and never failing once started, so the scan is linear.
_STRING = re.compile(r'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")
_RUN = re.compile(rb"[\[{]++|[\]}]++")


def json_depth_over(text: str, maximum: int) -> bool:
    """Whether JSON ``text`` nests arrays and objects more than ``maximum``
    deep, found without parsing it: strings are skipped, brackets counted.

    Exact for valid JSON; for invalid JSON it is exact up to where
    ``json.loads`` would stop, which is all that matters (the parser never
    goes deeper than that). Linear in the text.
    """
    if text.count("[") + text.count("{") <= maximum:
        return False
    # Outside its strings JSON is ASCII; bytes.translate drops the rest at memory speed.
    skeleton = _STRING.sub("", text).encode("utf-8", "replace").translate(None, _NOT_BRACKETS)
    depth = 0
    for run in _RUN.finditer(skeleton):
        length = run.end() - run.start()
        if skeleton[run.start()] in b"[{":
            depth += length
            if depth > maximum:
                return True
        else:
            depth -= length
            if depth < 0:
                return False  # a closing bracket too many: json.loads stops there
    return False


def check_json_depth(text: str, *, what: str) -> None:
    maximum = limit("RSI_MAX_INPUT_DEPTH")
    if json_depth_over(text, maximum):
        raise InputLimitError(f"{what} is nested more than {maximum} levels deep (RSI_MAX_INPUT_DEPTH)")


def json_loads(text: str | bytes, *, what: str = "JSON document", setting: str | None = None, **options: Any) -> Any:
    """``json.loads(text, **options)`` after refusing text over the size limit
    ``setting`` (when given) and nesting over ``RSI_MAX_INPUT_DEPTH``.

    Raises InputLimitError, or what ``json.loads`` raises (JSONDecodeError,
    UnicodeDecodeError for bytes that are not UTF-8): all ValueErrors.
    """
    if setting is not None:
        check_size(text, setting=setting, what=what)
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    check_json_depth(text, what=what)
    try:
        return json.loads(text, **options)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError) or not _is_int_digits_error(exc):
            raise
        raise _too_many_digits(what) from None


def _is_int_digits_error(exc: ValueError) -> bool:
    """Whether ``exc`` is int()'s refusal of text over ``sys.get_int_max_str_digits()``."""
    return "integer string conversion" in str(exc)


def _too_many_digits(what: str) -> InputLimitError:
    return InputLimitError(
        f"{what} holds an integer of more than {sys.get_int_max_str_digits()} digits (Python's int_max_str_digits)"
    )


class JSONLineError(ValueError):
    """A JSONL line that is not JSON or breaks a limit (``refused``); ``line``
    is its number (1-based) and ``detail`` says why, without the line number."""

    def __init__(self, line: int, detail: str, *, refused: bool = False) -> None:
        self.line = line
        self.detail = detail
        self.refused = refused
        super().__init__(f"line {line}: {detail}")


def jsonl_loads(text: str, *, what: str = "JSONL file", **options: Any) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line of JSONL ``text``.

    The caller limits the text's size; here every line gets the JSON depth
    limit and the lines are counted against ``RSI_MAX_JSONL_LINES`` up front.
    Raises JSONLineError (a ValueError) for a line that is not JSON or too deep.
    """
    # Only "\n" ends a line: JSON strings may hold U+2028 and the other breaks splitlines() knows.
    lines = text.split("\n")
    check_count(sum(1 for line in lines if line.strip()), setting="RSI_MAX_JSONL_LINES", what=f"lines in {what}")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json_loads(line, what="the line", **options)
        except InputLimitError as exc:
            raise JSONLineError(number, str(exc), refused=True) from None
        except json.JSONDecodeError as exc:
            raise JSONLineError(number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None


# --- YAML ---------------------------------------------------------------------------


class LimitedSafeLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader with a depth and an expanded-size limit, enforced as
    the composer builds nodes.

    An alias returns the node its anchor names, so the node graph stays small
    while the data it stands for is exponential: a node's expanded size (its
    nodes, and the UTF-8 bytes of its scalars) is the sum of its children's,
    computed once per node as it is composed, and a node over
    ``RSI_MAX_YAML_NODES``, over the byte limit ``bytes_setting`` (when
    given), or whose depth with what an alias brings under it is over
    ``RSI_MAX_INPUT_DEPTH`` stops composition. Counting nodes alone let a
    few aliases of one long string expand a 61 KB recipe to 225 MB. An alias
    to a node still being composed (a recursive structure) is refused. The
    composer recurses once per level, so depth is refused before Python's own
    limit is reached. An integer over Python's digit limit is refused too.
    """

    def __init__(self, stream: Any, *, bytes_setting: str | None = None) -> None:
        super().__init__(stream)
        self._max_depth = limit("RSI_MAX_INPUT_DEPTH")
        self._max_nodes = limit("RSI_MAX_YAML_NODES")
        self._bytes_setting = bytes_setting
        self._max_bytes = limit(bytes_setting) if bytes_setting is not None else None
        self._level = 0
        # id(node) -> (expanded nodes, expanded scalar bytes, height); nodes stay alive in the graph while composing.
        self._measured: dict[int, tuple[int, int, int]] = {}

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._level += 1
        try:
            if self._level > self._max_depth:
                raise InputLimitError(f"YAML is nested more than {self._max_depth} levels deep (RSI_MAX_INPUT_DEPTH)")
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()  # type: ignore[no-untyped-call]  # types-PyYAML leaves it untyped
                target = self.anchors.get(event.anchor)
                # Every node composed so far is measured; an anchor that is not is an ancestor of this alias.
                if target is not None and id(target) not in self._measured:
                    raise InputLimitError("YAML holds an alias to a node that contains it (a recursive structure)")
            node = super().compose_node(parent, index)
            size, scalar_bytes, height = self._measure(node)
            if size > self._max_nodes:
                raise InputLimitError(
                    f"YAML expands to more than {self._max_nodes} nodes with its aliases (RSI_MAX_YAML_NODES)"
                )
            if self._max_bytes is not None and scalar_bytes > self._max_bytes:
                raise InputLimitError(
                    f"YAML expands to more than {_size(self._max_bytes)} of text with its aliases "
                    f"({self._bytes_setting})"
                )
            if self._level - 1 + height > self._max_depth:
                raise InputLimitError(
                    f"YAML is nested more than {self._max_depth} levels deep with its aliases (RSI_MAX_INPUT_DEPTH)"
                )
            return node
        finally:
            self._level -= 1

    def _measure(self, node: Any) -> tuple[int, int, int]:
        known = self._measured.get(id(node))
        if known is not None:
            return known
        if isinstance(node, yaml.ScalarNode):
            children: list[Any] = []
            scalar_bytes = len(node.value.encode("utf-8", "surrogatepass"))
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
            scalar_bytes = 0
        else:
            children = [child for pair in node.value for child in pair]
            scalar_bytes = 0
        size, height = 1, 1
        for child in children:
            measured = self._measured.get(id(child))
            if measured is None:  # cannot happen: every child went through compose_node
                raise InputLimitError("YAML holds a node composed outside the limits")
            size += measured[0]
            scalar_bytes += measured[1]
            height = max(height, measured[2] + 1)
        self._measured[id(node)] = (size, scalar_bytes, height)
        return size, scalar_bytes, height

    def construct_limited_int(self, node: Any) -> int:
        try:
            return int(super().construct_yaml_int(node))
        except ValueError as exc:
            if _is_int_digits_error(exc):
                raise _too_many_digits("YAML") from None
            raise


LimitedSafeLoader.add_constructor("tag:yaml.org,2002:int", LimitedSafeLoader.construct_limited_int)


def yaml_load(
    text: str | bytes, *, loader: type[LimitedSafeLoader] = LimitedSafeLoader, setting: str, what: str
) -> Any:
    """The plain data of one YAML document, after refusing text over the size
    limit ``setting``; composition is limited by ``loader`` (a
    LimitedSafeLoader), its scalars' text after alias expansion by
    ``setting`` too. Raises InputLimitError or yaml.YAMLError."""
    check_size(text, setting=setting, what=what)
    instance = loader(text, bytes_setting=setting)
    try:
        return instance.get_single_data()
    finally:
        instance.dispose()


# --- gzip ---------------------------------------------------------------------------


_CHUNK = 1024 * 1024


def gunzip(data: bytes, *, setting: str, what: str) -> bytes:
    """The decompressed bytes of gzip ``data``, decompressed as a stream that
    stops one byte past the limit: the size limit ``setting``, or
    ``RSI_MAX_DECOMPRESSION_RATIO`` times the compressed size when that is
    smaller (and past ``RSI_DECOMPRESSION_RATIO_FLOOR_BYTES``). Memory stays
    within the limit whatever the data claims. Raises InputLimitError, or
    gzip.BadGzipFile, EOFError, zlib.error for broken data."""
    maximum = limit(setting)
    ratio = limit("RSI_MAX_DECOMPRESSION_RATIO")
    by_ratio = max(ratio * len(data), limit("RSI_DECOMPRESSION_RATIO_FLOOR_BYTES"))
    cap = min(maximum, by_ratio)
    out = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb") as stream:
        # In chunks: one read of the whole cap would hold it twice (the pieces and their join).
        while len(out) <= cap and (chunk := stream.read(min(_CHUNK, cap + 1 - len(out)))):
            out += chunk
    if len(out) > cap:
        if cap == maximum:
            raise InputLimitError(f"{what} decompresses to more than {_size(maximum)} ({setting})")
        raise InputLimitError(
            f"{what} decompresses to more than {ratio} times its {len(data)} bytes (RSI_MAX_DECOMPRESSION_RATIO)"
        )
    return bytes(out)
