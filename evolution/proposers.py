"""Proposal operators that are not tied to one benchmark.

``command`` runs any external program (a coding-agent CLI, a script) in a
fresh temporary copy of the parent's files and reads back what it changed:

- the workspace holds the parent's files plus ``.rsi/prompt.md`` (what the
  program may know: train evidence, the ledger, the round's budget, the
  components to explore and to prune, the kind of every path, the manifest
  format) and ``.rsi/view.json`` (the same as JSON);
- ``params["argv"]`` runs with the workspace as its working directory;
  ``{workspace}``, ``{prompt}`` and ``{manifest}`` in it become absolute
  paths;
- the program edits files in place and writes ``.rsi/edits.json``:
  ``{"edits": [{"component", "hypothesis", "paths": [...]}], "note": "..."}``;
- every file of the workspace except ``.rsi/`` becomes the proposal.

Params: ``argv`` (required), ``timeout_seconds`` (600), ``env_allowlist``
(["PATH", "HOME", "LANG"]: variables copied from the worker), ``env`` (extra
variables), ``limits`` (see ``evolution.sandbox.Limits``), ``max_file_bytes``
and ``max_files`` (what the workspace may hold when read back).

The program runs without bubblewrap (a proposer agent usually needs the
network) under the resource limits of ``evolution.sandbox``; as root it runs
as an unprivileged uid of its own (``sandbox.run_ids``), so the program and
its interpreter must be reachable by any user. Nothing here contains a hostile program: it can read what its user can
read. The platform does not trust the answer either: it recomputes the diff
and checks the surface, the declarations and the budget itself.

Importing this module also registers the offline example's proposer and the reasoning-gym benchmark's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import evolution.example.proposer  # noqa: F401  (registers the "example" proposer)
import evolution.rgym.proposer  # noqa: F401  (registers the "rgym" proposer)
from evolution import limits, operators
from evolution.operators import EditDeclaration, Proposal, ProposerView
from evolution.sandbox import Limits, SandboxError, run_sandboxed
from evolution.trees import MODE_SYMLINK, FileEntry, SnapshotError, materialize, read_directory

RSI_DIR = ".rsi"
PROMPT_FILE = "prompt.md"
VIEW_FILE = "view.json"
MANIFEST_FILE = "edits.json"
DEFAULT_TIMEOUT_SECONDS = 600
DEFAULT_ENV_ALLOWLIST = ("PATH", "HOME", "LANG")
# Read-back limits: generous, a harness is small; they only stop a runaway program.
DEFAULT_MAX_FILE_BYTES = 16 << 20
DEFAULT_MAX_FILES = 10_000
# Characters of one trajectory message shown in the prompt (view.json has them whole).
PROMPT_MESSAGE_CHARS = 1_500
# Characters of the program's stderr quoted in an error.
ERROR_TAIL_CHARS = 2_000


class ProposerError(RuntimeError):
    """The proposer produced no usable proposal; the message says why."""


# --- What the program gets --------------------------------------------------------------------------


def view_document(view: ProposerView) -> dict[str, Any]:
    """The view as JSON: everything but the file contents (they are in the
    workspace) and the params (they may hold credentials meant for ``env``)."""
    return {
        "round": view.round,
        "slot": view.slot,
        "seed": view.seed,
        "edit_budget": view.edit_budget,
        "stalled": view.stalled,
        "explore_components": list(view.explore_components),
        "pruning_targets": list(view.pruning_targets),
        "components": dict(sorted(view.components.items())),
        "files": sorted(view.parent_files),
        "evidence": [
            {
                "task_id": trial.task_id,
                "index": trial.index,
                "instruction": trial.instruction,
                "passed": trial.passed,
                "score": trial.score,
                "criteria": list(trial.criteria),
                "error": trial.error,
                "trajectory": list(trial.trajectory),
            }
            for trial in view.evidence
        ],
        "ledger": [
            {
                "round": entry.round,
                "component": entry.component,
                "hypothesis": entry.hypothesis,
                "delta_score": entry.delta_score,
                "delta_cost": entry.delta_cost,
                "accepted": entry.accepted,
                "admissible": entry.admissible,
            }
            for entry in view.ledger
        ],
        "manifest": f"{RSI_DIR}/{MANIFEST_FILE}",
    }


def _clip(text: str, limit: int = PROMPT_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} more characters]"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def prompt_text(view: ProposerView) -> str:
    """The task description the external program reads (Markdown)."""
    budget = (
        "no limit on the number of atomic edits"
        if view.edit_budget is None
        else f"at most {view.edit_budget} atomic edit(s)"
    )
    lines = [
        f"# Improve the harness (round {view.round}, slot {view.slot})",
        "",
        "The current directory is a copy of the harness: the files an agent runs with. Edit them so the agent",
        "solves more tasks of this kind in general, at no more cost than needed. Do not copy task-specific",
        "content (names, ids, messages, answers) from the evidence into the harness: such edits are detected",
        "and rejected, and they do not help on tasks you have not seen.",
        "",
        "## Rules",
        "",
        f"- Budget: {budget} in this round.",
        "- An atomic edit is the smallest change whose effect can be measured on its own. Give each one a",
        "  component kind and a one-sentence hypothesis, and list every path it changes.",
        "- All paths of one edit must be of the edit's component kind (table below). Only those paths may change;",
        "  a changed path that no edit declares, or that is not in the table, gets the proposal rejected.",
        f"- Write nothing under `{RSI_DIR}/` except the manifest.",
    ]
    if view.explore_components:
        lines.append(
            "- The run is stalled: at least one edit must touch one of these component kinds: "
            + ", ".join(view.explore_components)
            + "."
        )
    if view.pruning_targets:
        lines.append(
            "- Pruning targets (advice): these components showed no measured gain recently; consider removing "
            "what they add: " + ", ".join(view.pruning_targets) + "."
        )
    lines += [
        "",
        "## Manifest",
        "",
        f"When done, write `{RSI_DIR}/{MANIFEST_FILE}`:",
        "",
        "```json",
        '{"edits": [{"component": "prompt", "hypothesis": "One sentence.", "paths": ["prompts/system.md"]}],',
        ' "note": "What you changed and why."}',
        "```",
        "",
        "## Files and their component kinds",
        "",
        "| path | kind |",
        "| --- | --- |",
        *(f"| `{path}` | {view.components.get(path, '(not editable)')} |" for path in sorted(view.parent_files)),
        "",
        "## Ledger (earlier edits and their measured effect)",
        "",
    ]
    if view.ledger:
        lines += ["| round | component | verdict | dS | dC | hypothesis |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [
            f"| {e.round} | {e.component} | {e.verdict} | {e.delta_score:+.4f} | "
            f"{operators.cost_change_text(e.delta_cost)} | {e.hypothesis} |"
            for e in view.ledger
        ]
        lines += [
            "",
            (
                "Do not propose a refuted hypothesis again (verdict rejected), even in other words; "
                "an admissible one that was not chosen is not refuted."
            ),
        ]
    else:
        lines.append("(empty)")
    passed = sum(t.passed for t in view.evidence)
    lines += [
        "",
        "## Evidence: train trials of the current harness",
        "",
        f"{len(view.evidence)} trial(s), {passed} passed. Failing trials first. `{RSI_DIR}/{VIEW_FILE}` has the same",
        "data as JSON, with messages uncut.",
    ]
    for trial in sorted(view.evidence, key=lambda t: (t.passed, t.task_id, t.index)):
        lines += [
            "",
            f"### {trial.task_id} #{trial.index}: {'passed' if trial.passed else 'failed'}, score {trial.score:g}"
            + (f", error {trial.error}" if trial.error else ""),
            "",
            "Instruction:",
            "",
            *(f"    {line}" for line in trial.instruction.splitlines()),
            "",
            f"Criteria: {_json(list(trial.criteria))}",
            "",
            "Trajectory:",
            "",
        ]
        for step in trial.trajectory:
            lines.append(f"- step {step.get('step_id')} ({step.get('source')}): {_clip(str(step.get('message', '')))}")
            for call in step.get("tool_calls") or []:
                lines.append(f"  - call {call.get('function_name')} {_clip(_json(call.get('arguments')))}")
            for result in (step.get("observation") or {}).get("results", []):
                lines.append(f"  - result: {_clip(str(result.get('content', '')))}")
    return "\n".join(lines) + "\n"


# --- Reading the answer -----------------------------------------------------------------------------


def parse_manifest(raw: bytes) -> tuple[list[EditDeclaration], str, dict[str, int]]:
    """The edits, note and usage of a manifest; ProposerError naming what is wrong."""
    try:
        data = limits.json_loads(raw, what=f"manifest {RSI_DIR}/{MANIFEST_FILE}")
    except limits.InputLimitError as exc:
        raise ProposerError(str(exc)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProposerError(f"manifest {RSI_DIR}/{MANIFEST_FILE} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("edits"), list):
        raise ProposerError(f'manifest {RSI_DIR}/{MANIFEST_FILE} must be an object with a list "edits"')
    edits = []
    for number, item in enumerate(data["edits"]):
        where = f"manifest edit {number}"
        if not isinstance(item, dict):
            raise ProposerError(f"{where} is not an object")
        component, hypothesis, paths = item.get("component"), item.get("hypothesis"), item.get("paths")
        if not isinstance(component, str) or not component.strip():
            raise ProposerError(f'{where}: "component" must be a non-empty string')
        if not isinstance(hypothesis, str) or not hypothesis.strip():
            raise ProposerError(f'{where}: "hypothesis" must be a non-empty string')
        if not isinstance(paths, list) or not paths or not all(isinstance(p, str) and p for p in paths):
            raise ProposerError(f'{where}: "paths" must be a non-empty list of strings')
        edits.append(EditDeclaration(component=component.strip(), hypothesis=hypothesis.strip(), paths=list(paths)))
    note = data.get("note", "")
    if not isinstance(note, str):
        raise ProposerError(f'manifest {RSI_DIR}/{MANIFEST_FILE}: "note" must be a string')
    usage = data.get("usage", {})
    if not isinstance(usage, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in usage.items()
    ):
        raise ProposerError(f'manifest {RSI_DIR}/{MANIFEST_FILE}: "usage" must map names to integers')
    return edits, note, usage


def _read_back(workspace: Path, *, max_file_bytes: int, max_files: int) -> tuple[dict[str, bytes], bytes]:
    """The proposed files and the manifest bytes."""
    try:
        entries = read_directory(workspace, max_file_bytes=max_file_bytes, max_files=max_files)
    except SnapshotError as exc:
        raise ProposerError(f"the workspace cannot be read back: {exc}") from None
    files: dict[str, bytes] = {}
    manifest: bytes | None = None
    for entry in entries:
        if entry.path == f"{RSI_DIR}/{MANIFEST_FILE}" and entry.mode != MODE_SYMLINK:
            manifest = entry.data
        if entry.path == RSI_DIR or entry.path.startswith(RSI_DIR + "/"):
            continue
        if entry.mode == MODE_SYMLINK:
            # A proposal carries file contents only; a symlink cannot be represented.
            raise ProposerError(f"{entry.path}: symlinks are not allowed in a proposal")
        files[entry.path] = entry.data
    if manifest is None:
        raise ProposerError(f"the program wrote no manifest {RSI_DIR}/{MANIFEST_FILE}")
    return files, manifest


# --- The operator -----------------------------------------------------------------------------------


def _argv(params: Mapping[str, Any], values: Mapping[str, str]) -> list[str]:
    argv = params.get("argv")
    if not isinstance(argv, list | tuple) or not argv or not all(isinstance(part, str) for part in argv):
        raise ProposerError('params "argv" must be a non-empty list of strings')
    filled = []
    for part in argv:
        # Plain replacement, not str.format: argv may hold braces of its own (inline code, JSON).
        for key, value in values.items():
            part = part.replace("{" + key + "}", value)
        filled.append(part)
    return filled


def _environment(params: Mapping[str, Any]) -> dict[str, str]:
    allowlist: Sequence[str] = params.get("env_allowlist", DEFAULT_ENV_ALLOWLIST)
    extra = params.get("env", {})
    if not isinstance(extra, Mapping):
        raise ProposerError('params "env" must be a mapping of names to values')
    env = {name: os.environ[name] for name in allowlist if name in os.environ}
    env.update({str(name): str(value) for name, value in extra.items()})
    return env


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text[-ERROR_TAIL_CHARS:] if text else "(no output on stderr)"


@operators.register("proposal", "command")
def command_proposer(view: ProposerView) -> Proposal:
    """Run ``params["argv"]`` in a fresh copy of the parent and return what it changed.

    Raises ProposerError on a bad configuration, a nonzero exit, a timeout, a
    missing or malformed manifest, or a workspace that cannot be read back
    (a symlink, an oversized file). The temporary workspace is removed in
    every case; nothing else is written.
    """
    params = view.params
    timeout = params.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ProposerError(f'params "timeout_seconds" must be a positive number, not {timeout!r}')
    try:
        limits = Limits.from_dict(params.get("limits", {}))
    except (TypeError, ValueError) as exc:
        raise ProposerError(f'params "limits": {exc}') from None
    env = _environment(params)
    max_file_bytes = int(params.get("max_file_bytes", DEFAULT_MAX_FILE_BYTES))
    max_files = int(params.get("max_files", DEFAULT_MAX_FILES))

    reserved = sorted(p for p in view.parent_files if p == RSI_DIR or p.startswith(RSI_DIR + "/"))
    if reserved:
        raise ProposerError(f"the parent has files under {RSI_DIR}/, which is the proposer's own folder: {reserved[0]}")
    # mkdtemp, not pytest's or the worker's folders: when the worker is root the
    # program runs as an unprivileged uid, which must reach the workspace (it is chowned to it).
    workspace = Path(tempfile.mkdtemp(prefix="rsi-proposer-"))
    try:
        try:
            materialize([FileEntry(path, "100644", data) for path, data in view.parent_files.items()], workspace)
        except SnapshotError as exc:
            raise ProposerError(f"the parent's files cannot be laid out: {exc}") from None
        rsi = workspace / RSI_DIR
        rsi.mkdir()
        (rsi / PROMPT_FILE).write_text(prompt_text(view), encoding="utf-8")
        (rsi / VIEW_FILE).write_text(json.dumps(view_document(view), indent=1, default=str), encoding="utf-8")
        values = {"workspace": str(workspace), "prompt": str(rsi / PROMPT_FILE), "manifest": str(rsi / MANIFEST_FILE)}
        command = _argv(params, values)
        try:
            result = run_sandboxed(
                command,
                cwd=workspace,
                env=env,
                timeout=float(timeout),
                limits=limits,
                writable=[workspace],
                readable=[],
                use_bwrap=False,
            )
        except (SandboxError, ValueError) as exc:
            raise ProposerError(f"cannot run the proposer command: {exc}") from None
        if result.disk_exceeded:
            raise ProposerError(f"the proposer command was killed: {result.disk_problem}")
        if result.timed_out:
            raise ProposerError(f"the proposer command timed out after {float(timeout):g} s: {_tail(result.stderr)}")
        if result.returncode != 0:
            how = (
                f"was killed by signal {result.killed_by_signal}"
                if result.killed_by_signal
                else f"exited with status {result.returncode}"
            )
            raise ProposerError(f"the proposer command {how}: {_tail(result.stderr)}")
        files, manifest = _read_back(workspace, max_file_bytes=max_file_bytes, max_files=max_files)
        edits, note, usage = parse_manifest(manifest)
        return Proposal(files=files, edits=edits, note=note, usage=usage)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
