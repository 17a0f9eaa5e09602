"""Offline support-routing agent: a simulated policy steered by harness files.

    agent.py --harness DIR --task DIR --output DIR --seed N [--case-recall-similarity X]

The task directory holds ``instruction.md`` (the customer's message) and public
files (``ticket.json``). The agent picks one support tool, fills its
arguments and writes ``answer.json`` (as ``output/format.toml`` says) and
``trajectory.json`` (ATIF v1.5) into the output directory.

The "model" is a frozen scoring rule, so every decision comes from the
harness: tool keywords, descriptions and argument patterns, prompt examples,
memory hints and known cases, normalization rules, control flow, context
settings and the sampling temperature. Tool choice is sampled (Gumbel-max at
the configured temperature) from a generator seeded by ``--seed`` and the task
text, so a run is deterministic given (harness, task, seed) and different
seeds can disagree. Token counts are about chars/4 of everything put in front
of the policy at each step, so a longer harness or more steps cost more.

Standard library only (any Python >= 3.11); the clock is never read, so
trajectories are reproducible. Exit status: 0 when the run finished (whether
or not it submitted), 2 when the harness or task could not be used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import sys
import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

AGENT_NAME = "offline-support-router"
AGENT_VERSION = "1.0.0"
KNOWN_MODELS = frozenset({"offline-policy-1"})
# reasoning_effort -> (noise multiplier, hidden reasoning tokens per step)
EFFORT = {"low": (1.0, 16), "medium": (0.85, 48), "high": (0.7, 120)}
KNOWN_STEPS = ("classify", "extract", "verify", "submit")

# The frozen policy's preferences. They belong to the "model", not the
# harness, so the proposer can only move them through the harness files.
KEYWORD_WEIGHT = 2.0
DESCRIPTION_WEIGHT = 0.5
DESCRIPTION_CAP = 1.5
ARG_MATCH_WEIGHT = 1.0
HINT_WEIGHT = 1.5
EXAMPLE_WEIGHT = 4.0
# A memorized answer is reused for a message that shares at least this share of its words with the known
# case (Jaccard over words), as a model reuses what it memorized for a message that looks like it; on a
# lookalike message about another order or account the memorized arguments are wrong. Chosen as "half the
# words", before any run measured its effect, and not tuned since.
CASE_RECALL_SIMILARITY = 0.5

STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with from into onto about as is are was were be been am
    i me my mine we our you your it its this that these those there here please thanks thank hi hello
    dear can could would should will shall may might must do does did done have has had not no yes so
    just also any some all one two what which who when how than then them they their he she his her us
    very route message below tool tools request arguments argument canonical form customer support
    resolves main issue""".split()  # noqa: SIM905
)
MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ),
        start=1,
    )
    for name in names
}


class HarnessError(Exception):
    """The harness (or task) cannot be used; the run ends without an answer."""


# --- Harness ------------------------------------------------------------------


@dataclass
class ArgSpec:
    name: str
    patterns: list[re.Pattern[str]]
    validate: re.Pattern[str] | None


@dataclass
class ToolSpec:
    name: str
    description: str
    keywords: list[str]
    args: list[ArgSpec]


@dataclass
class SubagentSpec:
    """A subagent the policy can start (``subagents/*.toml``): ``when`` says on what, ``reads`` what it reads
    in a context of its own; ``text`` is its file, which the main context lists like a tool."""

    name: str
    when: str
    reads: str
    text: str


@dataclass
class Settings:
    """The typed knobs of config.toml, control/flow.toml, context/window.toml and output/format.toml."""

    temperature: float
    reasoning_effort: str
    max_steps: int
    steps: list[str]
    max_retries: int
    include_public_files: bool
    max_request_chars: int
    history: str
    answer_file: str
    tool_key: str
    args_key: str
    on_missing_args: str


@dataclass
class Harness:
    model: str
    settings: Settings
    tools: list[ToolSpec]
    rules: list[dict[str, Any]]
    hints: list[tuple[str, str]]
    cases: list[tuple[str, dict[str, Any]]]
    examples: list[tuple[frozenset[str], str]]
    system_prompt: str
    # Everything the policy reads at every step, in order.
    context_text: str
    subagents: list[SubagentSpec] = field(default_factory=list)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HarnessError(f"cannot read {path.name}: {exc}") from exc


def _toml(path: Path, text: str | None = None) -> dict[str, Any]:
    try:
        return tomllib.loads(_read(path) if text is None else text)
    except tomllib.TOMLDecodeError as exc:
        raise HarnessError(f"{path}: invalid TOML: {exc}") from exc


def _compile(pattern: Any, where: str) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise HarnessError(f"{where}: a pattern must be a string")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise HarnessError(f"{where}: invalid regular expression {pattern!r}: {exc}") from exc


def _load_tool(path: Path) -> ToolSpec:
    data = _toml(path)
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise HarnessError(f"tools/{path.name}: `name` must be a snake_case string")
    if not isinstance(data.get("args", []), list) or not isinstance(data.get("keywords", []), list):
        raise HarnessError(f"tools/{path.name}: `args` and `keywords` must be arrays")
    args = []
    for index, raw in enumerate(data.get("args", [])):
        where = f"tools/{path.name} args[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise HarnessError(f"{where}: every argument needs a `name`")
        patterns = [_compile(p, where) for p in raw.get("patterns", [])]
        validate = _compile(raw["validate"], where) if "validate" in raw else None
        args.append(ArgSpec(name=raw["name"], patterns=patterns, validate=validate))
    keywords = [str(k).lower() for k in data.get("keywords", []) if str(k).strip()]
    return ToolSpec(name=name, description=str(data.get("description", "")), keywords=keywords, args=args)


# What starts a subagent, and what it may read that the main context may not hold.
SUBAGENT_TRIGGERS = ("missing_args",)
SUBAGENT_READS = ("public_files",)


def _load_subagent(path: Path) -> SubagentSpec:
    text = _read(path)
    data = _toml(path, text)
    where = f"subagents/{path.name}"
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise HarnessError(f"{where}: `name` must be a snake_case string")
    when, reads = data.get("when"), data.get("reads")
    if when not in SUBAGENT_TRIGGERS or reads not in SUBAGENT_READS:
        raise HarnessError(
            f"{where}: `when` must be one of {', '.join(SUBAGENT_TRIGGERS)} and `reads` one of "
            f"{', '.join(SUBAGENT_READS)}"
        )
    return SubagentSpec(name=name, when=when, reads=reads, text=text)


def _skill_rules(path: Path, text: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for block in re.findall(r"```toml\s*\n(.*?)```", text, flags=re.DOTALL):
        for rule in _toml(path, block).get("rule", []):
            if not isinstance(rule, dict) or not isinstance(rule.get("arg"), str):
                raise HarnessError(f"skills/{path.name}: every rule needs an `arg`")
            for op in rule.get("ops", []):
                if not isinstance(op, dict) or op.get("op") not in OPS:
                    raise HarnessError(f"skills/{path.name}: unknown operation {op!r} (known: {', '.join(OPS)})")
                if op["op"] == "regex_sub":
                    _compile(op.get("pattern"), f"skills/{path.name}")
            rules.append(rule)
    return rules


def _memory(text: str) -> tuple[list[tuple[str, str]], list[tuple[str, dict[str, Any]]]]:
    hints = [
        (m.group(1).lower(), m.group(2)) for m in re.finditer(r'^\s*-\s*"([^"]+)"\s*->\s*([a-z_]+)\s*$', text, re.M)
    ]
    cases = []
    for m in re.finditer(r'^\s*-\s*"([^"]+)"\s*=>\s*(\{.*\})\s*$', text, re.M):
        try:
            answer = json.loads(m.group(2))
        except json.JSONDecodeError:
            continue
        if (
            isinstance(answer, dict)
            and isinstance(answer.get("tool"), str)
            and isinstance(answer.get("args", {}), dict)
        ):
            cases.append((_squash(m.group(1)), answer))
    return hints, cases


def _examples(prompt: str) -> list[tuple[frozenset[str], str]]:
    pairs = re.findall(r"^Request:\s*(.+?)\s*\n\s*Tool:\s*([a-z_]+)\s*$", prompt, flags=re.M)
    return [(content_words(request), tool) for request, tool in pairs]


def _setting(
    data: dict[str, Any], key: str, kind: type, default: Any, where: str, choices: tuple[Any, ...] = ()
) -> Any:
    value = data.get(key, default)
    # bool is an int in Python; do not let `max_steps = true` through.
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok or (choices and value not in choices):
        allowed = f" (one of {', '.join(map(str, choices))})" if choices else ""
        raise HarnessError(f"{where}: `{key}` must be a {kind.__name__}{allowed}, not {value!r}")
    return value


def _settings(root: Path) -> tuple[str, Settings]:
    config = _toml(root / "config.toml")
    model = config.get("model")
    if model not in KNOWN_MODELS:
        raise HarnessError(f"config.toml: unknown model {model!r}")
    flow = _toml(root / "control" / "flow.toml")
    window_path = root / "context" / "window.toml"
    window = _toml(window_path) if window_path.exists() else {}
    output = _toml(root / "output" / "format.toml")
    steps = _setting(flow, "steps", list, [], "control/flow.toml")
    unknown = [s for s in steps if s not in KNOWN_STEPS]
    if unknown:
        raise HarnessError(f"control/flow.toml: unknown step(s) {unknown} (known: {', '.join(KNOWN_STEPS)})")
    for required in ("classify", "extract"):
        if required not in steps:
            raise HarnessError(f"control/flow.toml: step {required!r} is required")
    settings = Settings(
        temperature=max(0.0, _setting(config, "temperature", float, 1.0, "config.toml")),
        reasoning_effort=_setting(config, "reasoning_effort", str, "low", "config.toml", tuple(EFFORT)),
        max_steps=_setting(config, "max_steps", int, 8, "config.toml"),
        steps=steps,
        max_retries=max(0, _setting(flow, "max_retries", int, 0, "control/flow.toml")),
        include_public_files=_setting(window, "include_public_files", bool, False, "context/window.toml"),
        max_request_chars=_setting(window, "max_request_chars", int, 0, "context/window.toml"),
        history=_setting(window, "history", str, "full", "context/window.toml", ("full", "last")),
        answer_file=_setting(output, "answer_file", str, "answer.json", "output/format.toml"),
        tool_key=_setting(output, "tool_key", str, "tool", "output/format.toml"),
        args_key=_setting(output, "args_key", str, "args", "output/format.toml"),
        on_missing_args=_setting(output, "on_missing_args", str, "skip", "output/format.toml", ("skip", "partial")),
    )
    if not re.fullmatch(r"[\w-][\w.-]*", settings.answer_file):
        raise HarnessError("output/format.toml: answer_file must be a plain file name")
    return model, settings


def load_harness(root: Path) -> Harness:
    """Read and check every harness file; raise HarnessError on anything unusable."""
    if not root.is_dir():
        raise HarnessError(f"harness directory {root} does not exist")
    model, settings = _settings(root)
    prompts = [_read(p) for p in sorted((root / "prompts").glob("*.md"))]
    tool_files = sorted((root / "tools").glob("*.toml"))
    tools = [_load_tool(p) for p in tool_files]
    if not tools:
        raise HarnessError("no tools: tools/*.toml is empty")
    if len({t.name for t in tools}) != len(tools):
        raise HarnessError("two tool files declare the same tool name")
    skill_files = sorted((root / "skills").glob("*.md"))
    skill_texts = [_read(p) for p in skill_files]
    rules = [rule for p, text in zip(skill_files, skill_texts, strict=True) for rule in _skill_rules(p, text)]
    memory_texts = [_read(p) for p in sorted((root / "memory").glob("*.md"))]
    hints, cases = _memory("\n".join(memory_texts))
    system_prompt = "\n\n".join(prompts)
    tool_texts = [_read(p) for p in tool_files]
    subagents = [_load_subagent(p) for p in sorted((root / "subagents").glob("*.toml"))]
    return Harness(
        model=model,
        settings=settings,
        tools=tools,
        rules=rules,
        hints=hints,
        cases=cases,
        examples=_examples(system_prompt),
        system_prompt=system_prompt,
        context_text="\n\n".join(
            [system_prompt, *tool_texts, *skill_texts, *memory_texts, *(a.text for a in subagents)]
        ),
        subagents=subagents,
    )


# --- Text helpers ---------------------------------------------------------------


def tokens(text: str) -> int:
    """Approximate tokens: about four characters each."""
    return math.ceil(len(text) / 4)


def content_words(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2 and w not in STOPWORDS)


def _squash(text: str) -> str:
    return " ".join(text.lower().split())


def _keyword_hit(keyword: str, text_lc: str) -> bool:
    # Prefix match at a word start: "track" also counts "tracking".
    return re.search(r"(?<![a-z0-9])" + re.escape(keyword), text_lc) is not None


# --- Normalization operations (the vocabulary a skill can use) -------------------


def _op_money(value: str, op: dict[str, Any]) -> str:
    digits = re.sub(r"[^\d.,]", "", value)
    if op.get("decimal_comma") and re.search(r",\d{1,2}$", digits) and "." not in digits:
        digits = digits.replace(",", ".")
    else:
        digits = digits.replace(",", "")
    try:
        return f"{float(digits):.2f}"
    except ValueError:
        return value


def _op_regex_sub(value: str, op: dict[str, Any]) -> str:
    try:
        return re.sub(op["pattern"], str(op.get("repl", "")), value)
    except (re.error, IndexError) as exc:
        raise HarnessError(f"skill rule regex_sub {op['pattern']!r} -> {op.get('repl')!r} fails: {exc}") from exc


def _op_date_iso(value: str, op: dict[str, Any]) -> str:
    text = value.strip().lower()
    day = month = year = None
    if m := re.fullmatch(r"(\d{4})-(\d{1,2})-(\d{1,2})", text):
        year, month, day = int(m[1]), int(m[2]), int(m[3])
    elif m := re.fullmatch(r"(\d{1,2})[/.-](\d{1,2})[/.-](\d{4})", text):
        first, second, year = int(m[1]), int(m[2]), int(m[3])
        day, month = (first, second) if op.get("day_first") else (second, first)
    elif m := re.fullmatch(r"(\d{1,2})(?:st|nd|rd|th)?(?:\s+of)?\s+([a-z]+)\.?,?\s+(\d{4})", text):
        day, month, year = int(m[1]), MONTHS.get(m[2]), int(m[3])
    elif m := re.fullmatch(r"([a-z]+)\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})", text):
        month, day, year = MONTHS.get(m[1]), int(m[2]), int(m[3])
    if not (day and month and year):
        return value
    try:
        return datetime(year, month, day, tzinfo=UTC).strftime("%Y-%m-%d")
    except ValueError:
        return value


OPS = {
    "strip": lambda value, op: value.strip(),
    "lower": lambda value, op: value.lower(),
    "upper": lambda value, op: value.upper(),
    "regex_sub": lambda value, op: _op_regex_sub(value, op),
    "money": _op_money,
    "date_iso": _op_date_iso,
}


def normalize(name: str, value: str, rules: list[dict[str, Any]]) -> str:
    for rule in rules:
        if rule["arg"] == name:
            for op in rule.get("ops", []):
                value = OPS[op["op"]](value, op)
    return value


# --- Trajectory -------------------------------------------------------------------


class Trajectory:
    def __init__(self, *, seed: int, key: str, history: str, base_tokens: int, effort_tokens: int) -> None:
        offset = int(hashlib.sha256(f"time|{seed}|{key}".encode()).hexdigest()[:8], 16) % (86400 * 60)
        self.start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=offset)
        self.steps: list[dict[str, Any]] = []
        self.history = history
        self.base_tokens = base_tokens
        self.effort_tokens = effort_tokens
        self.seen_tokens = 0
        self.last_tokens = 0
        self.calls = 0

    def _add(self, step: dict[str, Any]) -> dict[str, Any]:
        step_id = len(self.steps) + 1
        moment = self.start + timedelta(seconds=2 * step_id)
        self.steps.append({"step_id": step_id, "timestamp": moment.strftime("%Y-%m-%dT%H:%M:%SZ"), **step})
        return self.steps[-1]

    def note(self, source: str, message: str) -> None:
        self._add({"source": source, "message": message})

    def act(
        self,
        message: str,
        call: tuple[str, dict[str, Any]] | None = None,
        result: str | None = None,
        delegated_tokens: int = 0,
    ) -> None:
        """One policy step: it reads the whole harness context plus history. ``delegated_tokens``: what a
        subagent the step started read in its own context (counted as this step's prompt)."""
        step: dict[str, Any] = {"source": "agent", "model_name": "", "message": message}
        written = message
        if call is not None:
            self.calls += 1
            call_id = f"call_{self.calls}"
            step["tool_calls"] = [{"tool_call_id": call_id, "function_name": call[0], "arguments": call[1]}]
            written += json.dumps(call[1], sort_keys=True)
            if result is not None:
                step["observation"] = {"results": [{"source_call_id": call_id, "content": result}]}
        history = self.seen_tokens if self.history == "full" else self.last_tokens
        step["metrics"] = {
            "prompt_tokens": self.base_tokens + history + delegated_tokens,
            "completion_tokens": tokens(written) + self.effort_tokens,
        }
        produced = tokens(written) + tokens(result or "")
        self.seen_tokens += produced
        self.last_tokens = produced
        self._add(step)

    def agent_steps(self) -> int:
        return sum(1 for s in self.steps if s["source"] == "agent")


# --- The policy -----------------------------------------------------------------


@dataclass
class Attempt:
    tool: ToolSpec
    evidence: float
    args: dict[str, str | None]
    valid: dict[str, bool]

    def rank(self) -> tuple[int, float]:
        """Most valid arguments first, then the strongest evidence for the tool."""
        return sum(self.valid.values()), self.evidence


def read_task(task_dir: Path) -> tuple[str, str]:
    instruction_path = task_dir / "instruction.md"
    if not instruction_path.is_file():
        raise HarnessError(f"task directory {task_dir} has no instruction.md")
    instruction = _read(instruction_path)
    files = []
    for path in sorted(p for p in task_dir.rglob("*") if p.is_file() and p != instruction_path):
        files.append(f"--- {path.relative_to(task_dir).as_posix()} ---\n{_read(path)}")
    return instruction, "\n".join(files)


def score_tools(harness: Harness, request: str) -> dict[str, tuple[float, list[str]]]:
    text_lc = request.lower()
    words = content_words(request)
    scores: dict[str, tuple[float, list[str]]] = {}
    for tool in harness.tools:
        reasons: list[str] = []
        keyword_hits = [k for k in tool.keywords if _keyword_hit(k, text_lc)]
        score = KEYWORD_WEIGHT * len(keyword_hits)
        reasons += [f"keyword '{k}'" for k in keyword_hits]
        description_hits = sorted(content_words(tool.description) & words)
        score += min(DESCRIPTION_CAP, DESCRIPTION_WEIGHT * len(description_hits))
        reasons += [f"description '{w}'" for w in description_hits]
        if tool.args:
            found = [a.name for a in tool.args if any(p.search(request) for p in a.patterns)]
            score += ARG_MATCH_WEIGHT * len(found) / len(tool.args)
            reasons += [f"pattern for {name}" for name in found]
        hint_hits = [phrase for phrase, name in harness.hints if name == tool.name and phrase in text_lc]
        score += HINT_WEIGHT * len(hint_hits)
        reasons += [f"memory hint '{h}'" for h in hint_hits]
        similarity = max(
            (len(words & ex) / len(words | ex) for ex, name in harness.examples if name == tool.name and words | ex),
            default=0.0,
        )
        if similarity > 0:
            score += EXAMPLE_WEIGHT * similarity
            reasons.append(f"example similarity {similarity:.2f}")
        scores[tool.name] = (score, reasons)
    return scores


def extract(tool: ToolSpec, request: str, files: str, rules: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Every normalized candidate for each argument, best first.

    The customer's own words come before the public files, then pattern
    order, then position in the text. Extraction uses the first candidate;
    the verify step may fall back to a later one.
    """
    candidates: dict[str, list[str]] = {}
    for arg in tool.args:
        found: list[str] = []
        for source in (request, files):
            for pattern in arg.patterns:
                for match in pattern.finditer(source):
                    raw = match.group(1) if match.groups() else match.group(0)
                    if raw is not None:
                        value = normalize(arg.name, raw, rules)
                        if value not in found:
                            found.append(value)
        candidates[arg.name] = found
    return candidates


def is_valid(arg: ArgSpec, value: str | None) -> bool:
    return value is not None and (arg.validate is None or arg.validate.fullmatch(value) is not None)


def check(
    tool: ToolSpec, values: dict[str, str | None], candidates: dict[str, list[str]]
) -> tuple[list[str], list[str]]:
    """Verify each argument; repair an invalid one from a later candidate that is valid.

    Changes ``values`` in place. Returns (repairs, problems) as readable lines.
    """
    repairs: list[str] = []
    problems: list[str] = []
    for arg in tool.args:
        value = values[arg.name]
        if is_valid(arg, value):
            continue
        replacement = next((c for c in candidates[arg.name] if is_valid(arg, c)), None)
        if replacement is not None:
            values[arg.name] = replacement
            repairs.append(f"{arg.name}: {value!r} -> {replacement!r}")
        elif value is None:
            problems.append(f"{arg.name}: missing")
        else:
            pattern = arg.validate.pattern if arg.validate else ""
            problems.append(f"{arg.name}: {value!r} does not match {pattern}")
    return repairs, problems


def choose_tool(
    harness: Harness, scores: dict[str, tuple[float, list[str]]], tried: set[str], rng: random.Random
) -> ToolSpec:
    """Gumbel-max sampling: softmax(score / temperature) over the tools not tried yet."""
    noise = harness.settings.temperature * EFFORT[harness.settings.reasoning_effort][0]
    sampled: dict[str, float] = {}
    # One draw per tool in name order, every time, so runs with the same seed share their noise.
    for name in sorted(scores):
        u = min(max(rng.random(), 1e-12), 1 - 1e-12)
        sampled[name] = scores[name][0] + noise * -math.log(-math.log(u))
    open_tools = [t for t in harness.tools if t.name not in tried] or harness.tools
    return max(open_tools, key=lambda t: (sampled[t.name], -harness.tools.index(t)))


def attempt_tools(
    harness: Harness, request: str, files: str, trajectory: Trajectory, rng: random.Random
) -> list[Attempt]:
    """classify -> extract (-> verify, and retry with another tool while it fails)."""
    settings = harness.settings
    verify = "verify" in settings.steps
    retries = settings.max_retries if verify else 0
    per_attempt = 3 if verify else 2
    reserve = 1 if "submit" in settings.steps else 0
    attempts: list[Attempt] = []
    tried: set[str] = set()
    while len(attempts) <= retries:
        if trajectory.agent_steps() + per_attempt + reserve > settings.max_steps:
            trajectory.note("system", f"max_steps={settings.max_steps} reached: no further attempt")
            break
        scores = score_tools(harness, request)
        tool = choose_tool(harness, scores, tried, rng)
        tried.add(tool.name)
        ranked = sorted(scores.items(), key=lambda item: -item[1][0])
        summary = "; ".join(f"{n} {s:.2f} ({', '.join(why) or 'no evidence'})" for n, (s, why) in ranked)
        trajectory.act(f"Intent scores: {summary}. Sampled at temperature {settings.temperature:g}: chose {tool.name}.")

        candidates = extract(tool, request, files, harness.rules)
        values = {name: (found[0] if found else None) for name, found in candidates.items()}
        shown = ", ".join(f"{k}={v!r}" if v is not None else f"{k} not found" for k, v in values.items())
        trajectory.act(f"Extracted arguments for {tool.name}: {shown or 'none needed'}.")
        if verify:
            checked = dict(values)
            repairs, problems = check(tool, values, candidates)
            report = "; ".join([f"repaired {line}" for line in repairs] + problems) or "all arguments valid"
            trajectory.act(f"Verifying the arguments of {tool.name}.", ("check_arguments", checked), report)
        valid = {a.name: is_valid(a, values[a.name]) for a in tool.args}
        attempts.append(Attempt(tool=tool, evidence=scores[tool.name][0], args=values, valid=valid))
        if not verify or all(valid.values()):
            break
    return attempts


def delegate_missing(
    harness: Harness, attempt: Attempt, request: str, files: str, trajectory: Trajectory, reserve: int
) -> None:
    """Start the harness's ``missing_args`` subagent, if it has one and a step is left, for the arguments
    ``attempt`` misses: in a context of its own (its file, the message and the task's public files, whether or
    not the main context includes them) it extracts them with the tool's patterns and normalization, and the
    valid ones fill ``attempt`` in place."""
    missing = [name for name, value in attempt.args.items() if value is None]
    helper = next((a for a in harness.subagents if a.when == "missing_args"), None)
    if not missing or helper is None or trajectory.agent_steps() + 1 + reserve > harness.settings.max_steps:
        return
    found = extract(attempt.tool, request, files, harness.rules)
    specs = {a.name: a for a in attempt.tool.args}
    filled = {name: next((v for v in found[name] if is_valid(specs[name], v)), None) for name in missing}
    filled = {name: value for name, value in filled.items() if value is not None}
    attempt.args.update(filled)
    attempt.valid.update(dict.fromkeys(filled, True))
    context = tokens(helper.text) + tokens(request) + tokens(files)
    report = ", ".join(f"{k}={v!r}" for k, v in filled.items()) or "nothing found"
    trajectory.act(
        f"Starting subagent {helper.name} for the missing {', '.join(missing)}.",
        ("start_subagent", {"name": helper.name, "missing": missing}),
        report,
        delegated_tokens=context,
    )


def recall(
    harness: Harness, request: str, trajectory: Trajectory, threshold: float = CASE_RECALL_SIMILARITY
) -> dict[str, Any] | None:
    """A known case from memory that the message contains, or else the one most like it (at least
    ``threshold``, by default ``CASE_RECALL_SIMILARITY``, of their words shared), used as the answer,
    arguments and all."""
    if not harness.cases or trajectory.agent_steps() >= harness.settings.max_steps:
        return None
    squashed = _squash(request)
    quoted = [line[2:] for line in request.splitlines() if line.startswith("> ")]
    words = _all_words(" ".join(quoted) if quoted else request)  # the customer's words, not the instruction's
    best: tuple[float, dict[str, Any]] | None = None
    for text, answer in harness.cases:
        if not text:
            continue
        similarity = 1.0 if text in squashed else _jaccard(_all_words(text), words)
        if similarity >= threshold and (best is None or similarity > best[0]):
            best = (similarity, answer)
    if best is None:
        return None
    similarity, answer = best
    how = "matching this message" if similarity == 1.0 else f"like this message ({similarity:.0%} of words shared)"
    trajectory.act(f"Memory has a known case {how}; reusing its answer ({answer['tool']}).")
    return {"tool": answer["tool"], "args": dict(answer.get("args") or {})}


def _all_words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", text.lower()))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def run(
    harness_dir: Path, task_dir: Path, output_dir: Path, seed: int, case_recall: float = CASE_RECALL_SIMILARITY
) -> dict[str, Any]:
    """Run one trial and write the output files. Safe to repeat: same inputs, same files.

    A harness that cannot be used leaves a trajectory with one error step and no answer. ``case_recall``:
    the recall threshold (``--case-recall-similarity``; a comparison's sensitivity row sets it).
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    instruction = ""
    try:
        instruction, files = read_task(task_dir)
        harness = load_harness(harness_dir)
        return run_policy(harness, instruction, files, output_dir, seed, case_recall)
    except HarnessError as exc:
        (output_dir / "answer.json").unlink(missing_ok=True)
        trajectory = Trajectory(seed=seed, key=instruction, history="full", base_tokens=0, effort_tokens=0)
        trajectory.note("system", f"error: {exc}")
        document = _document(trajectory, seed, instruction, model="", extra={"error": str(exc), "submitted": False})
        _write_json(output_dir / "trajectory.json", document)
        return {"error": str(exc), "submitted": False}


def run_policy(
    harness: Harness,
    instruction: str,
    files: str,
    output_dir: Path,
    seed: int,
    case_recall: float = CASE_RECALL_SIMILARITY,
) -> dict[str, Any]:
    settings = harness.settings
    # A stale answer from an earlier run in the same directory must not count as this run's.
    (output_dir / settings.answer_file).unlink(missing_ok=True)
    limit = settings.max_request_chars
    request = instruction[:limit] if limit > 0 else instruction
    visible_files = files if settings.include_public_files else ""
    trajectory = Trajectory(
        seed=seed,
        key=instruction,
        history=settings.history,
        base_tokens=tokens(harness.context_text) + tokens(request) + tokens(visible_files),
        effort_tokens=EFFORT[settings.reasoning_effort][1],
    )
    rng = random.Random(int(hashlib.sha256(f"policy|{seed}|{instruction}".encode()).hexdigest()[:16], 16))

    trajectory.note("system", harness.system_prompt)
    trajectory.note("user", request + (f"\n\n{visible_files}" if visible_files else ""))
    cut = f"; task text cut at {limit} of {len(instruction)} characters" if 0 < limit < len(instruction) else ""
    trajectory.note(
        "system",
        f"context: {len(harness.tools)} tools, {len(harness.rules)} normalization rules, "
        f"{len(harness.hints)} memory hints, {len(harness.cases)} known cases, "
        f"public files {'included' if visible_files else 'not included'}{cut}",
    )

    answer = recall(harness, request, trajectory, case_recall)
    attempts: list[Attempt] = []
    reason = ""
    if answer is None:
        attempts = attempt_tools(harness, request, visible_files, trajectory, rng)
        if not attempts:
            reason = "not submitted: no attempt fitted in max_steps"
        else:
            best = max(attempts, key=lambda a: (*a.rank(), -attempts.index(a)))
            delegate_missing(harness, best, request, files, trajectory, 1 if "submit" in settings.steps else 0)
            missing = [name for name, value in best.args.items() if value is None]
            if missing and settings.on_missing_args == "skip":
                reason = f"not submitted: missing {', '.join(missing)}"
            else:
                answer = {"tool": best.tool.name, "args": {k: v for k, v in best.args.items() if v is not None}}

    submitted = False
    if answer is not None:
        if "submit" not in settings.steps:
            reason = "not submitted: the control flow has no submit step"
        elif trajectory.agent_steps() >= settings.max_steps:
            reason = f"not submitted: max_steps={settings.max_steps} reached"
        else:
            _write_json(
                output_dir / settings.answer_file,
                {settings.tool_key: answer["tool"], settings.args_key: answer["args"]},
            )
            submitted = True
            trajectory.act(
                f"Submitting {answer['tool']}.",
                (answer["tool"], answer["args"]),
                f"answer written to {settings.answer_file}",
            )
    if not submitted:
        trajectory.note("system", reason)

    extra = {"submitted": submitted, "tool": answer["tool"] if answer else None, "attempts": len(attempts)}
    document = _document(trajectory, seed, instruction, model=harness.model, extra=extra)
    document["agent"]["tool_definitions"] = [_tool_definition(t) for t in harness.tools]
    document["agent"]["extra"] = {"temperature": settings.temperature, "reasoning_effort": settings.reasoning_effort}
    _write_json(output_dir / "trajectory.json", document)
    return extra


def _tool_definition(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": {
                "type": "object",
                "properties": {a.name: {"type": "string"} for a in tool.args},
                "required": [a.name for a in tool.args],
            },
        },
    }


def _document(
    trajectory: Trajectory, seed: int, instruction: str, *, model: str, extra: dict[str, Any]
) -> dict[str, Any]:
    for step in trajectory.steps:
        if "model_name" in step:
            step["model_name"] = model
    agent_steps = [s for s in trajectory.steps if "metrics" in s]
    session = hashlib.sha256(f"session|{seed}|{instruction}".encode()).hexdigest()[:32]
    return {
        "schema_version": "ATIF-v1.5",
        "session_id": session,
        "agent": {"name": AGENT_NAME, "version": AGENT_VERSION, "model_name": model},
        "steps": trajectory.steps,
        "final_metrics": {
            "total_prompt_tokens": sum(s["metrics"]["prompt_tokens"] for s in agent_steps),
            "total_completion_tokens": sum(s["metrics"]["completion_tokens"] for s in agent_steps),
            "total_steps": len(trajectory.steps),
            "extra": {"agent_steps": len(agent_steps), **extra},
        },
    }


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def cli(run_trial: Any, doc: str, name: str, argv: list[str] | None, *, recall_option: bool = False) -> int:
    """An agent's command line (``--harness --task --output --seed``, and ``--case-recall-similarity`` with
    ``recall_option``): ``run_trial`` runs the trial; exit 2, with the reason on stderr, when it returns an
    ``error``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--harness", required=True, type=Path)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--seed", required=True, type=int)
    if recall_option:
        parser.add_argument("--case-recall-similarity", type=float, default=CASE_RECALL_SIMILARITY)
    options = parser.parse_args(argv)
    extra = (options.case_recall_similarity,) if recall_option else ()
    result = run_trial(options.harness, options.task, options.output, options.seed, *extra)
    if "error" in result:
        print(f"{name}: {result['error']}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli(run, __doc__ or "", "agent", argv, recall_option=True)


if __name__ == "__main__":
    sys.exit(main())
