"""LLM operators: a proposer, a leakage critic and a failure analyst that
talk to an OpenAI-compatible chat-completions endpoint (evolution.llm).

Importing this module registers the proposal operator ``llm`` and the
critique operator ``llm``. docs/llm.md describes configuration, prompts and
output schemas.

The proposer sees only what the loop's ProposerView holds (train evidence,
ledger, budget, exploration and pruning targets) and never the train tasks'
expected answers. Its edits are applied here to a fresh copy of the parent;
the platform then recomputes the real diff and checks surface, declarations
and budget itself, exactly as for any other proposer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import unidiff

from evolution import operators
from evolution.critic import RULES as RULE_CRITIC_RULES
from evolution.critic import CriticTask, Flag, TaskIndex
from evolution.gitdiff import parse_git_diff
from evolution.llm import LLMError, chat_json, config_from
from evolution.operators import EditDeclaration, Proposal, ProposerView
from evolution.proposers import ProposerError
from evolution.surfaces import COMPONENT_KINDS

# Prompt size guards (characters); every one is a params key of the same name.
DEFAULT_MAX_FILE_CHARS = 20_000
DEFAULT_MAX_MESSAGE_CHARS = 1_500
DEFAULT_MAX_EVIDENCE = 20
DEFAULT_MAX_DIFF_CHARS = 60_000
DEFAULT_MAX_TASK_CHARS = 2_000


class LLMProposalError(ProposerError):
    """The model's answer gave no usable proposal; the message says why.
    ``usage`` holds the tokens spent on the failed attempt."""

    def __init__(self, message: str, *, usage: Mapping[str, int] | None = None) -> None:
        super().__init__(message)
        self.usage: dict[str, int] = dict(usage or {})


class PatchError(ValueError):
    """A unified diff that does not apply; the message names the file and hunk."""


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} more characters]"


def _int_param(params: Mapping[str, Any], name: str, default: int) -> int:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProposerError(f'params "{name}" must be a non-negative integer, not {value!r}')
    return value


# --- Applying a unified diff -------------------------------------------------------------------------


def _strip_prefix(path: str) -> str:
    path = path.strip()
    if path.startswith(("a/", "b/")):
        path = path[2:]
    return path


def _split_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _find_block(lines: Sequence[str], block: Sequence[str], hint: int) -> int | None:
    """Where ``block`` occurs in ``lines``: at ``hint`` if it fits there, else
    the nearest occurrence (line numbers written by a model are often off)."""

    def fits(at: int) -> bool:
        return at + len(block) <= len(lines) and all(
            lines[at + i].rstrip("\r\n") == block[i].rstrip("\r\n") for i in range(len(block))
        )

    hint = min(max(hint, 0), len(lines))
    if fits(hint):
        return hint
    for distance in range(1, len(lines) + 1):
        for at in (hint - distance, hint + distance):
            if 0 <= at <= len(lines) and fits(at):
                return at
    return None


def apply_unified_diff(files: Mapping[str, bytes], diff: str) -> tuple[dict[str, bytes], list[str]]:
    """Apply a unified diff (``diff -u`` or ``git diff`` text) to ``files``.

    Returns the new file mapping and the paths it touched. Text files only;
    each hunk must match its context and removed lines exactly (it may sit
    at another line number than the header says). Raises PatchError. Pure.
    """
    if not diff.endswith("\n"):
        diff += "\n"
    try:
        patch = unidiff.PatchSet(diff)
    except unidiff.UnidiffParseError as exc:
        raise PatchError(f"not a unified diff: {exc}") from None
    if not len(patch):
        raise PatchError("the diff changes no file (no ---/+++ headers found)")
    result = dict(files)
    touched: list[str] = []
    for patched in patch:
        if patched.is_binary_file:
            raise PatchError(f"{patched.path}: binary patches are not supported; send whole-file contents")
        source, target = _strip_prefix(patched.source_file), _strip_prefix(patched.target_file)
        if patched.is_added_file or source == "/dev/null":
            path = target
            if path in result:
                raise PatchError(f"{path}: the diff creates this file, but it already exists")
            original: list[str] = []
        else:
            path = source
            if path not in result:
                raise PatchError(f"{path}: no such file in the parent")
            try:
                original = _split_lines(result[path].decode("utf-8"))
            except UnicodeDecodeError:
                raise PatchError(f"{path}: not a UTF-8 text file; send whole-file contents") from None
        out: list[str] = []
        cursor = 0
        for number, hunk in enumerate(patched, start=1):
            old_block = [line.value for line in hunk if line.line_type in (" ", "-")]
            start = hunk.source_start - 1 if hunk.source_length else hunk.source_start
            at = _find_block(original, old_block, start) if old_block else min(max(start, cursor), len(original))
            if at is None or at < cursor:
                first = old_block[0].rstrip("\n") if old_block else ""
                raise PatchError(
                    f"{path}: hunk {number} (@@ -{hunk.source_start},{hunk.source_length} @@) does not apply: "
                    f"its context and removed lines are not in the file in order (first line {first!r})"
                )
            out += original[cursor:at]
            cursor = at + len(old_block)
            for line in hunk:
                if line.line_type in (" ", "+"):
                    out.append(line.value)
                elif line.line_type == "\\" and out and out[-1].endswith("\n"):
                    out[-1] = out[-1][:-1]  # "\ No newline at end of file"
        out += original[cursor:]
        if patched.is_removed_file or target == "/dev/null":
            if out:
                raise PatchError(f"{path}: the diff deletes the file but leaves lines in it")
            result.pop(path)
        else:
            new_path = target
            if new_path != path:
                result.pop(path)
                if new_path in result:
                    raise PatchError(f"{new_path}: the diff renames onto an existing file")
            result[new_path] = "".join(out).encode("utf-8")
            touched.append(new_path)
        touched.append(path)
    return result, sorted(set(touched))


# --- Proposer: prompt ---------------------------------------------------------------------------------

PROPOSER_SYSTEM = """You improve an agent harness: the files (prompts, configuration, tools, skills, memory, \
control code) an AI agent runs with. Propose atomic edits that make the agent solve more tasks of this \
kind in general, at no more cost than needed.

Rules:
- An atomic edit is the smallest change whose effect can be measured on its own. Give each one a component \
kind (one of: {kinds}), a one-sentence hypothesis, and its change.
- All paths an edit changes must be of the edit's component kind (see the file table). Paths marked \
"(not editable)" and paths not listed must not change, except new files whose path matches an editable kind.
- Never copy task-specific content (task ids, names, numbers, messages, file names, answers) from the \
evidence into the harness: such edits are detected and rejected, and do not help on unseen tasks.
- Do not re-propose a hypothesis the ledger shows was not accepted, even in other words.

Answer with one JSON object and nothing else:
{{"edits": [{{"component": "<kind>", "hypothesis": "<one sentence>", "paths": ["<path>", ...],
  "diff": "<unified diff against the current files, with --- a/<path> and +++ b/<path> headers>"}}],
 "note": "<what you changed and why>"}}
Instead of "diff" an edit may give "files": {{"<path>": "<the whole new content>"}} (null deletes the file). \
Edits apply in order, each to the result of the previous ones."""


def proposer_messages(view: ProposerView) -> list[dict[str, str]]:
    """The chat messages for one proposal slot, built from the view only.

    Includes the parent's text files, each path's component kind, the train
    evidence (failing trials first, messages clipped), the ledger, the
    budget and the exploration and pruning targets. The train tasks'
    expected answers are left out: a proposer has no use for them but to
    copy them. Pure.
    """
    params = view.params
    max_file = _int_param(params, "max_file_chars", DEFAULT_MAX_FILE_CHARS)
    max_message = _int_param(params, "max_message_chars", DEFAULT_MAX_MESSAGE_CHARS)
    max_evidence = _int_param(params, "max_evidence", DEFAULT_MAX_EVIDENCE)
    budget = "no limit" if view.edit_budget is None else f"at most {view.edit_budget} atomic edit(s)"
    lines = [f"# Round {view.round}, slot {view.slot}", "", f"Budget: {budget}."]
    if view.explore_components:
        lines.append(
            "The run is stalled: at least one edit must use one of these component kinds: "
            + ", ".join(view.explore_components)
            + "."
        )
    if view.pruning_targets:
        lines.append(
            "Pruning targets (advice): these components showed no measured gain recently; consider removing what "
            "they add: " + ", ".join(view.pruning_targets) + "."
        )
    lines += ["", "## Files", ""]
    for path in sorted(view.parent_files):
        kind = view.components.get(path, "(not editable)")
        try:
            text = view.parent_files[path].decode("utf-8")
        except UnicodeDecodeError:
            lines += [f"### {path} [{kind}] (binary, {len(view.parent_files[path])} bytes)", ""]
            continue
        lines += [f"### {path} [{kind}]", "", "```", _clip(text, max_file), "```", ""]
    lines += ["## Ledger (earlier edits and their measured effect)", ""]
    if view.ledger:
        lines += [
            f"- round {e.round} {e.component} {e.verdict.upper() if e.refuted else e.verdict} "
            f"dS={e.delta_score:+.4f} dC={operators.cost_change_text(e.delta_cost)}: {e.hypothesis}"
            for e in view.ledger
        ]
    else:
        lines.append("(empty)")
    ordered = sorted(view.evidence, key=lambda t: (t.passed, t.task_id, t.index))
    passed = sum(t.passed for t in view.evidence)
    lines += ["", "## Evidence: train trials of the current harness", "", f"{len(ordered)} trial(s), {passed} passed."]
    for trial in ordered[:max_evidence]:
        lines += [
            "",
            f"### {trial.task_id} #{trial.index}: {'passed' if trial.passed else 'failed'}, score {trial.score:g}"
            + (f", error {trial.error}" if trial.error else ""),
            "Instruction: " + _clip(trial.instruction, max_message),
            "Criteria: " + json.dumps(list(trial.criteria), ensure_ascii=False, default=str),
        ]
        for step in trial.trajectory:
            message = _clip(str(step.get("message", "")), max_message)
            lines.append(f"- step {step.get('step_id')} ({step.get('source')}): {message}")
            for call in step.get("tool_calls") or []:
                arguments = json.dumps(call.get("arguments"), ensure_ascii=False, default=str)
                lines.append(f"  - call {call.get('function_name')} {_clip(arguments, max_message)}")
            for result in (step.get("observation") or {}).get("results", []):
                lines.append(f"  - result: {_clip(str(result.get('content', '')), max_message)}")
    if len(ordered) > max_evidence:
        lines.append(f"\n({len(ordered) - max_evidence} more trial(s) not shown)")
    return [
        {"role": "system", "content": PROPOSER_SYSTEM.format(kinds=", ".join(COMPONENT_KINDS))},
        {"role": "user", "content": "\n".join(lines) + "\n"},
    ]


# --- Proposer: answer ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedAnswer:
    files: dict[str, bytes]
    edits: list[EditDeclaration]
    note: str


def apply_answer(parent_files: Mapping[str, bytes], document: Any) -> ParsedAnswer:
    """Validate the model's JSON answer and apply its edits, in order, to a
    copy of ``parent_files``. Raises ValueError naming the edit and field.
    Each edit declares the paths it lists plus the paths it really touched."""
    if not isinstance(document, dict) or not isinstance(document.get("edits"), list) or not document["edits"]:
        raise ValueError('the answer must be an object with a non-empty list "edits"')
    files = dict(parent_files)
    edits: list[EditDeclaration] = []
    for number, item in enumerate(document["edits"]):
        where = f"edit {number}"
        if not isinstance(item, dict):
            raise ValueError(f"{where} is not an object")
        component, hypothesis = item.get("component"), item.get("hypothesis")
        if not isinstance(component, str) or component.strip() not in COMPONENT_KINDS:
            raise ValueError(f'{where}: "component" must be one of {", ".join(COMPONENT_KINDS)}, not {component!r}')
        if not isinstance(hypothesis, str) or not hypothesis.strip():
            raise ValueError(f'{where}: "hypothesis" must be a non-empty string')
        listed = item.get("paths", [])
        if not isinstance(listed, list) or not all(isinstance(p, str) and p for p in listed):
            raise ValueError(f'{where}: "paths" must be a list of paths')
        has_diff, has_files = "diff" in item, "files" in item
        if has_diff == has_files:
            raise ValueError(f'{where}: give exactly one of "diff" or "files"')
        if has_diff:
            if not isinstance(item["diff"], str) or not item["diff"].strip():
                raise ValueError(f'{where}: "diff" must be a non-empty unified diff')
            try:
                files, touched = apply_unified_diff(files, item["diff"])
            except PatchError as exc:
                raise ValueError(f"{where}: {exc}") from None
        else:
            whole = item["files"]
            if not isinstance(whole, dict) or not whole:
                raise ValueError(f'{where}: "files" must map paths to their whole new content')
            touched = []
            for path, content in whole.items():
                if content is None:
                    if path not in files:
                        raise ValueError(f"{where}: cannot delete {path}: no such file")
                    files.pop(path)
                elif isinstance(content, str):
                    files[path] = content.encode("utf-8")
                else:
                    raise ValueError(f'{where}: "files" value of {path} must be a string or null')
                touched.append(path)
        paths = sorted({*listed, *touched})
        edits.append(EditDeclaration(component=component.strip(), hypothesis=hypothesis.strip(), paths=paths))
    note = document.get("note", "")
    return ParsedAnswer(files=files, edits=edits, note=note if isinstance(note, str) else "")


# The proposer's answer as a JSON schema, for servers that hold output to one (params "json_schema"). It asks
# for whole files, the form a small model can fill; a diff is as welcome where no schema is sent.
PROPOSAL_SCHEMA = {
    "type": "object",
    "properties": {
        "edits": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "component": {"enum": list(COMPONENT_KINDS)},
                    "hypothesis": {"type": "string"},
                    "files": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
                },
                "required": ["component", "hypothesis", "files"],
            },
        },
        "note": {"type": "string"},
    },
    "required": ["edits", "note"],
}


@operators.register("proposal", "llm")
def llm_proposer(view: ProposerView) -> Proposal:
    """Ask the model for atomic edits and return the resulting file set.

    Malformed JSON, an invalid answer or a diff that does not apply is sent
    back to the model with the reason, ``repair_attempts`` times (default 1);
    then LLMProposalError says what was wrong. Proposal.usage holds the
    proposer's own tokens (and cost when prices are configured), summed over
    every request. Writes nothing.
    """
    params = view.params
    try:
        config = config_from(params)
    except LLMError as exc:
        raise LLMProposalError(f"LLM proposer configuration: {exc}") from None
    repairs = _int_param(params, "repair_attempts", 1)
    messages = proposer_messages(view)
    try:
        answer, usage = chat_json(
            config,
            messages,
            check=lambda doc: apply_answer(view.parent_files, doc),
            repair_attempts=repairs,
            schema=PROPOSAL_SCHEMA,
        )
    except LLMError as exc:
        raise LLMProposalError(f"LLM proposer: {exc}", usage=exc.usage) from None
    return Proposal(files=answer.files, edits=answer.edits, note=answer.note, usage=usage)


# --- Leakage critic ---------------------------------------------------------------------------------------

CRITIC_SYSTEM = """You review a change to an agent harness for benchmark leakage before it is evaluated. \
Flag ADDED content that is specific to the evaluation tasks listed: task names or ids, entity names, \
file names or paths from tasks, task-specific values or answers, logic keyed to these tasks, or inert \
machinery (code that does nothing). Generic improvements (better instructions, tools, checks) are fine \
even when they help these tasks.

Answer with one JSON object and nothing else:
{"flags": [{"rule": "<one of: %s>", "path": "<file path>", "line": "<the added line>",
  "matched": "<the exact leaked text, copied from the line>", "task": "<task id or null>",
  "evidence": "<one sentence>"}]}
Answer {"flags": []} when nothing is specific to the tasks."""


@dataclass(frozen=True)
class _Task:
    id: str
    text: str


def _critic_tasks(tasks: Sequence[CriticTask] | TaskIndex, limit: int) -> list[_Task]:
    if isinstance(tasks, TaskIndex):
        # The index keeps instructions normalized (lower case); good enough for a reviewer.
        return [_Task(tid, _clip(text, limit)) for tid, text in zip(tasks.task_ids, tasks.instructions, strict=True)]
    result = []
    for task in tasks:
        public = "\n".join(f"[file {path}]\n{text}" for path, text in sorted(task.files.items()))
        result.append(_Task(task.id, _clip(task.instruction + ("\n" + public if public else ""), limit)))
    return result


def _added_lines(diff_text: str) -> dict[str, list[tuple[int, str]]]:
    """Path -> (1-based new line number, text) of every added line."""
    added: dict[str, list[tuple[int, str]]] = {}
    for change in parse_git_diff(diff_text):
        if change.binary or change.new_path is None:
            continue
        rows = added.setdefault(change.new_path, [])
        for hunk in change.hunks:
            number = hunk.new_start
            for line in hunk.lines:
                kind = line[:1]
                if kind == "+":
                    rows.append((number, line[1:]))
                    number += 1
                elif kind == " ":
                    number += 1
    return added


def verify_flags(document: Any, added: Mapping[str, Sequence[tuple[int, str]]], task_ids: set[str]) -> list[Flag]:
    """Keep the model's flags that point at real added content: the path is
    in the diff and ``matched`` occurs in one of its added lines (case
    insensitive). The rest are hallucinations and are dropped. Raises
    ValueError for an answer of the wrong shape."""
    if not isinstance(document, dict) or not isinstance(document.get("flags"), list):
        raise ValueError('the answer must be an object with a list "flags"')
    flags: list[Flag] = []
    for number, item in enumerate(document["flags"]):
        if not isinstance(item, dict):
            raise ValueError(f"flag {number} is not an object")
        path, matched = item.get("path"), item.get("matched")
        if not isinstance(path, str) or not isinstance(matched, str) or not matched.strip():
            continue
        rule = item.get("rule")
        rule = rule if isinstance(rule, str) and rule in RULE_CRITIC_RULES else "llm"
        task = item.get("task")
        task = task if isinstance(task, str) and task in task_ids else None
        needle = matched.strip().lower()
        hit = next(((n, text) for n, text in added.get(path, ()) if needle in text.lower()), None)
        if hit is None:
            continue
        evidence = item.get("evidence")
        flags.append(
            Flag(
                rule=rule,
                path=path,
                line_number=hit[0],
                line=hit[1],
                matched=matched.strip(),
                task_id=task,
                evidence="llm: " + (evidence if isinstance(evidence, str) else "flagged by the LLM critic"),
            )
        )
    unique = {(f.rule, f.path, f.line_number, f.matched, f.task_id): f for f in flags}
    return sorted(unique.values(), key=lambda f: (f.path, f.line_number or 0, f.rule, f.matched, f.task_id or ""))


@operators.register("critique", "llm")
def llm_critique(
    diff_text: str,
    tasks: Sequence[CriticTask] | TaskIndex,
    *,
    parent_text: Mapping[str, str] | None = None,
    config: Any = None,
    params: Mapping[str, Any] | None = None,
) -> list[Flag]:
    """Flags for added content of ``diff_text`` that an LLM finds specific to
    the evolve tasks; same signature and result as evolution.critic.critique
    (plus ``params``). Sends the diff and the tasks' public text (instruction
    and public files; never expected answers). Only flags whose ``matched``
    text really occurs in an added line of the named path are kept.
    Raises LLMError when the endpoint fails and DiffParseError for a diff
    it cannot read, like the rule critic. ``parent_text`` and ``config``
    are accepted for compatibility and unused.
    """
    params = params or {}
    added = _added_lines(diff_text)
    if not any(added.values()):
        return []
    task_list = _critic_tasks(tasks, _int_param(params, "max_task_chars", DEFAULT_MAX_TASK_CHARS))
    diff_limit = _int_param(params, "max_diff_chars", DEFAULT_MAX_DIFF_CHARS)
    user = "\n".join(
        ["# Evaluation tasks", ""]
        + [f"## {task.id}\n{task.text}\n" for task in task_list]
        + ["# The change", "", "```diff", _clip(diff_text, diff_limit), "```"]
    )
    messages = [
        {"role": "system", "content": CRITIC_SYSTEM % ", ".join(RULE_CRITIC_RULES)},
        {"role": "user", "content": user},
    ]
    ids = {task.id for task in task_list}
    flags, _usage = chat_json(
        config_from(params),
        messages,
        check=lambda doc: verify_flags(doc, added, ids),
        repair_attempts=_int_param(params, "repair_attempts", 1),
    )
    return cast(list[Flag], flags)


# --- Failure analyst ----------------------------------------------------------------------------------------

ANALYST_SYSTEM = """You analyse why an AI agent failed a task, from its trajectory. Choose the ONE label \
that best explains the failure, from this list (slug: meaning):
%s

Answer with one JSON object and nothing else:
{"label": "<slug>", "step": <the step id where it went wrong, or null>, "note": "<two sentences at most>"}"""

PROTECTED_SPLITS = frozenset({"sealed", "heldout"})


@dataclass(frozen=True)
class FailureAnalysis:
    label: str  # a slug of the labels offered
    note: str
    step_id: int | None = None
    usage: dict[str, int] = field(default_factory=dict)


def _analysis(document: Any, slugs: set[str], step_ids: set[int]) -> FailureAnalysis:
    if not isinstance(document, dict):
        raise ValueError('the answer must be an object with "label" and "note"')
    label, note, step = document.get("label"), document.get("note", ""), document.get("step")
    if label not in slugs:
        raise ValueError(f'"label" must be one of {", ".join(sorted(slugs))}, not {label!r}')
    if not isinstance(note, str):
        raise ValueError('"note" must be a string')
    if not (isinstance(step, int) and not isinstance(step, bool) and step in step_ids):
        step = None
    return FailureAnalysis(label=str(label), note=note.strip()[:2000], step_id=step)


def analyse_failure(
    trial: Any,
    *,
    params: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    allow_protected: bool = False,
) -> FailureAnalysis:
    """Suggest an annotation label and a short note for a failed trial.

    ``trial`` is an evolution.models.Trial; ``labels`` maps slugs to
    descriptions (default: the labels available in the trial's experiment).
    A suggestion only: nothing is written. Sealed and held-out trials are
    refused unless ``allow_protected`` (their text would leave the platform).
    Raises ValueError for such a trial, LLMError when the endpoint fails.
    """
    from evolution.models import TrajectoryStep
    from evolution.services.annotations import labels_available

    if trial.split in PROTECTED_SPLITS and not allow_protected:
        raise ValueError(f"trial {trial.pk} is on the {trial.split} split; its text is not sent to an LLM")
    params = params or {}
    if labels is None:
        experiment_id = trial.candidate.experiment_id
        labels = {label.slug: label.description or label.name for label in labels_available(experiment=experiment_id)}
    if not labels:
        raise ValueError("no annotation labels to choose from")
    max_message = _int_param(params, "max_message_chars", DEFAULT_MAX_MESSAGE_CHARS)
    steps = list(TrajectoryStep.objects.filter(trajectory__trial=trial).order_by("step_id"))
    lines = [
        f"Task instruction: {_clip(trial.task.instruction, max_message)}",
        f"Outcome: {trial.outcome or trial.state}, score {trial.score}"
        + (f", error {trial.error_kind}: {_clip(trial.error, 500)}" if trial.error_kind else ""),
        "Criteria: " + json.dumps(trial.criteria_results, ensure_ascii=False, default=str),
        "",
        "Trajectory:",
    ]
    for step in steps:
        lines.append(f"- step {step.step_id} ({step.source}): {_clip(step.message, max_message)}")
        for call in step.tool_calls or []:
            arguments = json.dumps(call.get("arguments"), ensure_ascii=False, default=str)
            lines.append(f"  - call {call.get('function_name')} {_clip(arguments, max_message)}")
        for result in (step.observation or {}).get("results", []):
            lines.append(f"  - result: {_clip(str(result.get('content', '')), max_message)}")
    catalogue = "\n".join(f"- {slug}: {' '.join(text.split())}" for slug, text in sorted(labels.items()))
    messages = [
        {"role": "system", "content": ANALYST_SYSTEM % catalogue},
        {"role": "user", "content": "\n".join(lines)},
    ]
    step_ids = {step.step_id for step in steps}
    analysis, usage = chat_json(
        config_from(params),
        messages,
        check=lambda doc: _analysis(doc, set(labels), step_ids),
        repair_attempts=_int_param(params, "repair_attempts", 1),
    )
    return FailureAnalysis(label=analysis.label, note=analysis.note, step_id=analysis.step_id, usage=usage)


__all__ = [
    "FailureAnalysis",
    "LLMProposalError",
    "PatchError",
    "analyse_failure",
    "apply_answer",
    "apply_unified_diff",
    "llm_critique",
    "llm_proposer",
    "proposer_messages",
    "verify_flags",
]
