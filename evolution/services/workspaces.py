"""Import an existing evolution workspace (the layout of the public RSIHub project).

A workspace is a git repository with one ``gen/<id>`` tag per generation (the
tag's tree is that generation's harness) and an append-only ``archive.jsonl``
of generation events. docs/workspaces.md describes the fields we read and how
liberal we are about them.

We did not run any of it, so nothing imported is ever certified by us: the
per-task scores become external evaluations (``external_results_ingest``), the
source's verdict, score, cost, evaluator fingerprint and task-set hash are kept
in the evaluation's ``source`` exactly as the source wrote them, and candidates
never reach ACCEPTED (which needs a certification).
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils.text import slugify

from evolution import limits
from evolution.models import (
    Benchmark,
    Candidate,
    Evaluation,
    Evaluator,
    Experiment,
    SplitMembership,
    SplitName,
    Task,
)
from evolution.services.experiments import SplitsFrozenError, split_digests_store, surface_create
from evolution.services.external import MAX_RESULTS, ExternalResultsError, external_results_ingest
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry, SnapshotError, read_git

FORMAT = "rsihub-workspace"
ARCHIVE = "archive.jsonl"
# Fields the source stamps once per evaluation: the first value seen for a
# generation is kept (a later event may not rewrite what was measured).
STAMPED = ("score", "task_vector", "cost", "evaluator_fingerprint", "task_set_hash")
PASS_WORDS = frozenset({"pass", "passed", "success", "succeeded", "resolved", "ok", "correct", "solved"})
# RSIHub's outcome classes (src/evolve/evaluation/results.py, Outcome): a trial's
# ``status`` says whether the benchmark ran, its ``reward`` how well it did.
COMPLETE = "benchmark_complete"
ERROR_OUTCOMES = frozenset({"infrastructure_failed", "candidate_invalid", "timeout", "cancelled", "missing"})
# A timeout owned by the benchmark (the agent or verifier ran out of time) with
# a reward is scored by RSIHub; any other non-complete trial is not.
BENCHMARK_OWNERS = frozenset({"benchmark_agent", "benchmark_verifier"})
# Generations RSIHub records without a tag: the proposal was refused before
# any evaluation (driver._append_candidate_rejected and its siblings).
PROPOSAL_REJECTED = frozenset(
    {"no_proposal", "invalid_proposal", "rejected_validation", "rejected_novelty", "operator_failed"}
)
KEEP_VERDICTS = frozenset({"keep", "kept", "accept", "accepted", "adopt", "adopted", "improved"})
DISCARD_VERDICTS = frozenset({"discard", "discarded", "reject", "rejected", "revert", "reverted", "regressed"})
# Fields of an evaluation's source that a later event may change (the gate's decision).
SOURCE_UPDATED = ("verdict", "reason", "status", "outcome", "pending_gate_record", "valid_parent")
SURFACE_SPEC = 'include: ["**"]\ncomponents: {"**": config}\n'
# The placeholder evaluator: runs nothing, fails loudly if anybody tries.
PLACEHOLDER_CODE = (
    "import sys; sys.exit('this evaluator is a placeholder for an imported workspace: the source evaluator "
    "(fingerprint ' + sys.argv[1] + ') is not stored here and cannot be run')"
)
_SPLITS = {choice.value for choice in SplitName if choice != SplitName.HELDOUT}


class WorkspaceError(ValueError):
    """Bad workspace; the message names the archive line when there is one."""


class WorkspaceRefused(WorkspaceError):
    """A workspace over one of the input limits (evolution.limits): refused before any work."""


@dataclass
class Generation:
    genid: str
    line: int
    record: dict[str, Any] = field(default_factory=dict)
    ignored: list[dict[str, Any]] = field(default_factory=list)
    # One item per trial, in external_results_ingest's shape: task, index, passed, score, tokens?, steps?
    results: list[dict[str, Any]] = field(default_factory=list)
    splits: dict[str, str] = field(default_factory=dict)
    entries: list[FileEntry] = field(default_factory=list)
    commit: str = ""

    @property
    def tag(self) -> str:
        tag = self.record.get("tag")
        return tag if isinstance(tag, str) and tag else f"gen/{self.genid}"

    @property
    def parent(self) -> str | None:
        parent = self.record.get("parent")
        return None if parent is None or parent == "" else str(parent)


@dataclass
class ImportReport:
    experiment: Experiment
    created: bool
    imported: list[str]
    skipped: list[str]
    notes: list[str]


# --- Reading the archive (pure) -------------------------------------------------


def _genid(event: Mapping[str, Any]) -> str | None:
    for key in ("genid", "generation", "gen", "id"):
        value = event.get(key)
        if isinstance(value, bool):
            continue
        if isinstance(value, int | str) and str(value).strip():
            return str(value).strip()
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _trial(where: str, raw: Any) -> dict[str, Any]:
    """One trial from the many shapes a task vector may use."""
    if isinstance(raw, bool):
        return {"passed": raw, "score": 1.0 if raw else 0.0}
    plain = _number(raw)
    if plain is not None:
        if not 0 <= plain <= 1:
            raise WorkspaceError(f"{where}: score {raw!r} is not in [0, 1]")
        return {"passed": plain >= 1.0, "score": plain}
    if not isinstance(raw, Mapping):
        raise WorkspaceError(f"{where}: a trial must be a number, true/false or an object, got {raw!r}")
    score_raw = raw.get("score", raw.get("reward"))
    score = _number(score_raw)
    if score_raw is not None and (score is None or not 0 <= score <= 1):
        raise WorkspaceError(f"{where}: score {score_raw!r} is not a number in [0, 1]")
    status = raw.get("status", raw.get("outcome"))
    if isinstance(status, str) and (status == COMPLETE or status in ERROR_OUTCOMES):
        return _rsihub_trial(where, raw, status, score)
    passed = raw.get("passed")
    if not isinstance(passed, bool):
        if isinstance(status, str) and status:
            passed = status.strip().lower() in PASS_WORDS
        elif score is not None:
            passed = score >= 1.0
        else:
            raise WorkspaceError(f"{where}: a trial needs 'passed', 'status' or 'score'")
    result: dict[str, Any] = {"passed": passed, "score": score if score is not None else (1.0 if passed else 0.0)}
    for key in ("tokens", "steps"):
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            result[key] = value
    return result


def _rsihub_trial(where: str, raw: Mapping[str, Any], status: str, reward: float | None) -> dict[str, Any]:
    """A trial as RSIHub's TrialResult writes it: ``status`` is the outcome
    class, ``reward`` the score. Only a scored trial is a pass or a fail; an
    infrastructure failure (or any trial RSIHub does not score) is an error,
    which counts neither way."""
    scored = reward is not None and (
        status == COMPLETE or (status == "timeout" and raw.get("owner") in BENCHMARK_OWNERS)
    )
    if scored:
        assert reward is not None
        return {"passed": reward >= 1.0, "score": reward}
    if status == COMPLETE:
        raise WorkspaceError(f"{where}: a benchmark_complete trial needs a reward")
    detail = ": ".join(str(raw[key]) for key in ("exception_type", "exception_message") if raw.get(key))
    return {"passed": False, "error": f"{status}{' (' + detail + ')' if detail else ''}"[:2000]}


def _task_vector(where: str, vector: Any) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Per-trial results and per-task splits from a task vector.

    Accepted: RSIHub's ``{"schema_version": 1, "tasks": {id: {"trials": [...]}}}``,
    a plain ``{id: score | bool | {...}}`` mapping, or a list of
    ``{"task": id, ...}`` objects.
    """
    if isinstance(vector, Mapping) and isinstance(vector.get("tasks"), Mapping | list):
        vector = vector["tasks"]
    items: list[tuple[str, Any]]
    if isinstance(vector, Mapping):
        items = [(str(key), value) for key, value in vector.items()]
    elif isinstance(vector, list):
        items = []
        for position, entry in enumerate(vector):
            task = entry.get("task", entry.get("task_id")) if isinstance(entry, Mapping) else None
            if not isinstance(task, str | int) or isinstance(task, bool) or not str(task):
                raise WorkspaceError(f"{where}[{position}]: needs a 'task' (or 'task_id')")
            items.append((str(task), entry))
    else:
        raise WorkspaceError(f"{where}: must be an object or a list, got {type(vector).__name__}")
    results: list[dict[str, Any]] = []
    task_splits: dict[str, str] = {}
    for task, value in items:
        here = f"{where}.{task}"
        if not task.strip() or len(task) > 200:
            raise WorkspaceError(f"{here}: task id must be 1 to 200 characters")
        trials: list[Any] = [value]
        if isinstance(value, Mapping):
            split = value.get("split")
            if split is not None:
                if split not in _SPLITS:
                    raise WorkspaceError(f"{here}.split: {split!r} is not one of {', '.join(sorted(_SPLITS))}")
                task_splits[task] = split
            if "trials" in value:
                if not isinstance(value["trials"], list) or not value["trials"]:
                    raise WorkspaceError(f"{here}.trials: must be a non-empty list")
                trials = value["trials"]
        for index, raw in enumerate(trials):
            results.append(
                {"task": task, "index": index, **_trial(f"{here}[{index}]" if len(trials) > 1 else here, raw)}
            )
    return results, task_splits


def _events(text: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) of the archive's lines, within the input limits."""
    try:
        yield from limits.jsonl_loads(text, what=ARCHIVE)
    except limits.InputLimitError as exc:
        raise WorkspaceRefused(str(exc)) from None
    except limits.JSONLineError as exc:
        error = WorkspaceRefused if exc.refused else WorkspaceError
        raise error(f"{ARCHIVE} line {exc.line}: {exc.detail}") from None


def archive_parse(text: str, *, known: Collection[str] = ()) -> list[Generation]:
    """Parse ``archive.jsonl`` into generations in first-seen order.

    Events of one generation are merged: stamped fields keep their first
    value, other fields take the latest; an event measured on another task
    set than the generation's first is kept aside (``ignored``). ``known``
    holds generation ids imported earlier (valid parents). Raises
    WorkspaceError naming the line. Pure.
    """
    generations: dict[str, Generation] = {}
    for number, event in _events(text):
        where = f"{ARCHIVE} line {number}"
        if not isinstance(event, dict):
            raise WorkspaceError(f"{where}: must be a JSON object")
        genid = _genid(event)
        if genid is None:
            raise WorkspaceError(f"{where}: no generation id (genid)")
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", genid):
            raise WorkspaceError(f"{where}: generation id {genid!r} is not a usable tag name")
        generation = generations.get(genid)
        if generation is None:
            generation = generations[genid] = Generation(genid=genid, line=number)
        record = generation.record
        first_hash = record.get("task_set_hash")
        if event.get("task_set_hash") is not None and first_hash is not None and event["task_set_hash"] != first_hash:
            generation.ignored.append({"line": number, "task_set_hash": event["task_set_hash"]})
            continue
        # RSIHub's merged rows: the first evaluation (an event with a task-set
        # hash) replaces what an earlier placeholder stamped, e.g. generation
        # 0's set-up cost of 0 gives way to the genesis evaluation's cost.
        replaces = event.get("task_set_hash") is not None and first_hash is None
        for key, value in event.items():
            if key in STAMPED and record.get(key) is not None and not replaces:
                continue
            record[key] = value
        parent = event.get("parent")
        if parent not in (None, "") and str(parent) not in generations and str(parent) not in known:
            raise WorkspaceError(f"{where}: parent {parent!r} is not a generation defined before it")
        if str(parent) == genid:
            raise WorkspaceError(f"{where}: generation {genid!r} names itself as parent")
    tasks: set[str] = set()
    for generation in generations.values():
        where = f"{ARCHIVE} line {generation.line} (generation {generation.genid})"
        vector = generation.record.get("task_vector")
        if vector is not None:
            generation.results, generation.splits = _task_vector(f"{where}: task_vector", vector)
        # Counted here, before any tree is read or task stored: 200,000 tasks took 254 s to be refused.
        tasks.update(result["task"] for result in generation.results)
        if len(generation.results) > MAX_RESULTS:
            raise WorkspaceRefused(f"{where}: {len(generation.results)} trial results, over the limit of {MAX_RESULTS}")
        try:
            limits.check_count(len(tasks), setting="RSI_MAX_TASKS", what="tasks in the workspace")
        except limits.InputLimitError as exc:
            raise WorkspaceRefused(f"{where}: {exc}") from None
        score = generation.record.get("score")
        if score is not None and _number(score) is None:
            raise WorkspaceError(f"{where}: score {score!r} is not a number")
        for key in ("evaluator_fingerprint", "task_set_hash", "verdict"):
            value = generation.record.get(key)
            if value is not None and not isinstance(value, str):
                raise WorkspaceError(f"{where}: {key} must be a string, got {value!r}")
    return list(generations.values())


def _state(generation: Generation) -> tuple[str, str]:
    """Candidate state and reason for a source verdict. Never ACCEPTED or
    CERTIFIED: those say *we* certified it. A verdict RSIHub marks
    provisional (``pending_gate_record``: its gate has not decided yet) is not
    a discard: the candidate is evaluated and awaiting the source's gate."""
    record = generation.record
    verdict = record.get("verdict")
    word = verdict.strip().lower() if isinstance(verdict, str) else ""
    outcome = record.get("outcome")
    if isinstance(outcome, str) and outcome in ERROR_OUTCOMES:
        return Candidate.State.FAILED, f"imported: the source's evaluation ended {outcome!r} ({record.get('reason')!r})"
    if record.get("pending_gate_record") is True:
        return Candidate.State.EVALUATED, "imported: evaluated, awaiting the source's gate; not certified here"
    if word in KEEP_VERDICTS:
        return Candidate.State.EVALUATED, f"imported: the source kept it (verdict {verdict!r}); not certified here"
    if word in DISCARD_VERDICTS:
        return Candidate.State.REJECTED_GATE, f"imported: the source discarded it (verdict {verdict!r})"
    if generation.results:
        return Candidate.State.EVALUATED, f"imported: source verdict {verdict!r}; not certified here"
    status = str(record.get("status") or "")
    state = Candidate.State.FAILED if "fail" in status.lower() else Candidate.State.CANCELLED
    return state, f"imported: the source recorded no results (verdict {verdict!r}, status {status!r})"


def _proposal_rejected(generation: Generation) -> dict[str, Any] | None:
    """The rejected proposal a tagless generation stands for, or None."""
    record = generation.record
    status = record.get("status")
    if generation.results or not isinstance(status, str) or status not in PROPOSAL_REJECTED:
        return None
    return {
        "genid": generation.genid,
        "parent": generation.parent,
        "status": status,
        "reason": str(record.get("reason") or record.get("note") or ""),
        "mutated": [str(path) for path in record.get("mutated") or [] if isinstance(path, str)][:100],
        "surface_violations": [str(path) for path in record.get("surface_violations") or [] if isinstance(path, str)][
            :100
        ],
        "archive_line": generation.line,
    }


def _commit(repo: Path, tag: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return result.stdout.strip() if result.returncode == 0 else ""


# --- Writing ----------------------------------------------------------------------


def _names(name: str) -> str:
    slug = slugify(f"imported-{name}")[:100].strip("-")
    if not slug or slug == "imported":
        raise WorkspaceError(f"name {name!r} gives no usable benchmark name; pass --name")
    return slug


def workspace_import(*, path: Path, name: str | None = None) -> ImportReport:
    """Import the workspace at ``path`` as an experiment named ``name``
    (default: the folder name).

    All or nothing: the archive and every generation's tree are read and
    validated before the first write, and the writes happen in one
    transaction. Safe to repeat: generations imported before are skipped,
    so a grown archive imports only its new generations.
    """
    path = Path(path)
    archive = path / ARCHIVE
    if not archive.is_file():
        raise WorkspaceError(f"{path}: no {ARCHIVE} (is this an evolution workspace?)")
    name = name or path.resolve().name
    slug = _names(name)
    experiment = Experiment.objects.filter(name=name).first()
    imported: dict[str, int] = {}
    if experiment is not None:
        origin = experiment.run_settings.get("imported_from") if isinstance(experiment.run_settings, dict) else None
        if not isinstance(origin, dict) or origin.get("format") != FORMAT:
            raise WorkspaceError(f"an experiment named {name!r} exists and was not imported from a workspace")
        imported = dict(origin.get("generations", {}))
    elif Benchmark.objects.filter(name=slug).exists() or Evaluator.objects.filter(name=slug).exists():
        raise WorkspaceError(f"a benchmark or evaluator named {slug!r} exists already; choose another --name")

    try:
        text = limits.read_bytes(archive, setting="RSI_MAX_ARCHIVE_BYTES", what=str(archive)).decode("utf-8")
    except limits.InputLimitError as exc:
        raise WorkspaceRefused(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise WorkspaceError(f"{archive}: not UTF-8 ({exc})") from None
    rejected: dict[str, dict[str, Any]] = {}
    if experiment is not None:
        rejected = dict(experiment.run_settings["imported_from"].get("proposals_rejected", {}))
    generations = archive_parse(text, known=[*imported, *rejected])
    new = [g for g in generations if g.genid not in imported and g.genid not in rejected]
    skipped = [g.genid for g in generations if g.genid in imported or g.genid in rejected]
    for generation in new:
        generation.commit = _commit(path, generation.tag)
        proposal = _proposal_rejected(generation) if not generation.commit else None
        if proposal is not None:
            # RSIHub refused the proposal before evaluating it and made no tag.
            rejected[generation.genid] = proposal
            continue
        try:
            generation.entries = read_git(
                path,
                f"refs/tags/{generation.tag}",
                max_file_bytes=settings.RSI_MAX_FILE_BYTES,
                max_files=settings.RSI_MAX_TREE_FILES,
            )
        except SnapshotError as exc:
            raise WorkspaceError(f"{ARCHIVE} line {generation.line} (generation {generation.genid}): {exc}") from None
    tagged = [generation for generation in new if generation.genid not in rejected]
    earlier = [generation for generation in generations if generation.genid in imported]

    notes: list[str] = []
    with transaction.atomic():
        created = experiment is None
        if experiment is None:
            experiment = _experiment_create(name=name, slug=slug, path=path, generations=tagged)
        else:
            experiment = Experiment.objects.select_for_update(no_key=True).get(pk=experiment.pk)
        _tasks_add(experiment, tagged + earlier)
        by_genid = {genid: Candidate.objects.get(pk=pk) for genid, pk in imported.items()}
        for generation in earlier:
            _refresh(by_genid[generation.genid], generation, path, notes)
        for generation in new:
            if generation.genid in rejected:
                proposal = rejected[generation.genid]
                notes.append(
                    f"generation {generation.genid}: proposal rejected ({proposal['status']}: {proposal['reason']})"
                )
                continue
            candidate = _candidate(experiment, generation, by_genid, notes)
            by_genid[generation.genid] = candidate
            imported[generation.genid] = candidate.pk
            if generation.results:
                _scores(candidate, generation, path)
            for extra in generation.ignored:
                notes.append(
                    f"generation {generation.genid}: line {extra['line']} measured task set "
                    f"{extra['task_set_hash']!r}, not imported (only the first task set is)"
                )
        experiment.run_settings = {
            **experiment.run_settings,
            "imported_from": {
                **experiment.run_settings.get("imported_from", {}),
                "generations": imported,
                "proposals_rejected": rejected,
            },
        }
        experiment.save(update_fields=["run_settings", "seed_candidate"])
        try:
            split_digests_store(experiment=experiment)
        except SplitsFrozenError as exc:  # results run here bind the task sets: roll the import back
            raise WorkspaceError(str(exc)) from None
    return ImportReport(
        experiment=experiment,
        created=created,
        imported=[generation.genid for generation in new],
        skipped=skipped,
        notes=notes,
    )


def _experiment_create(*, name: str, slug: str, path: Path, generations: list[Generation]) -> Experiment:
    fingerprints = sorted(
        {str(g.record["evaluator_fingerprint"]) for g in generations if g.record.get("evaluator_fingerprint")}
    )
    fingerprint = ",".join(fingerprints) or "unknown"
    benchmark = Benchmark.objects.create(
        name=slug, title=f"Imported from {name}", description=f"Tasks named in the task vectors of {path}"
    )
    argv = ["{python}", "-c", PLACEHOLDER_CODE, fingerprint]
    evaluator = Evaluator.objects.create(
        name=slug, files=tree_store(entries=[]), runner_argv=argv, verifier_argv=argv, timeout_seconds=1
    )
    surface = surface_create(name=f"imported {name}"[:200], spec=SURFACE_SPEC)
    return Experiment.objects.create(
        name=name,
        description=f"Imported from the evolution workspace {path.resolve()}; nothing here was run or certified by us.",
        benchmark=benchmark,
        evaluator=evaluator,
        surface=surface,
        split_ratios={"train": 1.0},
        trials_per_task=max((r["index"] + 1 for g in generations for r in g.results), default=1),
        run_settings={
            "imported_from": {
                "format": FORMAT,
                "workspace": str(path.resolve()),
                "evaluator_fingerprints": fingerprints,
                "generations": {},
            }
        },
        status=Experiment.Status.FINISHED,
    )


def _tasks_add(experiment: Experiment, generations: list[Generation]) -> None:
    wanted: dict[str, str] = {}
    for generation in generations:
        for result in generation.results:
            wanted.setdefault(result["task"], generation.splits.get(result["task"], SplitName.TRAIN))
    existing = {task.external_id: task for task in experiment.benchmark.tasks.all()}
    members = set(SplitMembership.objects.filter(experiment=experiment).values_list("task__external_id", flat=True))
    for task_id, split in sorted(wanted.items()):
        task = existing.get(task_id) or Task.objects.create(
            benchmark=experiment.benchmark,
            external_id=task_id,
            instruction=f"imported task {task_id}",
            expected={},
            metadata={"imported": True},
        )
        if task_id not in members:
            SplitMembership.objects.create(experiment=experiment, task=task, split=split)


def _candidate(
    experiment: Experiment, generation: Generation, by_genid: dict[str, Candidate], notes: list[str]
) -> Candidate:
    tree = tree_store(entries=generation.entries)
    duplicate = Candidate.objects.filter(experiment=experiment, tree=tree).first()
    if duplicate is not None:
        # One candidate per tree in an experiment: a generation that changed
        # nothing is the same harness; its scores attach to that candidate.
        notes.append(f"generation {generation.genid} has the same files as {duplicate.label or duplicate.pk}")
        return duplicate
    state, reason = _state(generation)
    round_number = int(generation.genid) if generation.genid.isdigit() and len(generation.genid) < 9 else None
    candidate = Candidate.objects.create(
        experiment=experiment,
        parent=by_genid.get(generation.parent) if generation.parent else None,
        tree=tree,
        origin=Candidate.Origin.IMPORTED,
        state=state,
        state_reason=reason,
        round=round_number,
        label=generation.tag[:200],
    )
    if experiment.seed_candidate_id is None and candidate.parent_id is None:
        experiment.seed_candidate = candidate
    return candidate


def _refresh(candidate: Candidate, generation: Generation, path: Path, notes: list[str]) -> None:
    """Apply what a later import reads about a generation imported before:
    the gate's event after a provisional verdict, an evaluation recorded
    after the generation was first seen. Safe to repeat."""
    evaluation = candidate.evaluations.filter(external=True, source__genid=generation.genid).first()
    if evaluation is None and generation.results:
        _scores(candidate, generation, path)
        notes.append(f"generation {generation.genid}: evaluation imported")
    elif evaluation is not None:
        fields = {key: generation.record.get(key) for key in SOURCE_UPDATED}
        if any(evaluation.source.get(key) != value for key, value in fields.items()):
            evaluation.source = {**evaluation.source, **fields}
            evaluation.save(update_fields=["source"])
    state, reason = _state(generation)
    if candidate.origin != Candidate.Origin.IMPORTED or (candidate.state, candidate.state_reason) == (state, reason):
        return
    # Imported candidates mirror the source's verdict (the engine's state
    # machine is for what we run); the condition keeps a concurrent change safe.
    updated = Candidate.objects.filter(pk=candidate.pk, origin=Candidate.Origin.IMPORTED, state=candidate.state).update(
        state=state, state_reason=reason
    )
    if updated:
        notes.append(f"generation {generation.genid}: {candidate.state} -> {state} ({reason})")


def _scores(candidate: Candidate, generation: Generation, path: Path) -> Evaluation:
    record = generation.record
    source = {
        "kind": "imported-workspace",
        "format": FORMAT,
        "workspace": str(path.resolve()),
        "archive_line": generation.line,
        "genid": generation.genid,
        "tag": generation.tag,
        "commit": generation.commit,
        "parent": generation.parent,
        **{key: record.get(key) for key in ("score", "cost", "evaluator_fingerprint", "task_set_hash")},
        **{key: record.get(key) for key in SOURCE_UPDATED},
    }
    try:
        return external_results_ingest(candidate=candidate, results=generation.results, source=source)
    except ExternalResultsError as exc:
        raise WorkspaceError(f"{ARCHIVE} line {generation.line} (generation {generation.genid}): {exc}") from None
