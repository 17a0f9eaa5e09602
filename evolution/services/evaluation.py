"""Evaluations and trials: start, claim, execute, finish, reap.

Every step is safe to run twice. A trial is claimed with a conditional
UPDATE (pending, or running with an expired lease) and finished with another
conditional UPDATE that names the claim (owner and attempt), so a worker
whose lease was taken over cannot overwrite the newer result. The trial that
finishes an evaluation enqueues certification after commit; the certifier
itself is idempotent, and the reaper re-enqueues whatever a lost message or a
killed worker left behind.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from evolution import digests, dispatch, faults, ramp
from evolution.models import (
    Candidate,
    Evaluation,
    Evaluator,
    Experiment,
    ModelEndpoint,
    Run,
    SplitMembership,
    Task,
    Tree,
    Trial,
)
from evolution.prepared import PreparedGet, PreparedUpdate, statement_cursor
from evolution.sandbox import Limits
from evolution.services.candidates import candidates_transition
from evolution.services.records import evaluator_config_digest
from evolution.services.snapshots import tree_entries
from evolution.services.trajectories import trajectory_store
from evolution.trees import FileEntry, materialize
from evolution.trials import TrialResult, TrialSpec, run_trial

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
# A candidate may have several evaluations (seed repeats for the noise band,
# transfer runs on sealed splits after the gate). Only an APPROVED candidate
# changes state when evaluated; the others keep the state the gate gave them.
EVALUABLE_STATES = (
    Candidate.State.APPROVED,
    Candidate.State.EVALUATING,
    Candidate.State.CERTIFIED,
    Candidate.State.ACCEPTED,
    Candidate.State.REJECTED_GATE,
)


class EvaluationError(ValueError):
    pass


class TrialHeldBack(Exception):
    """A limit on trials in flight (the experiment's or its model
    endpoint's) is reached: the trial stays pending and its message is to be
    sent again later. Nothing was claimed."""


def worker_identity() -> str:
    """Who holds a claim: host, process and, in a thread-pool worker, thread."""
    if threading.current_thread() is threading.main_thread():
        return f"{socket.gethostname()}:{os.getpid()}"
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_native_id()}"


def trial_seed(base_seed: int, task_external_id: str, index: int) -> int:
    """A trial's seed from the evaluation seed, the task and the trial index.

    Independent of database ids, so the same evaluation in another experiment
    (or after a crash and resume) runs with the same seeds.
    """
    material = digests.sha256_hex(f"{base_seed}\n{task_external_id}\n{index}".encode())
    return int(material[:12], 16)


def _infra_error(message: str) -> TrialResult:
    return TrialResult(
        outcome=Trial.Outcome.ERROR,
        score=None,
        criteria_results=[],
        tokens=None,
        steps=None,
        wall_time=0.0,
        valid_output=None,
        submitted=None,
        error_kind=Trial.ErrorKind.INFRA,
        error=message,
        sandbox_profile="",
        trajectory=None,
        agent_log="",
    )


def _enqueue_trials(trial_ids: Sequence[int]) -> None:
    # One name for the tests to watch; the messages leave after commit.
    dispatch.trials_run_after_commit(trial_ids)


def evaluation_start(
    *,
    candidate: Candidate,
    splits: Sequence[str],
    k: int | None = None,
    purpose: str = Evaluation.Purpose.CANDIDATE,
    repeat: int = 0,
    seed: int | None = None,
    run: Run | None = None,
) -> Evaluation:
    """Create an evaluation of ``candidate`` on every task of ``splits`` with
    ``k`` trials each, and enqueue its trials after commit.

    Precondition: the candidate is approved for evaluation (or certified,
    for a repeat or transfer evaluation).
    """
    experiment = candidate.experiment
    k = k or experiment.trials_per_task
    if k < 1:
        raise EvaluationError("k must be at least 1")
    unknown = set(splits) - set(experiment.split_digests)
    if not splits or unknown:
        raise EvaluationError(f"unknown or empty splits: {sorted(unknown) or '(none)'}")
    base_seed = int(experiment.run_settings.get("seed", 0)) if seed is None else seed
    base_seed += repeat

    with transaction.atomic():
        locked = Candidate.objects.select_for_update(no_key=True).get(pk=candidate.pk)
        if locked.state not in EVALUABLE_STATES:
            raise EvaluationError(f"candidate {locked.pk} is {locked.state}; it cannot be evaluated")
        memberships = (
            SplitMembership.objects.filter(experiment=experiment, split__in=splits)
            .select_related("task")
            .order_by("split", "task__external_id")
        )
        evaluation = Evaluation.objects.create(
            experiment=experiment,
            candidate=locked,
            run=run,
            purpose=purpose,
            repeat=repeat,
            splits=sorted(splits),
            k=k,
            seed=base_seed,
            # The evaluator as stored now (the one the trials will load), not
            # a copy the caller may hold from before a change.
            evaluator_digest=evaluator_config_digest(Evaluator.objects.get(experiments=experiment)),
        )
        lease = timezone.now() + timedelta(seconds=settings.RSI_TRIAL_LEASE_SECONDS)
        trials = [
            Trial(
                evaluation=evaluation,
                candidate=locked,
                task=membership.task,
                split=membership.split,
                index=index,
                seed=trial_seed(base_seed, membership.task.external_id, index),
                # For a pending trial the lease is the time after which the
                # reaper assumes its message was lost and sends it again.
                lease_expires_at=lease,
            )
            for membership in memberships
            for index in range(k)
        ]
        Trial.objects.bulk_create(trials)
        evaluation.trials_total = len(trials)
        evaluation.save(update_fields=["trials_total"])
        candidates_transition(
            candidates=Candidate.objects.filter(pk=locked.pk, state=Candidate.State.APPROVED),
            to=Candidate.State.EVALUATING,
        )
        trial_ids = list(Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True))
        _enqueue_trials(trial_ids)
    return evaluation


def trial_claim(*, trial_id: int, owner: str) -> Trial | None:
    """Claim a trial for ``owner``; None when someone else holds it or it is
    finished. Safe to call for a duplicate message. Raises TrialHeldBack
    when a limit on trials in flight is reached (the claim is undone).

    The limits hold across every worker process and host: a trial is
    claimed first, then, under a lock on the endpoint's row and the
    experiment's (on SQLite every writing transaction is serialized), the
    other trials in flight are counted and the claim is undone when they
    reach a limit. Two claims racing are counted in turn, each seeing the
    other's; the unlimited path costs no query more than before.
    """
    trial = _trial_claim(trial_id=trial_id, owner=owner)
    if trial is None:
        return None
    experiment = trial.evaluation.experiment
    if experiment.max_trials_in_flight is None and experiment.endpoint_id is None:
        return trial
    with transaction.atomic():
        full = _limit_reached(trial, experiment)
        if not full:
            return trial
        # Back to pending; the task sends the message again, and the lease keeps
        # the reaper from sending another meanwhile.
        lease = timezone.now() + timedelta(seconds=settings.RSI_TRIAL_LEASE_SECONDS)
        Trial.objects.filter(pk=trial.pk, state=Trial.State.RUNNING, lease_owner=owner, attempt=trial.attempt).update(
            state=Trial.State.PENDING, lease_owner="", attempt=F("attempt") - 1, started_at=None, lease_expires_at=lease
        )
    raise TrialHeldBack(f"trial {trial_id} held back: {full}")


def _limit_reached(trial: Trial, experiment: Experiment) -> str:
    """Which limit the other trials in flight reach, or "". Call in a transaction."""
    others = Trial.objects.filter(state=Trial.State.RUNNING, lease_expires_at__gt=timezone.now()).exclude(pk=trial.pk)
    # Always endpoint first, then experiment: one order, no deadlock.
    if experiment.endpoint_id is not None:
        limit = (
            ModelEndpoint.objects.select_for_update(no_key=True)
            .filter(pk=experiment.endpoint_id)
            .values_list("max_in_flight", flat=True)
        )
        endpoint_limit = next(iter(limit), None)
        calling = others.filter(evaluation__experiment__endpoint_id=experiment.endpoint_id)
        if endpoint_limit is not None and calling.count() >= endpoint_limit:
            return f"its model endpoint has {endpoint_limit} trial(s) in flight"
    if experiment.max_trials_in_flight is not None:
        list(Experiment.objects.select_for_update(no_key=True).filter(pk=experiment.pk).values_list("pk"))
        if others.filter(evaluation__experiment_id=experiment.pk).count() >= experiment.max_trials_in_flight:
            return f"its experiment has {experiment.max_trials_in_flight} trial(s) in flight"
    return ""


def _trial_claim(*, trial_id: int, owner: str) -> Trial | None:
    now = timezone.now()
    lease = now + timedelta(seconds=settings.RSI_TRIAL_LEASE_SECONDS)
    running, pending = Trial.State.RUNNING.value, Trial.State.PENDING.value
    claimed = _claim_update.execute(
        (running, owner, lease, now), (trial_id, pending, running, now, Evaluation.State.RUNNING.value)
    )
    if not claimed:
        return None
    return _claimed_trial.get(trial_id)


# Pending, or running with an expired lease, of a running evaluation. Every
# condition on the trial's own columns, none through a join: Django turns an
# update filtered across a relation into "id IN (SELECT ...)", and PostgreSQL
# then does not re-check the subquery against the row a concurrent claim just
# committed, so two duplicate messages could both claim one pending trial
# (seen in the trust suite's duplicate delivery). Written once
# (``PreparedUpdate``): Django building and compiling it took most of the
# claim's CPU, every trial.
_claim_update = PreparedUpdate(
    Trial,
    fields=("state", "lease_owner", "lease_expires_at", "started_at"),
    also="attempt = attempt + 1",
    where="id = %s AND (state = %s OR (state = %s AND lease_expires_at < %s)) "
    "AND evaluation_id IN (SELECT id FROM {evaluation} WHERE state = %s)",
    tables={"evaluation": Evaluation},
)


# What running and finishing a trial reads (``trial_spec``, ``trial_finish``): the
# claim's query compiles and reads a third of the columns of the whole rows, a
# large share of a thread-pool worker's own CPU a trial. Other fields load on use.
_CLAIMED_FIELDS = (
    "evaluation",
    "candidate",
    "task",
    "attempt",
    "seed",
    "index",
    "state",
    "lease_owner",
    "task__public_files",
    "task__instruction",
    "task__expected",
    "task__criteria",
    "candidate__tree",
    "evaluation__experiment",
    "evaluation__experiment__max_trials_in_flight",
    "evaluation__experiment__endpoint",
    "evaluation__experiment__evaluator",
    *(
        f"evaluation__experiment__evaluator__{name}"
        for name in (
            "files",
            "runner_argv",
            "verifier_argv",
            "env_allowlist",
            "timeout_seconds",
            "limits",
            "agent_network",
        )
    ),
)

# Compiled once per process and database (``evolution.prepared``): Django
# compiling this five-table query anew was most of its cost, every trial.
_claimed_trial = PreparedGet(
    lambda: Trial.objects.select_related("task", "evaluation__experiment__evaluator", "candidate").only(
        *_CLAIMED_FIELDS
    )
)


# Trees are content-addressed (a digest names exactly one content), so the
# files a worker read for one trial serve every later trial of the same
# candidate, evaluator or task without two queries each. Bounded, oldest out.
TREE_CACHE_BYTES = 32 << 20
TREE_CACHE_TREES = 256
_tree_cache: OrderedDict[str, tuple[list[FileEntry], int]] = OrderedDict()
_tree_cache_size = [0]
_tree_cache_lock = threading.Lock()


def tree_cache_clear() -> None:
    """Forget every tree this process has read (the next trial of each reads its files again)."""
    with _tree_cache_lock:
        _tree_cache.clear()
        _tree_cache_size[0] = 0


def _tree_materialize_cached(digest: str, dest: Path) -> None:
    """Write the tree ``digest`` into ``dest`` like ``tree_materialize``
    (entries re-validated by ``materialize`` on every write)."""
    materialize(_tree_entries_cached(digest), dest)


# The digest each thread is reading now, with a lock the reader holds:
# slots that start together need the same trees, and without it each read
# them (about 35 reads too many in a pass of 256 trials of one task set).
_tree_reads: dict[str, threading.Lock] = {}


def _tree_entries_cached(digest: str) -> list[FileEntry]:
    """The entries of the tree ``digest``, from this process's memory when
    it holds them; else read once, however many threads ask at once."""
    with _tree_cache_lock:
        cached = _tree_cache.get(digest)
        if cached is not None:
            _tree_cache.move_to_end(digest)
            return cached[0]
        reading = _tree_reads.get(digest)
        if reading is None:
            reading = _tree_reads[digest] = threading.Lock()
            reading.acquire()
            waiting = False
        else:
            waiting = True
    if waiting:
        # Another thread reads it: wait for its end and take what it kept (a
        # tree too large to keep, or a failed read, this thread reads itself).
        with reading:
            pass
        with _tree_cache_lock:
            cached = _tree_cache.get(digest)
            if cached is not None:
                return cached[0]
        return tree_entries(tree=Tree(digest=digest))
    try:
        entries = tree_entries(tree=Tree(digest=digest))
        size = sum(len(entry.data) for entry in entries)
        with _tree_cache_lock:
            if size <= TREE_CACHE_BYTES // 4 and digest not in _tree_cache:
                _tree_cache[digest] = (entries, size)
                _tree_cache_size[0] += size
                while _tree_cache_size[0] > TREE_CACHE_BYTES or len(_tree_cache) > TREE_CACHE_TREES:
                    _, (_dropped, dropped_size) = _tree_cache.popitem(last=False)
                    _tree_cache_size[0] -= dropped_size
    finally:
        with _tree_cache_lock:
            del _tree_reads[digest]
        reading.release()
    return entries


def trial_spec(trial: Trial, root: Path) -> TrialSpec:
    """What ``run_trial`` needs for ``trial``: its candidate's harness, its
    task's files and its evaluator's written under ``root`` (fresh folders,
    moved into the trial's sandbox), and how to run and check it. Loads
    through the relations ``trial`` holds (a claimed trial holds them all)."""
    evaluator = trial.evaluation.experiment.evaluator
    harness_dir = root / "harness"
    task_dir = root / "task"
    evaluator_dir = root / "evaluator"
    # Materialized for every trial (from the database, or from this process's
    # memory of the same content-addressed tree): no worker depends on a
    # shared disk, and nothing edited on disk between trials is ever used.
    _tree_materialize_cached(trial.candidate.tree_id, harness_dir)
    _tree_materialize_cached(evaluator.files_id, evaluator_dir)
    if trial.task.public_files_id:
        _tree_materialize_cached(trial.task.public_files_id, task_dir)
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / "instruction.md").write_text(trial.task.instruction)
    network = _task_network(trial.task)
    return TrialSpec(
        harness_dir=harness_dir,
        task_dir=task_dir,
        evaluator_dir=evaluator_dir,
        private={"expected": trial.task.expected, "criteria": trial.task.criteria},
        runner_argv=list(evaluator.runner_argv),
        verifier_argv=list(evaluator.verifier_argv),
        env_allowlist=list(evaluator.env_allowlist),
        extra_env={"RSI_SEED": str(trial.seed), "RSI_TRIAL_INDEX": str(trial.index)},
        timeout_seconds=min(evaluator.timeout_seconds, settings.RSI_TRIAL_TIMEOUT),
        limits=Limits.from_dict(evaluator.limits),
        seed=trial.seed,
        trial_index=trial.index,
        sandbox_mode=settings.RSI_SANDBOX,
        python=settings.RSI_PYTHON,
        # Fresh copies made for this trial alone: moved, not copied a second time.
        move_inputs=True,
        agent_network=evaluator.agent_network or network["agent"],
        verifier_network=network["verifier"],
        environment=_task_environment(trial.task),
        environments_dir=settings.RSI_ENVIRONMENTS_DIR,
        environment_bases_dir=settings.RSI_ENVIRONMENT_BASES_DIR,
    )


def _task_network(task: Task) -> dict[str, bool]:
    """Whether the task lets its agent and its verifier use the network
    (Harbor's ``allow_internet``, read at import into the private expected
    data, so it is part of the task's digest); off when it does not say."""
    expected = task.expected
    network = expected.get("network") if isinstance(expected, dict) else None
    network = network if isinstance(network, dict) else {}
    return {phase: network.get(phase) is True for phase in ("agent", "verifier")}


def _task_environment(task: Task) -> dict[str, Any] | None:
    """The recipe of the environment ``task`` runs in (imported from its
    Dockerfile: evolution/environments.py), None for the host's system."""
    expected = task.expected
    recipe = expected.get("environment") if isinstance(expected, dict) else None
    return recipe if isinstance(recipe, dict) else None


def lease_renew(*, trial: Trial, owner: str) -> bool:
    """Push the lease of a trial ``owner`` still holds forward; False when
    the claim was lost (taken over, cancelled or finished)."""
    lease = timezone.now() + timedelta(seconds=settings.RSI_TRIAL_LEASE_SECONDS)
    return bool(
        Trial.objects.filter(pk=trial.pk, state=Trial.State.RUNNING, lease_owner=owner, attempt=trial.attempt).update(
            lease_expires_at=lease
        )
    )


class _LeaseRenewals:
    """The leases a process holds, renewed by one thread.

    One thread for every trial of a thread-pool worker instead of one a
    trial: a new thread waits for the GIL before it can say it has started
    and again to be joined (4.4 and 2.4 ms a trial among 64 busy slots,
    in the git history of docs/performance.md). The thread gives its database
    connection back after each round of renewals, so a worker whose trials
    run longer than a third of the lease does not keep one connection open
    a trial while its agents wait. A renewal that hangs delays the others
    by as long; the lease is three renewals long.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # In a forked child the parent's thread does not exist, and the lock
        # may have been taken by it at the fork: start over.
        self._changed = threading.Condition()
        self._due: dict[object, tuple[Trial, str, float]] = {}
        self._thread: threading.Thread | None = None
        # When the thread will next look, if it waits (None: until told).
        self._wake_at: float | None = None

    def hold(self, trial: Trial, owner: str) -> object:
        """Renew ``trial``'s lease for ``owner`` every third of its length
        from now until ``release``; returns what to release."""
        token = object()
        due = time.monotonic() + _renewal_interval()
        with self._changed:
            self._due[token] = (trial, owner, due)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-renewals", daemon=True)
                self._thread.start()
            elif self._wake_at is None or due < self._wake_at:
                self._changed.notify()
        return token

    def release(self, token: object) -> None:
        with self._changed:
            self._due.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                now = time.monotonic()
                due = [(token, trial, owner) for token, (trial, owner, at) in self._due.items() if at <= now]
                if not due:
                    self._wake_at = min((at for _trial, _owner, at in self._due.values()), default=None)
                    self._changed.wait(None if self._wake_at is None else self._wake_at - now)
                    self._wake_at = now  # awake: a new lease is seen at the next look
                    continue
            for token, trial, owner in due:
                try:
                    kept = lease_renew(trial=trial, owner=owner)
                except Exception:
                    # The database restarting, say: a missed renewal only risks
                    # a duplicate attempt, which is safe, so keep renewing on a
                    # new connection rather than give the claim up for good.
                    logger.warning("trial %s: lease renewal failed; retrying", trial.pk, exc_info=True)
                    _connection_dropped()
                    kept = True
                with self._changed:
                    if token not in self._due:
                        continue  # released meanwhile
                    if kept:
                        self._due[token] = (trial, owner, time.monotonic() + _renewal_interval())
                    else:
                        del self._due[token]  # the claim was lost: nothing left to renew
            _connection_dropped()


def _renewal_interval() -> float:
    return max(0.2, settings.RSI_TRIAL_LEASE_SECONDS / 3)


def _connection_dropped() -> None:
    """Close this thread's connection, whatever state it is in: the renewals
    go on with a new one."""
    try:
        connection.close()
    except Exception:
        logger.warning("lease renewals: closing the database connection failed", exc_info=True)


_lease_renewals = _LeaseRenewals()


@contextmanager
def _lease_heartbeat(trial: Trial, owner: str) -> Iterator[None]:
    """Renew the trial's lease every third of its length while its worker holds it.

    The lease says "a live worker holds this"; a trial that runs longer than
    the lease (a slow agent, a loaded machine) must not be taken over while
    its worker is alive, or every attempt is stolen before it finishes. Only
    a worker that died stops renewing, and the reaper then sends the trial
    again. Inside a caller's transaction (tests, in-process drivers) the
    caller already holds the row, and a second connection would only wait
    for it, so no renewal runs there.
    """
    # is_in_memory_db exists on the SQLite backend alone, which the vendor test guards.
    in_memory = connection.vendor == "sqlite" and connection.is_in_memory_db()  # type: ignore[attr-defined]
    if connection.in_atomic_block or in_memory:
        yield
        return
    token = _lease_renewals.hold(trial, owner)
    try:
        yield
    finally:
        _lease_renewals.release(token)


def trial_execute(*, trial_id: int, owner: str | None = None) -> bool:
    """Claim, run and finish one trial. Returns False when there was nothing
    to do (finished already, or claimed by someone else)."""
    owner = owner or worker_identity()
    trial = trial_claim(trial_id=trial_id, owner=owner)
    if trial is None:
        return False
    in_pool_thread = threading.current_thread() is not threading.main_thread()
    # Renewed from the claim to the finish, not only while the agent runs:
    # writing the inputs out and storing the result also take time, and on a
    # loaded machine a lease that lapsed there lets a duplicate message take
    # a live worker's trial over, and the next one take it back.
    with _lease_heartbeat(trial, owner):
        if trial.attempt > MAX_ATTEMPTS:
            result = _infra_error(f"gave up after {MAX_ATTEMPTS} attempts (worker lost each time)")
            return trial_finish(trial=trial, owner=owner, result=result)
        settings.RSI_WORK_DIR.mkdir(mode=0o711, parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"trial-{trial.pk}-", dir=settings.RSI_WORK_DIR))
        # Traversable (not listable) so an unprivileged trial user reaches its workspace.
        root.chmod(0o711)
        try:
            spec = trial_spec(trial, root / "inputs")
            if in_pool_thread and not connection.in_atomic_block:
                # A thread-pool slot gives its database connection back while
                # its agent runs (seconds to minutes): dozens of waiting trials
                # per host would otherwise hold dozens of idle connections.
                connection.close()
            with ramp.started():
                result = run_trial(spec, work_root=root)
            faults.checkpoint("trial:finished")
        except Exception as exc:  # the trial must end in a state, never vanish
            logger.exception("trial %s: infrastructure failure", trial.pk)
            result = _infra_error(f"{type(exc).__name__}: {exc}")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        finished = trial_finish(trial=trial, owner=owner, result=result)
    held_back_wake(trial=trial)
    return finished


def held_back_wake(*, trial: Trial) -> int | None:
    """After a trial under a limit on trials in flight ends, send a message for one trial that the limit held
    back, so the freed slot is taken at once, not when that trial's backed-off message comes round (up to
    HELD_BACK_MAX_SECONDS later: the endpoint sat idle meanwhile, ``bench llm``). Returns its id, or None when
    nothing waits or the experiment has no limit (then it costs no query). Safe to repeat: a claim takes a
    pending trial once, and its own delayed message later finds it claimed or finished."""
    experiment = trial.evaluation.experiment
    if experiment.max_trials_in_flight is None and experiment.endpoint_id is None:
        return None
    # Held back: pending, with the lease the hold set so that the reaper does not send it too.
    waiting = Trial.objects.filter(
        state=Trial.State.PENDING, lease_expires_at__gt=timezone.now(), evaluation__state=Evaluation.State.RUNNING
    )
    if experiment.endpoint_id is not None:
        waiting = waiting.filter(evaluation__experiment__endpoint_id=experiment.endpoint_id)
    else:
        waiting = waiting.filter(evaluation__experiment_id=experiment.pk)
    next_id = waiting.order_by("pk").values_list("pk", flat=True).first()
    if next_id is not None:
        _enqueue_trials([next_id])
    return next_id


def trial_execute_in_process(*, trial_id: int, owner: str | None = None) -> bool:
    """``trial_execute`` for a driver that runs trials one after the other in
    its own process (inline runs, parity, comparisons, ``evaluate`` without
    workers): a trial held back by a limit (workers elsewhere hold the
    endpoint's slots) is tried again after a wait instead of failing the
    driver."""
    wait = settings.RSI_TRIAL_DEFER_SECONDS
    while True:
        try:
            return trial_execute(trial_id=trial_id, owner=owner)
        except TrialHeldBack:
            time.sleep(wait)
            wait = min(30.0, wait * 1.5)


def _store_trajectory(trial: Trial, document: dict[str, Any]) -> None:
    # The one writer of trajectories (redacts secrets, replaces any previous one).
    trajectory_store(trial=trial, document=document)


def trial_finish(*, trial: Trial, owner: str, result: TrialResult) -> bool:
    """Record a trial's result if ``owner`` still holds the claim, advance the
    evaluation's counter, and enqueue certification when it was the last."""
    now = timezone.now()
    state = Trial.State.ERROR if result.outcome == Trial.Outcome.ERROR else Trial.State.DONE
    with transaction.atomic():
        updated = _finish_update.execute(
            (
                state,
                result.outcome,
                result.score,
                result.criteria_results,
                result.tokens,
                result.steps,
                result.wall_time,
                result.valid_output,
                result.submitted,
                result.error_kind,
                result.error[:10000],
                result.sandbox_profile,
                result.environment,
                now,
                None,
            ),
            (trial.pk, Trial.State.RUNNING.value, owner, trial.attempt),
        )
        if not updated:
            logger.warning("trial %s: claim by %s was lost; result discarded", trial.pk, owner)
            return False
        if result.trajectory:
            _store_trajectory(trial, result.trajectory)
        # Last: every finishing trial of the evaluation updates its row, which
        # stays locked from here to the commit.
        if _evaluation_advance(evaluation_id=trial.evaluation_id, now=now):
            # Locked so that two evaluations of one candidate finishing at once
            # cannot both see the other still running.
            Candidate.objects.select_for_update(no_key=True).filter(pk=trial.candidate_id).first()
            if not Evaluation.objects.filter(candidate_id=trial.candidate_id, state=Evaluation.State.RUNNING).exists():
                candidates_transition(
                    candidates=Candidate.objects.filter(pk=trial.candidate_id), to=Candidate.State.EVALUATED
                )
            evaluation_id = trial.evaluation_id
            dispatch.certify_after_commit(evaluation_id)
    return True


# The finish, if ``owner`` still holds the claim (written once, as the claim is).
_SCORED = ("outcome", "score", "criteria_results", "tokens", "steps", "wall_time", "valid_output", "submitted")
_finish_update = PreparedUpdate(
    Trial,
    # In the order trial_finish passes their values.
    fields=(
        "state",
        *_SCORED,
        "error_kind",
        "error",
        "sandbox_profile",
        "environment",
        "finished_at",
        "lease_expires_at",
    ),
    where="id = %s AND state = %s AND lease_owner = %s AND attempt = %s",
)


def _evaluation_advance(*, evaluation_id: int, now: datetime) -> bool:
    """Count one more finished trial of an evaluation; True when it was the last and the evaluation, still
    running, is now complete. Call in the transaction that records the trial.

    Dozens of trial slots finish trials of one evaluation at once, each waiting
    for the row until the one before commits: on PostgreSQL the count, the
    completion and the answer are one statement, so the row is held for one
    round trip and the commit, not for two and the Python between them."""
    if connection.vendor != "postgresql":
        Evaluation.objects.filter(pk=evaluation_id).update(trials_finished=F("trials_finished") + 1)
        return bool(
            Evaluation.objects.filter(
                pk=evaluation_id, state=Evaluation.State.RUNNING, trials_finished__gte=F("trials_total")
            ).update(state=Evaluation.State.COMPLETE, finished_at=now)
        )
    table = connection.ops.quote_name(Evaluation._meta.db_table)
    # SET and WHERE read the row as it was; "old" (locked first, so it is the
    # row the update changes) says whether this update completed it.
    last = "e.state = %s AND e.trials_finished + 1 >= e.trials_total"
    sql = f"""
        WITH old AS (SELECT id, state FROM {table} WHERE id = %s FOR NO KEY UPDATE)
        UPDATE {table} e SET trials_finished = e.trials_finished + 1,
            state = CASE WHEN {last} THEN %s ELSE e.state END,
            finished_at = CASE WHEN {last} THEN %s ELSE e.finished_at END
        FROM old WHERE e.id = old.id
        RETURNING old.state = %s AND e.state = %s
    """
    running, complete = Evaluation.State.RUNNING.value, Evaluation.State.COMPLETE.value
    with statement_cursor(connection) as cursor:
        cursor.execute(sql, (evaluation_id, running, complete, running, now, running, complete))
        row = cursor.fetchone()
    return bool(row and row[0])


def lease_reap(*, now: Any = None, enqueue_trial: Callable[[int], None] | None = None) -> dict[str, int]:
    """Send again whatever was lost: pending trials whose message never
    arrived, running trials whose worker died (expired lease), and complete
    evaluations that were never certified. Safe to run at any time, from any
    number of processes: every action it triggers is itself idempotent."""
    now = now or timezone.now()
    lease = timedelta(seconds=settings.RSI_TRIAL_LEASE_SECONDS)
    expired = Q(lease_expires_at__lt=now) & (Q(state=Trial.State.PENDING) | Q(state=Trial.State.RUNNING))
    trial_ids = list(
        Trial.objects.filter(expired, evaluation__state=Evaluation.State.RUNNING).values_list("pk", flat=True)[:1000]
    )
    # Push pending leases forward so the next pass does not send them again at once.
    Trial.objects.filter(pk__in=trial_ids, state=Trial.State.PENDING).update(lease_expires_at=now + lease)
    send = enqueue_trial or (lambda trial_id: _enqueue_trials([trial_id]))
    for trial_id in trial_ids:
        send(trial_id)
    stale = now - lease
    evaluation_ids = list(
        Evaluation.objects.filter(state=Evaluation.State.COMPLETE, finished_at__lt=stale).values_list("pk", flat=True)
    )
    for evaluation_id in evaluation_ids:
        dispatch.certify_after_commit(evaluation_id)
    return {"trials": len(trial_ids), "evaluations": len(evaluation_ids)}
