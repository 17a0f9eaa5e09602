"""Trust scenarios 7 (evaluator tampering), 8 (out-of-surface edits), 10 (forged records) and 10b
(forged decisions in a bundle).

Every scenario here runs in the calling process, without a worker: trials
are claimed, run (in the real trial sandbox) and finished by the same
services a worker calls, inside one transaction per evaluation, so their
messages are only published once the trials are done (a worker that gets
them finds nothing left to do). Destructive writes to rows other
experiments share (blobs, evaluators, triggers) are made inside a savepoint
that is rolled back once the platform's reaction has been checked.

The helpers at the top (``probe_experiment``, ``evaluate_inline``,
``accepted_seed``, ``paused_run``...) are shared with ``evidence`` and
``sandbox_abuse``.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.db.models import Model
from django.utils import timezone

from evolution import operators, records, selectors
from evolution.loop import lifecycle
from evolution.loop import propose as loop_propose
from evolution.models import Candidate, CertifiedResult, Evaluation, Experiment, ReviewItem, Run, Task, Tree, Trial
from evolution.services import evaluation as evaluation_services
from evolution.services.candidates import candidate_accept, candidate_transition
from evolution.services.experiments import TaskInput, benchmark_upsert, evaluator_upsert, experiment_create
from evolution.services.proposals import ProposalRejected, candidate_freeze, proposal_tree
from evolution.services.records import records_verify, result_certify
from evolution.services.snapshots import tree_entries, tree_store
from evolution.surfaces import check_diff, component_for, in_surface, parse_surface
from evolution.trees import FileEntry
from lab.trust import Inapplicable, TrialContext, TrustFailure, expect, scenario
from lab.trust.context import proposer_python

INLINE_OWNER = "trust-suite-inline"
SPLITS = ("train", "gate", "sealed")


# --- Shared helpers -------------------------------------------------------------------------------------


def _unique(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def task_input(task: Task) -> TaskInput:
    """A faithful copy of a stored task (public files included)."""
    files: dict[str, str | bytes] = {}
    if task.public_files is not None:
        files = {entry.path: entry.data for entry in tree_entries(tree=task.public_files)}
    return TaskInput(
        external_id=task.external_id,
        instruction=task.instruction,
        expected=task.expected,
        criteria=list(task.criteria),
        files=files,
        metadata=dict(task.metadata),
    )


def probe_experiment(
    experiment: Experiment,
    *,
    tag: str,
    evaluator: Any = None,
    seed_tree: Tree | None = None,
    task_edit: Callable[[str, TaskInput], TaskInput] | None = None,
) -> Experiment:
    """``experiment`` itself, or a twin small enough to evaluate in a few trials.

    The twin has the same evaluator (or ``evaluator``), surface, seed files
    (or ``seed_tree``), run settings and k, over a copy of one task per split
    (every task when no split holds more than two). ``task_edit(split,
    task)`` rewrites a task before the twin's benchmark is made (planting a
    canary must happen before the split digests are frozen). The twin's
    records are not compared with anyone's, so scenarios that only need "an
    experiment of this benchmark" stay fast on a 60-task benchmark.
    """
    by_split: dict[str, list[Task]] = {}
    for membership in experiment.split_memberships.select_related("task").order_by("split", "task__external_id"):
        by_split.setdefault(membership.split, []).append(membership.task)
    small = all(len(tasks) <= 2 for tasks in by_split.values())
    if small and evaluator is None and seed_tree is None and task_edit is None:
        return experiment
    chosen = {split: tasks if small else tasks[:1] for split, tasks in by_split.items()}
    if small and task_edit is None:
        benchmark = experiment.benchmark
    else:
        inputs = [
            task_edit(split, task_input(task)) if task_edit else task_input(task)
            for split, tasks in chosen.items()
            for task in tasks
        ]
        # Identical copies share one benchmark; edited ones (a canary) get their own.
        name = f"{experiment.benchmark.name}~probe" + (f"~{_unique(tag)}" if task_edit else "")
        benchmark = benchmark_upsert(name=name, title=f"{experiment.benchmark.title} (trust probe)", tasks=inputs)
    return experiment_create(
        name=f"{experiment.name}~{_unique(tag)}",
        benchmark=benchmark,
        evaluator=evaluator or experiment.evaluator,
        surface=experiment.surface,
        seed_tree=seed_tree or selectors.experiment_seed(experiment).tree,
        split_lists={split: [task.external_id for task in tasks] for split, tasks in chosen.items()},
        trials_per_task=experiment.trials_per_task,
        run_settings=experiment.run_settings,
        description=f"trust suite probe of {experiment.name!r}",
    )


def evaluator_twin(experiment: Experiment, *, tag: str, files: Tree | None = None, timeout: int | None = None) -> Any:
    """A new evaluator like ``experiment``'s (same commands, environment and
    limits) with other files and/or a shorter timeout."""
    base = experiment.evaluator
    return evaluator_upsert(
        name=f"{base.name}~{_unique(tag)}",
        files=files or base.files,
        runner_argv=base.runner_argv,
        verifier_argv=base.verifier_argv,
        env_allowlist=base.env_allowlist,
        timeout_seconds=timeout or base.timeout_seconds,
        limits=base.limits,
    )


def tree_with(tree: Tree, changes: Mapping[str, bytes | None], *, modes: Mapping[str, str] | None = None) -> Tree:
    """``tree`` with files added or replaced (bytes) or removed (None)."""
    entries = {entry.path: entry for entry in tree_entries(tree=tree)}
    for path, data in changes.items():
        if data is None:
            entries.pop(path, None)
        else:
            mode = (modes or {}).get(path) or (entries[path].mode if path in entries else "100644")
            entries[path] = FileEntry(path, mode, data)
    return tree_store(entries=list(entries.values()))


def evaluate_inline(
    candidate: Candidate,
    splits: Sequence[str],
    *,
    k: int = 1,
    purpose: str = Evaluation.Purpose.CANDIDATE,
    repeat: int = 0,
) -> Evaluation:
    """Start an evaluation and run every trial in this process (real sandbox)."""
    with transaction.atomic():
        evaluation = evaluation_services.evaluation_start(
            candidate=candidate, splits=list(splits), k=k, purpose=purpose, repeat=repeat
        )
        for trial_id in Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True):
            evaluation_services.trial_execute_in_process(trial_id=trial_id, owner=INLINE_OWNER)
    evaluation.refresh_from_db()
    return evaluation


def certified(evaluation: Evaluation) -> CertifiedResult:
    record = result_certify(evaluation_id=evaluation.pk)
    evaluation.refresh_from_db()
    expect(record is not None, f"evaluation {evaluation.pk} was not certified ({evaluation.state}: {evaluation.error})")
    assert record is not None
    return record


def accepted_seed(experiment: Experiment, splits: Sequence[str] = ("gate",)) -> tuple[Candidate, Evaluation]:
    """Evaluate, certify and accept the seed, so it can be a parent."""
    seed = selectors.experiment_seed(experiment)
    evaluation = evaluate_inline(seed, splits, purpose=Evaluation.Purpose.BASELINE)
    certified(evaluation)
    seed.refresh_from_db()
    expect(candidate_accept(candidate=seed, reason="trust suite probe parent"), f"seed {seed.pk} not accepted")
    return seed, evaluation


def paused_run(experiment: Experiment, *, proposer: str = "example", params: Mapping[str, Any] | None = None) -> Run:
    """A run of the rrsi recipe, paused at once: proposals are frozen through
    it by hand, and no worker advances it."""
    from evolution.recipes import load_preset, parse_recipe, recipe_to_dict

    data = recipe_to_dict(load_preset("rrsi"))
    data["proposal"] = {"operator": proposer, "params": dict(params or {})}
    recipe = parse_recipe(data, known_operators=operators.known_operators())
    with transaction.atomic():
        run = lifecycle.run_create(experiment=experiment, recipe=recipe)
        lifecycle.run_pause(run=run)
    run.refresh_from_db()
    return run


def outcomes(evaluation: Evaluation) -> list[tuple[str, int, str, float | None, str]]:
    return list(
        Trial.objects.filter(evaluation=evaluation)
        .order_by("task__external_id", "index")
        .values_list("task__external_id", "index", "outcome", "score", "error_kind")
    )


@contextmanager
def rolled_back() -> Iterator[None]:
    """A savepoint that is always rolled back: forged rows vanish afterwards."""
    with transaction.atomic():
        yield
        transaction.set_rollback(True)


@contextmanager
def triggers_off() -> Iterator[str]:
    """Inside ``rolled_back``: switch off the append-only triggers the way an
    attacker with database rights would (PostgreSQL: replica role; SQLite:
    drop the trigger). Yields how."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL session_replication_role = replica")
            yield "session_replication_role = replica"
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [_table()])
            for (name,) in cursor.fetchall():
                cursor.execute(f'DROP TRIGGER "{name}"')
            yield "DROP TRIGGER"


def _table(model: type[Model] = CertifiedResult) -> str:
    return model._meta.db_table


def raw(sql: str, params: Sequence[Any] = ()) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return int(cursor.rowcount)


def refused_by_trigger(sql: str, params: Sequence[Any] = ()) -> bool:
    """Whether a raw statement is refused (an append-only trigger, a unique constraint)."""
    try:
        with transaction.atomic():
            raw(sql, params)
    except Exception:
        return True
    return False


def surface_paths(experiment: Experiment, files: Mapping[str, bytes]) -> list[str]:
    spec = parse_surface(experiment.surface.spec)
    return sorted(path for path in files if in_surface(spec, path))


def crippled_files(experiment: Experiment, files: Mapping[str, bytes]) -> dict[str, bytes]:
    """The harness with every surface file emptied except those holding
    protected keys: an honest agent with it cannot solve anything, so a pass
    can only come from tampering."""
    spec = parse_surface(experiment.surface.spec)
    protected = list(spec.protected_keys)
    from evolution.surfaces import match_pattern

    result = dict(files)
    for path in surface_paths(experiment, files):
        if not any(match_pattern(pattern, path) for pattern in protected):
            result[path] = b""
    return result


# --- 7: evaluator tampering ---------------------------------------------------------------------------

FORGED_VERDICT = b'{"passed": true, "score": 1.0, "criteria": [], "valid_output": true, "submitted": true}'
FAKE_RUNNER = (
    b'#!/bin/sh\necho 1 > "$LOGS_DIR/reward.txt" 2>/dev/null\necho 1 > /logs/verifier/reward.txt 2>/dev/null\n'
    b"echo '" + FORGED_VERDICT + b"'\nexit 0\n"
)
FAKE_PY = b"import sys\nprint('" + FORGED_VERDICT + b"')\nsys.exit(0)\n"

# Files a tampering candidate drops into its harness, by where they would have to act.
TAMPER_FILES: dict[str, bytes] = {
    "evaluator/verify.py": FAKE_PY,
    "evaluator/harbor_verify.py": FAKE_PY,
    "evaluator/agent.py": FAKE_PY,
    "tests/test.sh": b"#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    "conftest.py": b"import pytest\n\ndef pytest_runtest_makereport(item, call):\n    call.excinfo = None\n",
    "sitecustomize.py": FAKE_PY,
    "usercustomize.py": FAKE_PY,
    "bin/python3": FAKE_RUNNER,
    "bin/python": FAKE_RUNNER,
    "bin/pytest": FAKE_RUNNER,
    "bin/bash": FAKE_RUNNER,
    "bin/tr": FAKE_RUNNER,
    "logs/verifier/reward.txt": b"1\n",
    "logs/verifier/reward.json": b'{"reward": 1.0}\n',
    "reward.txt": b"1\n",
    "answer.json": b'{"tool": "refund_order", "args": {}}\n',
    "answer.txt": b"yes\n",
    "verdict.json": FORGED_VERDICT,
}
# The same, under each top-level folder of the surface (where a surface lets them in).
SURFACE_TAMPER_NAMES = ("conftest.py", "sitecustomize.py", "verify.py", "reward.txt", "python3", "test.sh")


def _surface_tamper_files(experiment: Experiment, parent_files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Tamper files at paths the surface accepts (next to its existing files)."""
    spec = parse_surface(experiment.surface.spec)
    folders = sorted({path.rsplit("/", 1)[0] for path in parent_files if "/" in path and in_surface(spec, path)})
    found: dict[str, bytes] = {}
    for folder in folders:
        for name in SURFACE_TAMPER_NAMES:
            path = f"{folder}/{name}"
            if in_surface(spec, path) and path not in parent_files:
                found[path] = TAMPER_FILES.get(name, FAKE_RUNNER if name in ("python3", "test.sh") else FAKE_PY)
    return found


def proposal_of(experiment: Experiment, parent_files: Mapping[str, bytes], files: dict[str, bytes]) -> Any:
    spec = parse_surface(experiment.surface.spec)
    changed = sorted(p for p in set(files) | set(parent_files) if files.get(p) != parent_files.get(p))
    by_kind: dict[str, list[str]] = {}
    for path in changed:
        by_kind.setdefault(component_for(spec, path) or "prompt", []).append(path)
    edits = [
        operators.EditDeclaration(component=kind, hypothesis=f"trust suite probe edit of {kind} files", paths=paths)
        for kind, paths in sorted(by_kind.items())
    ]
    return operators.Proposal(files=files, edits=edits, note="trust suite")


def proposal_freeze(run: Run, parent: Candidate, proposal: Any, slot: int) -> tuple[str, str, Candidate | None]:
    """(state, reason, candidate) of freezing ``proposal``; state "refused" on ProposalRejected."""
    try:
        outcome = candidate_freeze(run=run, parent=parent, proposal=proposal, round=1, slot=slot, edit_budget=None)
    except ProposalRejected as exc:
        return "refused", str(exc), None
    return outcome.state, outcome.reason, outcome.candidate


def _no_pass(evaluation: Evaluation, what: str) -> None:
    rows = outcomes(evaluation)
    expect(bool(rows), f"{what}: no trial ran")
    passed = [row for row in rows if row[2] == Trial.Outcome.PASS]
    expect(not passed, f"{what}: scored a pass it did not earn: {passed}")


@scenario(7, "7a-tamper-via-proposal", "Evaluator tampering: verifier files, conftest, fake runners, rewards")
def tamper_via_proposal(ctx: TrialContext) -> str:
    """A proposal that drops verifier look-alikes, a conftest.py, a
    sitecustomize.py, fake runners and pre-written rewards into a harness
    that cannot honestly solve anything: every out-of-surface file is
    refused at the surface, and the ones the surface lets in change nothing
    (the candidate scores no pass)."""
    experiment = probe_experiment(ctx.experiment, tag="tamper")
    parent, _ = accepted_seed(experiment)
    run = paused_run(experiment)
    parent_files = {e.path: e.data for e in tree_entries(tree=parent.tree)}
    crippled = crippled_files(experiment, parent_files)

    refused = 0
    for slot, (path, data) in enumerate(sorted(TAMPER_FILES.items()), start=1):
        state, reason, candidate = proposal_freeze(
            run, parent, proposal_of(experiment, parent_files, {**crippled, path: data}), slot
        )
        expect(
            state in ("refused", Candidate.State.REJECTED_SURFACE) and path in reason,
            f"tamper file {path!r} was not refused at the surface: {state} {reason!r}",
        )
        expect(candidate is None or not candidate.evaluations.exists(), f"{path}: rejected candidate evaluated")
        refused += 1

    # The honest counterpart (crippled harness alone) must fail, or the check below proves nothing.
    inside = _surface_tamper_files(experiment, parent_files)
    honest_state, reason, honest = proposal_freeze(run, parent, proposal_of(experiment, parent_files, crippled), 100)
    expect(honest is not None and honest_state == Candidate.State.FROZEN, f"crippled harness: {honest_state} {reason}")
    assert honest is not None
    candidate_transition(candidate=honest, to=Candidate.State.APPROVED, reason="trust suite")
    _no_pass(evaluate_inline(honest, ["gate"]), "the crippled honest harness")
    state, reason, tampered = proposal_freeze(
        run, parent, proposal_of(experiment, parent_files, {**crippled, **inside}), 101
    )
    if tampered is None or state != Candidate.State.FROZEN:
        return f"{refused} out-of-surface tamper files refused; in-surface ones refused too ({state}: {reason[:80]})"
    candidate_transition(candidate=tampered, to=Candidate.State.APPROVED, reason="trust suite")
    evaluation = evaluate_inline(tampered, ["gate"])
    _no_pass(evaluation, f"in-surface tamper files {sorted(inside)}")
    return f"{refused} out-of-surface tamper files refused; {len(inside)} in-surface ones scored no pass"


@scenario(7, "7b-tamper-imported-harness", "Evaluator tampering: a harness that never met the surface")
def tamper_imported_harness(ctx: TrialContext) -> str:
    """The same files in a harness that never went through a surface (a seed
    or an imported harness), with executable fake runners: the trial
    workspace keeps them away from the verifier, so no pass is scored."""
    seed_tree = selectors.experiment_seed(ctx.experiment).tree
    seed_files = {e.path: e.data for e in tree_entries(tree=seed_tree)}
    crippled = crippled_files(ctx.experiment, seed_files)
    modes = {path: "100755" for path in TAMPER_FILES if path.startswith("bin/") or path.endswith(".sh")}
    honest_tree = tree_with(seed_tree, crippled)
    tampered_tree = tree_with(honest_tree, TAMPER_FILES, modes=modes)
    honest = probe_experiment(ctx.experiment, tag="tamper-honest", seed_tree=honest_tree)
    _no_pass(evaluate_inline(selectors.experiment_seed(honest), ["gate"]), "the crippled honest harness")
    tampered = probe_experiment(ctx.experiment, tag="tamper-imported", seed_tree=tampered_tree)
    evaluation = evaluate_inline(selectors.experiment_seed(tampered), ["gate"])
    _no_pass(evaluation, "a harness holding verifier look-alikes, conftest, sitecustomize and fake runners")
    return f"{len(TAMPER_FILES)} tamper files in the harness: {outcomes(evaluation)[0][2]}, no pass"


# A hostile agent program: tries to change the verifier and to plant what
# a verifier might pick up, reports what worked in its trajectory, and does
# not solve the task (so a pass could only come from tampering).
HOSTILE_TAMPER_AGENT = r"""
import json, os, sys, stat
from pathlib import Path

FORGED = %(forged)r
report = {}

def attempt(name, action):
    try:
        action()
        report[name] = "done"
    except BaseException as exc:
        report[name] = "blocked: %%s" %% type(exc).__name__

here = Path(__file__).resolve()
trial = next((p for p in here.parents if (p / "evaluator").is_dir()), here.parent)
evaluator = trial / "evaluator"
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1] if flag in args else None
output = Path(value("--output") or os.environ.get("AGENT_OUTPUT") or trial / "output")
workspace = Path(os.environ.get("AGENT_WORKSPACE") or output / "workspace")

for path in sorted(evaluator.rglob("*")) if evaluator.is_dir() else []:
    if path.is_file():
        attempt("overwrite evaluator/" + path.name, lambda p=path: p.write_text("print(%%r)\n" %% FORGED))
attempt("new file in evaluator/", lambda: (evaluator / "sitecustomize.py").write_text("print(1)\n"))
attempt("create private/", lambda: (trial / "private" / "logs" / "verifier").mkdir(parents=True))
for folder in (output, workspace, Path.home(), Path.home() / "bin", Path.home() / ".local/bin"):
    for name in ("python3", "python", "bash", "tr", "pytest"):
        def plant(folder=folder, name=name):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text("#!/bin/sh\necho '%%s'\n" %% FORGED)
            (folder / name).chmod(0o755)
        attempt("fake %%s in %%s" %% (name, folder.name), plant)
    for name, text in (("sitecustomize.py", "print(%%r)" %% FORGED), ("conftest.py", ""), ("reward.txt", "1\n"),
                       ("reward.json", '{"reward": 1}'), ("answer.json", FORGED), ("verdict.json", FORGED)):
        write = lambda folder=folder, name=name, text=text: (folder / name).write_text(text)
        attempt("%%s in %%s" %% (name, folder.name), write)
site = Path.home() / (".local/lib/python%%d.%%d/site-packages" %% sys.version_info[:2])
def plant_usercustomize():
    site.mkdir(parents=True, exist_ok=True)
    (site / "usercustomize.py").write_text("print(1)")
attempt("usercustomize", plant_usercustomize)
print(FORGED)
trajectory = {"schema_version": "ATIF-v1.5", "session_id": "hostile", "agent": {"name": "hostile", "version": "1"},
              "steps": [{"step_id": 1, "timestamp": "2026-01-01T00:00:00Z", "source": "agent",
                         "message": "REPORT " + json.dumps(report, sort_keys=True)}],
              "final_metrics": {"total_prompt_tokens": 1, "total_completion_tokens": 1, "total_steps": 1}}
target = value("--trajectory")
(Path(target) if target else output / "trajectory.json").write_text(json.dumps(trajectory))
"""


def hostile_experiment(ctx: TrialContext, program: str, *, tag: str, timeout: int | None = None) -> Experiment:
    """A twin of ``ctx.experiment`` whose agent is ``program``, put where the
    benchmark really runs agent code: a Harbor-style harness's agent (the
    command ``agent.toml`` names, whose file the surface keeps off-limits)
    or the example evaluator's runner (the example harness is data only).
    The twin keeps the evaluator's commands, environment and limits."""
    base = ctx.experiment
    seed = selectors.experiment_seed(base).tree
    seed_paths = {entry.path for entry in tree_entries(tree=seed)}
    evaluator_paths = {entry.path for entry in tree_entries(tree=base.evaluator.files)}
    agent_in_harness = next((p for p in sorted(seed_paths) if p.endswith(".py")), None)
    if "agent.toml" in seed_paths and agent_in_harness is not None:
        return probe_experiment(
            base,
            tag=tag,
            seed_tree=tree_with(seed, {agent_in_harness: program.encode()}),
            evaluator=evaluator_twin(base, tag=tag, timeout=timeout) if timeout else None,
        )
    runner = next((arg for arg in base.evaluator.runner_argv if arg.startswith("{evaluator}/")), None)
    expect(runner is not None, "the evaluator's runner is not one of its files")
    assert runner is not None
    name = runner.removeprefix("{evaluator}/")
    expect(name in evaluator_paths, f"runner {name} is not among the evaluator's files")
    files = tree_with(base.evaluator.files, {name: program.encode()})
    return probe_experiment(base, tag=tag, evaluator=evaluator_twin(base, tag=tag, files=files, timeout=timeout))


def agent_report(trial: Trial) -> dict[str, Any] | None:
    """The REPORT a hostile agent left in its trajectory, if it got stored."""
    from evolution.models import TrajectoryStep

    for message in TrajectoryStep.objects.filter(trajectory__trial=trial).values_list("message", flat=True):
        if message.startswith("REPORT "):
            report: dict[str, Any] = json.loads(message.removeprefix("REPORT "))
            return report
    return None


@scenario(7, "7c-tamper-by-agent", "Evaluator tampering by the running agent: verifier copy, PATH, rewards")
def tamper_by_agent(ctx: TrialContext) -> str:
    """An agent that, while it runs, overwrites the verifier's files, creates
    the verifier's private folder and reward, plants fake ``python3``/``bash``
    /``tr``/``pytest`` runners and a sitecustomize.py wherever it can write,
    and prints a forged verdict, without solving the task: the trial scores
    no pass and the evaluator's stored files are unchanged."""
    from evolution.services.snapshots import tree_verify

    experiment = hostile_experiment(ctx, HOSTILE_TAMPER_AGENT % {"forged": FORGED_VERDICT.decode()}, tag="tamper-agent")
    evaluation = evaluate_inline(selectors.experiment_seed(experiment), ["gate"])
    _no_pass(evaluation, "a tampering agent")
    expect(not tree_verify(tree_digest=experiment.evaluator.files_id), "the evaluator's stored files changed")
    trial = Trial.objects.filter(evaluation=evaluation).first()
    report = agent_report(trial) if trial else None
    expect(report is not None, f"the agent left no report (trial {trial and trial.outcome}: {trial and trial.error})")
    assert report is not None
    hit = sorted(name for name, result in report.items() if result == "done" and "evaluator" in name)
    hit += sorted(name for name, result in report.items() if result == "done" and name == "create private/")
    expect(not hit, f"the agent changed the verifier's files or folder: {hit}")
    blocked = sum(1 for result in report.values() if result != "done")
    return f"{len(report)} tampering attempts ({blocked} blocked, the rest inert): {outcomes(evaluation)[0][2]}"


@scenario(7, "7d-verifier-changed", "Evaluator tampering: verifier file changed before certification")
def verifier_changed_before_certify(ctx: TrialContext) -> str:
    """After the trials finish and before certification, the bytes of the
    verifier stored in the database are rewritten (raw SQL), or the evaluator
    row is pointed at other files: certification refuses. The same change
    after certification is flagged by records_verify."""
    experiment = probe_experiment(ctx.experiment, tag="tamper-cert")
    seed = selectors.experiment_seed(experiment)
    # One transaction: the certification message the last trial enqueues is only sent at its
    # end, so no worker certifies the evaluation between the trials and the tampering.
    with transaction.atomic():
        evaluation = evaluate_inline(seed, ["gate"], purpose=Evaluation.Purpose.BASELINE)
        expect(evaluation.state == Evaluation.State.COMPLETE, f"evaluation is {evaluation.state}")
        verifier = _verifier_entry(experiment)
        blob_table = _table(blob_model())
        with rolled_back():
            raw(f"UPDATE {blob_table} SET content = %s WHERE digest = %s", [FAKE_PY, verifier.blob])
            record = result_certify(evaluation_id=evaluation.pk)
            evaluation.refresh_from_db()
            expect(record is None, "certification accepted an evaluator whose verifier changed on disk")
            expect(evaluation.state == Evaluation.State.FAILED, f"evaluation is {evaluation.state}, not failed")
            expect(verifier.path in evaluation.error, f"refusal does not name {verifier.path}: {evaluation.error!r}")
            reason = evaluation.error
        evaluation.refresh_from_db()
        # The evaluator row itself pointed at other files (raw SQL): refused too.
        evaluator_table = _table(type(experiment.evaluator))
        with rolled_back():
            raw(f"UPDATE {evaluator_table} SET files_id = %s WHERE id = %s", [seed.tree_id, experiment.evaluator_id])
            record = result_certify(evaluation_id=evaluation.pk)
            evaluation.refresh_from_db()
            expect(record is None, "certification accepted an evaluator row swapped to other files")
            expect("evaluator" in evaluation.error, f"refusal does not name the evaluator: {evaluation.error!r}")
        evaluation.refresh_from_db()
        certified(evaluation)
    expect(records_verify(experiment=experiment).ok, "records do not verify before tampering")
    with rolled_back():
        raw(f"UPDATE {blob_table} SET content = %s WHERE digest = %s", [FAKE_PY, verifier.blob])
        problems = records_verify(experiment=experiment).problems
        expect(any(verifier.path in p for p in problems), f"records_verify missed the changed verifier: {problems}")
    return f"certification refused ({reason[:70]}...); records_verify flags it after certification"


def blob_model() -> Any:
    from evolution.models import Blob

    return Blob


class _Entry:
    def __init__(self, path: str, blob: str) -> None:
        self.path, self.blob = path, blob


def _verifier_entry(experiment: Experiment) -> _Entry:
    """The evaluator file its verifier command runs."""
    from evolution.models import TreeEntry

    names = [arg.removeprefix("{evaluator}/") for arg in experiment.evaluator.verifier_argv if "{evaluator}/" in arg]
    entry = TreeEntry.objects.filter(tree_id=experiment.evaluator.files_id, path__in=names).first()
    expect(entry is not None, f"no verifier file among {names}")
    assert entry is not None
    return _Entry(entry.path, entry.blob_id)


# --- 8: out-of-surface edits --------------------------------------------------------------------------


def _path_variants(parent_files: Mapping[str, bytes], surface_file: str) -> dict[str, str]:
    """label -> path of an added file that must be refused."""
    folder, _, name = surface_file.rpartition("/")
    folder = folder or "prompts"
    upper = folder[0].upper() + folder[1:]
    fullwidth = chr(ord(folder[0]) - ord("a") + 0xFF41) + folder[1:]
    cyrillic = folder.replace("o", "\u043e", 1) if "o" in folder else folder.replace("e", "\u0435", 1)
    return {
        "parent traversal": "../escape.md",
        "traversal inside": f"{folder}/../../escape.md",
        "absolute": "/etc/cron.d/escape",
        "absolute tmp": "/tmp/escape.md",
        "backslash": f"{folder}\\..\\..\\escape.md",
        ".git/hooks": ".git/hooks/pre-commit",
        "nested .git": f"{folder}/.git/hooks/post-checkout",
        ".GIT case": ".GIT/hooks/pre-commit",
        "case look-alike": f"{upper}/{name}",
        "case look-alike new file": f"{folder.upper()}/extra.md",
        "fullwidth look-alike": f"{fullwidth}/{name}",
        "cyrillic look-alike": f"{cyrillic}/{name}",
        "NFD name": f"{folder}/cafe\u0301.md",
        "NFC non-ASCII": f"{folder}/caf\u00e9.md",
        "zero-width": f"{folder}/ex\u200btra.md",
        "trailing dot": f"{folder}./{name}",
        "trailing space": f"{folder}/{name} ",
        "reserved evaluator": "evaluator/verify.py",
        "reserved Evaluator": "Evaluator/verify.py",
        "reserved fullwidth": "\uff45valuator/verify.py",
        "reserved tasks": "tasks/t1/expected.json",
        "reserved records": "records/0001.json",
        "reserved .rsi": ".rsi/prompt.md",
        "outside include": "escape.md",
    }


def _protected_variants(experiment: Experiment, parent_files: Mapping[str, bytes]) -> dict[str, dict[str, bytes]]:
    from evolution.surfaces import match_pattern

    spec = parse_surface(experiment.surface.spec)
    variants: dict[str, dict[str, bytes]] = {}
    for pattern, keys in spec.protected_keys.items():
        for path, data in parent_files.items():
            if not match_pattern(pattern, path):
                continue
            text = data.decode()
            for key in keys:
                leaf = key.rsplit(".", 1)[-1]
                line = re.compile(rf"^(\s*){re.escape(leaf)}(\s*=)", re.M)
                if not line.search(text):
                    continue
                variants[f"{path}: {key} renamed away"] = {path: line.sub(rf"\1{leaf}_gone\2", text, 1).encode()}
                variants[f"{path}: {key} redefined"] = {path: (f'{leaf} = "trust-hacked"\n' + text).encode()}
                variants[f"{path}: {key} quoted"] = {
                    path: line.sub(rf'\1"{leaf}_x"\2', text, 1).encode() + f'\n"{leaf}" = ["trust-hacked"]\n'.encode()
                }
    return variants


def _diff_variants(surface_file: str) -> dict[str, str]:
    """Crafted ``git diff`` texts (what ``surface_check`` and imports read): symlinks, modes, renames."""
    a = surface_file
    return {
        "symlink out (absolute)": f"diff --git a/{a}.lnk b/{a}.lnk\nnew file mode 120000\n--- /dev/null\n"
        f"+++ b/{a}.lnk\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n",
        "symlink out (..)": f"diff --git a/{a}.lnk b/{a}.lnk\nnew file mode 120000\n--- /dev/null\n"
        f"+++ b/{a}.lnk\n@@ -0,0 +1 @@\n+../../../evaluator/verify.py\n\\ No newline at end of file\n",
        "file turned symlink": f"diff --git a/{a} b/{a}\nold mode 100644\nnew mode 120000\n",
        "gitlink": f"diff --git a/{a}.sub b/{a}.sub\nnew file mode 160000\nindex 0000000..1111111\n--- /dev/null\n"
        f"+++ b/{a}.sub\n@@ -0,0 +1 @@\n+Subproject commit 1111111111111111111111111111111111111111\n",
        "odd mode": f"diff --git a/{a} b/{a}\nold mode 100644\nnew mode 100777\n",
        "rename out (..)": f"diff --git a/{a} b/../{a}\nsimilarity index 100%\nrename from {a}\nrename to ../{a}\n",
        "rename out (reserved)": f"diff --git a/{a} b/evaluator/x\nsimilarity index 100%\nrename from {a}\n"
        "rename to evaluator/x\n",
        "rename out (.git/hooks)": f"diff --git a/{a} b/.git/hooks/pre-commit\nsimilarity index 100%\n"
        f"rename from {a}\nrename to .git/hooks/pre-commit\n",
        "copy from reserved": f"diff --git a/evaluator/verify.py b/{a}.copy\nsimilarity index 100%\n"
        f"copy from evaluator/verify.py\ncopy to {a}.copy\n",
    }


SYMLINK_PROGRAM = r"""
import json, os, pathlib
w = pathlib.Path.cwd()
target = sorted(p for p in w.rglob("*") if p.is_file() and ".rsi" not in p.parts)[0]
os.symlink(%(link_target)r, target.parent / "escape-link")
target.chmod(0o755)
(w / ".rsi" / "edits.json").write_text(json.dumps({"edits": [{"component": "prompt", "hypothesis": "link",
    "paths": [str((target.parent / "escape-link").relative_to(w))]}]}))
"""


EXEC_BIT_PROGRAM = r"""
import json, pathlib
w = pathlib.Path.cwd()
target = sorted(p for p in w.rglob("*.md") if ".rsi" not in p.parts)[0]
target.write_text(target.read_text() + "\n")
target.chmod(0o755)
(w / ".rsi" / "edits.json").write_text(json.dumps({"edits": [{"component": "prompt", "hypothesis": "exec bit",
    "paths": [str(target.relative_to(w))]}]}))
"""


@scenario(
    8, "8-out-of-surface", "Out-of-surface edits: .., absolute, symlinks, renames, .git, look-alikes, keys, modes"
)
def out_of_surface(ctx: TrialContext) -> str:
    """Each crafted edit goes through the real path of a proposal
    (``candidate_freeze``), of a command proposer's workspace (real symlinks
    and modes on disk), or of a ``git diff`` checked against the surface: it
    is refused with a reason, no evaluable candidate is stored, and the
    parent is unchanged."""
    from evolution.proposers import ProposerError, command_proposer

    experiment = probe_experiment(ctx.experiment, tag="surface")
    parent, _ = accepted_seed(experiment)
    parent_tree, parent_state = parent.tree_id, parent.state
    run = paused_run(experiment)
    spec = parse_surface(experiment.surface.spec)
    parent_files = {e.path: e.data for e in tree_entries(tree=parent.tree)}
    surface_files = surface_paths(experiment, parent_files)
    expect(bool(surface_files), "the seed has no file on the surface")
    target = next((p for p in surface_files if "/" in p), surface_files[0])
    checked: list[str] = []

    def refused(label: str, files: dict[str, bytes], must_name: str | None) -> None:
        state, reason, candidate = proposal_freeze(
            run, parent, proposal_of(experiment, parent_files, files), len(checked) + 1
        )
        expect(
            state in ("refused", Candidate.State.REJECTED_SURFACE, "invalid"),
            f"{label}: not refused ({state}) {sorted(set(files) - set(parent_files))}",
        )
        expect(bool(reason.strip()), f"{label}: refused without a reason")
        if must_name is not None and state == Candidate.State.REJECTED_SURFACE:
            expect(must_name in reason, f"{label}: reason does not name {must_name!r}: {reason!r}")
        if candidate is not None:
            expect(
                not Evaluation.objects.filter(candidate=candidate).exists(), f"{label}: rejected candidate evaluated"
            )
            try:
                evaluation_services.evaluation_start(candidate=candidate, splits=["gate"], k=1)
            except evaluation_services.EvaluationError:
                pass
            else:
                raise TrustFailure(f"{label}: a surface-rejected candidate could be evaluated")
        checked.append(label)

    for label, path in _path_variants(parent_files, target).items():
        refused(label, {**parent_files, path: b"escaped\n"}, None)
    content = parent_files[target]
    for label, path in (("rename out (reserved)", "evaluator/moved.md"), ("rename out (..)", "../moved.md")):
        moved = {p: d for p, d in parent_files.items() if p != target}
        refused(label, {**moved, path: content}, None)
    for path in sorted(set(parent_files) - set(surface_files)):
        refused(f"change off-surface {path}", {**parent_files, path: parent_files[path] + b"\n# hacked\n"}, path)
        refused(f"delete off-surface {path}", {p: d for p, d in parent_files.items() if p != path}, path)
    for label, change in _protected_variants(experiment, parent_files).items():
        refused(label, {**parent_files, **change}, None)

    for label, diff in _diff_variants(target).items():
        try:
            verdict = check_diff(spec, diff, old_files=parent_files)
        except ValueError as exc:  # DiffParseError: refused as unusable
            checked.append(f"{label} (unparsable: {exc})")
            continue
        expect(not verdict.allowed, f"git diff {label}: allowed by the surface")
        expect(all(v.reason for v in verdict.violations), f"git diff {label}: violation without a reason")
        checked.append(label)

    view = loop_propose.proposer_view(
        run=run,
        recipe=lifecycle.run_recipe(run),
        parent=parent,
        round_number=1,
        slot=900,
        budget=None,
        stalled=False,
        explore=[],
    )
    for link_target in ("/etc/passwd", "../../.."):
        program = SYMLINK_PROGRAM % {"link_target": link_target}
        params = {"argv": [proposer_python(), "-c", program], "timeout_seconds": 30}
        try:
            command_proposer(_with_params(view, params))
        except ProposerError as exc:
            expect("symlink" in str(exc), f"workspace symlink to {link_target}: refused for another reason: {exc}")
            checked.append(f"workspace symlink -> {link_target}")
        else:
            raise TrustFailure(f"a workspace symlink to {link_target} became a proposal")

    # An exec bit set in the workspace does not travel: proposals carry contents, the parent's modes stay.
    params = {"argv": [proposer_python(), "-c", EXEC_BIT_PROGRAM], "timeout_seconds": 30}
    proposal = command_proposer(_with_params(view, params))
    tree, _old, new = proposal_tree(parent=parent, proposal=proposal)
    modes = {entry.path: entry.mode for entry in new}
    changed = [p for p in proposal.files if proposal.files[p] != parent_files.get(p)]
    expect(bool(changed), "the exec-bit program changed nothing")
    expect(all(modes[p] == "100644" for p in changed), f"an exec bit reached a proposed tree: {modes}")
    expect(not Candidate.objects.filter(tree=tree).exists(), "reading a proposal stored a candidate")
    checked.append("exec bit set in a proposer workspace")

    parent.refresh_from_db()
    expect(parent.tree_id == parent_tree and parent.state == parent_state, "the parent changed")
    live = Candidate.objects.filter(experiment=experiment).exclude(pk=parent.pk)
    live = live.exclude(state__in=[Candidate.State.REJECTED_SURFACE])
    expect(not live.exists(), f"candidates stored outside a rejected state: {list(live.values_list('state', 'label'))}")
    expect(
        Evaluation.objects.filter(experiment=experiment).exclude(candidate=parent).count() == 0,
        "an evaluation was started for a refused edit",
    )
    return f"{len(checked)} crafted edits refused with a reason (an exec bit dropped); parent unchanged"


def _with_params(view: operators.ProposerView, params: Mapping[str, Any]) -> operators.ProposerView:
    from dataclasses import replace

    return replace(view, params=dict(params))


# --- 10: forged records -------------------------------------------------------------------------------


def _records(experiment: Experiment) -> list[CertifiedResult]:
    return list(CertifiedResult.objects.filter(experiment=experiment).order_by("seq"))


def _problems(experiment: Experiment) -> list[str]:
    return records_verify(experiment=experiment).problems


def _bundle_problems(experiment: Experiment) -> list[str]:
    from django.conf import settings

    from evolution.services.bundles import bundle_build, bundle_verify

    return bundle_verify(json.loads(json.dumps(bundle_build(experiment=experiment))), key=settings.RSI_RECORDS_KEY)


def _bundle_cli(experiment: Experiment, workdir: Path) -> tuple[int, str]:
    """``export_experiment`` then ``verify_records --bundle``: (exit status, output)."""
    import io

    from django.core.management import call_command

    path = Path(tempfile.mkdtemp(dir=workdir)) / "bundle.json"
    call_command("export_experiment", str(experiment.pk), str(path), stdout=io.StringIO())
    out = io.StringIO()
    try:
        call_command("verify_records", bundle=str(path), stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def _flipped(outcome: str) -> dict[str, Any]:
    """The forged result: a pass where there was none, a fail where there was a pass."""
    return {"outcome": "fail", "score": 0.0} if outcome == Trial.Outcome.PASS else {"outcome": "pass", "score": 1.0}


@scenario(10, "10-forged-records", "Forged records: edited score, replaced blob, replayed certificate, reordered chain")
def forged_records(ctx: TrialContext) -> str:
    """Three certified records, then each forgery by raw SQL (the append-only
    triggers switched off the way a database owner could): records_verify
    names the record, and an exported bundle fails ``verify_records
    --bundle`` the same way. Each forgery is rolled back before the next."""
    experiment = probe_experiment(ctx.experiment, tag="forge")
    seed = selectors.experiment_seed(experiment)
    for repeat in range(3):
        purpose = Evaluation.Purpose.BASELINE if repeat == 0 else Evaluation.Purpose.NOISE
        certified(evaluate_inline(seed, ["gate"], purpose=purpose, repeat=repeat))
    rows = _records(experiment)
    expect(len(rows) == 3, f"expected 3 records, got {len(rows)}")
    expect(not _problems(experiment), f"records do not verify before forging: {_problems(experiment)}")
    expect(not _bundle_problems(experiment), "the bundle does not verify before forging")
    table, trial_table, blob_table = _table(), _table(Trial), _table(blob_model())
    first, second, third = rows
    workdir = Path(ctx.workdir)
    done: list[str] = []

    def forged(label: str, must: str, forge: Callable[[], None], *, bundle: bool = True) -> None:
        with rolled_back(), triggers_off():
            forge()
            problems = _problems(experiment)
            expect(any(must in p for p in problems), f"{label}: records_verify did not name {must!r}: {problems}")
            if bundle:
                bundle_found = _bundle_problems(experiment)
                expect(bool(bundle_found), f"{label}: the exported bundle verifies")
        done.append(label)

    # The triggers refuse a plain UPDATE / DELETE of a record.
    blocked = refused_by_trigger(f"UPDATE {table} SET signature = %s WHERE id = %s", ["0" * 64, first.pk])
    expect(blocked, "an UPDATE of a certified record was not refused by the append-only trigger")

    def edit_score() -> None:
        payload = dict(second.payload)
        payload["trials"] = [{**t, **_flipped(t["outcome"])} for t in payload["trials"]]
        # Stored as the certifier would store it: only the edit differs.
        raw(f"UPDATE {table} SET payload = %s WHERE id = %s", [records.canonical_payload(payload).decode(), second.pk])

    forged("edited score in the record", "record #2", edit_score)

    def edit_trial() -> None:
        for pk, outcome in Trial.objects.filter(evaluation_id=second.evaluation_id).values_list("pk", "outcome"):
            flipped = _flipped(outcome)
            raw(f"UPDATE {trial_table} SET outcome = %s, score = %s WHERE id = %s", [*flipped.values(), pk])

    forged("edited score in the trial rows", "record #2", edit_trial, bundle=False)
    # A bundle carries the certified payloads, not trial rows: the forged rows never reach it.
    with rolled_back(), triggers_off():
        edit_trial()
        from evolution.services.bundles import bundle_build

        exported = bundle_build(experiment=experiment)["records"][1]["payload"]["trials"]
        expect(exported == second.payload["trials"], "forged trial rows reached the exported bundle")

    def replace_blob() -> None:
        entry = tree_entries(tree=seed.tree)[0]
        from evolution import digests

        raw(f"UPDATE {blob_table} SET content = %s WHERE digest = %s", [b"replaced\n", digests.blob_digest(entry.data)])

    forged("replaced blob", "record #1", replace_blob)

    def copy_columns(columns: Sequence[str]) -> None:
        for column in columns:
            raw(
                f"UPDATE {table} SET {column} = (SELECT {column} FROM {table} WHERE id = %s) WHERE id = %s",
                [first.pk, third.pk],
            )

    # A byte-for-byte copy of record #1 cannot even be stored twice (its digest is unique)...
    with rolled_back(), triggers_off():
        expect(
            refused_by_trigger(f"UPDATE {table} SET record_digest = %s WHERE id = %s", [first.record_digest, third.pk]),
            "a second row with record #1's digest was stored",
        )
    # ...and with its payload and signature but its own digest it is named.
    forged("replayed old certificate", "record #3", lambda: copy_columns(("payload", "signature", "prev_digest")))

    def reorder() -> None:
        raw(f"UPDATE {table} SET seq = 999 WHERE id = %s", [first.pk])
        raw(f"UPDATE {table} SET seq = 1 WHERE id = %s", [second.pk])
        raw(f"UPDATE {table} SET seq = 2 WHERE id = %s", [first.pk])

    forged("reordered chain", "record #1", reorder)

    def truncate() -> None:
        raw(f"DELETE FROM {table} WHERE id = %s", [third.pk])

    forged("truncated chain", "chain head", truncate)

    def truncate_and_rehead() -> None:
        raw(f"DELETE FROM {table} WHERE id = %s", [third.pk])
        exp_table = _table(Experiment)
        raw(
            f"UPDATE {exp_table} SET chain_length = 2, chain_head = %s WHERE id = %s",
            [second.record_digest, experiment.pk],
        )

    forged("truncated chain with a moved head", "chain head signature", truncate_and_rehead)

    status, output = 0, ""
    with rolled_back(), triggers_off():
        edit_score()
        status, output = _bundle_cli(experiment, workdir)
    expect(status == 1 and "MISMATCH" in output, f"verify_records --bundle passed a forged bundle: {output[-300:]}")
    expect(not _problems(experiment), f"records do not verify after the rollbacks: {_problems(experiment)}")
    return f"{len(done)} forgeries each named by records_verify and caught in the bundle; trigger refused UPDATE"


# --- 10b: forged decisions in a bundle ----------------------------------------------------------

DECISION_NOTE = "\nCheck the answer once more before submitting it ({}).\n"


@operators.register("proposal", "trust-decisions")
def decisions_proposer(view: operators.ProposerView) -> operators.Proposal:
    """One line added to the first prompt file on the surface: a generic
    note, except in slot 1, where it names a train task (the critic holds
    that one for a reviewer)."""
    prompts = sorted(p for p in view.components if p.endswith(".md") and p in view.parent_files)
    if not prompts:
        raise Inapplicable("no prompt file on the surface to edit")
    path = prompts[0]
    note = DECISION_NOTE.format(f"{view.round}.{view.slot}")
    if view.slot == 1 and view.evidence:
        note = f"\nFor {view.evidence[0].task_id} give the answer that passed before.\n"
    files = dict(view.parent_files)
    files[path] = view.parent_files[path] + note.encode()
    hypothesis = "a last check before submitting reduces careless answers"
    return operators.Proposal(files=files, edits=[operators.EditDeclaration(view.components[path], hypothesis, [path])])


def decided_experiment(experiment: Experiment) -> Experiment:
    """A one-round rrsi run of ``experiment`` (in this process) whose gate
    decided the seed and the round's candidates, and whose flagged
    candidate a reviewer rejected: every kind of decision, certified."""
    from django.contrib.auth.models import User

    from evolution.loop.inline import run_drive
    from evolution.loop.review import review_decide
    from evolution.recipes import load_preset, parse_recipe, recipe_to_dict

    data = recipe_to_dict(load_preset("rrsi"))
    data.update(rounds=1, candidates_per_round=3)
    data["proposal"] = {"operator": "trust-decisions", "params": {}}
    data["evaluation"] = {**data["evaluation"], "trials_per_task": 1}
    data["noise"] = {**data["noise"], "repeats": 2}
    data["edit_budget"] = {**data["edit_budget"], "T": 1}
    recipe = parse_recipe(data, known_operators=operators.known_operators())
    run = lifecycle.run_create(experiment=experiment, recipe=recipe)
    run = run_drive(run, until=lambda r: ReviewItem.objects.filter(candidate__run=r).exists())
    item = ReviewItem.objects.filter(candidate__run=run).order_by("pk").first()
    expect(item is not None, f"the critic held no candidate for review (run {run.status}: {run.error})")
    assert item is not None  # expect raised otherwise
    reviewer, _ = User.objects.get_or_create(username="trust-suite-reviewer")
    review_decide(item=item, user=reviewer, approve=False, reason="names a task")
    run = run_drive(run)
    expect(run.status == Run.Status.FINISHED, f"the run did not finish: {run.status} {run.error}")
    experiment.refresh_from_db()
    return experiment


WIDE_SURFACE = "include: ['**']\ncomponents:\n  '**': prompt\n"


@scenario(10, "10b-forged-decisions", "Forged decisions in a bundle: candidate states, reasons, surface spec, verdicts")
def forged_decisions(ctx: TrialContext) -> str:
    """A run whose gate and reviewer decided; its bundle edited as an
    attacker would (a rejected candidate shown accepted with a forged
    reason, an accepted one rejected, an unknown state, a reason rewritten,
    the surface widened to ``**`` with its digest recomputed, a gate
    verdict rewritten, the decisions dropped): each edit fails
    ``verify_records --bundle`` and ``import_bundle`` refuses it, writing
    nothing. The same state edits in the database are named by
    ``records_verify``."""
    import io

    from django.conf import settings
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from evolution import digests
    from evolution.services.bundles import BundleError, bundle_build, bundle_import, bundle_verify

    experiment = decided_experiment(probe_experiment(ctx.experiment, tag="decide"))
    expect(not _problems(experiment), f"records do not verify before forging: {_problems(experiment)}")
    key = settings.RSI_RECORDS_KEY
    clean = json.loads(json.dumps(bundle_build(experiment=experiment)))
    expect(
        not bundle_verify(clean, key=key), f"the bundle does not verify before forging: {bundle_verify(clean, key=key)}"
    )
    kinds = sorted({d["kind"] for d in clean["decisions"]})
    expect(kinds == ["gate", "review"], f"decision records in the bundle: {kinds}")
    by_state = {c["state"]: c for c in reversed(clean["candidates"])}
    rejected, accepted = by_state.get("rejected_review"), by_state.get("accepted")
    expect(rejected is not None and accepted is not None, f"states in the bundle: {sorted(by_state)}")
    assert rejected is not None and accepted is not None  # expect raised otherwise

    def state(tree: str, name: str, reason: str | None = None) -> Callable[[dict[str, Any]], None]:
        def edit(bundle: dict[str, Any]) -> None:
            candidate = next(c for c in bundle["candidates"] if c["tree"] == tree)
            candidate["state"] = name
            if reason is not None:
                candidate["state_reason"] = reason

        return edit

    def widen(bundle: dict[str, Any]) -> None:
        bundle["surface"].update(spec=WIDE_SURFACE, digest=digests.sha256_hex(WIDE_SURFACE.encode()))

    def verdict(bundle: dict[str, Any]) -> None:
        gate = next(d for d in bundle["decisions"] if d["kind"] == "gate")
        gate["payload"]["gate"]["rule"] = "accept"

    def drop(bundle: dict[str, Any]) -> None:
        bundle["decisions"] = []

    forgeries = {
        "rejected shown accepted with a forged reason": (
            state(rejected["tree"], "accepted", "dS above the noise band"),
            "certified review decision",
        ),
        "accepted shown rejected": (state(accepted["tree"], "rejected_gate"), "certified gate decision"),
        "unknown state": (state(rejected["tree"], "promoted"), "unknown state 'promoted'"),
        "reason rewritten": (state(accepted["tree"], "accepted", "approved by the board"), "state reason differs"),
        "surface widened to **": (widen, "surface differs from the certified one"),
        "gate verdict rewritten": (verdict, "payload digest"),
        "decisions dropped": (drop, "chain truncated or extended"),
    }
    before = (Experiment.objects.count(), Candidate.objects.count())
    for label, (forge, must) in forgeries.items():
        bundle = copy.deepcopy(clean)
        forge(bundle)
        problems = bundle_verify(bundle, key=key)
        expect(any(must in p for p in problems), f"{label}: verify_records --bundle did not say {must!r}: {problems}")
        try:
            bundle_import(bundle=bundle, key=key, name=_unique("forged"))
        except BundleError:
            pass
        else:
            raise TrustFailure(f"{label}: the forged bundle was imported")
        expect((Experiment.objects.count(), Candidate.objects.count()) == before, f"{label}: the import wrote rows")

    # The command line: one bundle, both commands.
    path = Path(tempfile.mkdtemp(dir=ctx.workdir)) / "forged.json"
    bundle = copy.deepcopy(clean)
    state(rejected["tree"], "accepted", "dS above the noise band")(bundle)
    path.write_text(json.dumps(bundle))
    try:
        call_command("verify_records", bundle=str(path), stdout=io.StringIO())
    except SystemExit as exc:
        expect(exc.code == 1, f"verify_records --bundle exited {exc.code}")
    else:
        raise TrustFailure("verify_records --bundle passed the forged bundle")
    try:
        call_command("import_bundle", str(path), name=_unique("forged"), stdout=io.StringIO())
    except CommandError as exc:
        expect(exc.returncode == 2 and "\n" not in str(exc), f"import_bundle refused as {exc.returncode}: {exc}")
    else:
        raise TrustFailure("import_bundle took the forged bundle")
    expect((Experiment.objects.count(), Candidate.objects.count()) == before, "import_bundle wrote rows")

    # The database: the same state edits, named by records_verify (rolled back).
    db_forgeries = {
        "rejected shown accepted": (rejected["tree"], "accepted", "certified review decision"),
        "unknown state": (accepted["tree"], "promoted", "unknown state 'promoted'"),
    }
    for label, (tree, name, must) in db_forgeries.items():
        with rolled_back():
            # Accepted needs a certification time (a check constraint): the forger sets one too.
            Candidate.objects.filter(experiment=experiment, tree_id=tree).update(
                state=name, certified_at=timezone.now()
            )
            problems = _problems(experiment)
            expect(any(must in p for p in problems), f"database {label}: records_verify did not say {must!r}")
    # Scores and review outside the decisions: stored split totals, a certified evaluation no record binds,
    # a review skipped by setting the rejected candidate's state to approved (the evaluate path refuses it).
    from evolution.loop import late
    from evolution.models import EvaluationSplitStats

    reviewed = Candidate.objects.get(experiment=experiment, tree_id=rejected["tree"])
    with rolled_back():
        stats = EvaluationSplitStats.objects.filter(evaluation__experiment=experiment).order_by("pk")[0]
        EvaluationSplitStats.objects.filter(pk=stats.pk).update(passed=stats.passed + 1)
        extra = Evaluation.objects.create(
            experiment=experiment, candidate=reviewed, splits=["gate"], state=Evaluation.State.CERTIFIED
        )
        Candidate.objects.filter(pk=reviewed.pk).update(state=Candidate.State.APPROVED)
        problems = _problems(experiment)
        for must in (
            f"evaluation {stats.evaluation_id}, split {stats.split!r}: stored totals differ",
            f"evaluation {extra.pk} is certified, but no record binds it",
            f"candidate {reviewed.tree_id[:12]}: state 'approved', but the critic held it for review",
        ):
            expect(any(must in p for p in problems), f"records_verify did not say {must!r}: {problems}")
        try:
            late.candidate_evaluate_late(candidate_id=reviewed.pk, scope="gate")
        except late.LateError:
            pass
        else:
            raise TrustFailure("a candidate whose review was skipped was evaluated")
    expect(not _problems(experiment), f"records do not verify after the rollbacks: {_problems(experiment)}")
    return (
        f"{len(forgeries)} bundle forgeries refused by verify and import (nothing written), "
        f"{len(db_forgeries) + 3} in the database named by records_verify, a skipped review refused"
    )
