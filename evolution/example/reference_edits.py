"""Reference edits of the example harness: what good, leaky and wasteful edits look like.

Each edit rewrites files of a *copy* of the seed harness (``harness/``). They
document the design of the example (which improvements exist, in which
component kind), give tests something real to measure, and are a yardstick
for the offline proposer and the leakage critic:

- ``generic``: a benchmark-independent improvement; it should raise the
  score on train, gate and sealed alike (or cut cost at equal score);
- ``leaky``: copies task-specific strings (messages, names, ids, answers)
  from train tasks into the harness; it raises the train score only;
- ``cost``: adds tokens and changes nothing else;
- ``breaking``: a plumbing mistake that makes every output invalid.

Edits assert that the text they replace is present, so they fail loudly
when the seed harness changes under them. Pure file edits; no Django.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolution.splits import assign_by_ratio, strata_of

SETTINGS_PATH = Path(__file__).resolve().parent / "evaluator.toml"

Tasks = Sequence[dict[str, Any]]


@dataclass(frozen=True)
class ReferenceEdit:
    name: str
    component: str
    category: str  # generic | leaky | cost | breaking
    hypothesis: str
    apply: Callable[[Path, Tasks], None]


def split_tasks(tasks: Tasks) -> dict[str, list[dict[str, Any]]]:
    """Tasks by split, with the default seed, ratios and stratification of ``evaluator.toml`` (as the
    platform cuts them: ``services.experiments.splits_assign``)."""
    settings = tomllib.loads(SETTINGS_PATH.read_text(encoding="utf-8"))["splits"]
    stratify_by = settings.get("stratify_by")
    strata = strata_of({t["id"]: t.get("metadata") or {} for t in tasks}, stratify_by) if stratify_by else None
    assignment = assign_by_ratio(
        [t["id"] for t in tasks], seed=settings["seed"], ratios=settings["ratios"], strata=strata
    )
    return {name: [t for t in tasks if assignment[t["id"]] == name] for name in ("train", "gate", "sealed")}


def customer_message(task: dict[str, Any]) -> str:
    """The quoted customer message of a task's instruction."""
    return " ".join(line[2:] for line in task["instruction"].splitlines() if line.startswith("> "))


def _replace(root: Path, path: str, old: str, new: str) -> None:
    file = root / path
    text = file.read_text(encoding="utf-8")
    if old not in text:
        raise ValueError(f"{path}: the text to replace is not there: {old!r}")
    file.write_text(text.replace(old, new, 1), encoding="utf-8")


def _set_list(root: Path, path: str, key: str, values: Sequence[str], *, literal: bool = False) -> None:
    """Replace the one-line TOML array ``key = [...]`` (the first occurrence after any earlier edits)."""
    file = root / path
    text = file.read_text(encoding="utf-8")
    quote = "'" if literal else '"'
    rendered = f"{key} = [" + ", ".join(f"{quote}{v}{quote}" for v in values) + "]"
    new, count = re.subn(rf"^{re.escape(key)} = \[.*\]$", lambda _: rendered, text, count=1, flags=re.M)
    if count != 1:
        raise ValueError(f"{path}: no `{key} = [...]` line")
    file.write_text(new, encoding="utf-8")


def _set_arg_patterns(root: Path, tool: str, arg: str, patterns: Sequence[str]) -> None:
    file = root / "tools" / f"{tool}.toml"
    text = file.read_text(encoding="utf-8")
    rendered = "patterns = [" + ", ".join(f"'{p}'" for p in patterns) + "]"
    block = re.compile(rf'(name = "{re.escape(arg)}"\n)patterns = \[.*\]$', re.M)
    new, count = block.subn(lambda m: m.group(1) + rendered, text, count=1)
    if count != 1:
        raise ValueError(f"tools/{tool}.toml: no patterns line for {arg}")
    file.write_text(new, encoding="utf-8")


# --- generic ---------------------------------------------------------------------------------------

KEYWORDS = {
    "refund_order": ["refund", "money back", "reimburse", "pay back", "charged twice", "repay"],
    "track_shipment": [
        "track",
        "where is my",
        "hasn't arrived",
        "not arrived",
        "parcel",
        "package",
        "courier",
        "stuck",
    ],
    "change_address": ["address", "moved", "redirect", "postcode", "new place", "deliver to"],
    "cancel_subscription": ["cancel", "subscription", "unsubscribe", "membership", "stop billing", "no longer want"],
    "reset_password": ["password", "log in", "login", "locked out", "sign in", "reset link"],
    "book_callback": ["call me", "callback", "call back", "ring me", "phone me", "speak to", "talk to"],
    "update_payment": ["card", "payment", "expired", "replacement", "how i pay", "visa", "mastercard"],
}


def tool_keywords(root: Path, tasks: Tasks) -> None:
    for tool, keywords in KEYWORDS.items():
        _set_list(root, f"tools/{tool}.toml", "keywords", keywords)


MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
ORDER = [r"(?i)(?<![\w-])#?([A-Z]-?\d{4})\b"]
PATTERNS = {
    ("refund_order", "order_id"): ORDER,
    ("refund_order", "amount"): [
        r"(?i)(?:[$€£]|\b(?:USD|EUR|GBP)\b)\s?(\d+(?:[.,]\d{1,2})?)",
        r"(?i)(\d+(?:[.,]\d{1,2})?)\s?(?:USD|EUR|GBP|dollars|euros|pounds)\b",
    ],
    ("track_shipment", "tracking_number"): [r"(?i)\b(TRK[-\s]?\d{3}\s?\d{3}\s?\d{3})\b"],
    ("change_address", "order_id"): ORDER,
    ("cancel_subscription", "account_id"): [r"(?i)\b(ACC[-\s]?\d{6})\b"],
    ("reset_password", "email"): [r"([\w.+-]+@[\w-]+(?:\.[\w-]+)+)"],
    ("book_callback", "phone"): [r"((?:\+|\b0)[\d\s()-]{9,16}\d)"],
    ("book_callback", "date"): [
        r"(\d{4}-\d{2}-\d{2})",
        r"(\d{1,2}/\d{1,2}/\d{4})",
        rf"(?i)(\d{{1,2}}(?:st|nd|rd|th)?(?:\s+of)?\s+{MONTH},?\s+\d{{4}})",
        rf"(?i)({MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}})",
    ],
    ("update_payment", "card_last4"): [
        r"(?i)(?:ending(?: in)?|ends in|last four(?: digits)?|\*{4}|x{4})[\s*x-]*(\d{4})\b"
    ],
}


def tool_patterns(root: Path, tasks: Tasks) -> None:
    for (tool, arg), patterns in PATTERNS.items():
        _set_arg_patterns(root, tool, arg, patterns)


def skill_normalize(root: Path, tasks: Tasks) -> None:
    path = "skills/normalize.md"
    _replace(root, path, '{ op = "money", decimal_comma = false }', '{ op = "money", decimal_comma = true }')
    _replace(
        root,
        path,
        'arg = "postcode"\nops = [{ op = "upper" }]',
        'arg = "postcode"\nops = [{ op = "upper" }, { op = "regex_sub", pattern = \'^([A-Z0-9]+?)\\s*(\\d[A-Z]{2})$\', '
        "repl = '\\1 \\2' }]",
    )
    _replace(
        root,
        path,
        'arg = "email"\nops = [{ op = "strip" }]',
        'arg = "email"\nops = [{ op = "strip" }, { op = "lower" }, { op = "regex_sub", pattern = \'[.,;:!?]+$\', '
        "repl = '' }]",
    )
    _replace(
        root,
        path,
        "ops = [{ op = \"regex_sub\", pattern = '[\\s-]', repl = '' }]",
        "ops = [{ op = \"regex_sub\", pattern = '\\(0\\)', repl = '' }, "
        "{ op = \"regex_sub\", pattern = '[\\s()-]', repl = '' }, "
        "{ op = \"regex_sub\", pattern = '^00', repl = '+' }, { op = \"regex_sub\", pattern = '^0', repl = '+44' }]",
    )
    _replace(root, path, '{ op = "date_iso", day_first = false }', '{ op = "date_iso", day_first = true }')


def flow_verify(root: Path, tasks: Tasks) -> None:
    _replace(
        root,
        "control/flow.toml",
        'steps = ["classify", "extract", "submit"]',
        'steps = ["classify", "extract", "verify", "submit"]',
    )
    _replace(root, "control/flow.toml", "max_retries = 0", "max_retries = 1")


def config_temperature(root: Path, tasks: Tasks) -> None:
    _replace(root, "config.toml", "temperature = 0.9", "temperature = 0.2")


def context_files(root: Path, tasks: Tasks) -> None:
    _replace(root, "context/window.toml", "include_public_files = false", "include_public_files = true")


def context_longer(root: Path, tasks: Tasks) -> None:
    _replace(root, "context/window.toml", "max_request_chars = 320", "max_request_chars = 2000")


def context_history_last(root: Path, tasks: Tasks) -> None:
    _replace(root, "context/window.toml", 'history = "full"', 'history = "last"')


def output_partial(root: Path, tasks: Tasks) -> None:
    _replace(root, "output/format.toml", 'on_missing_args = "skip"', 'on_missing_args = "partial"')


def memory_drop_stale_hint(root: Path, tasks: Tasks) -> None:
    _replace(root, "memory/notes.md", '- "order" -> refund_order\n- "account" -> cancel_subscription\n', "(none)\n")


GENERIC_EXAMPLES = [
    ("I want my money back for an order that arrived broken.", "refund_order"),
    ("My package still hasn't arrived, where is it?", "track_shipment"),
    ("I moved house, please send my order to the new postcode.", "change_address"),
    ("Please stop billing me and end my membership.", "cancel_subscription"),
    ("I can't log in to my account, please send a reset link.", "reset_password"),
    ("Please ring me tomorrow, I'd like to speak to someone.", "book_callback"),
    ("My card expired, please use my new card for payments.", "update_payment"),
]


def _add_examples(root: Path, examples: Sequence[tuple[str, str]]) -> None:
    file = root / "prompts" / "system.md"
    text = file.read_text(encoding="utf-8").rstrip("\n")
    file.write_text(text + "".join(f"\n\nRequest: {r}\nTool: {t}" for r, t in examples) + "\n", encoding="utf-8")


def prompt_examples(root: Path, tasks: Tasks) -> None:
    _add_examples(root, GENERIC_EXAMPLES)


ABOUT = re.compile(r"## About the shop\n.*?\n\n(?=## )", re.DOTALL)


def prompt_trim(root: Path, tasks: Tasks) -> None:
    file = root / "prompts" / "system.md"
    text, count = ABOUT.subn("", file.read_text(encoding="utf-8"))
    if count != 1:
        raise ValueError("prompts/system.md: no 'About the shop' section")
    file.write_text(text, encoding="utf-8")


# --- leaky -----------------------------------------------------------------------------------------


def memory_known_cases(root: Path, tasks: Tasks) -> None:
    """Store each train task's message with its expected answer: pure memorization."""
    lines = [
        f'- "{customer_message(t).replace(chr(34), chr(39))}" => {json.dumps(t["expected"], sort_keys=True)}'
        for t in split_tasks(tasks)["train"]
    ]
    _replace(root, "memory/notes.md", "## Known cases\n\n(none)\n", "## Known cases\n\n" + "\n".join(lines) + "\n")


def prompt_train_examples(root: Path, tasks: Tasks) -> None:
    """Copy train messages into the prompt as examples (tool only, but keyed to the benchmark)."""
    _add_examples(root, [(customer_message(t), t["expected"]["tool"]) for t in split_tasks(tasks)["train"]])


# --- cost and breaking -----------------------------------------------------------------------------

PADDING = (
    """
## Service standards

Always be courteous and professional. Read every message carefully and completely before acting, and
consider what the customer is really asking for. Think about the context of the request, the tone of the
message and the history of the relationship between the customer and the shop. Remember that customers may
be stressed or in a hurry, and that a calm and accurate answer is worth more than a fast one. Double-check
your work, take your time, and make sure that every detail is right before you submit. Keep in mind that the
shop values accuracy, empathy, clarity, honesty, reliability, consistency, fairness and respect. Treat
every customer as you would like to be treated yourself, and always do your very best for them.
"""
    * 3
)


def prompt_padding(root: Path, tasks: Tasks) -> None:
    file = root / "prompts" / "system.md"
    file.write_text(file.read_text(encoding="utf-8") + PADDING, encoding="utf-8")


def output_wrong_key(root: Path, tasks: Tasks) -> None:
    _replace(root, "output/format.toml", 'args_key = "args"', 'args_key = "arguments"')


EDITS = {
    edit.name: edit
    for edit in [
        ReferenceEdit(
            "tool-keywords",
            "client_tool",
            "generic",
            "Synonym keywords let the policy recognise requests that avoid the tool's own words.",
            tool_keywords,
        ),
        ReferenceEdit(
            "tool-patterns",
            "client_tool",
            "generic",
            "Argument patterns that accept common written variants find arguments the narrow ones miss.",
            tool_patterns,
        ),
        ReferenceEdit(
            "skill-normalize",
            "skill",
            "generic",
            "Normalizing case, spacing, decimal commas, national phone numbers and day-first dates turns "
            "extracted values into the canonical forms tools accept.",
            skill_normalize,
        ),
        ReferenceEdit(
            "flow-verify",
            "control_flow",
            "generic",
            "Checking arguments before submitting and retrying with another tool repairs wrong tool choices.",
            flow_verify,
        ),
        ReferenceEdit(
            "config-temperature",
            "config",
            "generic",
            "A lower temperature makes the policy follow the strongest evidence more often.",
            config_temperature,
        ),
        ReferenceEdit(
            "context-files",
            "context_mgmt",
            "generic",
            "Showing the ticket file lets the agent use values the customer refers to as 'on file'.",
            context_files,
        ),
        ReferenceEdit(
            "context-longer",
            "context_mgmt",
            "generic",
            "Not cutting long messages keeps arguments that come late in the text.",
            context_longer,
        ),
        ReferenceEdit(
            "output-partial",
            "output_plumbing",
            "generic",
            "Submitting the arguments that were found earns partial credit instead of none.",
            output_partial,
        ),
        ReferenceEdit(
            "memory-drop-stale-hint",
            "memory",
            "generic",
            "The stale hints send every message mentioning an order towards refunds and every one "
            "mentioning an account towards cancellation; dropping them removes that bias.",
            memory_drop_stale_hint,
        ),
        ReferenceEdit(
            "prompt-examples",
            "prompt",
            "generic",
            "A few made-up examples per tool anchor the tool choice for paraphrased requests.",
            prompt_examples,
        ),
        ReferenceEdit(
            "prompt-trim",
            "prompt",
            "generic",
            "The 'About the shop' section informs no decision; removing it cuts tokens at equal score.",
            prompt_trim,
        ),
        ReferenceEdit(
            "context-history-last",
            "context_mgmt",
            "generic",
            "Each step needs only the previous one; re-reading the whole history costs tokens for nothing.",
            context_history_last,
        ),
        ReferenceEdit(
            "memory-known-cases",
            "memory",
            "leaky",
            "Remembering solved cases answers repeated requests directly.",
            memory_known_cases,
        ),
        ReferenceEdit(
            "prompt-train-examples",
            "prompt",
            "leaky",
            "Examples taken from real requests anchor the tool choice.",
            prompt_train_examples,
        ),
        ReferenceEdit(
            "prompt-padding",
            "prompt",
            "cost",
            "Service standards in the prompt make the agent more careful.",
            prompt_padding,
        ),
        ReferenceEdit(
            "output-wrong-key",
            "output_plumbing",
            "breaking",
            "'arguments' is the more common field name for tool calls.",
            output_wrong_key,
        ),
    ]
}
GENERIC = [name for name, edit in EDITS.items() if edit.category == "generic"]


def apply(name: str, root: Path, *, tasks: Tasks = ()) -> ReferenceEdit:
    """Apply one reference edit (or ``all-generic``) to the harness copy at ``root``."""
    if name == "all-generic":
        for generic in GENERIC:
            EDITS[generic].apply(root, tasks)
        return EDITS[GENERIC[-1]]
    edit = EDITS[name]
    edit.apply(root, tasks)
    return edit
