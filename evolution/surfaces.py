"""Surfaces: which harness paths a method may change, and as what component.

Pure functions and dataclasses, no ORM. A surface is written as YAML::

    include: ["prompts/**", "tools/**", "config.toml"]
    exclude: ["tools/internal/**"]
    components: {"prompts/**": prompt, "tools/**": client_tool, "config.toml": config}
    protected_keys: {"config.toml": ["model", "agent.reasoning_effort"]}
    allow_symlinks: false   # optional
    allow_unicode: false    # optional
    refuse_hidden_characters: false   # optional

Patterns are matched segment by segment on normalized paths (never with
``fnmatch``, whose ``*`` crosses ``/`` and accepts ``..``): ``*`` matches
within one segment, ``**`` (a whole segment) matches zero or more segments,
``?`` one character; every other character, ``[`` and ``]`` included, is
literal. A path is on the surface when it is a valid path, is not reserved,
matches an include pattern and no exclude pattern.

Reserved prefixes (evaluator files, task data, records) are outside every
surface whatever the patterns say. They, ``.git`` and case-fold collisions
are compared on a folded form of the path (NFKC, case-folded, common
Cyrillic/Greek look-alikes mapped to Latin, invisible characters dropped,
trailing dots and spaces of segments dropped), so ``Evaluator/x`` or a
fullwidth ``ｅvaluator/x`` cannot slip past on a case-insensitive or
normalizing file system.

Component kind of a path: among the ``components`` patterns that match it,
the most specific wins, ranked by (1) the longest literal prefix before the
first wildcard, (2) the most literal characters, (3) the fewest ``**``
segments, (4) the fewest ``*``, (5) the fewest ``?``, (6) the
lexicographically smallest pattern text (only so that a full tie is
deterministic). So ``tools/*.md`` beats ``tools/**``, which beats ``**``,
and ``*/memory/**`` beats ``**``.

With ``refuse_hidden_characters: true`` a diff that adds hidden or
look-alike characters (``evolution.hidden_chars``: bidirectional controls,
zero-width and other invisible characters, look-alike letters in ASCII
words) to any file is refused, each file with the code points and lines.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

from evolution import hidden_chars, limits
from evolution.gitdiff import FileChange, parse_git_diff, whole_file_texts

# The closed vocabulary of component kinds, defined here only: this module needs
# no Django setup, and evolution.models builds ComponentKind's choices from it.
COMPONENT_KINDS: tuple[str, ...] = (
    "prompt",
    "control_flow",
    "config",
    "output_plumbing",
    "context_mgmt",
    "client_tool",
    "skill",
    "memory",
    "subagent",
)
# The structural kinds: a candidate that adopts one first earns the lambda_N bonus.
STRUCTURAL_KINDS: frozenset[str] = frozenset({"client_tool", "skill", "memory", "subagent"})
DEFAULT_RESERVED: tuple[str, ...] = ("evaluator/", "tasks/", ".rsi/", "records/")
STRUCTURED_FORMATS: dict[str, str] = {".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}

REGULAR_MODES = frozenset({"100644", "100755"})
SYMLINK_MODE = "120000"
GITLINK_MODE = "160000"

_SPEC_KEYS = (
    "include",
    "exclude",
    "components",
    "protected_keys",
    "allow_symlinks",
    "allow_unicode",
    "refuse_hidden_characters",
)
# How many hidden characters one violation names before "and N more".
HIDDEN_SHOWN = 5
# Latin look-alikes (after case folding) that NFKC does not map: enough to
# catch the classic Cyrillic/Greek substitutions in a file name.
_CONFUSABLES = str.maketrans(
    {
        "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j",
        "ѕ": "s", "ԁ": "d", "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ɡ": "g", "ɑ": "a",
        "α": "a", "ο": "o", "ν": "v", "ι": "i", "κ": "k", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
    }
)  # fmt: skip
_DRIVE_RE = re.compile(r"^[A-Za-z]:")
_MISSING = object()


class SurfaceSpecError(ValueError):
    """The surface document is not valid; the message names the key."""


@dataclass(frozen=True)
class SurfaceSpec:
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    components: Mapping[str, str] = field(default_factory=dict)
    # File pattern -> dotted key paths that may not change.
    protected_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    allow_symlinks: bool = False
    allow_unicode: bool = False
    refuse_hidden_characters: bool = False


@dataclass(frozen=True)
class Violation:
    path: str
    reason: str


@dataclass(frozen=True)
class SurfaceVerdict:
    allowed: bool
    violations: list[Violation]
    components: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "violations": [{"path": v.path, "reason": v.reason} for v in self.violations],
            "components": list(self.components),
        }


# --- Parsing the surface document ----------------------------------------------


def parse_surface(yaml_text: str) -> SurfaceSpec:
    """Parse and validate a surface YAML document (duplicate keys rejected)."""
    try:
        # SafeLoader subclass: plain data only, within the size, depth and alias limits.
        data = limits.yaml_load(yaml_text, loader=_StrictLoader, setting="RSI_MAX_SURFACE_BYTES", what="surface")
    except limits.InputLimitError as exc:
        raise SurfaceSpecError(str(exc)) from exc
    except yaml.YAMLError as exc:
        raise SurfaceSpecError(f"surface is not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise SurfaceSpecError("surface must be a YAML mapping with an 'include' key")
    return surface_from_dict(data)


def surface_from_dict(data: Mapping[str, Any]) -> SurfaceSpec:
    """Validate an already-loaded surface mapping."""
    unknown = sorted(str(key) for key in data if key not in _SPEC_KEYS)
    if unknown:
        raise SurfaceSpecError(f"unknown key {unknown[0]!r} in surface (allowed: {', '.join(_SPEC_KEYS)})")
    if "include" not in data:
        raise SurfaceSpecError("missing required key 'include'")
    patterns = sum(
        len(value)
        for value in (data.get(key) for key in ("include", "exclude", "components", "protected_keys"))
        if isinstance(value, list | Mapping)
    )
    try:
        limits.check_count(patterns, setting="RSI_MAX_SURFACE_PATTERNS", what="patterns in the surface")
    except limits.InputLimitError as exc:
        raise SurfaceSpecError(str(exc)) from exc
    allow_symlinks = _flag(data, "allow_symlinks")
    allow_unicode = _flag(data, "allow_unicode")
    refuse_hidden = _flag(data, "refuse_hidden_characters")
    include = _pattern_list(data, "include", allow_unicode)
    exclude = _pattern_list(data, "exclude", allow_unicode)

    raw_components = data.get("components", {})
    if not isinstance(raw_components, Mapping):
        raise SurfaceSpecError("'components' must be a mapping of pattern to component kind")
    components: dict[str, str] = {}
    for pattern, kind in raw_components.items():
        where = f"components[{pattern!r}]"
        _check_pattern(pattern, where, allow_unicode)
        if kind not in COMPONENT_KINDS:
            raise SurfaceSpecError(
                f"{where}: unknown component kind {kind!r} (expected one of {', '.join(COMPONENT_KINDS)})"
            )
        components[pattern] = kind

    raw_protected = data.get("protected_keys", {})
    if not isinstance(raw_protected, Mapping):
        raise SurfaceSpecError("'protected_keys' must be a mapping of file pattern to a list of keys")
    protected: dict[str, tuple[str, ...]] = {}
    for pattern, keys in raw_protected.items():
        where = f"protected_keys[{pattern!r}]"
        _check_pattern(pattern, where, allow_unicode)
        last = pattern.rsplit("/", 1)[-1]
        if "*" not in last and "?" not in last and _format_of(pattern) is None:
            raise SurfaceSpecError(f"{where}: protected keys need a .json, .toml, .yaml or .yml file")
        if not isinstance(keys, list) or not keys:
            raise SurfaceSpecError(f"{where}: must be a non-empty list of dotted keys")
        for key in keys:
            if not isinstance(key, str) or not key or any(part == "" for part in key.split(".")):
                raise SurfaceSpecError(f"{where}: bad key {key!r} (use dotted names like 'agent.model')")
        protected[pattern] = tuple(keys)

    return SurfaceSpec(
        include=include,
        exclude=exclude,
        components=components,
        protected_keys=protected,
        allow_symlinks=allow_symlinks,
        allow_unicode=allow_unicode,
        refuse_hidden_characters=refuse_hidden,
    )


def _flag(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise SurfaceSpecError(f"{key!r} must be true or false")
    return value


def _pattern_list(data: Mapping[str, Any], key: str, allow_unicode: bool) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise SurfaceSpecError(f"{key!r} must be a list of path patterns")
    for position, pattern in enumerate(value):
        _check_pattern(pattern, f"{key}[{position}]", allow_unicode)
    return tuple(value)


def _check_pattern(pattern: Any, where: str, allow_unicode: bool) -> None:
    if not isinstance(pattern, str):
        raise SurfaceSpecError(f"{where}: pattern must be a string, got {pattern!r}")
    maximum = limits.limit("RSI_MAX_PATTERN_CHARS")
    if len(pattern) > maximum:
        raise SurfaceSpecError(f"{where}: pattern of {len(pattern)} characters, over {maximum} (RSI_MAX_PATTERN_CHARS)")
    problem = _pattern_problem(pattern, allow_unicode)
    if problem:
        raise SurfaceSpecError(f"{where}: bad pattern {pattern!r}: {problem}")


def _pattern_problem(pattern: str, allow_unicode: bool) -> str | None:
    if pattern.endswith("/"):
        return f"trailing '/' (write {pattern + '**'!r} for a folder)"
    # Wildcards are checked segment by segment below; the rest of the syntax
    # is the same as for a path.
    problem = path_problem(pattern.replace("*", "x").replace("?", "x"), allow_unicode=allow_unicode)
    if problem:
        return problem
    for segment in pattern.split("/"):
        if "**" in segment and segment != "**":
            return "'**' must be a whole path segment"
    return None


class _StrictLoader(limits.LimitedSafeLoader):
    """SafeLoader that refuses duplicate mapping keys: a second ``model:``
    would otherwise silently win."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        # Keys pulled in by a '<<' merge may be overridden; only explicit
        # keys written twice are an error.
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


# --- Paths and patterns ----------------------------------------------------------


def path_problem(path: str, *, allow_unicode: bool = False) -> str | None:
    """Why ``path`` is not an acceptable repository-relative path, or None.

    Rejects empty, absolute, backslash, control-character, ``.``/``..``,
    empty-segment and ``.git`` paths; non-ASCII unless ``allow_unicode``, and
    even then anything not NFC or holding invisible formatting characters.
    """
    if not path:
        return "empty path"
    if any(0xD800 <= ord(char) <= 0xDFFF for char in path):
        return "path is not valid UTF-8"
    if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in path):
        return "control character in path"
    if "\\" in path:
        return "backslash in path"
    if path.startswith("/") or _DRIVE_RE.match(path):
        return "absolute path"
    for segment in path.split("/"):
        if segment == "..":
            return "'..' segment (path traversal)"
        if segment == ".":
            return "'.' segment"
        if segment == "":
            return "empty path segment"
    for segment in _fold(path).split("/"):
        # NTFS ignores trailing dots/spaces and knows the 8.3 name GIT~1.
        if segment in (".git", "git~1"):
            return ".git internals"
    if not path.isascii():
        if not allow_unicode:
            return "non-ASCII path (the surface does not set allow_unicode)"
        if unicodedata.normalize("NFC", path) != path:
            return "path is not NFC-normalized"
        if any(unicodedata.category(char) == "Cf" for char in path):
            return "invisible formatting character in path"
    return None


def match_pattern(pattern: str, path: str) -> bool:
    """Whether ``path`` matches ``pattern`` segment by segment. An invalid
    path (``..``, absolute, backslash, ...) matches nothing; an invalid
    pattern raises :class:`SurfaceSpecError`."""
    if path_problem(path, allow_unicode=True) is not None:
        return False
    return _match_segments(_compile(pattern), tuple(path.split("/")))


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> tuple[re.Pattern[str] | None, ...]:
    problem = _pattern_problem(pattern, allow_unicode=True)
    if problem:
        raise SurfaceSpecError(f"bad pattern {pattern!r}: {problem}")
    compiled: list[re.Pattern[str] | None] = []
    for segment in pattern.split("/"):
        if segment == "**":
            compiled.append(None)
            continue
        regex = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c) for c in segment)
        compiled.append(re.compile(regex, re.DOTALL))
    return tuple(compiled)


def _match_segments(pattern: tuple[re.Pattern[str] | None, ...], segments: tuple[str, ...]) -> bool:
    # reachable[j]: the pattern prefix seen so far can consume segments[:j].
    reachable = [True] + [False] * len(segments)
    for part in pattern:
        if part is None:
            # '**' consumes zero or more whole segments.
            for j in range(1, len(reachable)):
                reachable[j] = reachable[j] or reachable[j - 1]
        else:
            reachable = [False] + [
                reachable[j] and part.fullmatch(segments[j]) is not None for j in range(len(segments))
            ]
    return reachable[-1]


def _specificity(pattern: str) -> tuple[int, int, int, int, int, str]:
    """Sort key: the smallest is the most specific (see module docstring)."""
    wildcard = re.search(r"[*?]", pattern)
    literal_prefix = wildcard.start() if wildcard else len(pattern)
    doublestars = pattern.split("/").count("**")
    stars = pattern.count("*") - 2 * doublestars
    questions = pattern.count("?")
    literal_chars = len(pattern) - pattern.count("*") - questions
    return (-literal_prefix, -literal_chars, doublestars, stars, questions, pattern)


def component_for(spec: SurfaceSpec, path: str) -> str | None:
    """Component kind of ``path``: the most specific matching ``components``
    pattern wins; None when no pattern matches."""
    matching = [pattern for pattern in spec.components if match_pattern(pattern, path)]
    if not matching:
        return None
    return spec.components[min(matching, key=_specificity)]


def reachable_kinds(spec: SurfaceSpec) -> list[str]:
    """The component kinds the surface lets a proposer reach (some ``components`` pattern maps to them), in
    vocabulary order: a kind with no pattern cannot be edited, so it cannot be explored."""
    kinds = set(spec.components.values())
    return [kind for kind in COMPONENT_KINDS if kind in kinds]


def kinds_present(spec: SurfaceSpec, paths: Iterable[str]) -> set[str]:
    """The component kinds of the files at ``paths`` (a harness's tree): what the harness has."""
    return {kind for path in paths if (kind := component_for(spec, path)) is not None}


def is_reserved(path: str, reserved: Sequence[str] = DEFAULT_RESERVED) -> bool:
    """Whether ``path`` is, or is under, a reserved prefix (compared folded)."""
    folded = _fold(path)
    for prefix in reserved:
        root = _fold(prefix.strip("/"))
        if root and (folded == root or folded.startswith(root + "/")):
            return True
    return False


def in_surface(spec: SurfaceSpec, path: str, *, reserved: Sequence[str] = DEFAULT_RESERVED) -> bool:
    return _surface_problem(spec, path, reserved) is None


def _surface_problem(spec: SurfaceSpec, path: str, reserved: Sequence[str]) -> str | None:
    problem = path_problem(path, allow_unicode=spec.allow_unicode)
    if problem:
        return problem
    if is_reserved(path, reserved):
        return "reserved path (evaluator files, task data and records are outside every surface)"
    if not any(match_pattern(pattern, path) for pattern in spec.include):
        return "outside surface (matches no include pattern)"
    for pattern in spec.exclude:
        if match_pattern(pattern, path):
            return f"outside surface (excluded by {pattern!r})"
    return None


def _fold(path: str) -> str:
    """The form under which two paths may name the same file somewhere."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", path).casefold())
    text = "".join(char for char in text if unicodedata.category(char) != "Cf").translate(_CONFUSABLES)
    return "/".join(segment if segment in (".", "..") else segment.rstrip(" .") for segment in text.split("/"))


def _literal_paths(spec: SurfaceSpec) -> set[str]:
    patterns = [*spec.include, *spec.exclude, *spec.components, *spec.protected_keys]
    return {pattern for pattern in patterns if "*" not in pattern and "?" not in pattern}


# --- Checking ----------------------------------------------------------------------


class _Collector:
    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.seen: set[Violation] = set()
        self.components: set[str] = set()

    def add(self, path: str, reason: str) -> None:
        violation = Violation(path, reason)
        if violation not in self.seen:
            self.seen.add(violation)
            self.violations.append(violation)

    def verdict(self) -> SurfaceVerdict:
        return SurfaceVerdict(
            allowed=not self.violations, violations=list(self.violations), components=sorted(self.components)
        )


def check_paths(
    spec: SurfaceSpec,
    paths: Iterable[str],
    *,
    reserved: Sequence[str] = DEFAULT_RESERVED,
    known_paths: Iterable[str] = (),
) -> SurfaceVerdict:
    """Check changed paths (without diff details: no modes, renames or
    protected keys). ``known_paths`` are other files of the tree, used only
    for case-fold collisions. Pure and safe to repeat."""
    collector = _Collector()
    paths = list(paths)
    for path in paths:
        _check_path(spec, path, reserved, collector)
    _check_collisions(spec, paths, set(known_paths) | set(paths), collector)
    return collector.verdict()


def check_diff(
    spec: SurfaceSpec,
    diff_text: str,
    *,
    old_files: Mapping[str, bytes] | None = None,
    new_files: Mapping[str, bytes] | None = None,
    reserved: Sequence[str] = DEFAULT_RESERVED,
) -> SurfaceVerdict:
    """Check a ``git diff`` against the surface. Raises
    :class:`evolution.gitdiff.DiffParseError` when the diff is unusable.

    ``old_files``/``new_files`` (path -> bytes of the parent and candidate
    trees) make protected-key and symlink checks exact; without them the
    diff hunks are used where they provably hold the whole file, and a
    conservative line heuristic otherwise (see :func:`check_changes`).
    """
    return check_changes(spec, parse_git_diff(diff_text), old_files=old_files, new_files=new_files, reserved=reserved)


def check_changes(
    spec: SurfaceSpec,
    changes: Sequence[FileChange],
    *,
    old_files: Mapping[str, bytes] | None = None,
    new_files: Mapping[str, bytes] | None = None,
    reserved: Sequence[str] = DEFAULT_RESERVED,
) -> SurfaceVerdict:
    """Check parsed file changes. Every path a change touches (both sides
    of a rename) must be on the surface and have a component kind; modes may
    only flip the executable bit; symlinks need ``allow_symlinks`` and a
    target on the surface; protected keys must keep their values; with
    ``refuse_hidden_characters``, no file may gain hidden characters.

    Protected-key fallback: when neither the file maps nor the hunks give
    the whole old and new document, any added or removed line that uses a
    protected key name (or a parent of a dotted key) as a key, e.g.
    ``model =``, ``"model":``, ``model:``, or that can move keys to another
    parent (a TOML table header, a YAML block-mapping opener, merge key or
    document marker, a JSON brace, an escaped quoted key) is a violation.
    It can refuse a harmless edit; pass the file maps for an exact answer.

    Limits: a pure rename (100% similarity) prints no mode, so a moved
    symlink is only re-checked when git shows its mode; a symlink target is
    resolved lexically (a chain through another symlink is not followed).
    Pure and safe to repeat.
    """
    collector = _Collector()
    for change in changes:
        _check_change(spec, change, old_files, new_files, reserved, collector)

    removed = {c.old_path for c in changes if c.status in ("deleted", "renamed") and c.old_path is not None}
    new_side = [c.new_path for c in changes if c.new_path is not None]
    if new_files is not None:
        existing = set(new_files)
    elif old_files is not None:
        existing = set(old_files) - removed
    else:
        existing = set()
    _check_collisions(spec, new_side, existing | set(new_side), collector)
    return collector.verdict()


def _check_path(spec: SurfaceSpec, path: str, reserved: Sequence[str], collector: _Collector, role: str = "") -> None:
    suffix = f" ({role})" if role else ""
    problem = _surface_problem(spec, path, reserved)
    if problem:
        collector.add(path, problem + suffix)
        return
    kind = component_for(spec, path)
    if kind is None:
        collector.add(path, "no component kind for path" + suffix)
    else:
        collector.components.add(kind)


def _check_collisions(spec: SurfaceSpec, paths: Iterable[str], universe: set[str], collector: _Collector) -> None:
    """Flag a path when it, or one of its folders, folds to the same form as
    a different known path or folder (``Config.toml`` vs ``config.toml``,
    ``Prompts/b.md`` next to ``prompts/a.md``)."""
    by_fold: dict[str, set[str]] = {}
    for known in universe | _literal_paths(spec):
        for prefix in _prefixes(known):
            by_fold.setdefault(_fold(prefix), set()).add(prefix)
    for path in paths:
        for prefix in _prefixes(path):
            others = sorted(by_fold.get(_fold(prefix), set()) - {prefix})
            if others:
                collector.add(path, f"case-fold collision with {others[0]!r}")
                break


def _prefixes(path: str) -> list[str]:
    """``a/b/c`` -> ``a/b/c``, ``a/b``, ``a`` (longest first)."""
    parts = path.split("/")
    return ["/".join(parts[:end]) for end in range(len(parts), 0, -1)]


def _check_change(
    spec: SurfaceSpec,
    change: FileChange,
    old_files: Mapping[str, bytes] | None,
    new_files: Mapping[str, bytes] | None,
    reserved: Sequence[str],
    collector: _Collector,
) -> None:
    if change.status == "renamed":
        assert change.old_path is not None and change.new_path is not None
        _check_path(spec, change.old_path, reserved, collector, "rename source")
        _check_path(spec, change.new_path, reserved, collector, "rename destination")
    elif change.status == "copied":
        assert change.old_path is not None
        # The source is only read, but copying evaluator or task files into
        # the harness is exactly the leak reserved paths exist to prevent.
        problem = path_problem(change.old_path, allow_unicode=spec.allow_unicode)
        if problem is None and is_reserved(change.old_path, reserved):
            problem = "copy source is a reserved path"
        if problem:
            collector.add(change.old_path, problem + " (copy source)")
        _check_path(spec, change.path, reserved, collector)
    else:
        _check_path(spec, change.path, reserved, collector)
    _check_modes(spec, change, new_files, reserved, collector)
    _check_protected(spec, change, old_files, new_files, collector)
    if spec.refuse_hidden_characters:
        _check_hidden(change, collector)


def _check_hidden(change: FileChange, collector: _Collector) -> None:
    """One violation per file that gains hidden characters, naming them."""
    found = hidden_chars.introduced_by(change)
    if not found:
        return
    named = "; ".join(item.evidence for item in found[:HIDDEN_SHOWN])
    more = len(found) - HIDDEN_SHOWN
    if more > 0:
        named += f"; and {more} more"
    collector.add(change.path, f"adds hidden characters: {named} (the surface sets refuse_hidden_characters)")


def _check_modes(
    spec: SurfaceSpec,
    change: FileChange,
    new_files: Mapping[str, bytes] | None,
    reserved: Sequence[str],
    collector: _Collector,
) -> None:
    path = change.path
    for mode in (change.old_mode, change.new_mode):
        if mode == GITLINK_MODE:
            collector.add(path, "submodule (gitlink) entries are not allowed")
            return
        if mode is not None and mode not in REGULAR_MODES and mode != SYMLINK_MODE:
            collector.add(path, f"unsupported file mode {mode}")
            return
    old, new = change.old_mode, change.new_mode
    if old and new and old != new and {old, new} != REGULAR_MODES:
        collector.add(path, f"mode change {old} -> {new} not allowed (only 100644 <-> 100755)")
        return
    # Deleting a symlink gives nothing new; creating or retargeting one does.
    if change.new_mode == SYMLINK_MODE:
        _check_symlink(spec, change, new_files, reserved, collector)


def _check_symlink(
    spec: SurfaceSpec,
    change: FileChange,
    new_files: Mapping[str, bytes] | None,
    reserved: Sequence[str],
    collector: _Collector,
) -> None:
    path = change.path
    if not spec.allow_symlinks:
        collector.add(path, "symlink not allowed (the surface does not set allow_symlinks)")
        return
    target = _new_text(change, new_files)
    if target is None:
        collector.add(path, "symlink target unknown (not in the diff)")
        return
    if target.startswith("/"):
        collector.add(path, f"symlink target {target!r} is absolute")
        return
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == "." or resolved.startswith("../") or resolved == "..":
        collector.add(path, f"symlink target {target!r} leaves the repository")
        return
    if _surface_problem(spec, resolved, reserved) is not None:
        collector.add(path, f"symlink target {target!r} resolves outside the surface ({resolved!r})")


def _new_text(change: FileChange, new_files: Mapping[str, bytes] | None) -> str | None:
    if new_files is not None and change.new_path is not None and change.new_path in new_files:
        return new_files[change.new_path].decode("utf-8", errors="surrogateescape")
    return whole_file_texts(change)[1]


# --- Protected keys --------------------------------------------------------------------


def _protected_for(spec: SurfaceSpec, path: str | None) -> list[str]:
    if path is None or path_problem(path, allow_unicode=True) is not None:
        return []
    keys: list[str] = []
    for pattern, names in spec.protected_keys.items():
        if match_pattern(pattern, path):
            keys.extend(name for name in names if name not in keys)
    return keys


def _check_protected(
    spec: SurfaceSpec,
    change: FileChange,
    old_files: Mapping[str, bytes] | None,
    new_files: Mapping[str, bytes] | None,
    collector: _Collector,
) -> None:
    """Compare protected key values at each protected location the change
    touches: the old path (unless the change is a copy, which leaves it
    alone) and the new path."""
    old_keys = [] if change.status == "copied" else _protected_for(spec, change.old_path)
    new_keys = _protected_for(spec, change.new_path)
    if not old_keys and not new_keys:
        return
    hunk_old, hunk_new = whole_file_texts(change)
    old_text = _file_text(old_files, change.old_path, hunk_old)
    new_text = _file_text(new_files, change.new_path, hunk_new)
    if change.old_path == change.new_path:
        locations = [(change.path, old_keys, old_text, new_text)]
    else:
        # A file moved away from a protected location leaves it empty; one
        # moved (or copied) onto it fills it.
        locations = []
        if old_keys and change.old_path is not None:
            locations.append((change.old_path, old_keys, old_text, ""))
        if new_keys and change.new_path is not None:
            locations.append((change.new_path, new_keys, "", new_text))
    for path, keys, before, after in locations:
        _compare_location(change, path, keys, before, after, collector)


def _file_text(files: Mapping[str, bytes] | None, path: str | None, fallback: str | None) -> str | None:
    if path is None:
        return ""  # the file does not exist on that side
    if files is not None and path in files:
        return files[path].decode("utf-8", errors="surrogateescape")
    return fallback


def _compare_location(
    change: FileChange, path: str, keys: list[str], before: str | None, after: str | None, collector: _Collector
) -> None:
    fmt = _format_of(path)
    if fmt is None:
        collector.add(path, "protected keys in a file that is not JSON, TOML or YAML")
        return
    if before is None or after is None:
        if change.binary:
            collector.add(path, "binary change to a file with protected keys")
        elif not change.hunks:
            collector.add(path, "cannot verify protected keys (file content is not in the diff)")
        else:
            _heuristic(change, path, keys, fmt, collector)
        return
    try:
        new_doc = _load(fmt, after)
    except ValueError as exc:
        collector.add(path, f"file with protected keys no longer parses: {exc}")
        return
    try:
        old_doc = _load(fmt, before)
    except ValueError as exc:
        collector.add(path, f"cannot verify protected keys: previous version does not parse: {exc}")
        return
    for key in keys:
        if not _same(_lookup(old_doc, key), _lookup(new_doc, key)):
            collector.add(path, f"protected key {key!r} changed")


def _format_of(path: str) -> str | None:
    return STRUCTURED_FORMATS.get(posixpath.splitext(path)[1].lower())


def _load(fmt: str, text: str) -> Any:
    """Parse a document; ValueError on any failure. The empty document (a
    file that does not exist on that side) is an empty mapping."""
    if text == "":
        return {}
    try:
        if fmt == "json":
            return limits.json_loads(text, what="the file", object_pairs_hook=_no_duplicates)
        if fmt == "toml":
            return tomllib.loads(text)
        return yaml.load(text, Loader=_StrictLoader)  # SafeLoader subclass: plain data only
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _lookup(document: Any, dotted: str) -> Any:
    node = document
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _same(left: Any, right: Any, *, budget: int = 100_000) -> bool:
    """Equality that also compares types (in Python ``1 == 1.0 == True``, but
    ``effort = 1`` and ``effort = true`` are different settings). Iterative
    with a step budget: YAML aliases can make a small file a huge or cyclic
    tree, and running out of budget counts as "changed"."""
    stack = [(left, right)]
    while stack:
        budget -= 1
        if budget < 0:
            return False
        a, b = stack.pop()
        if type(a) is not type(b):
            return False
        if isinstance(a, dict):
            if a.keys() != b.keys():
                return False
            stack.extend((a[key], b[key]) for key in a)
        elif isinstance(a, list | tuple):
            if len(a) != len(b):
                return False
            stack.extend(zip(a, b, strict=True))
        elif isinstance(a, float) and a != a:
            if b == b:
                return False
        elif a is not b and a != b:
            return False
    return True


_STRUCTURAL_LINE: dict[str, Callable[[str], bool]] = {
    "toml": lambda line: line.lstrip().startswith("["),
    "json": lambda line: "{" in line or "}" in line,
    "yaml": lambda line: bool(
        re.match(r"^\s*(?:-\s+)?[^\s#][^#]*:\s*(?:[&!][^\s]*\s*)?(?:#.*)?$", line)
        or re.match(r"^\s*(?:<<\s*:|\?(?:\s|$)|---|\.\.\.|[^#]*\*[\w-])", line)
    ),
}
_ESCAPED_KEY_RE = re.compile(r"""["'][^"']*\\[^"']*["']\s*[:=]""")


def _heuristic(change: FileChange, path: str, keys: list[str], fmt: str, collector: _Collector) -> None:
    names = sorted({part for key in keys for part in key.split(".")})
    key_res = {name: re.compile(rf"""(?<![\w-])["']?{re.escape(name)}["']?\s*[:=]""") for name in names}
    changed = [line[1:] for hunk in change.hunks for line in hunk.lines if line.startswith(("+", "-"))]
    for line in changed:
        for key in keys:
            if any(key_res[part].search(line) for part in key.split(".")):
                collector.add(
                    path, f"protected key {key!r} may have changed (diff lacks the whole file; a changed line names it)"
                )
        if _STRUCTURAL_LINE[fmt](line) or _ESCAPED_KEY_RE.search(line):
            collector.add(
                path, "protected keys may have moved (diff lacks the whole file; a changed line alters nesting)"
            )
