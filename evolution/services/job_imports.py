"""Import the runs of other tools as Harbor jobs are imported.

``job_read`` tells by what ``path`` holds which of these it is, and reads it
into the HarborJob that ``harbor_job_store`` stores (one imported candidate
with one external evaluation; evolution/services/harbor_jobs.py):

- a Harbor job folder (``config.json``, ``result.json``): ``harbor_job_read``;
- a terminal-bench 1.x run folder (``tb run``: ``run_metadata.json``, its
  RunMetadata, and ``results.json``, its BenchmarkResults: the list of
  TrialResults and ``n_resolved``, ``accuracy``, ``resolved_ids``), with one
  folder per task holding one folder per trial, each with the trial's
  ``results.json`` (field names of ``terminal_bench.harness.models``). A
  trial's reward is 1 when ``is_resolved``, else 0; a trial whose tests gave
  no verdict (``is_resolved`` null, its ``failure_mode`` saying why) is an
  error. Tokens are ``total_input_tokens`` + ``total_output_tokens``.
  Everything is checked against the run's own results.json: its counts, its
  accuracy, each trial's verdict against its parser results, and each trial
  folder's results.json against the run's entry;
- an Inspect AI eval log (a ``.eval`` or ``.json`` file;
  evolution/inspect_logs.py): each sample a trial of the task named by its
  id (each epoch an attempt), its reward the value of the log's first scorer
  (C, I, P, N, numbers, yes/no, as Inspect maps them to numbers), its
  tokens its ``model_usage``, an errored sample an error, and its messages
  its trajectory; checked against the log's ``results`` (sample count and
  the first scorer's mean) and ``stats.model_usage`` (a note when the
  tokens differ: retried samples spend tokens no sample keeps).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from evolution import inspect_logs, limits
from evolution.services.harbor_jobs import (
    HarborImportReport,
    HarborJob,
    HarborJobError,
    HarborJobRefused,
    HarborTrial,
    check_trial_count,
    harbor_job_read,
    harbor_job_store,
    job_json,
    trials_number,
)
from evolution.trajectory_formats import TrajectoryFormatError, parse
from evolution.trees import SnapshotError, open_inside

TERMINAL_BENCH = "terminal-bench-run"
INSPECT = "inspect-log"
MAX_ERROR_CHARS = 2_000
_ATTEMPT_RE = re.compile(r"\.(\d+)-of-\d+(?:\.|$)")
_CLOSE = 1e-9


def job_read(path: Path) -> HarborJob:
    """The job at ``path``: a Harbor job folder, a terminal-bench run folder
    or an Inspect AI log file, read and checked, writing nothing. Raises
    HarborJobError naming the file (or, for anything else, what ``path``
    looks like), HarborJobRefused over a limit or on a symbolic link."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        if os.path.lexists(path / "run_metadata.json") and os.path.lexists(path / "results.json"):
            return terminal_bench_run_read(path)
        if os.path.lexists(path / "config.json") or os.path.lexists(path / "result.json"):
            return harbor_job_read(path)
        raise HarborJobError(
            f"{path}: a folder with neither config.json and result.json (a Harbor job) nor run_metadata.json "
            "and results.json (a terminal-bench run)"
        )
    if path.is_file() and not path.is_symlink():
        return inspect_log_read(path)
    if path.is_symlink():
        raise HarborJobRefused(f"{path}: a symbolic link (links are not followed)")
    raise HarborJobError(f"{path}: no such file or folder")


def job_import(*, path: Path, experiment: str | None = None) -> HarborImportReport:
    """Import the job at ``path`` (see ``job_read``) into the experiment named
    ``experiment`` (default: the job's own, ``harbor_job_store``). All or
    nothing; safe to repeat (a job imported before adds nothing)."""
    return harbor_job_store(job=job_read(Path(path)), experiment=experiment)


def report_lines(report: HarborImportReport) -> list[str]:
    """What the import commands print of an import: its notes, then what was created."""
    lines = [f"note: {note}" for note in report.notes]
    if report.evaluation is not None:
        lines.append(
            f"{'created' if report.created else 'updated'} experiment {report.experiment.pk} "
            f"{report.experiment.name!r}: candidate {report.candidate.pk} {report.candidate.label!r}, "
            f"evaluation {report.evaluation.pk} with {report.evaluation.trials.count()} trial(s)"
        )
    return lines


# --- terminal-bench 1.x -------------------------------------------------------


def _tb_trial(where: str, entry: Any) -> HarborTrial:
    """A trial from one TrialResults; HarborJobError when it contradicts itself."""
    if not isinstance(entry, dict):
        raise HarborJobError(f"{where}: must be an object (terminal-bench's TrialResults)")
    task, name = entry.get("task_id"), entry.get("trial_name")
    if not isinstance(task, str) or not task or len(task) > 200 or not isinstance(name, str) or not name:
        raise HarborJobError(f"{where}: needs task_id (1 to 200 characters) and trial_name")
    resolved, tests = entry.get("is_resolved"), entry.get("parser_results")
    if resolved is not None and not isinstance(resolved, bool):
        raise HarborJobError(f"{where} ({name}): is_resolved must be true, false or null, got {resolved!r}")
    if tests is not None and not isinstance(tests, dict):
        raise HarborJobError(f"{where} ({name}): parser_results must be an object or null")
    # The harness resolves a trial when every unit test it parsed passed.
    if isinstance(resolved, bool) and tests and resolved != all(status == "passed" for status in tests.values()):
        raise HarborJobError(
            f"{where}: is_resolved is {str(resolved).lower()} but its parser_results say "
            f"{dict(Counter(str(status) for status in tests.values()))}"
        )
    failure = entry.get("failure_mode")
    error = None
    if resolved is None:
        error = f"{failure or 'unknown'}: the tests gave no verdict"[:MAX_ERROR_CHARS]
    counts = [entry.get("total_input_tokens"), entry.get("total_output_tokens")]
    for value in counts:
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise HarborJobError(f"{where} ({name}): token counts must be non-negative integers or null")
    # An agent that counts no tokens leaves both at 0 (AgentResult's default): unknown, not free.
    tokens = None if all(not value for value in counts) else sum(value or 0 for value in counts)
    attempt = _ATTEMPT_RE.search(name)
    return HarborTrial(
        name=name,
        task=task,
        started_at=str(entry.get("trial_started_at") or ""),
        reward=None if resolved is None else float(resolved),
        error=error,
        tokens=tokens,
        trajectory=None,
        attempt=int(attempt.group(1)) if attempt else None,
    )


def _tb_folders(path: Path) -> list[tuple[str, Path]]:
    """(where, trial folder) of each ``<task>/<trial>/results.json`` in the run folder."""
    found = []
    for task in sorted(path.iterdir()):
        if task.is_symlink():
            raise HarborJobRefused(f"{task.name}: a symbolic link (links are not followed)")
        if not task.is_dir():
            continue
        for trial in sorted(task.iterdir()):
            if trial.is_symlink():
                raise HarborJobRefused(f"{task.name}/{trial.name}: a symbolic link (links are not followed)")
            if trial.is_dir() and os.path.lexists(trial / "results.json"):
                found.append((f"{task.name}/{trial.name}/results.json", trial))
    return found


def terminal_bench_run_read(path: Path) -> HarborJob:
    """Read and check a terminal-bench 1.x run folder (see the module's
    docstring), writing nothing. HarborJobError naming the file at fault."""
    path = Path(path)
    metadata = job_json(path, "run_metadata.json")
    results = job_json(path, "results.json")
    if not isinstance(metadata, dict) or not isinstance(results, dict) or not isinstance(results.get("results"), list):
        raise HarborJobError(
            f"{path}: run_metadata.json and results.json must be terminal-bench's RunMetadata and BenchmarkResults"
        )
    entries = results["results"]
    check_trial_count(len(entries))
    if not entries:
        raise HarborJobError(f"{path}: results.json lists no trial")
    trials = [_tb_trial(f"results.json results[{i}]", entry) for i, entry in enumerate(entries)]
    by_name = {entry["trial_name"]: entry for entry in entries}
    if len(by_name) != len(entries):
        raise HarborJobError("results.json: a trial_name is listed twice")
    resolved = [trial for trial in trials if trial.reward == 1.0]
    if results.get("n_resolved") is not None and results["n_resolved"] != len(resolved):
        raise HarborJobError(
            f"results.json: n_resolved is {results['n_resolved']!r} but {len(resolved)} of its trials are resolved"
        )
    accuracy = len(resolved) / len(trials)
    for where, value in (("results.json", results.get("accuracy")), ("run_metadata.json", metadata.get("accuracy"))):
        if value is not None and (
            not isinstance(value, int | float) or not math.isclose(value, accuracy, abs_tol=_CLOSE)
        ):
            raise HarborJobError(
                f"{where}: accuracy {value!r}, but {len(resolved)} of {len(trials)} trials are resolved ({accuracy!r})"
            )
    if isinstance(results.get("resolved_ids"), list) and Counter(map(str, results["resolved_ids"])) != Counter(
        trial.task for trial in resolved
    ):
        raise HarborJobError("results.json: resolved_ids differ from the tasks of its resolved trials")
    folders = _tb_folders(path)
    for where, _folder in folders:
        entry = job_json(path, where)
        name = _tb_trial(where, entry).name
        if name not in by_name:
            raise HarborJobError(f"{where}: trial {name!r} is not in the run's results.json")
        if entry != by_name[name]:
            raise HarborJobError(f"{where}: differs from the run's results.json entry for {name}")
    trials_number(trials)
    modes = Counter(str(entry.get("failure_mode")) for entry in entries)
    run_id = str(metadata.get("run_id") or path.name)
    dataset = metadata.get("dataset_name")
    version = metadata.get("dataset_version")
    sums = {key: sum(entry.get(key) or 0 for entry in entries) for key in ("total_input_tokens", "total_output_tokens")}
    return HarborJob(
        path=path,
        name=run_id[:150],
        job_id=str(metadata.get("uuid") or results.get("id") or run_id),
        config=metadata,
        config_bytes=json.dumps(metadata, indent=2, sort_keys=True).encode() + b"\n",
        result={},
        trials=trials,
        kind=TERMINAL_BENCH,
        config_file="terminal-bench/run_metadata.json",
        label=f"terminal-bench:{metadata.get('agent_name') or 'agent'}",
        title="terminal-bench run",
        experiment=f"{dataset}@{version}" if isinstance(dataset, str) and version else None,
        summary={
            "agent_name": metadata.get("agent_name"),
            "model_name": metadata.get("model_name"),
            "dataset": f"{dataset}@{version}" if dataset else metadata.get("dataset_path"),
            "n_attempts": metadata.get("n_attempts"),
            "n_trials": len(trials),
            "n_resolved": len(resolved),
            "accuracy": accuracy,
            "failure_modes": dict(sorted(modes.items())),
            "n_input_tokens": sums["total_input_tokens"],
            "n_output_tokens": sums["total_output_tokens"],
            "trial_folders": len(folders),
            "started_at": metadata.get("start_time"),
            "finished_at": metadata.get("end_time"),
            "commit_hash": metadata.get("commit_hash"),
        },
    )


# --- Inspect AI ---------------------------------------------------------------


def _inspect_trial(document: dict[str, Any], sample: Any, scorers: list[str], index: int) -> HarborTrial:
    where = f"samples[{index}]"
    if not isinstance(sample, dict) or "id" not in sample:
        raise HarborJobError(f"{where}: must be an Inspect sample (an object with id and epoch)")
    task = str(sample["id"])
    epoch = sample.get("epoch") if isinstance(sample.get("epoch"), int) else 1
    name = f"sample {task} epoch {epoch}"
    if not task or len(task) > 200:
        raise HarborJobError(f"{name}: the sample id must be 1 to 200 characters")
    reward = error = None
    failure = sample.get("error")
    if isinstance(failure, dict | str):
        message = failure.get("message") if isinstance(failure, dict) else failure
        error = f"error: {message}"[:MAX_ERROR_CHARS]
    else:
        scored = inspect_logs.sample_score(sample, scorers)
        if scored is None:
            error = "not scored: the sample has no score"
        else:
            scorer, value = scored
            reward = inspect_logs.score_value(value)
            if reward is None or not 0 <= reward <= 1:
                raise HarborJobError(f"{name}: score {value!r} of {scorer} is not a number in [0, 1]")
    tokens = inspect_logs.usage_tokens(sample.get("model_usage"))
    try:
        trajectory = parse({**document, "samples": [sample]}, "inspect")[1]
    except TrajectoryFormatError as exc:
        raise HarborJobError(f"{name}: {exc}") from None
    return HarborTrial(
        name=name,
        task=task,
        started_at=str(sample.get("started_at") or ""),
        reward=reward,
        error=error,
        tokens=sum(tokens) if tokens is not None else None,
        trajectory=trajectory,
        attempt=epoch,
    )


def _inspect_check(document: dict[str, Any], trials: list[HarborTrial], scorers: list[str]) -> list[str]:
    """Refuse a log whose samples contradict its results; notes for what may differ honestly."""
    results = document.get("results") if isinstance(document.get("results"), dict) else None
    if results is not None and document.get("status") == "success":
        total = results.get("total_samples")
        if isinstance(total, int) and total != len(trials):
            raise HarborJobError(f"results.total_samples is {total} but the log holds {len(trials)} samples")
    if results is not None and scorers:
        first = next(s for s in results["scores"] if isinstance(s, dict) and s.get("name") == scorers[0])
        metrics = first.get("metrics") if isinstance(first.get("metrics"), dict) else {}
        assert metrics is not None
        metric = metrics.get("accuracy") or metrics.get("mean")
        if not isinstance(metric, dict):
            return _inspect_token_notes(document, trials)
        value = metric.get("value")
        reducer = first.get("reducer")
        scored: dict[str, list[float]] = {}
        for trial in trials:
            if trial.reward is not None:
                scored.setdefault(trial.task, []).append(trial.reward)
        if isinstance(value, int | float) and scored and reducer in (None, "mean"):
            # Inspect reduces the epochs of a sample (mean), then averages the samples.
            mean = sum(sum(v) / len(v) for v in scored.values()) / len(scored)
            if not math.isclose(mean, value, abs_tol=1e-6):
                raise HarborJobError(
                    f"results: {scorers[0]} {metric.get('name')} is {value!r}, but its samples' scores average {mean!r}"
                )
    return _inspect_token_notes(document, trials)


def _inspect_token_notes(document: dict[str, Any], trials: list[HarborTrial]) -> list[str]:
    notes = []
    stats = document.get("stats") if isinstance(document.get("stats"), dict) else {}
    assert stats is not None
    listed = inspect_logs.usage_tokens(stats.get("model_usage"))
    counted = [trial.tokens for trial in trials]
    if listed is not None and None not in counted and sum(listed) != sum(c or 0 for c in counted):
        notes.append(
            f"the samples' tokens ({sum(c or 0 for c in counted)}) differ from the log's stats.model_usage "
            f"({sum(listed)}): tokens of retried or unfinished samples are in the stats only"
        )
    return notes


def inspect_log_read(path: Path) -> HarborJob:
    """Read and check an Inspect AI log file (``.eval`` or ``.json``), writing
    nothing; see the module's docstring. A file that is not one is refused
    in one line naming what it is."""
    path = Path(path)
    try:
        with open_inside(path.parent, path.name) as stream:
            data = limits.read_bytes(stream, setting="RSI_MAX_TASKS_FILE_BYTES", what=path.name)
        document = inspect_logs.inspect_log_load(data, what=path.name, setting="RSI_MAX_TASKS_FILE_BYTES")
    except (limits.InputLimitError, SnapshotError) as exc:
        raise HarborJobRefused(str(exc)) from None
    except OSError as exc:
        raise HarborJobError(f"{path.name}: cannot read ({exc.strerror})") from None
    except inspect_logs.InspectLogError as exc:
        raise HarborJobError(
            f"{exc}; a job is a Harbor job folder, a terminal-bench run folder or an Inspect AI log"
        ) from None
    kind = ".eval" if inspect_logs.is_zip(data) else ".json"
    samples = document.get("samples") or []
    check_trial_count(len(samples))
    if not samples:
        raise HarborJobError(f"{path.name}: {inspect_logs.describe(document, kind=kind)}: no sample to import")
    scorers = inspect_logs.scorer_names(document)
    trials = [_inspect_trial(document, sample, scorers, i) for i, sample in enumerate(samples)]
    if len({(t.task, t.attempt) for t in trials}) != len(trials):
        raise HarborJobError(f"{path.name}: a sample id and epoch appear twice")
    try:
        notes = _inspect_check(document, trials, scorers)
    except HarborJobError as exc:
        raise HarborJobError(f"{path.name}: {exc}") from None
    trials_number(trials)
    spec = document["eval"]
    task, model = str(spec.get("task") or path.stem), str(spec.get("model") or "model")
    config = {"eval": spec, "plan": document.get("plan")}
    results = document.get("results") if isinstance(document.get("results"), dict) else {}
    assert results is not None
    stats = document.get("stats") if isinstance(document.get("stats"), dict) else {}
    assert stats is not None
    usage = inspect_logs.usage_tokens(stats.get("model_usage"))
    return HarborJob(
        path=path,
        name=f"{task} {model}"[:150],
        job_id=str(spec.get("eval_id") or f"{spec.get('run_id')}/{spec.get('task_id')}"),
        config=config,
        config_bytes=json.dumps(config, indent=2, sort_keys=True).encode() + b"\n",
        result={},
        trials=trials,
        kind=INSPECT,
        config_file="inspect/eval.json",
        label="inspect",
        title="Inspect AI eval log",
        experiment=task[:150],
        notes=notes,
        summary={
            "file": f"{kind} log, version {document.get('version')}",
            "task": task,
            "model": model,
            "inspect_ai": (spec.get("packages") or {}).get("inspect_ai")
            if isinstance(spec.get("packages"), dict)
            else None,
            "status": document.get("status"),
            "scorer": scorers[0] if scorers else None,
            "total_samples": results.get("total_samples"),
            "completed_samples": results.get("completed_samples"),
            "n_input_tokens": usage[0] if usage else None,
            "n_output_tokens": usage[1] if usage else None,
            "started_at": stats.get("started_at"),
            "finished_at": stats.get("completed_at"),
        },
    )
