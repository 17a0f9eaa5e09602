"""The reasoning-gym benchmark's offline proposer: seeded edits of the scripted solver's harness.

A stand-in for a model-driven proposer that needs no network. It reads the proposer view only (the
parent's files, the parent's train trials with their expected data, the ledger) and proposes one atomic
edit per candidate, from four families:

- ``generic``: a solver procedure for a family of questions (a skill that extracts the operands from any
  question of the generator and names the primitive operation that answers it), or a fix of a seed skill
  (ignore case when counting a letter, the other spelling of an arithmetic question);
- ``memorize``: a table of the train questions' answers in memory, keyed by a fingerprint of the question
  (no question text in the diff, though the rules critic still matches the answers, which are the tasks'
  expected values; a fresh seed's question has another fingerprint, so it cannot transfer);
- ``leaky``: train questions and their answers pasted verbatim into the prompt as worked examples;
- ``cost``: padding in the prompt that changes no answer;
- ``structural``: a mechanism of a kind the seed harness does not have (a subagent that evaluates the
  arithmetic in a question no skill answers). Weight 0 by default, so never drawn: it comes after every
  other edit, first only when a stalled run asks for a kind never tried (``view.explore_components``).

Which family a slot draws is ``random.Random(view.seed)`` over ``params["family_weights"]``. Whether an
edit helps is not decided here: the agent runs it on reasoning-gym's questions and the package grades it.
Every edit is a pure function of the parent's texts; an edit whose change is already in the parent is
skipped. Pure module: no Django, no file access.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from evolution import operators
from evolution.operators import EditDeclaration, Proposal, ProposerView, TrialEvidence

FAMILIES = ("generic", "memorize", "leaky", "cost", "structural")
# A family of weight 0 is never drawn: with "structural" at 0 the draws are those of a proposer without it.
DEFAULT_FAMILY_WEIGHTS = {"generic": 0.4, "memorize": 0.25, "leaky": 0.25, "cost": 0.1, "structural": 0.0}
PROMPT = "prompts/system.md"
MEMORY = "memory/answers.md"
ARITHMETIC = "skills/arithmetic.md"
LETTERS = "skills/letters.md"

Texts = dict[str, str]


class NothingToPropose(RuntimeError):
    """Every edit the proposer knows is already in the parent or refuted by the ledger."""


def fingerprint(question: str) -> str:
    """The agent's key of a question (evaluator/agent.py): the first 12 hex digits of its SHA-1."""
    return hashlib.sha1(question.strip().encode()).hexdigest()[:12]


def _skill(title: str, text: str, rule: str) -> str:
    return f"# {title}\n\n{text}\n\n```toml\n{rule.strip()}\n```\n"


SUBAGENT = "subagents/calculator.toml"
SUBAGENT_TEXT = """\
# A subagent the solver starts when no skill answers the question: in a context of its own it reads the
# question and evaluates the longest arithmetic expression in it (numbers joined by + - * /).
name = "calculator"
when = "no_skill"
op = "arith"
find = '(?P<expr>-?\\d+(?:\\.\\d+)?(?:\\s*[-+*/]\\s*-?\\d+(?:\\.\\d+)?)+)'
"""

SKILLS = {
    "skills/sorting.md": _skill(
        "Sorting words",
        "Split the words after the last colon at the commas and sort them by character codes, in the order the "
        "question names; join them with a comma and a space.",
        """
match = 'sort these words in (ascending|descending) order'
extract = ['sort these words in (?P<direction>ascending|descending) order[^:]*:\\s*(?P<words>.+?)\\s*$']
op = "sort_words"
direction_group = "direction"
""",
    ),
    "skills/gcd.md": _skill(
        "Greatest common divisor",
        "Take the numbers the question lists and compute their greatest common divisor.",
        """
match = 'Greatest Common Divisor'
extract = ['numbers:\\s*(?P<numbers>[-\\d,\\s]+)']
op = "gcd"
""",
    ),
}


def _answer_of(trial: TrialEvidence) -> str | None:
    expected = trial.expected
    if isinstance(expected, Mapping) and isinstance(expected.get("entry"), Mapping):
        answer = expected["entry"].get("answer")
        return None if answer is None else str(answer)
    return None


def _train_answers(evidence: Sequence[TrialEvidence]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for trial in sorted(evidence, key=lambda t: (t.task_id, t.index)):
        answer = _answer_of(trial)
        if answer is not None and "\n" not in answer:
            seen.setdefault(trial.instruction.strip(), answer)
    return sorted(seen.items())


# --- The edits: parent texts -> changed texts ------------------------------------------------------------


def add_skill(path: str) -> Callable[[Texts, Sequence[TrialEvidence]], Texts]:
    def edit(texts: Texts, evidence: Sequence[TrialEvidence]) -> Texts:
        return {} if texts.get(path) == SKILLS[path] else {path: SKILLS[path]}

    return edit


def arithmetic_chain(texts: Texts, evidence: Sequence[TrialEvidence]) -> Texts:
    """Also read questions that state an arithmetic problem ending in '='."""
    text = texts.get(ARITHMETIC)
    if text is None or "arithmetic problem" in text:
        return {}
    text = text.replace("match = '^Calculate '", "match = '^Calculate |arithmetic problem:'")
    text = text.replace(
        "extract = ['^Calculate (?P<expr>.+?)\\.?$']",
        "extract = ['^Calculate (?P<expr>.+?)\\.?$', 'arithmetic problem:\\s*(?P<expr>.+?)\\s*=\\s*$']",
    )
    return {ARITHMETIC: text.replace('after "Calculate"', 'after "Calculate" or before the final "="')}


def letters_ignore_case(texts: Texts, evidence: Sequence[TrialEvidence]) -> Texts:
    text = texts.get(LETTERS)
    if text is None or "ignore_case = false" not in text:
        return {}
    return {LETTERS: text.replace("ignore_case = false", "ignore_case = true")}


def memory_answer_table(texts: Texts, evidence: Sequence[TrialEvidence]) -> Texts:
    """The train questions' answers, keyed by fingerprint."""
    memory = texts.get(MEMORY, "")
    lines = [f"- sha1:{fingerprint(q)} => {a}" for q, a in _train_answers(evidence)]
    new = [line for line in lines if line not in memory]
    return {MEMORY: memory.rstrip("\n") + "\n\n" + "\n".join(new) + "\n"} if new else {}


def prompt_train_examples(texts: Texts, evidence: Sequence[TrialEvidence]) -> Texts:
    """Train questions and answers verbatim as worked examples."""
    prompt = texts.get(PROMPT, "")
    pairs = [(q, a) for q, a in _train_answers(evidence) if "\n" not in q and f"Q: {q}\n" not in prompt]
    if not pairs:
        return {}
    body = "\n\n".join(f"Q: {q}\nA: {a}" for q, a in pairs)
    return {PROMPT: prompt.rstrip("\n") + "\n\n## Worked examples\n\n" + body + "\n"}


PADDING = (
    "## How to think\n\n"
    + " ".join(
        "Consider the question carefully, restate it in your own words, check every step of the procedure twice "
        "and be sure the answer has the form the question asks for."
        for _ in range(12)
    )
    + "\n"
)


def prompt_padding(texts: Texts, evidence: Sequence[TrialEvidence]) -> Texts:
    prompt = texts.get(PROMPT, "")
    return {} if "## How to think" in prompt else {PROMPT: prompt.rstrip("\n") + "\n\n" + PADDING}


def subagent_calculator(texts: Texts, evidence: Sequence[TrialEvidence]) -> Texts:
    return {} if SUBAGENT in texts else {SUBAGENT: SUBAGENT_TEXT}


@dataclass(frozen=True)
class EditSpec:
    name: str
    family: str
    kind: str
    hypothesis: str
    apply: Callable[[Texts, Sequence[TrialEvidence]], Texts]


EDITS = [
    EditSpec(
        "skill-word-sorting",
        "generic",
        "skill",
        "A procedure that reads the words and the direction of a sorting question and sorts them answers every "
        "sorting question.",
        add_skill("skills/sorting.md"),
    ),
    EditSpec(
        "skill-gcd",
        "generic",
        "skill",
        "A procedure that reads the listed numbers and computes their greatest common divisor answers every GCD "
        "question.",
        add_skill("skills/gcd.md"),
    ),
    EditSpec(
        "skill-chain-sum",
        "generic",
        "skill",
        "Arithmetic questions are also phrased as a problem ending in '='; the arithmetic procedure applies to "
        "them too.",
        arithmetic_chain,
    ),
    EditSpec(
        "skill-letters-ignore-case",
        "generic",
        "skill",
        "A letter is counted whether it is written in upper or lower case.",
        letters_ignore_case,
    ),
    EditSpec(
        "memory-answer-table",
        "memorize",
        "memory",
        "Remembering the answers of questions already seen answers them again without solving them.",
        memory_answer_table,
    ),
    EditSpec(
        "prompt-train-examples",
        "leaky",
        "prompt",
        "Worked examples of questions and their answers in the prompt show the agent what to answer.",
        prompt_train_examples,
    ),
    EditSpec(
        "prompt-padding",
        "cost",
        "prompt",
        "Asking the agent to think each step through twice makes its answers more careful.",
        prompt_padding,
    ),
    EditSpec(
        "subagent-calculator",
        "structural",
        "subagent",
        "A subagent that evaluates the arithmetic in a question no skill answers gets those questions right "
        "instead of guessing.",
        subagent_calculator,
    ),
]
EDITS_BY_NAME = {edit.name: edit for edit in EDITS}


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def edit_apply(name: str, files: Mapping[str, str], evidence: Sequence[TrialEvidence] = ()) -> Texts:
    """The files of ``files`` after edit ``name`` (all of them; the changed ones replaced)."""
    return {**files, **EDITS_BY_NAME[name].apply(dict(files), evidence)}


@operators.register("proposal", "rgym")
def propose(view: ProposerView) -> Proposal:
    """Propose one candidate: one edit of the drawn family (the first that changes the parent and is not
    refuted by the ledger), or of any family when the drawn one has none left. Pure and deterministic given
    the view. Params (optional): ``family_weights``, ``edits`` (names allowed). Raises NothingToPropose when
    no allowed edit changes the parent."""
    rng = random.Random(view.seed)
    params = view.params
    texts = {path: data.decode("utf-8", errors="replace") for path, data in view.parent_files.items()}
    weights = {**DEFAULT_FAMILY_WEIGHTS, **dict(params.get("family_weights", {}))}
    families = [f for f in FAMILIES if float(weights.get(f, 0)) > 0] or ["generic"]
    family = rng.choices(families, weights=[float(weights[f]) for f in families], k=1)[0]
    refuted = {_norm(e.hypothesis) for e in view.ledger if e.refuted}
    allowed = set(params.get("edits", EDITS_BY_NAME))
    unknown = sorted(allowed - set(EDITS_BY_NAME))
    if unknown:
        raise ValueError(f"unknown reasoning-gym edits {unknown}; known: {', '.join(EDITS_BY_NAME)}")
    pool = [e for e in EDITS if e.name in allowed and _norm(e.hypothesis) not in refuted]
    explore = set(view.explore_components)
    drawn = [e for e in pool if e.family == family]
    rng.shuffle(drawn)
    ordered = drawn + [e for e in pool if e.family != family]
    if explore:
        ordered = [e for e in ordered if e.kind in explore] + [e for e in ordered if e.kind not in explore]
    for edit in ordered:
        changed = edit.apply(texts, view.evidence)
        if changed and view.components.get(next(iter(changed)), edit.kind) == edit.kind:
            files = dict(view.parent_files)
            files.update({path: text.encode("utf-8") for path, text in changed.items()})
            return Proposal(
                files=files,
                edits=[EditDeclaration(component=edit.kind, hypothesis=edit.hypothesis, paths=sorted(changed))],
                note=f"{edit.name} ({edit.family})",
            )
    raise NothingToPropose("every allowed edit is already in the parent or refuted by the ledger")
