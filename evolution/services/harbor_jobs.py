"""Import a Harbor job folder as an external evaluation.

Harbor (harbor 0.18.0, ``harbor run``) writes one folder per job: ``config.json``
(its JobConfig), ``result.json`` (its JobResult: counts, token and cost
totals, and per agent and dataset the trial names under each reward value),
and one folder per trial holding ``result.json`` (its TrialResult:
``task_name``, ``trial_name``, ``verifier_result.rewards``,
``exception_info``, ``agent_result`` token counts and cost) and the agent's
ATIF trajectory in ``agent/trajectory.json``. Field names are those of
``harbor.models.job.result`` and ``harbor.models.trial.result``.

Each job becomes one imported candidate (its files: the job's config, so two
agents or harnesses are two candidates) with one external evaluation, so two
jobs compare task by task in the results matrix. Nothing is certified: we did
not run it (evolution/services/external.py).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils.text import slugify

from evolution import limits
from evolution.models import Benchmark, Candidate, Evaluation, Evaluator, Experiment, SplitMembership, SplitName, Task
from evolution.services.experiments import SplitsFrozenError, split_digests_store, surface_create
from evolution.services.external import MAX_RESULTS, ExternalResultsError, external_results_ingest
from evolution.services.snapshots import tree_store
from evolution.services.trajectories import trajectory_store
from evolution.services.workspaces import PLACEHOLDER_CODE, SURFACE_SPEC
from evolution.trajectory_formats import TrajectoryFormatError, join_continuations, parse
from evolution.trees import MODE_FILE, FileEntry, SnapshotError, open_inside

FORMAT = "harbor-job"
# The job formats whose imports share experiments (evolution/services/job_imports.py reads the others).
JOB_FORMATS = (FORMAT, "terminal-bench-run", "inspect-log")
MAX_ERROR_CHARS = 2_000


class HarborJobError(ValueError):
    """Not a Harbor job folder, or one that contradicts itself; the message names the file."""


class HarborJobRefused(HarborJobError):
    """Over an input limit (evolution.limits), or a symbolic link in the job
    folder: refused before any work."""


class HarborExperimentRefused(HarborJobRefused):
    """The experiment named exists and was not made by Harbor job imports
    alone: a job may not add to it (nor rewrite its frozen split digests)."""


@dataclass
class HarborTrial:
    name: str
    task: str
    started_at: str
    reward: float | None
    error: str | None
    tokens: int | None
    trajectory: dict[str, Any] | None
    index: int = 0
    # The attempt's number where the producer gives one (else attempts are numbered by start time).
    attempt: int | None = None


@dataclass
class HarborJob:
    path: Path
    name: str
    job_id: str
    config: dict[str, Any]
    config_bytes: bytes
    result: dict[str, Any]
    trials: list[HarborTrial] = field(default_factory=list)
    kind: str = FORMAT
    # The candidate's one file (the job's configuration) and its label's prefix.
    config_file: str = "harbor-job/config.json"
    label: str = "harbor"
    title: str = "Harbor job"
    # The experiment it goes to when none is named (Harbor's: the job's name).
    experiment: str | None = None
    # For kinds other than Harbor's: the evaluation's source fields beside kind, name, id and path.
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class HarborImportReport:
    experiment: Experiment
    candidate: Candidate
    evaluation: Evaluation | None
    created: bool
    notes: list[str]


def job_json(job: Path, what: str, *, setting: str = "RSI_MAX_TASKS_FILE_BYTES") -> Any:
    """The JSON file at ``what`` (a path under the job folder ``job``) read
    within the input limits (size first, then depth), following no symbolic
    link: a link, or a folder on the way that is one, is refused, so nothing
    outside the job folder is read (``open_inside``, as snapshots read)."""
    try:
        with open_inside(job, what) as stream:
            data = limits.read_bytes(stream, setting=setting, what=what)
        return limits.json_loads(data, what=what)
    except (limits.InputLimitError, SnapshotError) as exc:
        raise HarborJobRefused(str(exc)) from None
    except OSError as exc:
        raise HarborJobError(f"{what}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise HarborJobError(f"{what}: not valid JSON ({exc})") from None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _reward(where: str, rewards: Any) -> float | None:
    """The trial's reward from Harbor's ``verifier_result.rewards`` (a name -> number map)."""
    if rewards is None:
        return None
    if not isinstance(rewards, dict) or not rewards:
        raise HarborJobError(f"{where}: verifier_result.rewards must be a non-empty object, got {rewards!r}")
    if "reward" in rewards:
        value = rewards["reward"]
    elif len(rewards) == 1:
        value = next(iter(rewards.values()))
    else:
        raise HarborJobError(f"{where}: several rewards ({', '.join(sorted(rewards))}) and none named 'reward'")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 1:
        raise HarborJobError(f"{where}: reward {value!r} is not a number in [0, 1]")
    return float(value)


def _trial(folder: Path) -> HarborTrial:
    """One trial folder: its result.json and, when there, agent/trajectory.json."""
    job = folder.parent
    where = f"{folder.name}/result.json"
    result = job_json(job, where)
    document = None
    # lexists, not is_file: a link is there to be refused, not skipped or followed.
    if os.path.lexists(folder / "agent" / "trajectory.json"):
        what = f"{folder.name}/agent/trajectory.json"
        document = job_json(job, what, setting="RSI_MAX_TRAJECTORY_BYTES")
        if isinstance(document, dict) and document.get("continued_trajectory_ref"):
            # Harbor's terminus-2 continues a long run in trajectory.cont-N.json beside it.
            def fetch(ref: str) -> Any:
                if not os.path.lexists(folder / "agent" / ref):
                    raise KeyError(ref)
                return job_json(job, f"{folder.name}/agent/{ref}", setting="RSI_MAX_TRAJECTORY_BYTES")

            try:
                document = join_continuations(document, fetch, name=what)[0]
            except TrajectoryFormatError as exc:
                raise HarborJobError(f"{what}: {exc}") from None
    return _trial_from(where, result, document, trajectory_where=f"{folder.name}/agent/trajectory.json")


def _trial_from(where: str, result: Any, document: Any, *, trajectory_where: str) -> HarborTrial:
    """A trial from Harbor's TrialResult and the agent's ATIF trajectory (or None). Pure."""
    if not isinstance(result, dict):
        raise HarborJobError(f"{where}: must be a JSON object (Harbor's TrialResult)")
    task, name = result.get("task_name"), result.get("trial_name")
    if not isinstance(task, str) or not task or len(task) > 200 or not isinstance(name, str) or not name:
        raise HarborJobError(f"{where}: needs task_name (1 to 200 characters) and trial_name")
    verifier = result.get("verifier_result")
    reward = _reward(where, verifier.get("rewards") if isinstance(verifier, dict) else None)
    exception = result.get("exception_info")
    error = None
    if reward is None:
        if isinstance(exception, dict):
            error = f"{exception.get('exception_type')}: {exception.get('exception_message')}"[:MAX_ERROR_CHARS]
        else:
            error = "no reward: the verifier did not run"
    # Harbor's TrialResult.compute_token_cost_totals: the agent's context, or each step's.
    contexts = [result.get("agent_result")] if result.get("agent_result") is not None else []
    if not contexts and isinstance(result.get("step_results"), list):
        contexts = [step.get("agent_result") for step in result["step_results"] if isinstance(step, dict)]
    tokens = None
    for context in contexts:
        if isinstance(context, dict):
            for key in ("n_input_tokens", "n_output_tokens"):
                if _count(context.get(key)) is not None:
                    tokens = (tokens or 0) + context[key]
    trajectory = None
    if document is not None:
        try:
            trajectory = parse(document, "atif")[1]
        except TrajectoryFormatError as exc:
            raise HarborJobError(f"{trajectory_where}: {exc}") from None
    return HarborTrial(
        name=name,
        task=task,
        started_at=str(result.get("started_at") or ""),
        reward=reward,
        error=error,
        tokens=tokens,
        trajectory=trajectory,
    )


def _job_rewards(result: dict[str, Any]) -> dict[str, float]:
    """trial name -> reward as the job's result.json lists them (JobStats.evals[*].reward_stats)."""
    rewards: dict[str, float] = {}
    evals = (result.get("stats") or {}).get("evals") or {}
    for stats in evals.values() if isinstance(evals, dict) else []:
        reward_stats = stats.get("reward_stats") if isinstance(stats, dict) else None
        by_value = reward_stats.get("reward") if isinstance(reward_stats, dict) else None
        if isinstance(reward_stats, dict) and by_value is None and len(reward_stats) == 1:
            by_value = next(iter(reward_stats.values()))
        for value, names in (by_value or {}).items():
            for name in names if isinstance(names, list) else []:
                rewards[str(name)] = float(value)
    return rewards


def harbor_job_read(path: Path) -> HarborJob:
    """Read and check a Harbor job folder, writing nothing.

    Every trial's reward must equal the one the job's result.json lists for
    it. No symbolic link is followed: a link where a file or a trial folder
    is read refuses the job, so nothing outside the folder is read. Raises
    HarborJobError naming the file, HarborJobRefused over a limit or on a link.
    """
    path = Path(path)
    if not os.path.lexists(path / "result.json") or not os.path.lexists(path / "config.json"):
        raise HarborJobError(f"{path}: no config.json and result.json (is this a Harbor job folder?)")
    config = job_json(path, "config.json")
    result = job_json(path, "result.json")
    if not isinstance(config, dict) or not isinstance(result, dict) or "stats" not in result:
        raise HarborJobError(f"{path}: config.json and result.json must be Harbor's JobConfig and JobResult objects")
    for child in path.iterdir():
        if child.is_symlink() and child.is_dir():
            raise HarborJobRefused(f"{child.name}: a symbolic link (links are not followed)")
    folders = sorted(child for child in path.iterdir() if child.is_dir() and os.path.lexists(child / "result.json"))
    check_trial_count(len(folders))
    if not folders:
        raise HarborJobError(f"{path}: no trial folder with a result.json")
    return _job(path, config, result, [_trial(folder) for folder in folders])


def check_trial_count(count: int) -> None:
    try:
        limits.check_count(count, setting="RSI_MAX_TASKS", what="trials in the job")
    except limits.InputLimitError as exc:
        raise HarborJobRefused(str(exc)) from None
    if count > MAX_RESULTS:
        raise HarborJobRefused(f"{count} trials, over the limit of {MAX_RESULTS}")


def harbor_job_from_documents(*, config: Any, result: Any, trials: list[tuple[Any, Any]], label: str) -> HarborJob:
    """A job from its documents, as the API receives them: the job's
    config.json and result.json, and per trial its result.json and
    agent/trajectory.json (or None). Checked as ``harbor_job_read`` checks a
    folder; ``label`` names the job's origin in messages and its source."""
    if not isinstance(config, dict) or not isinstance(result, dict) or "stats" not in result:
        raise HarborJobError("config and result must be Harbor's JobConfig and JobResult objects")
    check_trial_count(len(trials))
    if not trials:
        raise HarborJobError("trials: at least one trial is needed")
    built = [
        _trial_from(f"trials[{i}].result", raw, document, trajectory_where=f"trials[{i}].trajectory")
        for i, (raw, document) in enumerate(trials)
    ]
    return _job(Path(label), config, result, built)


def trials_number(trials: list[HarborTrial]) -> None:
    """Number the attempts at each task from 0: by the attempt number the
    producer gave, else in the order they started."""
    by_task: dict[str, int] = {}
    for trial in sorted(trials, key=lambda t: (t.task, t.attempt or 0, t.started_at, t.name)):
        trial.index = by_task.get(trial.task, 0)
        by_task[trial.task] = trial.index + 1


def _job(path: Path, config: dict[str, Any], result: dict[str, Any], trials: list[HarborTrial]) -> HarborJob:
    listed = _job_rewards(result)
    for trial in trials:
        if trial.name in listed and listed[trial.name] != trial.reward:
            raise HarborJobError(
                f"{trial.name}/result.json: reward {trial.reward!r}, but the job's result.json lists "
                f"{listed[trial.name]!r}"
            )
        if trial.reward is not None and trial.name not in listed:
            raise HarborJobError(f"{trial.name}/result.json: reward {trial.reward!r} not in the job's result.json")
    trials_number(trials)
    name = config.get("job_name") if isinstance(config.get("job_name"), str) else path.name
    return HarborJob(
        path=path,
        name=str(name)[:150] or path.name,
        job_id=str(result.get("id") or ""),
        config=config,
        config_bytes=json.dumps(config, indent=2, sort_keys=True).encode() + b"\n",
        result=result,
        trials=trials,
    )


def _made_by_harbor_imports(experiment: Experiment) -> bool:
    """Whether Harbor job imports alone made the experiment: one created it,
    and it holds no candidate but imported ones and no evaluation but
    external ones (an earlier version let a job into an experiment the loop
    made, and marked that experiment as imported)."""
    origin = experiment.run_settings.get("imported_from") if isinstance(experiment.run_settings, dict) else None
    return (
        isinstance(origin, dict)
        and origin.get("format") in JOB_FORMATS
        and not Candidate.objects.filter(experiment=experiment).exclude(origin=Candidate.Origin.IMPORTED).exists()
        and not Evaluation.objects.filter(experiment=experiment, external=False).exists()
    )


def _experiment_for(name: str, job: HarborJob) -> tuple[Experiment, bool]:
    experiment = Experiment.objects.select_for_update(no_key=True).filter(name=name).first()
    if experiment is not None:
        if not _made_by_harbor_imports(experiment):
            raise HarborExperimentRefused(
                f"experiment {name!r} was not made by Harbor job imports: a job may only create an experiment "
                "or add to one that Harbor imports made; import into another experiment name"
            )
        return experiment, False
    slug = slugify(f"harbor-{name}")[:100].strip("-")
    if Benchmark.objects.filter(name=slug).exists() or Evaluator.objects.filter(name=slug).exists():
        raise HarborJobError(f"a benchmark or evaluator named {slug!r} exists already; choose another --experiment")
    benchmark = Benchmark.objects.create(name=slug, title=f"Harbor tasks of {name}", description="Imported Harbor job")
    argv = ["{python}", "-c", PLACEHOLDER_CODE, "harbor"]
    evaluator = Evaluator.objects.create(
        name=slug, files=tree_store(entries=[]), runner_argv=argv, verifier_argv=argv, timeout_seconds=1
    )
    experiment = Experiment.objects.create(
        name=name,
        description=f"Imported from Harbor jobs (first: {job.path}); nothing here was run by us.",
        benchmark=benchmark,
        evaluator=evaluator,
        surface=surface_create(name=f"harbor {name}"[:200], spec=SURFACE_SPEC),
        split_ratios={"train": 1.0},
        trials_per_task=max(trial.index + 1 for trial in job.trials),
        run_settings={"imported_from": {"format": job.kind, "jobs": {}}},
        status=Experiment.Status.FINISHED,
    )
    return experiment, True


def _tasks_add(experiment: Experiment, job: HarborJob) -> None:
    """Add the job's tasks that are new to the train split of an experiment
    Harbor imports made (``_experiment_for`` refuses any other)."""
    known = set(SplitMembership.objects.filter(experiment=experiment).values_list("task__external_id", flat=True))
    missing = sorted({trial.task for trial in job.trials} - known)
    for task_id in missing:
        task, _ = Task.objects.get_or_create(
            benchmark=experiment.benchmark,
            external_id=task_id,
            defaults={"instruction": f"Harbor task {task_id}", "expected": {}, "metadata": {"imported": True}},
        )
        SplitMembership.objects.create(experiment=experiment, task=task, split=SplitName.TRAIN)


def harbor_job_import(*, path: Path, experiment: str | None = None) -> HarborImportReport:
    """Import the Harbor job at ``path`` into the experiment named
    ``experiment`` (created when missing; default: the job's name).

    All or nothing: the job, every trial and every trajectory are read and
    checked first, the writes are one transaction. Safe to repeat: a job
    imported before (same job id) returns its candidate and adds nothing.
    """
    return harbor_job_store(job=harbor_job_read(Path(path)), experiment=experiment)


def harbor_job_store(*, job: HarborJob, experiment: str | None = None) -> HarborImportReport:
    """Store a job read by ``harbor_job_read`` or ``harbor_job_from_documents``;
    see ``harbor_job_import``."""
    name = experiment or job.experiment or job.name
    notes: list[str] = []
    with transaction.atomic():
        experiment_row, created = _experiment_for(name, job)
        origin = experiment_row.run_settings.get("imported_from") or {}
        jobs = dict(origin.get("jobs") or {}) if isinstance(origin, dict) else {}
        if job.job_id and job.job_id in jobs:
            candidate = Candidate.objects.get(pk=jobs[job.job_id])
            notes.append(f"job {job.job_id} was imported before, as candidate {candidate.pk}")
            return HarborImportReport(experiment_row, candidate, None, False, notes)
        _tasks_add(experiment_row, job)
        tree = tree_store(entries=[FileEntry(path=job.config_file, mode=MODE_FILE, data=job.config_bytes)])
        found = Candidate.objects.filter(experiment=experiment_row, tree=tree).first()
        if found is not None:
            candidate = found
        else:
            candidate = Candidate.objects.create(
                experiment=experiment_row,
                parent=experiment_row.seed_candidate,
                tree=tree,
                origin=Candidate.Origin.IMPORTED,
                state=Candidate.State.EVALUATED,
                state_reason=f"imported from the {job.title} {job.name!r}; not certified here",
                label=f"{job.label}:{job.name}"[:200],
            )
        if experiment_row.seed_candidate_id is None:
            experiment_row.seed_candidate = candidate
        evaluation = _ingest(candidate, job)
        jobs[job.job_id or job.name] = candidate.pk
        experiment_row.run_settings = {
            **experiment_row.run_settings,
            "imported_from": {**origin, "format": origin.get("format", job.kind), "jobs": jobs},
        }
        experiment_row.save(update_fields=["run_settings", "seed_candidate"])
        try:
            split_digests_store(experiment=experiment_row)
        except SplitsFrozenError as exc:  # _experiment_for refused such an experiment already
            raise HarborExperimentRefused(str(exc)) from None
    return HarborImportReport(experiment_row, candidate, evaluation, created, [*job.notes, *notes])


def _ingest(candidate: Candidate, job: HarborJob) -> Evaluation:
    stats = job.result.get("stats") or {}
    agents = job.config.get("agents")
    source: dict[str, Any] = {
        "kind": "harbor-job",
        "format": FORMAT,
        "job_name": job.name,
        "job_id": job.job_id,
        "path": str(job.path.resolve()) if job.path.is_absolute() or job.path.exists() else str(job.path),
        "agents": agents if isinstance(agents, list) else None,
        "n_total_trials": job.result.get("n_total_trials"),
        **{
            key: stats.get(key)
            for key in ("n_completed_trials", "n_errored_trials", "n_input_tokens", "n_cache_tokens")
        },
        "n_output_tokens": stats.get("n_output_tokens"),
        "cost_usd": stats.get("cost_usd"),
        "started_at": job.result.get("started_at"),
        "finished_at": job.result.get("finished_at"),
    }
    if job.kind != FORMAT:
        source = {"kind": job.kind, "format": job.kind, "job_name": job.name, "job_id": job.job_id, **job.summary}
        source["path"] = str(job.path.resolve()) if job.path.exists() else str(job.path)
    if len(json.dumps(source)) > 8_000:
        source["agents"] = None  # a huge agent config is in the candidate's files anyway
    results: list[dict[str, Any]] = []
    for trial in job.trials:
        item: dict[str, Any] = {"task": trial.task, "index": trial.index, "passed": False}
        if trial.reward is not None:
            item.update(passed=trial.reward >= 1.0, score=trial.reward)
        else:
            item["error"] = trial.error
        if trial.tokens is not None:
            item["tokens"] = trial.tokens
        steps = len(trial.trajectory.get("steps") or []) if trial.trajectory else None
        if steps is not None:
            item["steps"] = steps
        results.append(item)
    try:
        evaluation = external_results_ingest(candidate=candidate, results=results, source=source)
    except ExternalResultsError as exc:
        raise HarborJobError(f"{job.path}: {exc}") from None
    trials = {(row.task.external_id, row.index): row for row in evaluation.trials.select_related("task")}
    for trial in job.trials:
        if trial.trajectory is not None:
            trajectory_store(trial=trials[(trial.task, trial.index)], document=trial.trajectory)
    return evaluation
