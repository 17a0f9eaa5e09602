"""Self-contained export bundles of an experiment's certified results.

A bundle is one JSON document (gzip-compressed when the file name ends in
``.gz``) holding everything needed to re-verify the experiment's certified
records somewhere else: the evaluation and decision records and the signed chain head, the
experiment's benchmark tasks (expected data included: the task-set digests
the records bind cover it), the splits, the evaluator, the surface, the
recipe(s), the candidates the records name (with their ancestors and
their critic flags) and every tree and blob those reference. docs/workspaces.md describes the format.

``bundle_verify`` is pure (no database): it checks the bundle's shape and
every tree's entries as storing them would, recomputes every blob, tree,
task, task-set, evaluator and record digest, the chain links and the
signatures, and the candidates' states against the certified decisions.
``bundle_import`` recreates the experiment in another database after that
very check (its only other refusals are conflicts with the database), so
``verify_records`` passes there.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hmac
import json
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from evolution import digests, limits, records
from evolution.models import (
    Benchmark,
    Blob,
    Candidate,
    CertifiedDecision,
    CertifiedResult,
    Evaluation,
    Experiment,
    LeakageFlag,
    Recipe,
    SplitMembership,
    SplitName,
    Task,
    Tree,
    TreeEntry,
    Trial,
)
from evolution.services.experiments import (
    ExperimentError,
    evaluator_upsert,
    split_digests_of,
    surface_create,
    task_digest,
)
from evolution.services.records import FLAG_FIELDS, settings_bound, split_stats_store
from evolution.services.snapshots import tree_store
from evolution.surfaces import SurfaceSpecError, parse_surface
from evolution.trees import FileEntry, SnapshotError, validate_entries

FORMAT = "rsiweb-bundle/1"


class BundleError(ValueError):
    """A bundle that cannot be read, verified or imported; ``problems`` lists why."""

    def __init__(self, message: str, problems: Iterable[str] = ()) -> None:
        self.problems = list(problems)
        super().__init__(message + ("".join(f"\n  {p}" for p in self.problems)))


# --- Export -----------------------------------------------------------------------


def _trees_and_blobs(tree_ids: Iterable[str]) -> tuple[dict[str, list[list[str]]], dict[str, str]]:
    wanted = sorted(set(tree_ids))
    trees: dict[str, list[list[str]]] = {digest: [] for digest in wanted}
    rows = TreeEntry.objects.filter(tree_id__in=wanted).order_by("tree_id", "path")
    for tree_id, path, mode, blob in rows.values_list("tree_id", "path", "mode", "blob_id"):
        trees[tree_id].append([path, mode, blob])
    blob_ids = {entry[2] for entries in trees.values() for entry in entries}
    blobs: dict[str, str] = {}
    for digest, content in Blob.objects.filter(digest__in=blob_ids).values_list("digest", "content"):
        blobs[digest] = base64.b64encode(bytes(content)).decode("ascii")
    return trees, dict(sorted(blobs.items()))


def bundle_build(*, experiment: Experiment) -> dict[str, Any]:
    """The bundle of ``experiment`` as a JSON-compatible dict. Reads only."""
    experiment = Experiment.objects.select_related("benchmark", "evaluator", "surface", "recipe").get(pk=experiment.pk)
    rows = list(CertifiedResult.objects.filter(experiment=experiment).order_by("seq"))
    decisions = list(CertifiedDecision.objects.filter(experiment=experiment).order_by("seq"))

    # The candidates the records name, their ancestors and the seed.
    named = {row.candidate_id for row in rows} | {row.candidate_id for row in decisions}
    if experiment.seed_candidate_id:
        named.add(experiment.seed_candidate_id)
    by_pk: dict[int, Candidate] = {}
    pending = set(named)
    while pending:
        batch = list(Candidate.objects.filter(pk__in=pending).select_related("parent"))
        pending = set()
        for candidate in batch:
            by_pk[candidate.pk] = candidate
            if candidate.parent_id and candidate.parent_id not in by_pk:
                pending.add(candidate.parent_id)
    candidates = [by_pk[pk] for pk in sorted(by_pk)]
    flags: dict[int, list[list[str]]] = {}
    for candidate_id, *flag in (
        LeakageFlag.objects.filter(candidate_id__in=list(by_pk))
        .order_by("pk")
        .values_list("candidate_id", *FLAG_FIELDS)
    ):
        flags.setdefault(candidate_id, []).append(flag)

    memberships = list(
        SplitMembership.objects.filter(experiment=experiment)
        .select_related("task__benchmark")
        .order_by("split", "task__benchmark__name", "task__external_id")
    )
    tasks = {membership.task_id: membership.task for membership in memberships}
    benchmarks = {experiment.benchmark.name: experiment.benchmark}
    for task in tasks.values():
        benchmarks[task.benchmark.name] = task.benchmark
    signed: list[CertifiedResult | CertifiedDecision] = [*rows, *decisions]
    recipe_digests = {row.payload.get("recipe") for row in signed if isinstance(row.payload, dict)} | {
        experiment.recipe.digest if experiment.recipe else None
    }
    recipes = Recipe.objects.filter(digest__in=[d for d in recipe_digests if d]).order_by("digest")

    tree_ids = [c.tree_id for c in candidates] + [experiment.evaluator.files_id]
    tree_ids += [t.public_files_id for t in tasks.values() if t.public_files_id]
    trees, blobs = _trees_and_blobs(tree_ids)
    evaluator = experiment.evaluator
    return {
        "format": FORMAT,
        "exported_at": timezone.now().isoformat(),
        "experiment": {
            "uid": str(experiment.uid),
            "name": experiment.name,
            "description": experiment.description,
            "benchmark": experiment.benchmark.name,
            "heldout_benchmarks": sorted(b.name for b in experiment.heldout_benchmarks.all()),
            "recipe": experiment.recipe.digest if experiment.recipe else None,
            "seed_tree": experiment.seed_candidate.tree_id if experiment.seed_candidate is not None else None,
            "split_seed": experiment.split_seed,
            "split_ratios": experiment.split_ratios,
            "split_stratify_by": experiment.split_stratify_by,
            "split_digests": experiment.split_digests,
            "run_settings": experiment.run_settings,
            "trials_per_task": experiment.trials_per_task,
            "status": experiment.status,
        },
        "chain": {
            "length": experiment.chain_length,
            "head": experiment.chain_head,
            "signature": experiment.chain_head_signature,
        },
        "benchmarks": [
            {"name": b.name, "title": b.title, "description": b.description} for _, b in sorted(benchmarks.items())
        ],
        "tasks": [
            {
                "benchmark": task.benchmark.name,
                "id": task.external_id,
                "instruction": task.instruction,
                "public_files": task.public_files_id,
                "expected": task.expected,
                "criteria": task.criteria,
                "metadata": task.metadata,
                "digest": task_digest(task),
            }
            for task in sorted(tasks.values(), key=lambda t: (t.benchmark.name, t.external_id))
        ],
        "splits": [
            {"benchmark": m.task.benchmark.name, "task": m.task.external_id, "split": m.split} for m in memberships
        ],
        "evaluator": {
            "name": evaluator.name,
            "files": evaluator.files_id,
            "runner_argv": evaluator.runner_argv,
            "verifier_argv": evaluator.verifier_argv,
            "env_allowlist": evaluator.env_allowlist,
            "timeout_seconds": evaluator.timeout_seconds,
            "limits": evaluator.limits,
            "agent_network": evaluator.agent_network,
        },
        "surface": {
            "name": experiment.surface.name,
            "spec": experiment.surface.spec,
            "digest": experiment.surface.digest,
        },
        "recipes": [{"name": r.name, "version": r.version, "spec": r.spec, "digest": r.digest} for r in recipes],
        "candidates": [
            {
                "tree": c.tree_id,
                "parent_tree": c.parent.tree_id if c.parent is not None else None,
                "origin": c.origin,
                "state": c.state,
                "round": c.round,
                "label": c.label,
                "state_reason": c.state_reason,
                "certified_at": c.certified_at.isoformat() if c.certified_at else None,
                "flags": flags.get(c.pk, []),
            }
            for c in candidates
        ],
        "records": [
            {
                "seq": row.seq,
                "prev_digest": row.prev_digest,
                "record_digest": row.record_digest,
                "signature": row.signature,
                "payload": row.payload,
            }
            for row in rows
        ],
        "decisions": [
            {
                "seq": entry.seq,
                "kind": entry.kind,
                "prev_digest": entry.prev_digest,
                "record_digest": entry.record_digest,
                "signature": entry.signature,
                "payload": entry.payload,
            }
            for entry in decisions
        ],
        "trees": trees,
        "blobs": blobs,
    }


def bundle_write(*, bundle: Mapping[str, Any], path: Path) -> None:
    data = json.dumps(bundle, sort_keys=True, ensure_ascii=False, allow_nan=False).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)


def bundle_read(path: Path) -> dict[str, Any]:
    """Read a bundle file (plain or gzip JSON); BundleError when unreadable
    or over a limit: ``RSI_MAX_BUNDLE_BYTES`` for the file and for what it
    decompresses to (decompressed as a stream that stops there, or at
    ``RSI_MAX_DECOMPRESSION_RATIO``), ``RSI_MAX_INPUT_DEPTH``, and the
    counts of files (blobs and tree entries) and tasks, before any is checked."""
    try:
        raw = limits.read_bytes(path, setting="RSI_MAX_BUNDLE_BYTES", what="the bundle file")
        if raw[:2] == b"\x1f\x8b":
            raw = limits.gunzip(raw, setting="RSI_MAX_BUNDLE_BYTES", what="the bundle")
        bundle = limits.json_loads(raw, what="the bundle")
    except limits.InputLimitError as exc:
        raise BundleError(f"{path}: refused: {exc}") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: not a readable bundle ({exc})") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise BundleError(f"{path}: not a {FORMAT} bundle")
    try:
        _check_counts(bundle)
    except limits.InputLimitError as exc:
        raise BundleError(f"{path}: refused: {exc}") from None
    return bundle


def _check_counts(bundle: Mapping[str, Any]) -> None:
    """Refuse a bundle holding more files or tasks than the limits allow (a
    malformed part is left for verification to report)."""
    blobs, trees, tasks = bundle.get("blobs"), bundle.get("trees"), bundle.get("tasks")
    files = len(blobs) if isinstance(blobs, dict) else 0
    if isinstance(trees, dict):
        files = max(files, sum(len(entries) for entries in trees.values() if isinstance(entries, list)))
    limits.check_count(files, setting="RSI_MAX_BUNDLE_FILES", what="files (blobs or tree entries) in the bundle")
    if isinstance(tasks, list):
        limits.check_count(len(tasks), setting="RSI_MAX_TASKS", what="tasks in the bundle")


# --- Verification (pure) ------------------------------------------------------------


def _decode(blob: Any) -> bytes | None:
    try:
        return base64.b64decode(blob, validate=True) if isinstance(blob, str) else None
    except (binascii.Error, ValueError):
        return None


def _split_digests(bundle: Mapping[str, Any], task_digests: Mapping[tuple[str, str], str]) -> dict[str, str]:
    return split_digests_of(
        (m.get("split"), m.get("benchmark"), m["task"], task_digests.get((m.get("benchmark"), m["task"]), "missing"))
        for m in bundle.get("splits", [])
    )


def bundle_verify(bundle: Mapping[str, Any], *, key: str) -> list[str]:
    """Every problem found in a bundle; empty when it checks out. No database.

    The one check of a bundle: ``verify_records --bundle`` prints it and
    ``bundle_import`` refuses on it, so the two never disagree; import adds
    only what needs the database (a conflict with what is already there).
    Checks that every section has the shape import reads (``_shape``), that
    every tree's entries are ones ``tree_store`` would take (paths with
    ``..``, absolute or escaping symlinks, control characters...), that the
    surface parses; recomputes blob, tree, task, task-set, evaluator,
    surface and recipe digests; checks that every record names things the
    bundle holds and that its task sets, evaluator, surface, run settings,
    recipe and candidate origin and parent are the bundle's; that the
    held-out benchmarks are those of the held-out split; checks the
    candidates' states against the certified decisions
    (``records.candidate_state_problems``) and the gate records against the
    candidates' critic flags and the review decisions
    (``records.review_basis_problems``); refuses a candidate no record names
    that is not the seed or an ancestor of one that is; and verifies
    the chain of evaluation and decision records together (links, record
    digests, signatures, signed head) with ``key``. A structurally broken
    bundle is reported as one problem, never raised.
    """
    try:
        problems = _shape(bundle)
        if problems:
            return problems
        return _verify(bundle, key=key)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        return [f"bundle is malformed: {type(exc).__name__}: {exc}"]


_TEXT = (str,)
_OPTIONAL_TEXT = (str, type(None))
_INT = (int,)


def _fields(problems: list[str], where: str, item: Any, fields: Mapping[str, tuple[type, ...]]) -> bool:
    """Report each field of ``item`` missing or of another type; True when all are right."""
    if not isinstance(item, dict):
        problems.append(f"{where}: not an object")
        return False
    ok = True
    for name, kinds in fields.items():
        value = item.get(name, ...)
        if value is ... or not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            problems.append(f"{where}: {name!r} is missing or not {'/'.join(k.__name__ for k in kinds)}")
            ok = False
    return ok


def _shape(bundle: Mapping[str, Any]) -> list[str]:
    """What ``_create`` reads, present and of the right type, and the
    references between sections that it follows (a task's benchmark, a
    split's task, a candidate's parent listed before it, a record's trials
    in the bundle's splits). Pure."""
    problems: list[str] = []
    sections = {
        "experiment": (dict,),
        "chain": (dict,),
        "benchmarks": (list,),
        "tasks": (list,),
        "splits": (list,),
        "evaluator": (dict,),
        "surface": (dict,),
        "recipes": (list,),
        "candidates": (list,),
        "records": (list,),
        "trees": (dict,),
        "blobs": (dict,),
    }
    if not _fields(problems, "bundle", bundle, sections):
        return problems
    if not isinstance(bundle.get("decisions", []), list):  # absent from bundles made before decisions were certified
        return ["bundle: 'decisions' is not list"]
    _fields(
        problems,
        "experiment",
        bundle["experiment"],
        {
            "uid": _TEXT,
            "name": _TEXT,
            "description": _TEXT,
            "benchmark": _TEXT,
            "heldout_benchmarks": (list,),
            "recipe": _OPTIONAL_TEXT,
            "seed_tree": _OPTIONAL_TEXT,
            "split_seed": _INT,
            "split_ratios": (dict,),
            "split_digests": (dict,),
            "run_settings": (dict,),
            "trials_per_task": _INT,
            "status": _TEXT,
        },
    )
    if bundle["experiment"].get("status") not in Experiment.Status.values:
        problems.append(f"experiment: unknown status {str(bundle['experiment'].get('status'))[:40]!r}")
    _fields(problems, "chain", bundle["chain"], {"length": _INT, "head": _TEXT, "signature": _TEXT})
    benchmarks = set()
    for position, item in enumerate(bundle["benchmarks"], start=1):
        if _fields(problems, f"benchmark {position}", item, {"name": _TEXT, "title": _TEXT, "description": _TEXT}):
            benchmarks.add(item["name"])
    for name in [bundle["experiment"].get("benchmark"), *(bundle["experiment"].get("heldout_benchmarks") or [])]:
        if name not in benchmarks:
            problems.append(f"experiment: benchmark {str(name)[:80]!r} not in the bundle")
    tasks = set()
    task_fields = {
        "benchmark": _TEXT,
        "id": _TEXT,
        "instruction": _TEXT,
        "public_files": _OPTIONAL_TEXT,
        "criteria": (list,),
        "metadata": (dict,),
        "digest": _TEXT,
    }
    for position, item in enumerate(bundle["tasks"], start=1):
        if _fields(problems, f"task {position}", item, task_fields):
            if "expected" not in item:
                problems.append(f"task {position}: 'expected' is missing")
            if item["benchmark"] not in benchmarks:
                problems.append(f"task {item['benchmark']}/{item['id']}: benchmark not in the bundle")
            tasks.add((item["benchmark"], item["id"]))
    in_split = set()
    for position, item in enumerate(bundle["splits"], start=1):
        if _fields(problems, f"split membership {position}", item, {"benchmark": _TEXT, "task": _TEXT, "split": _TEXT}):
            if item["split"] not in SplitName.values or (item["benchmark"], item["task"]) not in tasks:
                problems.append(f"split membership {position}: unknown split or task not in the bundle")
            in_split.add((item["split"], item["task"]))
    _fields(
        problems,
        "evaluator",
        bundle["evaluator"],
        {
            "name": _TEXT,
            "files": _TEXT,
            "runner_argv": (list,),
            "verifier_argv": (list,),
            "env_allowlist": (list,),
            "timeout_seconds": _INT,
            "limits": (dict,),
        },
    )
    # Bundles written before the setting existed have no agent_network: false.
    if isinstance(bundle["evaluator"], dict) and not isinstance(bundle["evaluator"].get("agent_network", False), bool):
        problems.append("evaluator: 'agent_network' is not bool")
    if _fields(problems, "surface", bundle["surface"], {"name": _TEXT, "spec": _TEXT, "digest": _TEXT}):
        try:
            parse_surface(bundle["surface"]["spec"])
        except SurfaceSpecError as exc:
            problems.append(f"surface: {exc}")
    for position, item in enumerate(bundle["recipes"], start=1):
        _fields(
            problems, f"recipe {position}", item, {"name": _TEXT, "version": _INT, "spec": (dict,), "digest": _TEXT}
        )
    listed: set[str] = set()
    candidate_fields = {
        "tree": _TEXT,
        "parent_tree": _OPTIONAL_TEXT,
        "origin": _TEXT,
        "state": _TEXT,
        "round": (int, type(None)),
        "label": _TEXT,
        "state_reason": _TEXT,
        "certified_at": _OPTIONAL_TEXT,
    }
    for position, item in enumerate(bundle["candidates"], start=1):
        if not _fields(problems, f"candidate {position}", item, candidate_fields):
            continue
        where = f"candidate {item['tree'][:12]}"
        if item["origin"] not in Candidate.Origin.values:
            problems.append(f"{where}: unknown origin {item['origin'][:40]!r}")
        if item["parent_tree"] is not None and item["parent_tree"] not in listed:
            problems.append(f"{where}: parent not listed before it")
        if item["certified_at"] is not None and parse_datetime(item["certified_at"]) is None:
            problems.append(f"{where}: certified_at is not a date and time")
        # Bundles written before flags were exported have none.
        flags = item.get("flags", [])
        if not isinstance(flags, list) or not all(
            isinstance(flag, list) and len(flag) == len(FLAG_FIELDS) and all(isinstance(part, str) for part in flag)
            for flag in flags
        ):
            problems.append(f"{where}: 'flags' is not a list of [rule, path, line, matched] lists")
        listed.add(item["tree"])
    record_fields = {"seq": _INT, "prev_digest": _TEXT, "record_digest": _TEXT, "signature": _TEXT, "payload": (dict,)}
    trial_fields = {"task": _TEXT, "split": _TEXT, "index": _INT, "seed": _INT, "outcome": _TEXT, "criteria": (list,)}
    for position, item in enumerate(bundle["records"], start=1):
        if not _fields(problems, f"record at position {position}", item, record_fields):
            continue
        payload = item["payload"]
        where = f"record #{item['seq']}"
        if not _fields(problems, where, payload, {"evaluation": (dict,), "evaluator": (dict,), "trials": (list,)}):
            continue
        _fields(
            problems,
            f"{where} evaluation",
            payload["evaluation"],
            {"purpose": _TEXT, "repeat": _INT, "splits": (list,), "k": _INT, "seed": _INT},
        )
        _fields(problems, f"{where} evaluator", payload["evaluator"], {"sandbox_profile": _TEXT})
        for trial in payload["trials"]:
            if not _fields(problems, f"{where} trial", trial, trial_fields):
                break
            if (trial["split"], trial["task"]) not in in_split:
                problems.append(f"{where}: task {trial['task'][:80]!r} is not in split {trial['split'][:20]!r}")
                break
    for position, item in enumerate(bundle.get("decisions", []), start=1):
        where = f"decision at position {position}"
        if _fields(problems, where, item, {**record_fields, "kind": _TEXT}) and (
            item["kind"] not in CertifiedDecision.Kind.values
        ):
            problems.append(f"decision #{item['seq']}: unknown kind {item['kind'][:40]!r}")
    for digest, entries in bundle["trees"].items():
        problems += _tree_problems(digest, entries, bundle["blobs"])
    return problems


def _tree_problems(digest: str, entries: Any, blobs: Mapping[str, Any]) -> list[str]:
    """A tree's entries checked by ``validate_entries``, the check
    ``tree_store`` makes before storing anything: one problem, or none."""
    where = f"tree {str(digest)[:12]}"
    if not isinstance(entries, list) or not all(
        isinstance(e, list) and len(e) == 3 and all(isinstance(part, str) for part in e) for e in entries
    ):
        return [f"{where}: entries are not [path, mode, blob digest] lists"]
    try:
        validate_entries(FileEntry(path, mode, _decode(blobs.get(blob)) or b"") for path, mode, blob in entries)
    except SnapshotError as exc:
        return [f"{where}: {exc}"]
    return []


def _verify(bundle: Mapping[str, Any], *, key: str) -> list[str]:
    problems: list[str] = []
    try:
        experiment = bundle["experiment"]
        uid = str(experiment["uid"])
        blobs = bundle["blobs"]
        trees = bundle["trees"]
        raw_records = bundle["records"]
        raw_decisions = bundle.get("decisions", [])
        chain = bundle["chain"]
        evaluator = bundle["evaluator"]
    except (KeyError, TypeError) as exc:
        return [f"bundle is missing {exc}"]

    for digest, encoded in sorted(blobs.items()):
        data = _decode(encoded)
        if data is None:
            problems.append(f"blob {digest[:12]}: not valid base64")
        elif digests.blob_digest(data) != digest:
            problems.append(f"blob {digest[:12]}: content hashes to {digests.blob_digest(data)[:12]}")
    for digest, entries in sorted(trees.items()):
        missing = sorted({entry[2] for entry in entries if entry[2] not in blobs})
        if missing:
            problems.append(f"tree {digest[:12]}: blob(s) {', '.join(m[:12] for m in missing)} not in the bundle")
        recomputed = digests.tree_digest((path, mode, blob) for path, mode, blob in entries)
        if recomputed != digest:
            problems.append(f"tree {digest[:12]}: entries hash to {recomputed[:12]}")

    task_digests: dict[tuple[str, str], str] = {}
    for task in bundle.get("tasks", []):
        where = f"task {task.get('benchmark')}/{task.get('id')}"
        recomputed = digests.task_digest(
            benchmark=task.get("benchmark"),
            external_id=task.get("id"),
            instruction=task.get("instruction"),
            public_files=task.get("public_files"),
            expected=task.get("expected"),
            criteria=task.get("criteria"),
        )
        if recomputed != task.get("digest"):
            problems.append(f"{where}: content hashes to {recomputed[:12]}, bundle says {str(task.get('digest'))[:12]}")
        if task.get("public_files") and task["public_files"] not in trees:
            problems.append(f"{where}: public files tree {task['public_files'][:12]} not in the bundle")
        task_digests[(task.get("benchmark"), task.get("id"))] = recomputed
    task_sets = _split_digests(bundle, task_digests)
    for split, digest in sorted(experiment.get("split_digests", {}).items()):
        if task_sets.get(split) != digest:
            problems.append(f"task set of split {split!r} does not match the experiment's frozen digest")

    if evaluator.get("files") not in trees:
        problems.append(f"evaluator files tree {str(evaluator.get('files'))[:12]} not in the bundle")
    surface = bundle.get("surface", {})
    if digests.sha256_hex(str(surface.get("spec", "")).encode()) != surface.get("digest"):
        problems.append("surface spec does not match its digest")
    recipes = {r.get("digest") for r in bundle.get("recipes", [])}
    for recipe in bundle.get("recipes", []):
        if digests.json_digest(recipe.get("spec")) != recipe.get("digest"):
            problems.append(f"recipe {recipe.get('name')!r}: spec does not match its digest")
    surface_digest = surface.get("digest")
    candidates = {c.get("tree") for c in bundle.get("candidates", [])}
    origins = {c.get("tree"): c.get("origin") for c in bundle.get("candidates", [])}
    parents = {c.get("tree"): c.get("parent_tree") for c in bundle.get("candidates", [])}
    run_settings = settings_bound(experiment.get("run_settings"))
    named: set[Any] = set()  # candidate trees a record names
    heldout = {m.get("benchmark") for m in bundle.get("splits", []) if m.get("split") == SplitName.HELDOUT}
    if set(experiment.get("heldout_benchmarks") or []) != heldout:
        problems.append("experiment: held-out benchmarks differ from the tasks of the held-out split")
    for candidate in bundle.get("candidates", []):
        if candidate.get("tree") not in trees:
            problems.append(f"candidate tree {str(candidate.get('tree'))[:12]} not in the bundle")
        if candidate.get("parent_tree") and candidate["parent_tree"] not in candidates:
            problems.append(f"candidate {str(candidate.get('tree'))[:12]}: parent not in the bundle")

    chain_records: list[records.ChainRecord] = []
    for position, raw in enumerate(raw_records, start=1):
        try:
            record = records.ChainRecord(
                int(raw["seq"]), raw["prev_digest"], raw["record_digest"], raw["signature"], dict(raw["payload"])
            )
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"record at position {position}: malformed ({exc})")
            continue
        chain_records.append(record)
        where = f"record #{record.seq}"
        payload = record.payload
        tree = payload.get("candidate", {}).get("tree")
        named.update({tree, payload.get("candidate", {}).get("parent_tree")})
        if tree not in candidates or tree not in trees:
            problems.append(f"{where}: candidate tree {str(tree)[:12]} not in the bundle")
        else:
            if origins[tree] != payload.get("candidate", {}).get("origin"):
                problems.append(f"{where}: candidate {str(tree)[:12]}'s origin differs from the certified one")
            if parents[tree] != payload.get("candidate", {}).get("parent_tree"):
                problems.append(f"{where}: candidate {str(tree)[:12]}'s parent differs from the certified one")
        if "run_settings" in payload and settings_bound(payload["run_settings"]) != run_settings:
            problems.append(f"{where}: run settings differ from the certified ones")
        if payload.get("recipe") is not None and payload["recipe"] != experiment.get("recipe"):
            problems.append(f"{where}: the experiment's recipe differs from the certified one")
        if "surface" in payload and payload["surface"] != surface_digest:
            problems.append(f"{where}: surface differs from the certified one")
        certified = payload.get("evaluator", {})
        expected_digest = digests.evaluator_digest(
            files_tree=evaluator.get("files"),
            runner_argv=evaluator.get("runner_argv", []),
            verifier_argv=evaluator.get("verifier_argv", []),
            env_allowlist=evaluator.get("env_allowlist", []),
            timeout_seconds=evaluator.get("timeout_seconds"),
            limits=evaluator.get("limits", {}),
            sandbox_profile=certified.get("sandbox_profile", ""),
            agent_network=evaluator.get("agent_network", False) is True,
        )
        if not hmac.compare_digest(str(certified.get("digest")), expected_digest):
            problems.append(
                f"{where}: evaluator (commands, files, environment or limits) differs from the certified one"
            )
        for split, digest in sorted(payload.get("task_sets", {}).items()):
            if task_sets.get(split) != digest:
                problems.append(f"{where}: task set of split {split!r} differs from the certified one")
        if payload.get("recipe") is not None and payload["recipe"] not in recipes:
            problems.append(f"{where}: recipe {str(payload['recipe'])[:12]} not in the bundle")

    decisions: list[tuple[int, str, Any]] = []
    for raw in raw_decisions:
        record = records.ChainRecord(
            raw["seq"], raw["prev_digest"], raw["record_digest"], raw["signature"], raw["payload"]
        )
        chain_records.append(record)
        decisions.append((record.seq, record.record_digest, record.payload))
        where = f"record #{record.seq}"
        payload = record.payload
        named.update(
            {
                (payload.get("candidate") or {}).get("tree"),
                (payload.get("gate") or {}).get("current"),
                (payload.get("review") or {}).get("derived") if raw["kind"] != "gate" else None,
                (payload.get("withdrawn") or {}).get("tree") if isinstance(payload.get("withdrawn"), dict) else None,
            }
        )
        if records.kind_problem(payload, raw["kind"]):
            problems.append(f"{where}: {records.kind_problem(payload, raw['kind'])}")
        tree = (payload.get("candidate") or {}).get("tree")
        if tree not in candidates:
            problems.append(f"{where}: candidate tree {str(tree)[:12]} not in the bundle")
        if payload.get("surface") != surface_digest:
            problems.append(f"{where}: surface differs from the certified one")
        if payload.get("recipe") is not None and payload["recipe"] not in recipes:
            problems.append(f"{where}: recipe {str(payload['recipe'])[:12]} not in the bundle")
    decisions.sort(key=lambda item: item[0])
    problems += records.candidate_state_problems(
        (
            records.CandidateState(c["tree"], c["state"], c["state_reason"], c["origin"])
            for c in bundle.get("candidates", [])
        ),
        ((seq, payload) for seq, _, payload in decisions),
        known_states=Candidate.State.values,
    )
    problems += records.review_basis_problems(
        decisions,
        {c["tree"]: records.critic_outcome(map(tuple, c["flags"])) for c in bundle["candidates"] if c.get("flags")},
    )
    # Export writes the candidates the records name, the seed and their ancestors: nothing else.
    lineage = {experiment.get("seed_tree")} | named
    for tree in list(lineage):
        while tree is not None and parents.get(tree) is not None and parents[tree] not in lineage:
            tree = parents[tree]
            lineage.add(tree)
    for candidate in bundle.get("candidates", []):
        if candidate.get("tree") not in lineage:
            problems.append(
                f"candidate {str(candidate.get('tree'))[:12]}: no record names it, "
                "and it is not the seed or an ancestor of a candidate a record names"
            )
    try:
        head = records.ChainHead(int(chain["length"]), str(chain["head"]), str(chain["signature"]))
    except (KeyError, TypeError, ValueError) as exc:
        return [*problems, f"chain head malformed ({exc})"]
    # Evaluations and decisions share one chain: verified together in seq order.
    chain_records.sort(key=lambda record: record.seq)
    problems += records.verify_chain(chain_records, key=key, experiment_uid=uid, head=head)
    return problems


# --- Import -------------------------------------------------------------------------


def _store_tree(digest: str, entries: list[list[str]], blobs: Mapping[str, str]) -> Tree:
    try:
        tree = tree_store(
            entries=[FileEntry(path, mode, base64.b64decode(blobs[blob])) for path, mode, blob in entries]
        )
    except SnapshotError as exc:
        raise BundleError(f"tree {digest[:12]}: {exc}") from None
    if tree.digest != digest:
        raise BundleError(f"tree {digest[:12]} stored as {tree.digest[:12]}")
    return tree


def bundle_import(*, bundle: Mapping[str, Any], key: str, name: str | None = None) -> Experiment:
    """Recreate a bundle's experiment with its certified records.

    Verifies the bundle first (BundleError listing the problems, nothing
    written). Content-addressed trees and blobs, benchmarks with identical
    tasks, an identical evaluator, surface and recipes that exist already
    are reused; a different task or evaluator under the same name is
    refused. Safe to repeat: a bundle whose experiment (same uid and chain
    head) is already here returns it unchanged. One transaction.
    """
    problems = bundle_verify(bundle, key=key)
    if problems:
        raise BundleError("the bundle does not verify; nothing was imported", problems)
    info = bundle["experiment"]
    existing = Experiment.objects.filter(uid=info["uid"]).first()
    if existing is not None:
        if existing.chain_head == bundle["chain"]["head"] and existing.chain_length == bundle["chain"]["length"]:
            return existing
        raise BundleError(f"experiment {info['uid']} exists here with another chain; nothing was imported")
    name = name or info["name"]
    if Experiment.objects.filter(name=name).exists():
        raise BundleError(f"an experiment named {name!r} exists already; import with --name")

    try:
        return _create(bundle, info=info, name=name)
    except BundleError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"the bundle is malformed ({type(exc).__name__}: {exc}); nothing was imported") from None


@transaction.atomic
def _create(bundle: Mapping[str, Any], *, info: Mapping[str, Any], name: str) -> Experiment:
    for digest, entries in bundle["trees"].items():
        _store_tree(digest, entries, bundle["blobs"])
    benchmarks: dict[str, Benchmark] = {}
    for item in bundle["benchmarks"]:
        benchmarks[item["name"]], _ = Benchmark.objects.get_or_create(
            name=item["name"], defaults={"title": item["title"], "description": item["description"]}
        )
    tasks: dict[tuple[str, str], Task] = {}
    for item in bundle["tasks"]:
        benchmark = benchmarks[item["benchmark"]]
        task = Task.objects.filter(benchmark=benchmark, external_id=item["id"]).first()
        if task is None:
            task = Task.objects.create(
                benchmark=benchmark,
                external_id=item["id"],
                instruction=item["instruction"],
                public_files_id=item["public_files"],
                expected=item["expected"],
                criteria=item["criteria"],
                metadata=item["metadata"],
            )
        elif task_digest(task) != item["digest"]:
            raise BundleError(f"task {item['benchmark']}/{item['id']} exists here with different content")
        tasks[(item["benchmark"], item["id"])] = task
    spec = bundle["evaluator"]
    try:
        evaluator = evaluator_upsert(
            name=spec["name"],
            files=Tree.objects.get(digest=spec["files"]),
            runner_argv=spec["runner_argv"],
            verifier_argv=spec["verifier_argv"],
            env_allowlist=spec["env_allowlist"],
            timeout_seconds=spec["timeout_seconds"],
            limits=spec["limits"],
            agent_network=spec.get("agent_network", False),
        )
    except ExperimentError as exc:
        raise BundleError(str(exc)) from None
    surface = surface_create(name=bundle["surface"]["name"], spec=bundle["surface"]["spec"])
    for item in bundle["recipes"]:
        Recipe.objects.get_or_create(
            digest=item["digest"], defaults={"name": item["name"], "version": item["version"], "spec": item["spec"]}
        )
    chain = bundle["chain"]
    status = info["status"]
    if status in (Experiment.Status.RUNNING, Experiment.Status.PAUSED):
        status = Experiment.Status.FINISHED  # its runs are not exported: nothing can resume here
    experiment = Experiment.objects.create(
        uid=info["uid"],
        name=name,
        description=info["description"],
        benchmark=benchmarks[info["benchmark"]],
        evaluator=evaluator,
        surface=surface,
        recipe=Recipe.objects.filter(digest=info["recipe"]).first() if info["recipe"] else None,
        split_seed=info["split_seed"],
        split_ratios=info["split_ratios"],
        # Bundles written before stratified splits have no such key: their splits were cut unstratified.
        split_stratify_by=str(info.get("split_stratify_by") or ""),
        split_digests=info["split_digests"],
        run_settings=info["run_settings"],
        trials_per_task=info["trials_per_task"],
        status=status,
        chain_length=chain["length"],
        chain_head=chain["head"],
        chain_head_signature=chain["signature"],
    )
    experiment.heldout_benchmarks.set([benchmarks[n] for n in info["heldout_benchmarks"]])
    by_split: dict[tuple[str, str], Task] = {}
    memberships = []
    for member in bundle["splits"]:
        task = tasks[(member["benchmark"], member["task"])]
        memberships.append(SplitMembership(experiment=experiment, task=task, split=member["split"]))
        by_split[(member["split"], member["task"])] = task
    SplitMembership.objects.bulk_create(memberships)

    candidates: dict[str, Candidate] = {}
    for item in bundle["candidates"]:
        certified_at = parse_datetime(item["certified_at"]) if item["certified_at"] else None
        candidates[item["tree"]] = Candidate.objects.create(
            experiment=experiment,
            parent=candidates[item["parent_tree"]] if item["parent_tree"] else None,
            tree_id=item["tree"],
            origin=item["origin"],
            state=item["state"],
            round=item["round"],
            label=item["label"],
            state_reason=item["state_reason"],
            certified_at=certified_at,
        )
    LeakageFlag.objects.bulk_create(
        LeakageFlag(candidate=candidates[item["tree"]], **dict(zip(FLAG_FIELDS, flag, strict=True)))
        for item in bundle["candidates"]
        for flag in item.get("flags", [])
    )
    if info["seed_tree"]:
        experiment.seed_candidate = candidates[info["seed_tree"]]
        experiment.save(update_fields=["seed_candidate"])

    for raw in bundle["records"]:
        payload = raw["payload"]
        candidate = candidates[payload["candidate"]["tree"]]
        settings_ = payload["evaluation"]
        profile = payload["evaluator"]["sandbox_profile"]
        trials = payload["trials"]
        evaluation = Evaluation.objects.create(
            experiment=experiment,
            candidate=candidate,
            purpose=settings_["purpose"],
            repeat=settings_["repeat"],
            splits=settings_["splits"],
            k=settings_["k"],
            seed=settings_["seed"],
            state=Evaluation.State.CERTIFIED,
            trials_total=len(trials),
            trials_finished=len(trials),
            sandbox_profile=profile,
            finished_at=timezone.now(),
        )
        rows = []
        for trial in trials:
            task = by_split.get((trial["split"], trial["task"]))
            if task is None:
                raise BundleError(f"record #{raw['seq']}: task {trial['task']!r} is not in split {trial['split']!r}")
            rows.append(
                Trial(
                    evaluation=evaluation,
                    candidate=candidate,
                    task=task,
                    split=trial["split"],
                    index=trial["index"],
                    seed=trial["seed"],
                    state=Trial.State.ERROR if trial["outcome"] == Trial.Outcome.ERROR else Trial.State.DONE,
                    outcome=trial["outcome"],
                    score=trial["score"],
                    criteria_results=trial["criteria"],
                    tokens=trial["tokens"],
                    steps=trial["steps"],
                    valid_output=trial["valid_output"],
                    submitted=trial["submitted"],
                    error_kind=trial["error_kind"],
                    sandbox_profile=profile,
                )
            )
        Trial.objects.bulk_create(rows)
        CertifiedResult.objects.create(
            experiment=experiment,
            seq=raw["seq"],
            evaluation=evaluation,
            candidate=candidate,
            payload=payload,
            prev_digest=raw["prev_digest"],
            record_digest=raw["record_digest"],
            signature=raw["signature"],
        )
    for raw in bundle.get("decisions", []):
        CertifiedDecision.objects.create(
            experiment=experiment,
            seq=raw["seq"],
            kind=raw["kind"],
            candidate=candidates[raw["payload"]["candidate"]["tree"]],
            payload=raw["payload"],
            prev_digest=raw["prev_digest"],
            record_digest=raw["record_digest"],
            signature=raw["signature"],
        )
    # The per-split totals certification stores, so the screens read them
    # as for a run of this installation instead of aggregating the trials.
    split_stats_store(evaluations=Evaluation.objects.filter(experiment=experiment, state=Evaluation.State.CERTIFIED))
    return experiment
