"""Writes that set up benchmarks, evaluators, surfaces and experiments."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.db import transaction

from evolution import digests, splits
from evolution.models import (
    Benchmark,
    Candidate,
    CertifiedResult,
    Evaluator,
    Experiment,
    SplitMembership,
    SplitName,
    Surface,
    Task,
    Tree,
    Trial,
)
from evolution.services.snapshots import tree_store
from evolution.surfaces import parse_surface
from evolution.trees import FileEntry, normalize_path

T = TypeVar("T")


class ExperimentError(ValueError):
    pass


class NameTakenError(ExperimentError):
    """A benchmark or evaluator of that name exists with other content (it cannot change: results bind it)."""


class SplitsFrozenError(ExperimentError):
    """Results bind the experiment's split digests: they cannot change."""


@dataclass(frozen=True)
class TaskInput:
    external_id: str
    instruction: str
    expected: Any = None
    criteria: list[dict[str, Any]] = field(default_factory=list)
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)


def _files_tree(files: Mapping[str, str | bytes]) -> Tree | None:
    if not files:
        return None
    entries = [
        FileEntry(path=normalize_path(path), mode="100644", data=data.encode() if isinstance(data, str) else data)
        for path, data in files.items()
    ]
    return tree_store(entries=entries)


@transaction.atomic
def benchmark_upsert(*, name: str, title: str = "", description: str = "", tasks: Sequence[TaskInput]) -> Benchmark:
    """Create a benchmark with its tasks, or return the existing one unchanged
    when every task is identical. Safe to repeat; refuses to silently change
    tasks that already exist (that would change task-set digests under
    existing certified results)."""
    ids = [task.external_id for task in tasks]
    if len(set(ids)) != len(ids):
        raise ExperimentError(f"benchmark {name!r}: task ids are not unique")
    benchmark, _ = Benchmark.objects.get_or_create(name=name, defaults={"title": title, "description": description})
    existing = {task.external_id: task for task in benchmark.tasks.all()}
    for item in tasks:
        tree = _files_tree(item.files)
        expected = item.expected if item.expected is not None else {}
        current = existing.get(item.external_id)
        if current is None:
            Task.objects.create(
                benchmark=benchmark,
                external_id=item.external_id,
                instruction=item.instruction,
                public_files=tree,
                expected=expected,
                criteria=list(item.criteria),
                metadata=dict(item.metadata),
            )
        elif (current.instruction, current.public_files_id, current.expected, current.criteria) != (
            item.instruction,
            tree.digest if tree else None,
            expected,
            list(item.criteria),
        ):
            raise NameTakenError(f"benchmark {name!r}: task {item.external_id!r} exists with different content")
    return benchmark


@transaction.atomic
def evaluator_upsert(
    *,
    name: str,
    files: Tree,
    runner_argv: Sequence[str],
    verifier_argv: Sequence[str],
    env_allowlist: Sequence[str] = (),
    timeout_seconds: int = 60,
    limits: Mapping[str, Any] | None = None,
    agent_network: bool = False,
) -> Evaluator:
    """Create an evaluator, or return the identical existing one. A different
    evaluator under an existing name is refused: evaluators are immutable
    because certified results bind to their digest. ``agent_network``: the
    agent's command keeps the host's network under bubblewrap."""
    if not runner_argv or not verifier_argv:
        raise ExperimentError("an evaluator needs a runner and a verifier command")
    if not isinstance(agent_network, bool):
        raise ExperimentError(f"agent_network must be true or false, not {agent_network!r}")
    values = {
        "files": files,
        "runner_argv": list(runner_argv),
        "verifier_argv": list(verifier_argv),
        "env_allowlist": sorted(env_allowlist),
        "timeout_seconds": timeout_seconds,
        "limits": dict(limits or {}),
        "agent_network": agent_network,
    }
    evaluator, created = Evaluator.objects.get_or_create(name=name, defaults=values)
    if not created:
        current = {key: getattr(evaluator, key) for key in values}
        if current != values:
            raise NameTakenError(f"evaluator {name!r} exists with different settings; use a new name")
    return evaluator


def benchmark_from_config(*, config: Mapping[str, Any], tasks: Sequence[TaskInput]) -> Benchmark:
    """``benchmark_upsert`` of a ``[benchmark]`` table of an example's TOML
    file (``name``, optional ``title`` and ``description``) with ``tasks``.
    KeyError when ``name`` is missing. Where a benchmark of that name holds
    other tasks (an earlier rsiweb's bundled example, in a database kept
    across an upgrade), the name gets the tasks' digest (``_bundled``)."""
    content = [
        [
            task.external_id,
            task.instruction,
            task.expected,
            task.criteria,
            {
                path: digests.sha256_hex(data.encode() if isinstance(data, str) else data)
                for path, data in task.files.items()
            },
        ]
        for task in tasks
    ]
    return _bundled(
        lambda name: benchmark_upsert(
            name=name, title=config.get("title", ""), description=config.get("description", ""), tasks=tasks
        ),
        config["name"],
        content,
    )


def evaluator_from_config(*, config: Mapping[str, Any], files: Tree) -> Evaluator:
    """``evaluator_upsert`` of an ``[evaluator]`` table of an example's TOML
    file: ``name``, ``runner_argv``, ``verifier_argv`` and the optional
    ``env_allowlist``, ``timeout_seconds`` (60), ``limits`` and
    ``agent_network`` (false). KeyError when a
    required key is missing. Safe to repeat, like ``evaluator_upsert``.
    Where an evaluator of that name has other settings (an earlier rsiweb's
    bundled files, in a database kept across an upgrade), the name gets the
    settings' digest (``_bundled``)."""
    settings = {
        "runner_argv": config["runner_argv"],
        "verifier_argv": config["verifier_argv"],
        "env_allowlist": config.get("env_allowlist", []),
        "timeout_seconds": int(config.get("timeout_seconds", 60)),
        "limits": config.get("limits", {}),
        "agent_network": config.get("agent_network", False),
    }
    return _bundled(
        lambda name: evaluator_upsert(name=name, files=files, **settings),
        config["name"],
        {"files": files.digest, **settings},
    )


def _bundled(upsert: Callable[[str], T], name: str, content: Any) -> T:
    """``upsert(name)`` for what rsiweb bundles; when ``name`` is taken by
    other content, ``upsert("<name>-<first 12 hex digits of content's
    digest>")``: a benchmark or evaluator cannot change under the results
    that bind it, and the bundled files of another version keep a name of
    their own, the same in every database."""
    try:
        return upsert(name)
    except NameTakenError:  # its upsert is atomic: the refused attempt left nothing behind
        return upsert(f"{name}-{digests.json_digest(content)[:12]}")


def surface_create(*, name: str, spec: str) -> Surface:
    """Store a surface after validating its YAML (SurfaceSpecError on bad input)."""
    parse_surface(spec)
    digest = digests.sha256_hex(spec.encode())
    surface = Surface.objects.filter(name=name, digest=digest).first()
    return surface or Surface.objects.create(name=name, spec=spec, digest=digest)


def task_digest(task: Task) -> str:
    return digests.task_digest(
        benchmark=task.benchmark.name,
        external_id=task.external_id,
        instruction=task.instruction,
        public_files=task.public_files_id,
        expected=task.expected,
        criteria=task.criteria,
    )


def split_digests_compute(*, experiment: Experiment) -> dict[str, str]:
    """Digest of every split's task set as the tasks are now (used when
    assigning splits and again by verify_records)."""
    memberships = SplitMembership.objects.filter(experiment=experiment).select_related("task__benchmark")
    return split_digests_of(
        (m.split, m.task.benchmark.name, m.task.external_id, task_digest(m.task)) for m in memberships
    )


def split_digests_frozen(*, experiment: Experiment) -> bool:
    """Whether results bind the experiment's split digests: a certified
    record, or a trial of an evaluation run here. External results (imported
    workspaces and Harbor jobs) do not: nothing certifies them, and an
    experiment made by imports alone grows as later imports add tasks."""
    return (
        CertifiedResult.objects.filter(experiment=experiment).exists()
        or Trial.objects.filter(evaluation__experiment=experiment, evaluation__external=False).exists()
    )


@transaction.atomic
def split_digests_store(*, experiment: Experiment) -> dict[str, str]:
    """Store the digest of each split's task set as the memberships are now
    (on the row and on ``experiment``), and return them.

    Every write of ``split_digests`` after an experiment is created goes
    through here, so none can rewrite a frozen digest: once results bind them
    (``split_digests_frozen``) a change is refused with SplitsFrozenError and
    nothing is written (the caller's transaction rolls back its own changes).
    Safe to repeat: unchanged digests are stored as they are.
    """
    locked = Experiment.objects.select_for_update(no_key=True).get(pk=experiment.pk)
    computed = split_digests_compute(experiment=locked)
    if computed != locked.split_digests and split_digests_frozen(experiment=locked):
        changed = sorted(
            s for s in {*computed, *locked.split_digests} if computed.get(s) != locked.split_digests.get(s)
        )
        raise SplitsFrozenError(
            f"experiment {locked.name!r}: results exist, so the task set of split(s) {', '.join(changed)} "
            "cannot change (its digest is frozen)"
        )
    Experiment.objects.filter(pk=locked.pk).update(split_digests=computed)
    experiment.split_digests = computed
    return computed


def split_digests_of(members: Iterable[tuple[str, str, str, str]]) -> dict[str, str]:
    """Digest of every split's task set from (split, benchmark, task id, task
    digest) rows. A task is named by its id, a held-out one (from another
    benchmark) by benchmark/id. Pure."""
    by_split: dict[str, dict[str, str]] = {}
    for split, benchmark, external_id, digest in members:
        key = external_id if split != SplitName.HELDOUT else f"{benchmark}/{external_id}"
        by_split.setdefault(split, {})[key] = digest
    return {name: digests.task_set_digest(name, tasks) for name, tasks in sorted(by_split.items())}


@transaction.atomic
def splits_assign(
    *,
    experiment: Experiment,
    seed: int | None = None,
    ratios: Mapping[str, float] | None = None,
    lists: Mapping[str, Sequence[str]] | None = None,
    stratify_by: str | None = None,
) -> dict[str, str]:
    """Assign every task of the experiment's benchmark to exactly one split
    (from ``lists`` when given, otherwise from ``seed`` and ``ratios``, each
    value of the task metadata key ``stratify_by`` cut on its own; None keeps
    the experiment's, "" cuts all tasks together), put the tasks of held-out
    benchmarks in ``heldout``, and freeze the digests.

    Refused once any trial of the experiment exists: changing splits under
    existing results would make them mean something else.
    """
    caller_copy = experiment
    experiment = Experiment.objects.select_for_update(no_key=True).get(pk=experiment.pk)
    if Trial.objects.filter(evaluation__experiment=experiment).exists():
        raise ExperimentError("splits cannot change after results exist for this experiment")
    tasks = {task.external_id: task for task in experiment.benchmark.tasks.all()}
    if not tasks:
        raise ExperimentError(f"benchmark {experiment.benchmark.name!r} has no tasks")
    try:
        if lists is not None:
            assignment = splits.assign_explicit(list(tasks), lists)
        else:
            seed = experiment.split_seed if seed is None else seed
            ratios = experiment.split_ratios if ratios is None else ratios
            stratify_by = experiment.split_stratify_by if stratify_by is None else stratify_by
            strata = None
            if stratify_by:
                strata = splits.strata_of({tid: task.metadata or {} for tid, task in tasks.items()}, stratify_by)
            assignment = splits.assign_by_ratio(list(tasks), seed=seed, ratios=ratios, strata=strata)
    except splits.SplitError as exc:
        raise ExperimentError(str(exc)) from exc

    SplitMembership.objects.filter(experiment=experiment).delete()
    rows = [SplitMembership(experiment=experiment, task=tasks[tid], split=name) for tid, name in assignment.items()]
    for benchmark in experiment.heldout_benchmarks.all():
        rows.extend(
            SplitMembership(experiment=experiment, task=t, split=SplitName.HELDOUT) for t in benchmark.tasks.all()
        )
    SplitMembership.objects.bulk_create(rows)

    experiment.split_seed = seed if lists is None and seed is not None else experiment.split_seed
    experiment.split_ratios = dict(ratios) if lists is None and ratios is not None else experiment.split_ratios
    if lists is None and stratify_by is not None:
        experiment.split_stratify_by = stratify_by
    experiment.save(update_fields=["split_seed", "split_ratios", "split_stratify_by"])
    split_digests_store(experiment=experiment)
    for name in ("split_seed", "split_ratios", "split_stratify_by", "split_digests"):
        setattr(caller_copy, name, getattr(experiment, name))
    digests: dict[str, str] = experiment.split_digests
    return digests


@transaction.atomic
def experiment_create(
    *,
    name: str,
    benchmark: Benchmark,
    evaluator: Evaluator,
    surface: Surface,
    seed_tree: Tree,
    split_seed: int = 0,
    split_ratios: Mapping[str, float] | None = None,
    split_lists: Mapping[str, Sequence[str]] | None = None,
    split_stratify_by: str = "",
    heldout: Sequence[Benchmark] = (),
    trials_per_task: int = 2,
    run_settings: Mapping[str, Any] | None = None,
    description: str = "",
) -> Experiment:
    """Create an experiment with its seed candidate and frozen splits (``split_lists``, or ``split_seed`` and
    ``split_ratios`` cut within each value of the task metadata key ``split_stratify_by`` when set)."""
    if trials_per_task < 1:
        raise ExperimentError("trials per task must be at least 1")
    if Experiment.objects.filter(name=name).exists():
        raise ExperimentError(f"an experiment named {name!r} exists already")
    if benchmark in heldout:
        raise ExperimentError("the experiment's own benchmark cannot also be held out")
    experiment = Experiment.objects.create(
        name=name,
        description=description,
        benchmark=benchmark,
        evaluator=evaluator,
        surface=surface,
        split_seed=split_seed,
        split_ratios=dict(split_ratios or {"train": 0.4, "gate": 0.3, "sealed": 0.3}),
        split_stratify_by=split_stratify_by,
        trials_per_task=trials_per_task,
        run_settings=dict(run_settings or {}),
        status=Experiment.Status.READY,
    )
    experiment.heldout_benchmarks.set(heldout)
    splits_assign(experiment=experiment, lists=split_lists)
    seed = Candidate.objects.create(
        experiment=experiment,
        tree=seed_tree,
        origin=Candidate.Origin.SEED,
        state=Candidate.State.APPROVED,
        label="seed",
        round=0,
    )
    experiment.seed_candidate = seed
    experiment.save(update_fields=["seed_candidate"])
    return experiment


def experiment_twin(
    *, like: Experiment, name: str, split_seed: int | None = None, evaluator: Evaluator | None = None
) -> Experiment:
    """A fresh experiment with ``like``'s benchmark, evaluator, surface, seed
    harness, splits and settings, so its certified records compare with
    ``like``'s (crash tests and the trust suite set one against the other).
    With ``split_seed`` the splits are drawn anew: ``like``'s ratios cut with
    that seed, stratified as ``like``'s (another draw of the same benchmark,
    held-out benchmarks kept). With ``evaluator`` the twin's trials run with
    that evaluator instead of ``like``'s."""
    if like.seed_candidate is None:
        raise ExperimentError(f"experiment {like.pk} has no seed harness to copy")
    lists: dict[str, list[str]] = {}
    # Held-out tasks come from the held-out benchmarks (splits_assign adds them), never from the lists.
    memberships = like.split_memberships.exclude(split=SplitName.HELDOUT)
    for split, task in memberships.values_list("split", "task__external_id").order_by("pk"):
        lists.setdefault(split, []).append(task)
    return experiment_create(
        name=name,
        benchmark=like.benchmark,
        evaluator=evaluator or like.evaluator,
        surface=like.surface,
        seed_tree=like.seed_candidate.tree,
        split_seed=like.split_seed if split_seed is None else split_seed,
        split_ratios=like.split_ratios,
        split_lists=lists if split_seed is None else None,
        split_stratify_by=like.split_stratify_by,
        heldout=list(like.heldout_benchmarks.all()),
        trials_per_task=like.trials_per_task,
        run_settings=like.run_settings,
    )
