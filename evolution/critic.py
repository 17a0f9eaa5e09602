"""The rule-based leakage critic: flag benchmark-specific content in a diff.

Pure functions and dataclasses, no ORM. The critic reads a candidate's diff
before any evaluation and reports *added* content that is shared with the
evolve-set tasks (train and gate) and absent from the parent harness: task
ids, task file paths, copied phrases, rare literals (order ids, names,
amounts), conditions keyed on task text, and machinery that provably does
nothing. The component is irrelevant; a generic prompt or tool improvement
passes because it shares nothing distinctive with the tasks.

Two guards keep ordinary text from being flagged:

- *template* text shared by many tasks (a common instruction preamble, a
  file every task has) is ignored: an n-gram, substring window or path that
  occurs in more than ``common_task_fraction`` of the tasks, and in at least
  ``common_min_tasks`` of them, carries no task-specific information;
- a copied phrase must carry information: it needs ``min_content_tokens``
  words that are neither English function words nor common in the task set,
  so "I can't log in to my account" written by hand does not count as a copy
  of a task that happens to say the same.

One rule is not about the tasks: ``hidden_unicode`` flags an edit that adds
hidden characters (bidirectional controls, zero-width and other invisible
characters, look-alike letters in ASCII words; ``evolution.hidden_chars``),
which make a line read differently from what it does, with the code point,
line and column as evidence.

Tasks are indexed once (:func:`build_index`); :func:`critique` accepts the
index or the tasks. Everything is case-insensitive and compares text with
runs of whitespace collapsed.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evolution import hidden_chars
from evolution.gitdiff import FileChange, parse_git_diff, whole_file_texts

RULES = (
    "task_id",
    "task_path",
    "shared_ngram",
    "long_substring",
    "rare_literal",
    "keyed_condition",
    "inert",
    "hidden_unicode",
)


@dataclass(frozen=True)
class CriticConfig:
    """Thresholds of the critic; every one is a recipe parameter."""

    ngram_size: int = 6
    min_substring_chars: int = 24
    # Informative words a copied phrase (n-gram run, substring, quoted
    # condition) must contain to count as evidence.
    min_content_tokens: int = 3
    # A literal is "rare" when it occurs in at most this many evolve tasks.
    rare_literal_max_tasks: int = 2
    min_literal_chars: int = 4
    max_literal_chars: int = 200
    # Ids this short are flagged only when they mix letters and digits
    # ("t00"), never when they are a short word or a bare number.
    min_id_chars: int = 4
    min_path_chars: int = 5
    keyed_min_chars: int = 12
    # Template text: present in more than this share of tasks and in at
    # least common_min_tasks tasks.
    common_task_fraction: float = 0.25
    common_min_tasks: int = 3
    # Standalone 4-digit numbers in this range read as years, not task data.
    year_range: tuple[int, int] | None = (1900, 2099)
    # Standalone integers ending in 00 (limits, sizes) are not task data.
    ignore_round_numbers: bool = True
    rules: frozenset[str] = frozenset(RULES)

    def __post_init__(self) -> None:
        unknown = set(self.rules) - set(RULES)
        if unknown:
            raise ValueError(f"unknown critic rules: {sorted(unknown)}")
        positive = ("ngram_size", "min_substring_chars", "min_literal_chars", "max_literal_chars", "keyed_min_chars")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 0 <= self.common_task_fraction <= 1:
            raise ValueError("common_task_fraction must be between 0 and 1")
        if self.rare_literal_max_tasks < 1:
            raise ValueError("rare_literal_max_tasks must be at least 1")


DEFAULT_CONFIG = CriticConfig()


@dataclass(frozen=True)
class CriticTask:
    """One evolve-set task as the critic sees it."""

    id: str
    instruction: str
    expected: Any = None
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Flag:
    """One piece of flagged content. ``line_number`` is the 1-based line in
    the new file, None when the flag is about the file's path itself."""

    rule: str
    path: str
    line_number: int | None
    line: str
    matched: str
    task_id: str | None
    evidence: str

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "path": self.path,
            "line_number": self.line_number,
            "line": self.line,
            "matched": self.matched,
            "task_id": self.task_id,
            "evidence": self.evidence,
        }


# --- Text helpers -------------------------------------------------------------

# Words: letter/digit runs, with inner apostrophes kept ("can't" is one word).
_WORD_RE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_ALNUM_RE = re.compile(r"[^\W_]+")

# English function words and chat formulas: never evidence on their own.
_STOPWORD_TEXT = """
    a about above after again against all also am an and any are as at back be because been before being below
    between both but by can cannot could dear did do does doing done down during each else every few for from
    further get gets got had has have having he hello her here hers herself hey hi him himself his how i if in
    into is it its itself just let like may me might more most much must my myself need needs new no nor not now
    of off ok okay on once one only or other our ours ourselves out over own please regards same she should so
    some still such than thank thanks that the their theirs them themselves then there these they this those
    through to too two under until up us use very want wants was we were what when where which while who whom
    why will with would yes you your yours yourself yourselves
    i'm i'd i've i'll don't doesn't didn't can't won't isn't aren't wasn't weren't hasn't haven't hadn't it's
    that's there's you're we're they're let's couldn't wouldn't shouldn't
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _normalize_with_map(line: str) -> tuple[str, list[int] | None]:
    """``line`` lower-cased with whitespace runs collapsed, and for each
    character of the result its index in ``line`` (None when identical
    positions), so a match can be reported in the author's own spelling."""
    if line.isascii() and "  " not in line and "\t" not in line and line == line.strip():
        return line.lower(), None
    out: list[str] = []
    positions: list[int] = []
    space_at: int | None = None
    for index, char in enumerate(line):
        if char.isspace():
            if out and space_at is None:
                space_at = index
            continue
        if space_at is not None:
            out.append(" ")
            positions.append(space_at)
            space_at = None
        for lowered in char.lower():
            out.append(lowered)
            positions.append(index)
    return "".join(out), positions


def _original(line: str, positions: list[int] | None, start: int, end: int) -> str:
    if positions is None:
        return line[start:end]
    return line[positions[start] : positions[end - 1] + 1]


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def _content_word(word: str, common_words: frozenset[str]) -> bool:
    word = word.replace("’", "'")
    if word in STOPWORDS or word in common_words:
        return False
    return len(word) >= 3 or any(char.isdigit() for char in word)


def _flatten(value: Any) -> Iterator[str]:
    """Scalar values of a JSON document (keys are schema, not data)."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _flatten(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, str):
        yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)


class _PhraseMatcher:
    """Find known phrases in normalized text, whole-word at each end that is
    a letter or digit. Phrases are anchored on their first letter/digit run,
    so a line costs one dict lookup per word instead of one scan per phrase."""

    def __init__(self, phrases: Iterable[str]) -> None:
        self._by_word: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for phrase in phrases:
            first = _ALNUM_RE.search(phrase)
            if first is not None:
                self._by_word[first.group()].append((phrase, first.start()))

    def find(self, text: str) -> Iterator[tuple[int, int, str]]:
        for word in _ALNUM_RE.finditer(text):
            for phrase, offset in self._by_word.get(word.group(), ()):
                start = word.start() - offset
                end = start + len(phrase)
                if start < 0 or text[start:end] != phrase:
                    continue
                if _is_word_char(phrase[0]) and start > 0 and _is_word_char(text[start - 1]):
                    continue
                if _is_word_char(phrase[-1]) and end < len(text) and _is_word_char(text[end]):
                    continue
                yield start, end, phrase


# --- Literals -----------------------------------------------------------------

_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# Letters then digits: A-1234, CUST-13519, ACC350902, TRK473313723, g6624.
_IDENT_RE = re.compile(r"(?<![\w-])[A-Za-z]{1,8}(?:[-_]\d{2,}|\d{4,})(?:[-_][A-Za-z0-9]+)*(?![\w-])")
# Numbers with inner separators: 174.25, 131,75, 2026-05-20, 12/05/2026.
_NUMBER_RE = re.compile(r"(?<![\w.,/:-])\d+(?:[.,:/-]\d+)*+(?!\w)")
_QUOTED_RE = re.compile(r"\"([^\"\n]+)\"|(?<!\w)'([^'\n]+)'(?!\w)|“([^”\n]+)”|`([^`\n]+)`")
_CAPITALIZED_RE = re.compile(r"(?<![\w-])[A-ZÀ-Ö][a-zß-ÿ]+(?:[-'][A-ZÀ-Ö]?[a-zß-ÿ]+)*(?![\w-])")


def _looks_specific(value: str) -> bool:
    """A quoted string or answer value that is data rather than a word:
    three digits, an at sign, or several words with a capital or digit."""
    digits = sum(char.isdigit() for char in value)
    if digits >= 3 or "@" in value:
        return True
    return " " in value.strip() and any(char.isupper() or char.isdigit() for char in value)


def _keep_number(number: str, config: CriticConfig) -> bool:
    digits = sum(char.isdigit() for char in number)
    if digits < 3 and not any(sep in number for sep in ".,"):
        return False
    if number.isdigit():
        if config.year_range and len(number) == 4 and config.year_range[0] <= int(number) <= config.year_range[1]:
            return False
        if config.ignore_round_numbers and number.endswith("00"):
            return False
    return True


def extract_literals(text: str, config: CriticConfig = DEFAULT_CONFIG) -> set[str]:
    """Distinctive literals of ``text``, normalized (lower case, whitespace
    collapsed): emails, ids like ``A-1234``, numbers with three digits or a
    decimal separator (not years or round numbers), specific-looking quoted
    strings and capitalized word pairs (names)."""
    found: list[str] = []
    found += _EMAIL_RE.findall(text)
    found += _IDENT_RE.findall(text)
    found += [number for number in _NUMBER_RE.findall(text) if _keep_number(number, config)]
    for match in _QUOTED_RE.finditer(text):
        quoted = next(group for group in match.groups() if group is not None)
        if _looks_specific(quoted):
            found.append(quoted)
    words = list(_CAPITALIZED_RE.finditer(text))
    for first, second in zip(words, words[1:], strict=False):
        between = text[first.end() : second.start()]
        if between.strip(" \t") or not between:
            continue
        if first.group().lower() in STOPWORDS or second.group().lower() in STOPWORDS:
            continue
        found.append(f"{first.group()} {second.group()}")
    literals = {_norm(item) for item in found}
    return {lit for lit in literals if config.min_literal_chars <= len(lit) <= config.max_literal_chars}


# --- Index --------------------------------------------------------------------


@dataclass
class TaskIndex:
    """The evolve tasks prepared for matching; build with :func:`build_index`
    and reuse across diffs. Read-only after construction."""

    config: CriticConfig
    task_ids: list[str]
    # Per task: (source, normalized text) of the instruction and each scalar
    # of the expected answer.
    segments: list[list[tuple[str, str]]]
    common_words: frozenset[str]
    id_tasks: dict[str, list[int]]
    id_matcher: _PhraseMatcher
    path_sources: dict[str, dict[int, str]]
    path_matcher: _PhraseMatcher
    literal_sources: dict[str, dict[int, str]]
    literal_matcher: _PhraseMatcher
    ngrams: dict[tuple[str, ...], dict[int, str]]
    windows: dict[str, tuple[int, ...]]
    instructions: list[str]

    @property
    def size(self) -> int:
        return len(self.task_ids)

    def is_common(self, count: int) -> bool:
        return _is_common(count, self.size, self.config)


def _is_common(count: int, size: int, config: CriticConfig) -> bool:
    """Template text: in more than the configured share of the tasks and in
    at least ``common_min_tasks`` of them (two tasks never make a template)."""
    return count >= config.common_min_tasks and count > config.common_task_fraction * size


def _distinctive_id(task_id: str, config: CriticConfig) -> bool:
    if not _ALNUM_RE.search(task_id):
        return False
    if len(task_id) >= config.min_id_chars:
        return True
    # Short: only an id like "t00", never a word ("add") or a bare number.
    return any(char.isalpha() for char in task_id) and any(char.isdigit() for char in task_id)


def _path_candidates(path: str, config: CriticConfig) -> set[str]:
    """The path and each of its trailing parts ("a/b/c.py", "b/c.py",
    "c.py") long and path-like enough to be evidence."""
    path = _norm(path)
    while path.startswith("./"):
        path = path[2:]
    parts = path.lstrip("/").split("/")
    suffixes = {"/".join(parts[start:]) for start in range(len(parts))}
    return {
        suffix
        for suffix in suffixes
        if len(suffix) >= config.min_path_chars and ("." in suffix or "/" in suffix) and _ALNUM_RE.search(suffix)
    }


def build_index(tasks: Sequence[CriticTask], config: CriticConfig = DEFAULT_CONFIG) -> TaskIndex:
    """Index the evolve tasks once (pure, safe to repeat). Task ids must be
    unique."""
    ids = [task.id for task in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError("task ids must be unique")
    segments: list[list[tuple[str, str]]] = []
    word_counts: dict[str, int] = defaultdict(int)
    ngrams: dict[tuple[str, ...], dict[int, str]] = defaultdict(dict)
    window_tasks: dict[str, set[int]] = defaultdict(set)
    literal_sources: dict[str, dict[int, str]] = defaultdict(dict)
    path_sources: dict[str, dict[int, str]] = defaultdict(dict)
    size = config.min_substring_chars
    for number, task in enumerate(tasks):
        task_segments = [("instruction", _norm(task.instruction))]
        task_segments += [("expected answer", _norm(value)) for value in _flatten(task.expected)]
        task_segments = [(source, text) for source, text in task_segments if text]
        segments.append(task_segments)
        words: set[str] = set()
        for source, text in task_segments:
            tokens = _WORD_RE.findall(text)
            words.update(tokens)
            for start in range(len(tokens) - config.ngram_size + 1):
                ngrams[tuple(tokens[start : start + config.ngram_size])].setdefault(number, source)
            for start in range(len(text) - size + 1):
                window_tasks[text[start : start + size]].add(number)
        for word in words:
            word_counts[word] += 1
        for literal in extract_literals(task.instruction, config):
            literal_sources[literal].setdefault(number, "instruction")
        for value in _flatten(task.expected):
            literals = extract_literals(value, config)
            # A whole answer value is a literal when it looks like data.
            if _looks_specific(value) and len(_norm(value)) <= config.max_literal_chars:
                literals.add(_norm(value))
            for literal in literals:
                literal_sources[literal].setdefault(number, "expected answer")
        for path, content in task.files.items():
            for literal in extract_literals(content, config):
                literal_sources[literal].setdefault(number, f"file {path}")
            for candidate in _path_candidates(path, config):
                path_sources[candidate].setdefault(number, path)

    def common(count: int) -> bool:
        return _is_common(count, len(ids), config)

    id_tasks: dict[str, list[int]] = defaultdict(list)
    for number, task_id in enumerate(ids):
        if _distinctive_id(task_id, config):
            id_tasks[_norm(task_id)].append(number)
    # Template filters need the task count, so they run after counting.
    kept_paths = {path: found for path, found in path_sources.items() if not common(len(found))}
    rare_literals = {
        literal: found for literal, found in literal_sources.items() if len(found) <= config.rare_literal_max_tasks
    }
    return TaskIndex(
        config=config,
        task_ids=ids,
        segments=segments,
        common_words=frozenset(word for word, count in word_counts.items() if common(count)),
        id_tasks=dict(id_tasks),
        id_matcher=_PhraseMatcher(id_tasks),
        path_sources=kept_paths,
        path_matcher=_PhraseMatcher(kept_paths),
        literal_sources=rare_literals,
        literal_matcher=_PhraseMatcher(rare_literals),
        ngrams={gram: found for gram, found in ngrams.items() if not common(len(found))},
        windows={window: tuple(sorted(found)) for window, found in window_tasks.items() if not common(len(found))},
        instructions=[_norm(task.instruction) for task in tasks],
    )


# --- The diff side ------------------------------------------------------------


@dataclass(frozen=True)
class _AddedLine:
    path: str
    number: int | None
    text: str


class _Parent:
    """What the parent harness already contains: the given parent files plus
    the removed and context lines of the diff (those are parent lines too)."""

    def __init__(self, texts: Iterable[str], ngram_size: int) -> None:
        normalized = [_norm(text) for text in texts]
        self.text = "\n".join(normalized)
        self.ngrams: set[tuple[str, ...]] = set()
        for text in normalized:
            tokens = _WORD_RE.findall(text)
            self.ngrams.update(tuple(tokens[i : i + ngram_size]) for i in range(len(tokens) - ngram_size + 1))

    def has(self, normalized: str) -> bool:
        return normalized in self.text


def _added_lines(change: FileChange) -> list[_AddedLine]:
    lines: list[_AddedLine] = []
    for hunk in change.hunks:
        number = hunk.new_start
        for line in hunk.lines:
            kind = line[:1]
            if kind == "+":
                lines.append(_AddedLine(change.path, number, line[1:]))
                number += 1
            elif kind == " ":
                number += 1
    return lines


def _parent_lines(change: FileChange) -> list[str]:
    return [line[1:] for hunk in change.hunks for line in hunk.lines if line[:1] in (" ", "-")]


# --- Rules --------------------------------------------------------------------


class _LineView:
    """One added line prepared once for every line rule: normalized text,
    the map back to the author's spelling, words, and which words carry
    information."""

    def __init__(self, index: TaskIndex, added: _AddedLine, parent: _Parent) -> None:
        self.index = index
        self.added = added
        self.parent = parent
        self.norm, self._positions = _normalize_with_map(added.text)
        self.tokens = list(_WORD_RE.finditer(self.norm))
        self.content = [_content_word(token.group(), index.common_words) for token in self.tokens]
        self._literals: list[tuple[int, int, str]] | None = None

    def original(self, start: int, end: int) -> str:
        return _original(self.added.text, self._positions, start, end)

    def flag(self, rule: str, start: int, end: int, task_id: str | None, evidence: str) -> Flag:
        added = self.added
        return Flag(rule, added.path, added.number, added.text, self.original(start, end), task_id, evidence)

    def content_between(self, start: int, end: int) -> int:
        return sum(
            informative
            for token, informative in zip(self.tokens, self.content, strict=True)
            if token.start() >= start and token.end() <= end
        )

    def literals(self) -> list[tuple[int, int, str]]:
        """Rare task literals in the line that the parent does not have."""
        if self._literals is None:
            found = self.index.literal_matcher.find(self.norm)
            self._literals = [hit for hit in found if not self.parent.has(hit[2])]
        return self._literals


def _rule_task_id(view: _LineView) -> Iterator[Flag]:
    index = view.index
    for start, end, phrase in index.id_matcher.find(view.norm):
        if view.parent.has(phrase):
            continue
        for number in index.id_tasks[phrase]:
            task_id = index.task_ids[number]
            yield view.flag("task_id", start, end, task_id, f"the id of evolve task {task_id}")


def _rule_task_path(view: _LineView) -> Iterator[Flag]:
    index = view.index
    hits = [hit for hit in index.path_matcher.find(view.norm) if not view.parent.has(hit[2])]
    for start, end, phrase in hits:
        # "c.py" inside a matched "b/c.py" is the same finding: keep the longest.
        if any(s <= start and end <= e and (s, e) != (start, end) for s, e, _ in hits):
            continue
        for number, path in index.path_sources[phrase].items():
            task_id = index.task_ids[number]
            yield view.flag("task_path", start, end, task_id, f"file {path} of evolve task {task_id}")


def _rule_shared_ngram(view: _LineView) -> Iterator[Flag]:
    index = view.index
    size = index.config.ngram_size
    words = [token.group() for token in view.tokens]
    starts: dict[int, list[int]] = defaultdict(list)
    sources: dict[int, str] = {}
    for start in range(len(words) - size + 1):
        gram = tuple(words[start : start + size])
        if gram in view.parent.ngrams:
            continue
        for number, source in index.ngrams.get(gram, {}).items():
            starts[number].append(start)
            sources.setdefault(number, source)
    for number, task_starts in starts.items():
        # Overlapping n-grams of one task merge into one run of words.
        runs: list[list[int]] = []
        for start in task_starts:
            if runs and start <= runs[-1][1] + 1:
                runs[-1][1] = start
            else:
                runs.append([start, start])
        for first, last in runs:
            if sum(view.content[first : last + size]) < index.config.min_content_tokens:
                continue
            task_id = index.task_ids[number]
            yield view.flag(
                "shared_ngram",
                view.tokens[first].start(),
                view.tokens[last + size - 1].end(),
                task_id,
                f"{last + size - first} words in a row from the {sources[number]} of evolve task {task_id}",
            )


def _longest_prefix_in(text: str, start: int, known: int, haystacks: Sequence[str]) -> int:
    """The largest ``end`` such that ``text[start:end]`` occurs in one of
    ``haystacks``, given that ``text[start:known]`` does. Occurrence is
    monotonic in the length, so a binary search is exact."""
    low, high = known, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if any(text[start:middle] in haystack for haystack in haystacks):
            low = middle
        else:
            high = middle - 1
    return low


def _rule_long_substring(view: _LineView) -> Iterator[Flag]:
    index = view.index
    norm = view.norm
    size = index.config.min_substring_chars
    covered: dict[int, int] = {}
    for start in range(len(norm) - size + 1):
        for number in index.windows.get(norm[start : start + size], ()):
            if covered.get(number, -1) > start:
                continue
            # Grow the match as one string that occurs in one text of the
            # task: consecutive windows alone could chain unrelated places.
            texts = [text for _, text in index.segments[number]]
            end = _longest_prefix_in(norm, start, start + size, texts)
            covered[number] = end
            source = next(source for source, text in index.segments[number] if norm[start:end] in text)
            # Spaces at either end are not shared content.
            first = start + (norm[start] == " ")
            last = end - (norm[end - 1] == " ")
            span = norm[first:last]
            if len(span) < size or view.parent.has(span):
                continue
            if view.content_between(first, last) < index.config.min_content_tokens:
                continue
            task_id = index.task_ids[number]
            evidence = f"{len(span)} characters in common with the {source} of evolve task {task_id}"
            yield view.flag("long_substring", first, last, task_id, evidence)


def _rule_rare_literal(view: _LineView) -> Iterator[Flag]:
    index = view.index
    for start, end, literal in view.literals():
        found = index.literal_sources[literal]
        for number, source in found.items():
            task_id = index.task_ids[number]
            evidence = (
                f"literal from the {source} of evolve task {task_id} (in {len(found)} of {index.size} evolve tasks)"
            )
            yield view.flag("rare_literal", start, end, task_id, evidence)


# Conditions: code comparisons and tests, rule-like prose ("If the message
# says ..."), and the arrow rules of memory files ('- "text" -> tool').
_CONDITION_RE = re.compile(
    r"(?<![\w-])(?:if|elif|when|whenever|unless|case|match|contains|startswith|endswith)(?![\w-])|==|!=|->|=>",
    re.IGNORECASE,
)


def _rule_keyed_condition(view: _LineView) -> Iterator[Flag]:
    index = view.index
    config = index.config
    if not _CONDITION_RE.search(view.norm):
        return
    for start, end, literal in view.literals():
        for number, source in index.literal_sources[literal].items():
            task_id = index.task_ids[number]
            evidence = f"condition keyed on a literal from the {source} of evolve task {task_id}"
            yield view.flag("keyed_condition", start, end, task_id, evidence)
    for match in _QUOTED_RE.finditer(view.norm):
        group = next(number for number in range(1, 5) if match.group(number) is not None)
        quoted = match.group(group).strip()
        if len(quoted) < config.keyed_min_chars or view.parent.has(quoted):
            continue
        informative = sum(_content_word(word, index.common_words) for word in _WORD_RE.findall(quoted))
        if informative < config.min_content_tokens:
            continue
        found = [number for number, text in enumerate(index.instructions) if quoted in text]
        if not found or index.is_common(len(found)):
            continue
        for number in found:
            task_id = index.task_ids[number]
            evidence = f"condition keyed on text from the instruction of evolve task {task_id}"
            yield view.flag("keyed_condition", match.start(group), match.end(group), task_id, evidence)


_LINE_RULES = {
    "task_id": _rule_task_id,
    "task_path": _rule_task_path,
    "shared_ngram": _rule_shared_ngram,
    "long_substring": _rule_long_substring,
    "rare_literal": _rule_rare_literal,
    "keyed_condition": _rule_keyed_condition,
}


# --- Inert machinery ------------------------------------------------------------

_DEAD_BRANCH_RE = re.compile(r"^\s*(?:if|elif|while)\s+\(?\s*(?:False|0|None)\s*\)?\s*:")
_TERMINAL = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _inert(line: _AddedLine, matched: str, evidence: str) -> Flag:
    return Flag("inert", line.path, line.number, line.text, matched, None, evidence)


def _apply_hunks(old_text: str, change: FileChange) -> str | None:
    """The new text of a modified file from its old text and hunks, or None
    when the hunks do not fit the old text."""
    old = old_text.split("\n")
    if old and old[-1] == "":
        old.pop()
    new: list[str] = []
    cursor = 0
    for hunk in change.hunks:
        start = hunk.old_start if hunk.old_count == 0 else hunk.old_start - 1
        if start < cursor or start > len(old):
            return None
        new += old[cursor:start]
        cursor = start
        for line in hunk.lines:
            kind, content = line[:1], line[1:]
            if kind in (" ", "-"):
                if cursor >= len(old) or old[cursor] != content:
                    return None
                cursor += 1
                if kind == " ":
                    new.append(content)
            elif kind == "+":
                new.append(content)
    return "\n".join(new + old[cursor:]) + "\n"


def _new_text(change: FileChange, parent_text: Mapping[str, str] | None) -> str | None:
    new = whole_file_texts(change)[1]
    if new is None and parent_text is not None and change.old_path is not None and change.old_path in parent_text:
        new = _apply_hunks(parent_text[change.old_path], change)
    return new


def _rule_inert(change: FileChange, added: list[_AddedLine], new_text: str | None, elsewhere: str) -> Iterator[Flag]:
    """Provably inert Python: dead branches, unreachable statements, and
    private or nested functions and classes that nothing refers to."""
    by_number = {line.number: line for line in added}
    tree = None
    if new_text is not None:
        try:
            tree = ast.parse(new_text)
        except (SyntaxError, ValueError):
            tree = None
    if tree is None:
        # Without the whole file only a line-local pattern is provable.
        for line in added:
            match = _DEAD_BRANCH_RE.match(line.text)
            if match:
                yield _inert(line, match.group().strip(), "branch whose condition is always false")
        return
    assert new_text is not None
    for node in ast.walk(tree):
        dead_test = isinstance(node, ast.If | ast.While) and isinstance(node.test, ast.Constant) and not node.test.value
        if dead_test and isinstance(node, ast.stmt) and node.lineno in by_number:
            kind = "loop" if isinstance(node, ast.While) else "branch"
            line = by_number[node.lineno]
            yield _inert(line, line.text.strip(), f"{kind} whose condition is always false")
        for attr in ("body", "orelse", "finalbody"):
            body = getattr(node, attr, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            terminal = next((i for i, stmt in enumerate(body) if isinstance(stmt, _TERMINAL)), None)
            if terminal is None:
                continue
            dead = [stmt for stmt in body[terminal + 1 :] if stmt.lineno in by_number]
            if dead:
                line = by_number[dead[0].lineno]
                word = type(body[terminal]).__name__.lower()
                yield _inert(line, line.text.strip(), f"unreachable: follows an unconditional {word}")
    yield from _unreferenced_definitions(tree, by_number, new_text, elsewhere)


def _unreferenced_definitions(
    tree: ast.Module, by_number: Mapping[int | None, _AddedLine], new_text: str, elsewhere: str
) -> Iterator[Flag]:
    # Public names may be imported or called by convention (a loader calling
    # run()), so only private names and nested functions can be proven dead.
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    nested: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            nested.update(child for child in ast.walk(node) if child is not node and isinstance(child, definitions))
    for node in ast.walk(tree):
        if not isinstance(node, definitions) or node.lineno not in by_number or node.decorator_list:
            continue
        name = node.name
        private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
        if not (private or node in nested):
            continue
        pattern = rf"(?<!\w){re.escape(name)}(?!\w)"
        # The parent corpus is lower-cased: compare without case there, which
        # can only keep a definition from being flagged.
        if len(re.findall(pattern, new_text)) > 1 or re.search(pattern, elsewhere, re.IGNORECASE):
            continue
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        line = by_number[node.lineno]
        yield _inert(line, name, f"{kind} {name} is defined but referenced nowhere")


# --- Hidden characters ----------------------------------------------------------


def hidden_flags(changes: Sequence[FileChange]) -> list[Flag]:
    """One ``hidden_unicode`` flag per line and hidden character an edit adds
    (on a line it adds or rewrites, see ``hidden_chars.introduced``), with
    its code point, name, kind, line and columns as evidence; a new file
    name counts as an added line without a number. ``matched`` is the
    character itself, so the diff marks it. The bytes of a line that are not
    UTF-8 (a diff of decodable text, ``trees.diff_entries(...,
    binary_as_text=True)``) make one flag per line, whatever their values,
    so a binary file cannot bury the review under flags. Pure."""
    flags: list[Flag] = []
    for change in changes:
        grouped: dict[tuple[int | None, str], list[hidden_chars.Added]] = {}
        for found in hidden_chars.introduced_by(change):
            key = found.hit.kind if found.hit.kind == hidden_chars.NOT_UTF8 else found.hit.char
            grouped.setdefault((found.line, key), []).append(found)
        for (number, _key), group in grouped.items():
            first = group[0]
            evidence = first.evidence
            if first.hit.kind == hidden_chars.NOT_UTF8 and len(group) > 1:
                evidence = f"{len(group)} bytes that are not UTF-8 ({hidden_chars.NOT_UTF8}) on line {number}, "
                evidence += f"the first {first.hit.code} at column {first.hit.column}"
            elif len(group) > 1:
                columns = ", ".join(str(item.hit.column) for item in group)
                evidence = evidence.replace(f"column {first.hit.column}", f"columns {columns}", 1)
            flags.append(Flag("hidden_unicode", change.path, number, first.text, first.hit.char, None, evidence))
    return flags


# --- Entry point ----------------------------------------------------------------


def critique(
    diff_text: str,
    tasks: Sequence[CriticTask] | TaskIndex,
    *,
    parent_text: Mapping[str, str] | None = None,
    config: CriticConfig | None = None,
) -> list[Flag]:
    """Flags for the added content of ``diff_text`` (git diff output) that is
    shared with the evolve tasks and absent from the parent.

    ``tasks`` is the evolve set (train and gate) or an index of it; a config
    given with an index must be the index's own. ``parent_text`` maps paths
    to the parent's file texts; without it only the diff's own removed and
    context lines count as the parent. A change git calls binary has no
    text in the diff and is skipped: pass the diff of the decodable text
    (``trees.diff_entries(..., binary_as_text=True)``), where a NUL or a byte
    that is not UTF-8 is itself a ``hidden_unicode`` flag. Flags then may
    hold NULs and surrogate escapes: ``hidden_chars.storable`` before
    storing them. Raises ``DiffParseError`` for a diff it cannot read. Pure
    and safe to repeat; flags are sorted and unique.
    """
    if isinstance(tasks, TaskIndex):
        if config is not None and config != tasks.config:
            raise ValueError("the config differs from the one the index was built with")
        index = tasks
    else:
        index = build_index(tasks, config or DEFAULT_CONFIG)
    enabled = index.config.rules
    changes = [change for change in parse_git_diff(diff_text) if not change.binary]
    parent_texts = [*(parent_text or {}).values(), *("\n".join(_parent_lines(change)) for change in changes)]
    # Names the parent already had (a file moved or renamed) are not new.
    parent_texts += [*(parent_text or {}), *(change.old_path for change in changes if change.old_path)]
    parent = _Parent(parent_texts, index.config.ngram_size)
    added_by_change = [(change, _added_lines(change)) for change in changes]
    flags: list[Flag] = []
    for change, added in added_by_change:
        if change.status in ("added", "renamed", "copied"):
            # The name of a new file is added content too.
            path_line = _AddedLine(change.path, None, change.path)
            flags += _line_flags(index, path_line, parent, enabled & {"task_id", "task_path", "rare_literal"})
        for line in added:
            flags += _line_flags(index, line, parent, enabled)
    if "inert" in enabled:
        for change, added in added_by_change:
            if not change.path.endswith(".py") or not added:
                continue
            elsewhere = "\n".join(
                [parent.text] + [line.text for other, lines in added_by_change if other is not change for line in lines]
            )
            flags += _rule_inert(change, added, _new_text(change, parent_text), elsewhere)
    if "hidden_unicode" in enabled:
        flags += hidden_flags(changes)
    order = {rule: number for number, rule in enumerate(RULES)}
    unique = {(f.rule, f.path, f.line_number, f.matched, f.task_id): f for f in flags}
    return sorted(
        unique.values(),
        key=lambda f: (f.path, f.line_number or 0, order[f.rule], f.matched, f.task_id or ""),
    )


def _line_flags(index: TaskIndex, added: _AddedLine, parent: _Parent, rules: Iterable[str]) -> list[Flag]:
    view = _LineView(index, added, parent)
    if not view.norm:
        return []
    flags: list[Flag] = []
    for rule in RULES:
        if rule in rules and rule in _LINE_RULES:
            flags += _LINE_RULES[rule](view)
    return flags
