"""The offline example's proposer: seeded text edits of the support-routing harness.

A stand-in for a model-driven proposer that needs no network. It reads the
proposer view only (the parent's files, the parent's train trials, the
ledger, the budget, exploration and pruning targets) and proposes atomic
edits from four families:

- ``generic``: benchmark-independent fixes of the seed harness's deliberate
  flaws (broader keywords and argument patterns, normalization, a verify
  step, a lower temperature, more context, partial answers, ...), ranked by
  the failure symptoms in the train trajectories;
- ``leaky``: copies of train evidence into the harness (messages, ids and
  answers as memory known cases, prompt examples or keywords). They raise
  the train score and nothing else, which is what the leakage critic is for;
- ``cost``: padding that costs tokens and changes no decision, which is what
  the cost rule of the gate is for;
- ``prune``: removal of padding (or of a step) in the components the loop
  names as pruning targets;
- ``structural``: a mechanism of a kind the harness does not have yet (a
  subagent that reads the ticket when an argument is missing). Never drawn by
  default (weight 0): it is proposed when the run is stalled and the loop asks
  for a kind never tried, or when nothing else is left, or when a recipe gives
  the family a weight. Whether it helps is measured like any other edit.

Each slot draws a family with ``random.Random(view.seed)`` (slot 0 is always
generic so a run can progress); the first edit comes from that family and the
rest of the bundle from the generic family. Every edit is a pure function of
the current file texts: when its change is already in the parent it changes
nothing and is skipped, so accepted edits are never proposed twice. Pure
module: no Django, no file access.
"""

from __future__ import annotations

import json
import random
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from evolution import operators
from evolution.example.reference_edits import KEYWORDS
from evolution.example.reference_edits import PATTERNS as REFERENCE_PATTERNS
from evolution.operators import EditDeclaration, Proposal, ProposerView, TrialEvidence

FAMILIES = ("generic", "leaky", "cost", "structural")
# Share of slots (after slot 0) given to each family; a recipe may override
# them with params["family_weights"]. "structural" is 0: a family of weight 0
# is never drawn, so the other families' draws are those of a proposer without it.
DEFAULT_FAMILY_WEIGHTS = {"generic": 0.5, "leaky": 0.3, "cost": 0.2, "structural": 0.0}
# Bundle size when the round has no edit budget.
DEFAULT_MAX_EDITS = 4
# Chance that a slot spends one edit on a pruning target when the loop names some.
DEFAULT_PRUNE_SHARE = 0.5
# Longest memory case text; the agent only sees the start of a long message.
MAX_CASE_CHARS = 160
MIN_CASE_CHARS = 16

Texts = dict[str, str]


class NothingToPropose(RuntimeError):
    """Every edit the proposer knows is already in the parent or refuted by the ledger."""


# --- What the proposer "knows" about support messages ------------------------------------------------

# The same synonym lists as the reference edit (one source of truth).
SYNONYMS = KEYWORDS

# The broader argument patterns of the reference edit (one source of truth).
PATTERNS = REFERENCE_PATTERNS

# Normalization rules (skill ``ops`` lines, TOML) per argument.
SKILL_OPS = {
    "amount": '[{ op = "money", decimal_comma = true }]',
    "postcode": '[{ op = "upper" }, { op = "regex_sub", pattern = \'^([A-Z0-9]+?)\\s*(\\d[A-Z]{2})$\', '
    "repl = '\\1 \\2' }]",
    "email": '[{ op = "strip" }, { op = "lower" }, { op = "regex_sub", pattern = \'[.,;:!?]+$\', repl = \'\' }]',
    "phone": "[{ op = \"regex_sub\", pattern = '\\(0\\)', repl = '' }, "
    "{ op = \"regex_sub\", pattern = '[\\s()-]', repl = '' }, "
    "{ op = \"regex_sub\", pattern = '^00', repl = '+' }, { op = \"regex_sub\", pattern = '^0', repl = '+44' }]",
    "date": '[{ op = "date_iso", day_first = true }]',
}

# Made-up requests, one per tool: general phrasings, no task data.
GENERIC_EXAMPLES = [
    ("The blender I bought arrived cracked, I would like my money back.", "refund_order"),
    ("My parcel was due last week and the courier still has not delivered it.", "track_shipment"),
    ("We are moving next month, please deliver my order to our new home instead.", "change_address"),
    ("I no longer use the service, please end my monthly plan.", "cancel_subscription"),
    ("I am locked out and cannot sign in, please send me a reset link.", "reset_password"),
    ("Could someone ring me back about my complaint?", "book_callback"),
    ("The card I pay with has expired, please take future payments from my new one.", "update_payment"),
]

# Multi-word phrases that point to one tool whoever writes them.
GENERIC_HINTS = [
    ("money back", "refund_order"),
    ("where is my", "track_shipment"),
    ("new address", "change_address"),
    ("stop billing", "cancel_subscription"),
    ("locked out", "reset_password"),
    ("ring me", "book_callback"),
    ("new card", "update_payment"),
]

# Padding: sections that cost tokens at every step and inform no decision.
PADDING = {
    "prompt": (
        "## Service standards",
        "Always be courteous and professional. Read every message carefully and completely before acting, and "
        "consider what the customer is really asking for. Think about the tone of the message and the history of "
        "the relationship between the customer and the shop. Customers may be stressed or in a hurry, and a calm "
        "and accurate answer is worth more than a fast one. Double-check your work and make sure every detail is "
        "right before you submit. The shop values accuracy, empathy, clarity, honesty, reliability, consistency, "
        "fairness and respect; treat every customer as you would like to be treated yourself.",
    ),
    "skill": (
        "## Background",
        "Canonical values exist because the systems behind the tools were written at different times by "
        "different teams, and each of them stores identifiers, amounts, dates and contact details in its own "
        "strict format. A value that is almost right is, for those systems, simply wrong. Normalizing carefully "
        "protects the customer from delays, protects the shop from costly mistakes, and keeps the support desk "
        "consistent across channels, languages and countries, which customers notice and appreciate.",
    ),
    "memory": (
        "## Session log",
        "Earlier sessions went smoothly overall. Most customers were polite and patient, messages arrived by "
        "email, chat and telephone, and the busiest hours were in the morning and just after lunch. Several "
        "customers thanked the desk for quick answers. Nothing unusual happened, no tool was out of service, and "
        "no follow-up was left open at the end of the day. Keep up the good work in this session as well.",
    ),
}
# Sections of the seed harness that are padding too.
SEED_PADDING_HEADERS = {"prompt": ["## About the shop"]}


# --- Text helpers -------------------------------------------------------------------------------------


def _squash(text: str) -> str:
    return " ".join(text.split())


def _norm_hypothesis(text: str) -> str:
    return _squash(text).casefold()


def _toml(text: str) -> dict[str, Any] | None:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def _set_key(text: str, key: str, rendered: str) -> str:
    """Set a top-level ``key = value`` line (the first one), or append it."""
    new, count = re.subn(rf"^{re.escape(key)}[ \t]*=.*$", lambda _: f"{key} = {rendered}", text, count=1, flags=re.M)
    if count:
        return new
    return text.rstrip("\n") + f"\n{key} = {rendered}\n"


def _toml_strings(values: Iterable[str]) -> str:
    # JSON strings are valid TOML basic strings for the plain text used here.
    return "[" + ", ".join(json.dumps(v, ensure_ascii=False) for v in values) + "]"


def _toml_literals(values: Iterable[str]) -> str:
    # Literal strings keep regex backslashes as they are.
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _section_span(text: str, header: str) -> tuple[int, int] | None:
    """Start of the ``header`` line and end of its section (next ``## `` header or end of text)."""
    match = re.search(rf"^{re.escape(header)}[ \t]*$", text, flags=re.M)
    if match is None:
        return None
    following = re.search(r"^## ", text[match.end() :], flags=re.M)
    return match.start(), (match.end() + following.start()) if following else len(text)


def _section_body(text: str, header: str) -> list[str] | None:
    span = _section_span(text, header)
    if span is None:
        return None
    return [line for line in text[span[0] : span[1]].splitlines()[1:] if line.strip() and line.strip() != "(none)"]


def _with_section_body(text: str, header: str, lines: Sequence[str]) -> str:
    """Replace (or append) a section's body with ``lines``; an empty body reads ``(none)``."""
    body = "\n".join(lines) if lines else "(none)"
    span = _section_span(text, header)
    if span is None:
        return text.rstrip("\n") + f"\n\n{header}\n\n{body}\n"
    start, end = span
    rest = text[end:]
    return text[:start] + f"{header}\n\n{body}\n" + ("\n" + rest if rest else "")


def _remove_section(text: str, header: str) -> str:
    span = _section_span(text, header)
    if span is None:
        return text
    start, end = span
    return (text[:start] + text[end:]).rstrip("\n") + "\n"


def _customer_lines(instruction: str) -> list[str]:
    """The quoted message lines of an instruction (the whole text when nothing is quoted)."""
    quoted = [line[2:] for line in instruction.splitlines() if line.startswith("> ")]
    return quoted or [_squash(instruction)]


def _case_text(instruction: str, visible_chars: int) -> str | None:
    """A prefix of the message that the agent sees whole and that a memory line can quote.

    The agent matches a case by containment in the (cut) message with runs of
    whitespace collapsed, and a case line cannot contain a double quote.
    """
    visible = instruction[:visible_chars] if visible_chars > 0 else instruction
    quoted = [line[2:] for line in visible.splitlines() if line.startswith("> ")]
    line = _squash(quoted[0] if quoted else visible).split('"')[0]
    if len(line) > MAX_CASE_CHARS:
        cut = line[:MAX_CASE_CHARS]
        line = cut[: cut.rfind(" ")] if " " in cut else cut
    line = line.strip()
    return line if len(line) >= MIN_CASE_CHARS else None


def _final_call(trial: TrialEvidence) -> tuple[str, dict[str, Any]] | None:
    """The last tool call of a trajectory: the submitted answer, in this example."""
    for step in reversed(trial.trajectory):
        calls = step.get("tool_calls") or []
        if calls:
            call = calls[-1]
            arguments = call.get("arguments")
            if isinstance(call.get("function_name"), str) and isinstance(arguments, dict):
                return call["function_name"], dict(arguments)
    return None


def _met(trial: TrialEvidence, criterion: str) -> bool | None:
    for item in trial.criteria:
        if item.get("id") == criterion:
            value = item.get("met", item.get("passed"))
            return bool(value) if value is not None else None
    return None


# --- The edit context ---------------------------------------------------------------------------------


@dataclass
class Context:
    """The current file texts (edits apply in turn) and what the view says about them."""

    texts: Texts
    kinds: Mapping[str, str]
    evidence: Sequence[TrialEvidence]

    def paths(self, kind: str, suffix: str = "") -> list[str]:
        return sorted(p for p in self.texts if self.kinds.get(p) == kind and p.endswith(suffix))

    def find(self, kind: str, suffix: str, marker: Callable[[str], bool]) -> str | None:
        """The first file of ``kind`` whose text satisfies ``marker``."""
        return next((p for p in self.paths(kind, suffix) if marker(self.texts[p])), None)

    def toml_with(self, kind: str, key: str) -> tuple[str, dict[str, Any]] | None:
        for path in self.paths(kind, ".toml"):
            data = _toml(self.texts[path])
            if data is not None and key in data:
                return path, data
        return None

    def tools(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Tool name -> (path, parsed tool file)."""
        found = {}
        for path in self.paths("client_tool", ".toml"):
            data = _toml(self.texts[path])
            if data is not None and isinstance(data.get("name"), str):
                found[data["name"]] = (path, data)
        return found

    def visible_chars(self) -> int:
        window = self.toml_with("context_mgmt", "max_request_chars")
        value = window[1]["max_request_chars"] if window else 0
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def memory_path(self) -> str | None:
        return self.find("memory", ".md", lambda t: "## Known cases" in t) or next(
            iter(self.paths("memory", ".md")), None
        )

    def prompt_path(self) -> str | None:
        return self.find("prompt", ".md", lambda t: "## Examples" in t) or next(iter(self.paths("prompt", ".md")), None)


Apply = Callable[[Context], Texts]


@dataclass(frozen=True)
class EditSpec:
    name: str
    family: str  # generic | leaky | cost | prune | structural
    kind: str  # the component kind the edit is meant for; the surface decides what is declared
    hypothesis: str
    apply: Apply  # -> {path: new text} of the files it changes; {} when it has nothing to do
    symptoms: tuple[str, ...] = field(default=())  # failure symptoms of the evidence it addresses


# --- Generic edits ------------------------------------------------------------------------------------


def tool_keywords(ctx: Context) -> Texts:
    changed = {}
    for name, (path, data) in ctx.tools().items():
        current = [str(k) for k in data.get("keywords", [])]
        missing = [k for k in SYNONYMS.get(name, []) if k not in current]
        if missing:
            changed[path] = _set_key(ctx.texts[path], "keywords", _toml_strings([*current, *missing]))
    return changed


def tool_patterns(ctx: Context) -> Texts:
    changed = {}
    for name, (path, data) in ctx.tools().items():
        text = ctx.texts[path]
        for arg in data.get("args", []):
            wanted = PATTERNS.get((name, arg.get("name")))
            if wanted is None or list(arg.get("patterns", [])) == wanted:
                continue
            block = re.compile(rf'(name = "{re.escape(arg["name"])}"\n)patterns = \[.*\]$', re.M)
            text = block.sub(_after_group_one("patterns = " + _toml_literals(wanted)), text, count=1)
        if text != ctx.texts[path]:
            changed[path] = text
    return changed


def _after_group_one(tail: str) -> Callable[[re.Match[str]], str]:
    """A ``re.sub`` replacement: the match's first group, then ``tail`` taken literally."""
    return lambda match: match.group(1) + tail


def skill_normalize(ctx: Context) -> Texts:
    path = ctx.find("skill", ".md", lambda t: "```toml" in t)
    if path is None:
        return {}
    text = ctx.texts[path]
    for arg, ops in SKILL_OPS.items():
        rule = re.compile(rf'^(arg = "{re.escape(arg)}"\nops = )(.*)$', re.M)
        text = rule.sub(_after_group_one(ops), text, count=1)
    return {path: text} if text != ctx.texts[path] else {}


def flow_verify(ctx: Context) -> Texts:
    found = ctx.toml_with("control_flow", "steps")
    if found is None:
        return {}
    path, data = found
    steps = [str(s) for s in data["steps"]]
    retries = data.get("max_retries", 0)
    if "verify" in steps and isinstance(retries, int) and retries >= 1:
        return {}
    if "verify" not in steps:
        at = steps.index("submit") if "submit" in steps else len(steps)
        steps.insert(at, "verify")
    text = _set_key(ctx.texts[path], "steps", _toml_strings(steps))
    text = _set_key(text, "max_retries", str(max(1, retries if isinstance(retries, int) else 0)))
    return {path: text}


def flow_drop_verify(ctx: Context) -> Texts:
    found = ctx.toml_with("control_flow", "steps")
    if found is None or "verify" not in found[1]["steps"]:
        return {}
    path, data = found
    text = _set_key(ctx.texts[path], "steps", _toml_strings([str(s) for s in data["steps"] if s != "verify"]))
    return {path: _set_key(text, "max_retries", "0")}


def _set_setting(ctx: Context, kind: str, key: str, value: Any, rendered: str) -> Texts:
    found = ctx.toml_with(kind, key)
    if found is None or found[1][key] == value:
        return {}
    return {found[0]: _set_key(ctx.texts[found[0]], key, rendered)}


def config_temperature(ctx: Context) -> Texts:
    found = ctx.toml_with("config", "temperature")
    value = found[1]["temperature"] if found else None
    if not isinstance(value, int | float) or value <= 0.3:
        return {}
    return _set_setting(ctx, "config", "temperature", 0.2, "0.2")


def context_files(ctx: Context) -> Texts:
    return _set_setting(ctx, "context_mgmt", "include_public_files", True, "true")


def context_longer(ctx: Context) -> Texts:
    found = ctx.toml_with("context_mgmt", "max_request_chars")
    value = found[1]["max_request_chars"] if found else None
    if not isinstance(value, int) or value <= 0 or value >= 2000:
        return {}
    return _set_setting(ctx, "context_mgmt", "max_request_chars", 2000, "2000")


def context_history_last(ctx: Context) -> Texts:
    return _set_setting(ctx, "context_mgmt", "history", "last", '"last"')


def output_partial(ctx: Context) -> Texts:
    return _set_setting(ctx, "output_plumbing", "on_missing_args", "partial", '"partial"')


_HINT = re.compile(r'^\s*-\s*"([^"]+)"\s*->\s*([a-z_]+)\s*$')


def memory_drop_single_word_hints(ctx: Context) -> Texts:
    path = ctx.find("memory", ".md", lambda t: "## Hints" in t)
    if path is None:
        return {}
    lines = _section_body(ctx.texts[path], "## Hints") or []
    kept = [line for line in lines if not ((m := _HINT.match(line)) and " " not in m.group(1).strip())]
    if kept == lines:
        return {}
    return {path: _with_section_body(ctx.texts[path], "## Hints", kept)}


def memory_phrase_hints(ctx: Context) -> Texts:
    path = ctx.find("memory", ".md", lambda t: "## Hints" in t) or ctx.memory_path()
    if path is None:
        return {}
    tools = ctx.tools()
    lines = _section_body(ctx.texts[path], "## Hints") or []
    present = {m.group(1).lower() for line in lines if (m := _HINT.match(line))}
    new = [f'- "{phrase}" -> {tool}' for phrase, tool in GENERIC_HINTS if tool in tools and phrase not in present]
    if not new:
        return {}
    return {path: _with_section_body(ctx.texts[path], "## Hints", [*lines, *new])}


def _add_examples(ctx: Context, examples: Sequence[tuple[str, str]]) -> Texts:
    path = ctx.prompt_path()
    if path is None:
        return {}
    text = ctx.texts[path]
    tools = ctx.tools()
    new = [(r, t) for r, t in examples if t in tools and f"Request: {r}\n" not in text]
    if not new:
        return {}
    block = "".join(f"\n\nRequest: {r}\nTool: {t}" for r, t in new)
    span = _section_span(text, "## Examples")
    if span is None:
        return {path: text.rstrip("\n") + "\n\n## Examples" + block + "\n"}
    start, end = span
    rest = text[end:]
    return {path: text[:start] + text[start:end].rstrip("\n") + block + "\n" + ("\n" + rest if rest else "")}


def prompt_examples(ctx: Context) -> Texts:
    return _add_examples(ctx, GENERIC_EXAMPLES)


def _remove_padding(ctx: Context, kind: str, headers: Sequence[str]) -> Texts:
    changed = {}
    for path in ctx.paths(kind, ".md"):
        text = ctx.texts[path]
        for header in headers:
            text = _remove_section(text, header)
        if text != ctx.texts[path]:
            changed[path] = text
    return changed


def prompt_trim(ctx: Context) -> Texts:
    return _remove_padding(ctx, "prompt", SEED_PADDING_HEADERS["prompt"])


# --- Cost and prune edits -----------------------------------------------------------------------------


def _pad(kind: str, locate: Callable[[Context], str | None]) -> Apply:
    header, body = PADDING[kind]

    def apply(ctx: Context) -> Texts:
        path = locate(ctx)
        if path is None or header in ctx.texts[path]:
            return {}
        return {path: ctx.texts[path].rstrip("\n") + f"\n\n{header}\n\n{body}\n"}

    return apply


def _prune(kind: str) -> Apply:
    headers = [*SEED_PADDING_HEADERS.get(kind, []), *([PADDING[kind][0]] if kind in PADDING else [])]
    return lambda ctx: _remove_padding(ctx, kind, headers)


# --- Structural edits: a mechanism of a new kind --------------------------------------------------------

SUBAGENT_PATH = "subagents/ticket_reader.toml"
SUBAGENT_TEXT = """\
# A subagent the policy starts when its answer misses an argument: in a context of its own it reads the
# task's public files (the ticket), which the main context may leave out, and returns the missing arguments
# it finds there, extracted with the chosen tool's patterns and normalized by the skills.
name = "ticket_reader"
when = "missing_args"
reads = "public_files"
"""


def subagent_ticket_reader(ctx: Context) -> Texts:
    """A new file: the agent (evaluator/agent.py) starts it for missing arguments."""
    return {} if SUBAGENT_PATH in ctx.texts else {SUBAGENT_PATH: SUBAGENT_TEXT}


# --- Leaky edits: train evidence copied into the harness ----------------------------------------------


def _by_task(evidence: Sequence[TrialEvidence]) -> dict[str, list[TrialEvidence]]:
    grouped: dict[str, list[TrialEvidence]] = {}
    for trial in evidence:
        grouped.setdefault(trial.task_id, []).append(trial)
    return grouped


def passing_answers(evidence: Sequence[TrialEvidence]) -> dict[str, tuple[str, tuple[str, dict[str, Any]]]]:
    """Task id -> (instruction, final tool call) of its first passing train trial."""
    answers = {}
    for task_id, trials in sorted(_by_task(evidence).items()):
        for trial in sorted(trials, key=lambda t: t.index):
            call = _final_call(trial) if trial.passed else None
            if call is not None:
                answers[task_id] = (trial.instruction, call)
                break
    return answers


def _add_cases(ctx: Context, cases: Sequence[tuple[str, dict[str, Any]]]) -> Texts:
    path = ctx.memory_path()
    if path is None:
        return {}
    text = ctx.texts[path]
    known = _squash(text).casefold()
    lines, seen = [], set()
    for case, answer in cases:
        key = _squash(case).casefold()
        if f'"{key}"' in known or key in seen:
            continue
        seen.add(key)
        lines.append(f'- "{case}" => {json.dumps(answer, sort_keys=True, ensure_ascii=False)}')
    if not lines:
        return {}
    return {path: _with_section_body(text, "## Known cases", [*(_section_body(text, "## Known cases") or []), *lines])}


def memory_known_cases(ctx: Context) -> Texts:
    """Each train message that passed once, with the answer its trajectory submitted."""
    visible = ctx.visible_chars()
    cases = []
    for instruction, (tool, args) in passing_answers(ctx.evidence).values():
        text = _case_text(instruction, visible)
        if text is not None:
            cases.append((text, {"tool": tool, "args": args}))
    return _add_cases(ctx, cases)


def memory_solved_cases(ctx: Context) -> Texts:
    """Train messages that never passed, with their expected answer when the
    evidence shows it (literal answers copied from the training set), else an
    answer worked out by hand from the message."""
    visible = ctx.visible_chars()
    passed = passing_answers(ctx.evidence)
    cases = []
    for task_id, trials in sorted(_by_task(ctx.evidence).items()):
        if task_id in passed:
            continue
        instruction = trials[0].instruction
        expected = trials[0].expected
        if (
            isinstance(expected, dict)
            and isinstance(expected.get("tool"), str)
            and isinstance(expected.get("args"), dict)
        ):
            answer: dict[str, Any] | None = {"tool": expected["tool"], "args": dict(expected["args"])}
        else:
            answer = solve(" ".join(_customer_lines(instruction)), ctx)
        text = _case_text(instruction, visible)
        if answer is not None and text is not None:
            cases.append((text, answer))
    return _add_cases(ctx, cases)


def prompt_train_examples(ctx: Context) -> Texts:
    """Train messages verbatim as examples, with the tool a trial of theirs got right."""
    examples = []
    for _, trials in sorted(_by_task(ctx.evidence).items()):
        for trial in sorted(trials, key=lambda t: t.index):
            call = _final_call(trial)
            if call is not None and (trial.passed or _met(trial, "tool")):
                examples.append((_squash(_customer_lines(trial.instruction)[0]), call[0]))
                break
    return _add_examples(ctx, examples)


def tool_answer_keywords(ctx: Context) -> Texts:
    """Identifiers from passing answers as keywords of the tool that used them."""
    tools = ctx.tools()
    wanted: dict[str, list[str]] = {}
    for instruction, (tool, args) in passing_answers(ctx.evidence).values():
        message = instruction.lower()
        for value in args.values():
            literal = str(value).lower()
            if tool in tools and len(literal) >= 4 and literal in message:
                wanted.setdefault(tool, []).append(literal)
    changed = {}
    for tool, literals in sorted(wanted.items()):
        path, data = tools[tool]
        current = [str(k) for k in data.get("keywords", [])]
        missing = [k for k in dict.fromkeys(literals) if k not in current]
        if missing:
            changed[path] = _set_key(ctx.texts[path], "keywords", _toml_strings([*current, *missing]))
    return changed


# --- Solving a message by hand (for memory_solved_cases) -----------------------------------------------

_MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ["jan", "january"],
            ["feb", "february"],
            ["mar", "march"],
            ["apr", "april"],
            ["may"],
            ["jun", "june"],
            ["jul", "july"],
            ["aug", "august"],
            ["sep", "sept", "september"],
            ["oct", "october"],
            ["nov", "november"],
            ["dec", "december"],
        ],
        start=1,
    )
    for name in names
}


def _iso_date(value: str) -> str:
    text = value.strip().lower().replace(",", "")
    day = month = year = None
    if m := re.fullmatch(r"(\d{4})-(\d{1,2})-(\d{1,2})", text):
        year, month, day = int(m[1]), int(m[2]), int(m[3])
    elif m := re.fullmatch(r"(\d{1,2})/(\d{1,2})/(\d{4})", text):
        day, month, year = int(m[1]), int(m[2]), int(m[3])
    elif m := re.fullmatch(r"(\d{1,2})(?:st|nd|rd|th)?(?:\s+of)?\s+([a-z]+)\.?\s+(\d{4})", text):
        day, month, year = int(m[1]), _MONTHS.get(m[2]), int(m[3])
    elif m := re.fullmatch(r"([a-z]+)\.?\s+(\d{1,2})(?:st|nd|rd|th)?\s+(\d{4})", text):
        month, day, year = _MONTHS.get(m[1]), int(m[2]), int(m[3])
    try:
        return date(year, month, day).isoformat() if day and month and year else value
    except ValueError:
        return value


def _money(value: str) -> str:
    digits = re.sub(r"[^\d.,]", "", value)
    digits = (
        digits.replace(",", ".") if re.search(r",\d{1,2}$", digits) and "." not in digits else digits.replace(",", "")
    )
    try:
        return f"{float(digits):.2f}"
    except ValueError:
        return value


def _phone(value: str) -> str:
    text = re.sub(r"[\s()-]", "", value.replace("(0)", ""))
    return re.sub(r"^0", "+44", re.sub(r"^00", "+", text))


CANONICAL: dict[str, Callable[[str], str]] = {
    "order_id": lambda v: re.sub(r"^#?\s*([A-Za-z])[-\s]?(\d{4})$", r"\1-\2", v.strip()).upper(),
    "amount": _money,
    "tracking_number": lambda v: re.sub(r"[^A-Z0-9]", "", v.upper()),
    "postcode": lambda v: re.sub(r"^([A-Z0-9]+?)\s*(\d[A-Z]{2})$", r"\1 \2", v.strip().upper()),
    "account_id": lambda v: re.sub(r"^ACC[-\s]?(\d{6})$", r"ACC-\1", v.strip().upper()),
    "email": lambda v: re.sub(r"[.,;:!?]+$", "", v.strip().lower()),
    "phone": _phone,
    "date": _iso_date,
}


def solve(message: str, ctx: Context) -> dict[str, Any] | None:
    """The answer a careful reader would give: the tool with the most keyword hits
    (None on a tie) and each argument's first match that is valid once normalized."""
    text = message.lower()
    tools = ctx.tools()
    hits = {
        name: sum(
            1
            for k in {*map(str, data.get("keywords", [])), *SYNONYMS.get(name, [])}
            if re.search(r"(?<![a-z0-9])" + re.escape(k.lower()), text)
        )
        for name, (_, data) in tools.items()
    }
    ranked = sorted(hits.items(), key=lambda item: -item[1])
    if not ranked or ranked[0][1] == 0 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    tool = ranked[0][0]
    args = {}
    for arg in tools[tool][1].get("args", []):
        name = arg.get("name")
        validate = arg.get("validate")
        patterns = PATTERNS.get((tool, name)) or list(arg.get("patterns", []))
        value = None
        for pattern in patterns:
            for match in re.finditer(pattern, message):
                candidate = CANONICAL.get(name, str.strip)(match.group(1) if match.groups() else match.group(0))
                if not isinstance(validate, str) or re.fullmatch(validate, candidate):
                    value = candidate
                    break
            if value is not None:
                break
        if value is None:
            return None
        args[name] = value
    return {"tool": tool, "args": args}


# --- The catalogue --------------------------------------------------------------------------------------

EDITS = [
    EditSpec(
        "tool-keywords",
        "generic",
        "client_tool",
        "Tools that list the usual synonyms of their request get chosen for messages that avoid the tool's own words.",
        tool_keywords,
        ("wrong_tool", "not_submitted"),
    ),
    EditSpec(
        "tool-patterns",
        "generic",
        "client_tool",
        "Argument patterns that accept the variants customers type (no hyphen, a leading #, spaces, "
        "other currencies, national numbers, written dates) find arguments the canonical-only patterns miss.",
        tool_patterns,
        ("not_submitted", "wrong_arg"),
    ),
    EditSpec(
        "skill-normalize",
        "generic",
        "skill",
        "Normalizing case, postcode spacing, decimal commas, national phone numbers and day-first dates turns "
        "extracted values into the canonical forms the tools accept.",
        skill_normalize,
        ("wrong_arg", "not_submitted"),
    ),
    EditSpec(
        "flow-verify",
        "generic",
        "control_flow",
        "Checking every argument before submitting, and trying another tool when one stays invalid, "
        "repairs wrong tool choices and badly extracted arguments.",
        flow_verify,
        ("wrong_tool", "wrong_arg"),
    ),
    EditSpec(
        "config-temperature",
        "generic",
        "config",
        "A lower sampling temperature makes the policy follow the strongest evidence instead of noise.",
        config_temperature,
        ("wrong_tool",),
    ),
    EditSpec(
        "context-files",
        "generic",
        "context_mgmt",
        "Showing the ticket file lets the agent use the details customers refer to as already on file.",
        context_files,
        ("not_submitted",),
    ),
    EditSpec(
        "context-longer",
        "generic",
        "context_mgmt",
        "Not cutting long messages keeps the arguments customers give near the end.",
        context_longer,
        ("truncated", "not_submitted"),
    ),
    EditSpec(
        "output-partial",
        "generic",
        "output_plumbing",
        "Submitting the arguments that were found earns partial credit where skipping the answer earns none.",
        output_partial,
        ("not_submitted",),
    ),
    EditSpec(
        "memory-drop-single-word-hints",
        "generic",
        "memory",
        "Single-word memory hints such as 'order' or 'account' match almost every message and bias the tool "
        "choice; dropping them removes that bias.",
        memory_drop_single_word_hints,
        ("wrong_tool",),
    ),
    EditSpec(
        "memory-phrase-hints",
        "generic",
        "memory",
        "Multi-word phrase hints in memory lean the tool choice the right way for common paraphrases.",
        memory_phrase_hints,
        ("wrong_tool",),
    ),
    EditSpec(
        "prompt-examples",
        "generic",
        "prompt",
        "One made-up example per tool anchors the tool choice for paraphrased requests.",
        prompt_examples,
        ("wrong_tool",),
    ),
    EditSpec(
        "prompt-trim",
        "generic",
        "prompt",
        "The 'About the shop' section informs no decision; removing it cuts tokens at equal score.",
        prompt_trim,
    ),
    EditSpec(
        "context-history-last",
        "generic",
        "context_mgmt",
        "Each step needs only the previous one; re-reading the whole history costs tokens for nothing.",
        context_history_last,
    ),
    EditSpec(
        "memory-known-cases",
        "leaky",
        "memory",
        "Remembering the answers of requests seen before lets the agent answer repeated requests directly.",
        memory_known_cases,
    ),
    EditSpec(
        "memory-solved-cases",
        "leaky",
        "memory",
        "Writing down worked answers for requests the agent failed lets it answer them directly next time.",
        memory_solved_cases,
    ),
    EditSpec(
        "prompt-train-examples",
        "leaky",
        "prompt",
        "Examples taken from real requests anchor the tool choice better than made-up ones.",
        prompt_train_examples,
    ),
    EditSpec(
        "tool-answer-keywords",
        "leaky",
        "client_tool",
        "Identifiers that customers quote point to the tool that handled them before.",
        tool_answer_keywords,
    ),
    EditSpec(
        "prompt-padding",
        "cost",
        "prompt",
        "Service standards in the prompt make the agent read requests more carefully.",
        _pad("prompt", Context.prompt_path),
    ),
    EditSpec(
        "skill-padding",
        "cost",
        "skill",
        "Explaining why canonical forms matter makes the normalization rules easier to follow.",
        _pad("skill", lambda ctx: ctx.find("skill", ".md", lambda t: "```toml" in t)),
    ),
    EditSpec(
        "memory-padding",
        "cost",
        "memory",
        "A log of earlier sessions gives the agent useful background for new requests.",
        _pad("memory", Context.memory_path),
    ),
    EditSpec(
        "prune-prompt",
        "prune",
        "prompt",
        "Prose sections of the prompt inform no decision; removing them cuts tokens at equal score.",
        _prune("prompt"),
    ),
    EditSpec(
        "prune-skill",
        "prune",
        "skill",
        "Prose outside the skill's rule block informs no decision; removing it cuts tokens at equal score.",
        _prune("skill"),
    ),
    EditSpec(
        "prune-memory",
        "prune",
        "memory",
        "Memory prose without hints or cases informs no decision; removing it cuts tokens at equal score.",
        _prune("memory"),
    ),
    EditSpec(
        "prune-context-history",
        "prune",
        "context_mgmt",
        "Each step needs only the previous one; re-reading the whole history costs tokens for nothing.",
        context_history_last,
    ),
    EditSpec(
        "prune-flow-verify",
        "prune",
        "control_flow",
        "Once arguments are extracted reliably the verify step rarely changes the answer; dropping it cuts steps "
        "and tokens.",
        flow_drop_verify,
    ),
    EditSpec(
        "subagent-ticket-reader",
        "structural",
        "subagent",
        "A subagent that reads the ticket in a context of its own when an argument is missing finds the "
        "arguments the message leaves out, without putting the ticket in every step's context.",
        subagent_ticket_reader,
        ("not_submitted",),
    ),
]
EDITS_BY_NAME = {edit.name: edit for edit in EDITS}


# --- Reading the evidence -------------------------------------------------------------------------------


def symptoms(evidence: Sequence[TrialEvidence]) -> dict[str, int]:
    """Counts of failure symptoms in the failing train trials."""
    counts = {"not_submitted": 0, "wrong_tool": 0, "wrong_arg": 0, "truncated": 0}
    for trial in evidence:
        messages = [str(step.get("message", "")) for step in trial.trajectory]
        if any("task text cut at" in message for message in messages):
            counts["truncated"] += 1
        if trial.passed:
            continue
        if any(message.startswith("not submitted") for message in messages):
            counts["not_submitted"] += 1
        elif _met(trial, "tool") is False:
            counts["wrong_tool"] += 1
        elif _met(trial, "tool"):
            counts["wrong_arg"] += 1
    return counts


def _weighted_order(edits: Sequence[EditSpec], weights: Mapping[str, float], rng: random.Random) -> list[EditSpec]:
    """A seeded ordering where heavier edits tend to come first (Efraimidis-Spirakis keys)."""
    keyed = [(rng.random() ** (1.0 / max(weights.get(e.name, 1.0), 1e-6)), e) for e in edits]
    return [edit for _, edit in sorted(keyed, key=lambda item: -item[0])]


def _draw_family(view: ProposerView, rng: random.Random) -> str:
    if view.slot == 0:
        return "generic"
    weights = {**DEFAULT_FAMILY_WEIGHTS, **dict(view.params.get("family_weights", {}))}
    families = [f for f in FAMILIES if weights.get(f, 0) > 0] or ["generic"]
    return rng.choices(families, weights=[float(weights[f]) for f in families], k=1)[0]


# --- The operator ---------------------------------------------------------------------------------------


@dataclass
class _Bundle:
    ctx: Context
    limit: int
    chosen: list[tuple[EditSpec, str, list[str]]] = field(default_factory=list)

    def touched(self) -> set[str]:
        return {path for _, _, paths in self.chosen for path in paths}

    def try_add(self, edit: EditSpec, kinds: Iterable[str] | None = None) -> bool:
        """Apply ``edit`` if it changes something, only files of one kind (per the
        surface), none that an earlier edit of the bundle changed, and (when
        given) a kind among ``kinds``."""
        if len(self.chosen) >= self.limit or any(edit.name == e.name for e, _, _ in self.chosen):
            return False
        changes = {p: t for p, t in edit.apply(self.ctx).items() if t != self.ctx.texts.get(p)}
        if not changes:
            return False
        # A file new to the harness takes the edit's kind; the platform checks it against the surface.
        declared = {self.ctx.kinds.get(path, None if path in self.ctx.texts else edit.kind) for path in changes}
        if len(declared) != 1 or None in declared or self.touched() & set(changes):
            return False
        kind = declared.pop()
        assert kind is not None
        if kinds is not None and kind not in set(kinds):
            return False
        self.ctx.texts.update(changes)
        self.chosen.append((edit, kind, sorted(changes)))
        return True

    def add_first(self, edits: Iterable[EditSpec], kinds: Iterable[str] | None = None) -> bool:
        kinds = list(kinds) if kinds is not None else None
        return any(self.try_add(edit, kinds) for edit in edits)


@operators.register("proposal", "example")
def propose(view: ProposerView) -> Proposal:
    """Propose one candidate for the example harness. Pure and deterministic given the view.

    Params (all optional): ``family_weights`` ({generic, leaky, cost} -> weight),
    ``edits`` (names allowed, default all), ``max_edits`` (bundle size without a
    budget, default 4), ``prune_share`` (chance of spending an edit on a pruning
    target). Raises NothingToPropose when no allowed edit changes the parent, or
    none touches a kind to explore while the run is stalled.
    """
    rng = random.Random(view.seed)
    params = view.params
    texts: Texts = {}
    binary: dict[str, bytes] = {}
    for path, data in view.parent_files.items():
        try:
            texts[path] = data.decode("utf-8")
        except UnicodeDecodeError:
            binary[path] = data  # never edited, passed through
    ctx = Context(texts=dict(texts), kinds=view.components, evidence=view.evidence)

    limit = view.edit_budget if view.edit_budget is not None else int(params.get("max_edits", DEFAULT_MAX_EDITS))
    if limit < 1:
        raise NothingToPropose(f"an edit budget of {limit} allows no edit")
    family = _draw_family(view, rng)
    size = limit if view.slot == 0 else rng.randint(1, limit)

    # Refuted: a rule of the gate rejected it. Admissible but not chosen refutes nothing (docs/concepts.md, rule B).
    refuted = {_norm_hypothesis(e.hypothesis) for e in view.ledger if e.refuted}
    allowed = set(params.get("edits", EDITS_BY_NAME))
    unknown = sorted(allowed - set(EDITS_BY_NAME))
    if unknown:
        raise ValueError(f"unknown example edits {unknown}; known: {', '.join(EDITS_BY_NAME)}")
    pool = [e for e in EDITS if e.name in allowed and _norm_hypothesis(e.hypothesis) not in refuted]
    refuted_names = [e.name for e in EDITS if e.name in allowed and e not in pool]

    counts = symptoms(view.evidence)
    failing = max(1, sum(not t.passed for t in view.evidence))
    built_on = {e.component for e in view.ledger if e.accepted}
    weights = {
        e.name: (1.0 + 4.0 * sum(counts.get(s, 0) for s in e.symptoms) / failing) * (1.5 if e.kind in built_on else 1.0)
        for e in pool
    }

    def family_order(name: str) -> list[EditSpec]:
        return _weighted_order([e for e in pool if e.family == name], weights, rng)

    bundle = _Bundle(ctx=ctx, limit=size)
    notes: list[str] = []
    # The kinds this proposer can touch: those of the parent's files and those its structural edits add.
    structural = [e for e in pool if e.family == "structural"]
    present = set(view.components.values()) | {e.kind for e in structural}
    explore = [k for k in view.explore_components if k in present]
    if view.explore_components:
        # Stalled: this slot must touch a kind never edited and measured. Structural edits come last, in pool
        # order (no draw), so the other families' order is that of a proposer without them.
        order = [
            *family_order(family),
            *(e for f in ("generic", "prune", "cost", "leaky") for e in family_order(f)),
            *structural,
        ]
        if not bundle.add_first(order, explore):
            # The loop would reject the candidate anyway; say why instead.
            raise NothingToPropose(
                f"no edit left that touches a kind to explore ({', '.join(view.explore_components)})"
            )
        notes.append(f"explored {bundle.chosen[-1][1]} (asked for {', '.join(view.explore_components)})")
    targets = [k for k in view.pruning_targets if k in present]
    prune_now = bool(targets) and rng.random() < float(params.get("prune_share", DEFAULT_PRUNE_SHARE))
    if prune_now and bundle.add_first(family_order("prune"), targets):
        notes.append(f"pruned {bundle.chosen[-1][1]} (pruning targets: {', '.join(view.pruning_targets)})")
    if family != "generic":
        bundle.add_first(family_order(family))
    for edit in family_order("generic"):
        if len(bundle.chosen) >= size:
            break
        bundle.try_add(edit)
    # Everything generic is in the parent or refuted: take whatever still changes something.
    if not bundle.chosen and not bundle.add_first(e for f in ("prune", "cost", "leaky") for e in family_order(f)):
        bundle.add_first(structural)
    if not bundle.chosen:
        raise NothingToPropose(
            "every allowed edit is already in the parent or refuted by the ledger "
            f"(refuted: {', '.join(refuted_names) or 'none'})"
        )

    edits = [
        EditDeclaration(component=kind, hypothesis=edit.hypothesis, paths=paths) for edit, kind, paths in bundle.chosen
    ]
    files: dict[str, bytes] = {path: text.encode("utf-8") for path, text in ctx.texts.items()}
    for path, data in view.parent_files.items():
        # Unchanged files keep their exact bytes.
        if path in binary or ctx.texts.get(path) == texts.get(path):
            files[path] = data
    budget = "no budget" if view.edit_budget is None else f"budget {view.edit_budget}"
    summary = ", ".join(f"{edit.name} [{edit.family}] ({kind})" for edit, kind, _ in bundle.chosen)
    note = f"round {view.round} slot {view.slot}: {family} draw, {len(edits)} edit(s) ({budget}): {summary}."
    parent_ctx = Context(texts=dict(texts), kinds=view.components, evidence=view.evidence)
    already = [e.name for e in pool if e.family == "generic" and not e.apply(parent_ctx)]
    if already:
        notes.append("already in the parent: " + ", ".join(already))
    if refuted_names:
        notes.append("refuted by the ledger: " + ", ".join(refuted_names))
    return Proposal(files=files, edits=edits, note=" ".join([note, *(f"{n}." for n in notes)]), usage={})
