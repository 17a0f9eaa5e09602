"""The reasoning-gym benchmark's offline agent: a scripted solver steered by the harness.

    agent.py --harness DIR --task DIR --output DIR --seed N

The "model" knows a few primitive operations (evaluate an arithmetic
expression, count a letter, reverse a word, sort words, greatest common
divisor, least common multiple) and nothing about which question needs
which: that is in the harness. A question is answered by, in order:

1. ``memory/answers.md``: a line ``- "QUESTION" => ANSWER`` or
   ``- sha1:HEX => ANSWER`` (HEX: the first 12 hex digits of the SHA-1 of
   the question) whose key is this exact question answers it directly;
2. ``prompts/system.md``: a worked example ``Q: QUESTION`` followed by
   ``A: ANSWER`` whose question is this exact question is copied;
3. ``skills/*.md``: the first skill (by file name) whose ```toml block has a
   ``match`` regex found in the question runs its ``op`` on the named groups
   of its first ``extract`` regex that matches;
4. ``subagents/*.toml``: a subagent with ``when = "no_skill"``, started when no
   skill answered, reads the question in a context of its own and runs its
   ``op`` on the longest match of its ``find`` regex (tokens: its file and the
   question, counted when it runs; every subagent file is in the main context);
5. otherwise the agent guesses: the first number in the question, or nothing.

Writes ``answer.txt`` and ``trajectory.json`` (ATIF v1.5). Tokens are the
characters / 4 of everything each step reads (prompt, every skill, memory,
question), so a longer harness costs more. Standard library only; never
reads the clock or the network; a trial is a pure function of (harness,
task, seed) (the seed changes nothing: the solver is deterministic).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import math
import operator
import re
import sys
import tomllib
from fractions import Fraction
from pathlib import Path
from typing import Any

AGENT_NAME = "rgym-scripted"
AGENT_VERSION = "1"
ANSWER_FILE = "answer.txt"
MEMORY_LINE = re.compile(r'^\s*-\s*(?:"(?P<text>.*)"|sha1:(?P<hash>[0-9a-f]{12}))\s*=>\s*(?P<answer>.*?)\s*$')
EXAMPLE = re.compile(r"^Q:\s*(?P<q>.*?)\s*\nA:\s*(?P<a>.*?)\s*$", re.MULTILINE | re.DOTALL)
TOML_BLOCK = re.compile(r"```toml\n(.*?)```", re.DOTALL)
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def fingerprint(question: str) -> str:
    return hashlib.sha1(question.strip().encode()).hexdigest()[:12]


def tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _arith(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _arith(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return Fraction(OPS[type(node.op)](_arith(node.left), _arith(node.right)))
    raise ValueError("not an arithmetic expression")


def _number(value: Fraction, places: int | None) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    if places is None:
        return str(float(value))
    return f"{float(value):.{places}f}".rstrip("0").rstrip(".")


def op_arith(groups: dict[str, str], rule: dict[str, Any]) -> str:
    expr = groups["expr"].replace("\u2212", "-").replace("\u00d7", "*").replace("\u00f7", "/")
    return _number(_arith(ast.parse(expr.strip(), mode="eval")), rule.get("decimal_places"))


def op_count_letter(groups: dict[str, str], rule: dict[str, Any]) -> str:
    letter, text = groups["letter"], groups["text"]
    if rule.get("ignore_case", False):
        letter, text = letter.lower(), text.lower()
    return str(text.count(letter))


def op_reverse(groups: dict[str, str], rule: dict[str, Any]) -> str:
    word: str = groups["word"].strip()
    return word[::-1]


def op_sort_words(groups: dict[str, str], rule: dict[str, Any]) -> str:
    words = [w.strip() for w in re.split(rule.get("split", ","), groups["words"]) if w.strip()]
    descending = rule.get("direction_group") is not None and groups.get(rule["direction_group"], "") == "descending"
    return str(rule.get("join", ", ")).join(sorted(words, reverse=descending))


def _ints(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"-?\d+", text)]


def op_gcd(groups: dict[str, str], rule: dict[str, Any]) -> str:
    return str(math.gcd(*_ints(groups["numbers"])))


def op_lcm(groups: dict[str, str], rule: dict[str, Any]) -> str:
    return str(math.lcm(*_ints(groups["numbers"])))


PRIMITIVES = {
    "arith": op_arith,
    "count_letter": op_count_letter,
    "reverse": op_reverse,
    "sort_words": op_sort_words,
    "gcd": op_gcd,
    "lcm": op_lcm,
}


def read_harness(harness: Path) -> dict[str, Any]:
    """The harness files the agent reads, as text, and the parsed skills (file order)."""

    def text(path: Path) -> str:
        return path.read_text(encoding="utf-8") if path.is_file() else ""

    subagents = []
    subagent_texts = []
    for path in sorted((harness / "subagents").glob("*.toml")) if (harness / "subagents").is_dir() else []:
        body = text(path)
        subagent_texts.append(body)
        try:
            subagents.append({"file": path.name, "text": body, **tomllib.loads(body)})
        except tomllib.TOMLDecodeError:
            continue
    skills = []
    skill_texts = []
    for path in sorted((harness / "skills").glob("*.md")) if (harness / "skills").is_dir() else []:
        body = text(path)
        skill_texts.append(body)
        for block in TOML_BLOCK.findall(body):
            try:
                rule = tomllib.loads(block)
            except tomllib.TOMLDecodeError:
                continue
            skills.append({"file": path.name, **rule})
    return {
        "prompt": text(harness / "prompts" / "system.md"),
        "memory": text(harness / "memory" / "answers.md"),
        "skills": skills,
        "skill_texts": skill_texts,
        "subagents": subagents,
        "subagent_texts": subagent_texts,
        "config": tomllib.loads(text(harness / "config.toml") or ""),
    }


def recall(question: str, memory: str) -> str | None:
    key = fingerprint(question)
    for line in memory.splitlines():
        found = MEMORY_LINE.match(line)
        if found and (found["hash"] == key or (found["text"] is not None and found["text"] == question.strip())):
            return found["answer"]
    return None


def from_examples(question: str, prompt: str) -> str | None:
    for found in EXAMPLE.finditer(prompt):
        if found["q"] == question.strip():
            return found["a"]
    return None


def solve(question: str, skills: list[dict[str, Any]]) -> tuple[str | None, str]:
    """(answer or None, what happened)."""
    for rule in skills:
        if not isinstance(rule.get("match"), str) or not re.search(rule["match"], question):
            continue
        op = PRIMITIVES.get(str(rule.get("op")))
        if op is None:
            return None, f"skill {rule['file']} names no known op ({rule.get('op')!r})"
        patterns = rule.get("extract", [])
        for pattern in [patterns] if isinstance(patterns, str) else patterns:
            found = re.search(pattern, question, re.DOTALL)
            if found:
                try:
                    return op({k: v for k, v in found.groupdict().items() if v is not None}, rule), (
                        f"skill {rule['file']}: {rule['op']}"
                    )
                except (ValueError, KeyError, ZeroDivisionError, SyntaxError, TypeError) as exc:
                    return None, f"skill {rule['file']}: {rule['op']} failed: {exc}"
        return None, f"skill {rule['file']} matched but no extract pattern did"
    return None, "no skill matches"


def delegate(question: str, subagents: list[dict[str, Any]]) -> tuple[str | None, str, int]:
    """The first ``no_skill`` subagent's answer: its ``op`` on the longest match of its ``find`` regex in the
    question. (answer or None, what happened, the tokens its own context read; 0 when none ran)."""
    helper = next((a for a in subagents if a.get("when") == "no_skill"), None)
    if helper is None:
        return None, "", 0
    read = tokens(helper["text"]) + tokens(question)
    op = PRIMITIVES.get(str(helper.get("op")))
    if op is None or not isinstance(helper.get("find"), str):
        return None, f"subagent {helper['file']} names no known op or no find pattern", read
    try:
        matches = list(re.finditer(helper["find"], question))
    except re.error as exc:
        return None, f"subagent {helper['file']}: bad find pattern: {exc}", read
    if not matches:
        return None, f"subagent {helper['file']} found nothing", read
    longest = max(matches, key=lambda m: len(m.group(0)))
    groups = {k: v for k, v in longest.groupdict().items() if v is not None}
    try:
        return op(groups, helper), f"subagent {helper['file']}: {helper['op']}", read
    except (ValueError, KeyError, ZeroDivisionError, SyntaxError, TypeError) as exc:
        return None, f"subagent {helper['file']}: {helper['op']} failed: {exc}", read


def run(harness: Path, task: Path, output: Path, seed: int) -> dict[str, Any]:
    question = (task / "instruction.md").read_text(encoding="utf-8").strip()
    files = read_harness(harness)
    context = tokens(files["prompt"]) + tokens(files["memory"]) + sum(map(tokens, files["skill_texts"]))
    context += sum(map(tokens, files["subagent_texts"]))
    context += tokens(question)
    steps: list[dict[str, Any]] = [
        {"step_id": 1, "source": "system", "message": files["prompt"][:2000]},
        {"step_id": 2, "source": "user", "message": question},
    ]
    answer = recall(question, files["memory"])
    how = "memory: known answer" if answer is not None else ""
    if answer is None:
        answer = from_examples(question, files["prompt"])
        how = "prompt: worked example" if answer is not None else ""
    if answer is None:
        answer, how = solve(question, files["skills"])
    delegated = 0
    if answer is None:
        answer, why, delegated = delegate(question, files["subagents"])
        how = f"{how}; {why}" if why else how
    if answer is None:
        numbers = re.findall(r"-?\d+", question)
        answer, how = (numbers[0] if numbers else ""), how + "; guessed"
    steps.append(
        {
            "step_id": 3,
            "source": "agent",
            "model_name": str(files["config"].get("model", AGENT_NAME)),
            "message": f"{how}. Answer: {answer}",
            "metrics": {"prompt_tokens": context + delegated, "completion_tokens": tokens(how) + tokens(answer)},
        }
    )
    output.mkdir(parents=True, exist_ok=True)
    (output / ANSWER_FILE).write_text(answer, encoding="utf-8")
    document = {
        "schema_version": "ATIF-v1.5",
        "session_id": hashlib.sha256(f"{seed}|{question}".encode()).hexdigest()[:32],
        "agent": {"name": AGENT_NAME, "version": AGENT_VERSION, "model_name": str(files["config"].get("model", ""))},
        "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": context + delegated,
            "total_completion_tokens": steps[-1]["metrics"]["completion_tokens"],
            "total_steps": len(steps),
        },
    }
    (output / "trajectory.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return {"answer": answer, "how": how}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Answer one reasoning-gym question with the harness's skills.")
    parser.add_argument("--harness", required=True, type=Path)
    parser.add_argument("--task", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    parser.add_argument("--seed", required=True, type=int)
    options = parser.parse_args(argv)
    run(options.harness, options.task, options.output, options.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
