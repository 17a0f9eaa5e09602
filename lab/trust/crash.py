"""Scenarios 1-6: interruptions, injected for real.

Each trial runs on a fresh twin experiment with real worker processes. The
platform passes when, after the fault and a recovery through the product's
own means (a replacement worker, the reaper, reconnection), the canonical
digest of the certified records equals that of an uninterrupted control on
the same benchmark, nothing half-made is eligible as a parent, and the chain
verifies.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from evolution import faults
from evolution.models import Evaluation, Experiment, Run, Trial
from lab.processes import REPO_ROOT, PrivateRedis, process_argv, process_state
from lab.records import record_contents, records_difference, records_digest
from lab.trust import Inapplicable, TrialContext, TrustFailure, expect, scenario
from lab.trust.context import Suite, no_half_made_parent

FAULT_TIMEOUT = 120.0


def _same_as_control(ctx: TrialContext, key: str) -> str:
    no_half_made_parent(ctx.experiment)
    got, want = records_digest(ctx.experiment), _suite(ctx).control_digest(ctx.benchmark, key)
    if got != want:
        control = _suite(ctx)._control_experiments[(ctx.benchmark, key)]
        raise TrustFailure(
            f"records differ from the uninterrupted control ({got[:12]} != {want[:12]}): "
            + records_difference(control, ctx.experiment)
        )
    return f"{len(record_contents(ctx.experiment))} records equal the control's"


def _suite(ctx: TrialContext) -> Suite:
    """The suite running ``ctx``'s trial: these scenarios need its workers and brokers."""
    if ctx.suite is None:
        raise TrustFailure("this scenario needs the suite's workers (run it with manage.py trust_suite)")
    return ctx.suite


def _work(ctx: TrialContext, key: str) -> Run | Evaluation:
    return _suite(ctx).run_start(ctx.experiment) if key == "loop" else _suite(ctx).evaluation_start(ctx.experiment)


def _wait(ctx: TrialContext, work: Run | Evaluation) -> None:
    if isinstance(work, Run):
        _suite(ctx).wait_run(work)
    else:
        _suite(ctx).wait_evaluation(work)


def _kill_at(ctx: TrialContext, *, key: str, point: str, skip: int) -> str:
    """Block a worker at ``point`` (after ``skip`` hits), SIGKILL it there,
    check the half-done state, recover with a fresh worker, compare."""
    _suite(ctx).control_digest(ctx.benchmark, key)
    marker = ctx.workdir / "fault"
    standby = _suite(ctx).start_worker(hold=True)
    faulty = _suite(ctx).start_worker(extra_env=_suite(ctx).fault_env(point, marker, skip=skip))
    work = _work(ctx, key)
    _suite(ctx).wait_until(marker.exists, FAULT_TIMEOUT, f"the fault point {point} (skip {skip})")
    faulty.kill()
    # The interrupted state itself must be safe: nothing half-made is a parent.
    no_half_made_parent(ctx.experiment)
    standby.release()
    _wait(ctx, work)
    return f"killed at {point} #{skip + 1}; " + _same_as_control(ctx, key)


@scenario(1, "1-crash-propose", "SIGKILL of the worker inside a proposal slot's transaction", needs_worker=True)
def crash_propose(ctx: TrialContext) -> str:
    return _kill_at(ctx, key="loop", point="propose:slot", skip=ctx.trial % 2)


@scenario(
    2, "2a-crash-eval-child", "SIGKILL of the worker after a trial ran, before its result is stored", needs_worker=True
)
def crash_eval_child(ctx: TrialContext) -> str:
    return _kill_at(ctx, key="evaluation", point="trial:finished", skip=ctx.trial % 3)


RECEIVED = re.compile(r"Task [\w.]+\[([0-9a-f-]+)\] received")
KILLED_AGENT_KINDS = {Trial.ErrorKind.AGENT_CRASH, Trial.ErrorKind.INFRA, Trial.ErrorKind.SANDBOX}
TRIAL_ROOT = re.compile(r"/trial-(\d+)-")


def _held_agent(pids: list[int]) -> tuple[int, int] | None:
    """(pid, trial id) of a sandboxed agent held stopped at ``agent:start``."""
    for pid in pids:
        argv = process_argv(pid)
        if faults.HOLD_NAME not in argv or "--harness" not in argv or process_state(pid) != "T":
            continue
        match = TRIAL_ROOT.search(" ".join(argv))
        if match:
            return pid, int(match.group(1))
    return None


@scenario(2, "2b-crash-eval-sandbox", "SIGKILL of the sandboxed agent process mid-trial", needs_worker=True)
def crash_eval_sandbox(ctx: TrialContext) -> str:
    control = _suite(ctx).control_experiment(ctx.benchmark, "evaluation")
    marker = ctx.workdir / "fault"
    # The worker holds one agent (a different one per trial) stopped in its
    # sandbox, just before it execs, until the suite kills it: no race with
    # an agent that finishes first, however loaded the machine.
    worker = _suite(ctx).start_worker(extra_env=_suite(ctx).fault_env("agent:start", marker, skip=ctx.trial % 3))
    evaluation = _suite(ctx).evaluation_start(ctx.experiment)
    _suite(ctx).wait_until(marker.exists, FAULT_TIMEOUT, "the worker to hold an agent (agent:start)")
    held: list[tuple[int, int]] = []

    def found() -> bool:
        agent = _held_agent(worker.child_pids())
        if agent is not None:
            held.append(agent)
        return agent is not None

    _suite(ctx).wait_until(found, FAULT_TIMEOUT, "the held agent's stopped process under the worker", interval=0.05)
    killed = held[0]
    os.kill(killed[0], signal.SIGKILL)
    _suite(ctx).wait_evaluation(evaluation)
    trial = Trial.objects.select_related("task").get(pk=killed[1])
    expect(trial.evaluation_id == evaluation.pk, f"the killed agent ran trial {trial.pk} of another evaluation")
    expect(trial.outcome != Trial.Outcome.PASS, f"trial {trial.pk} whose agent was SIGKILLed was scored a pass")
    # Seen from the worker, an agent killed from outside is an agent crash or,
    # under bubblewrap (which then reports no exit status), a sandbox failure:
    # either way an error outside the harness's score, never a result.
    expect(
        trial.state == Trial.State.ERROR and trial.error_kind in KILLED_AGENT_KINDS,
        f"trial {trial.pk} ended {trial.state}/{trial.error_kind!r}, not as an error of the agent's run",
    )
    expect(worker.alive(), "the worker died with its agent")
    no_half_made_parent(ctx.experiment)
    # Every other trial is exactly the control's; the killed one is an error.
    mine = _rows(ctx.experiment)
    theirs = _rows(control)
    key = (trial.split, trial.task.external_id, trial.index)
    expect(key in mine and key in theirs, f"trial {key} missing from the records")
    mine.pop(key)
    theirs.pop(key)
    expect(mine == theirs, "trials other than the killed one differ from the control's")
    return (
        f"agent of trial {trial.task.external_id}#{trial.index} killed: {trial.error_kind}, the rest equal the control"
    )


def _rows(experiment: Experiment) -> dict[tuple[str, str, int], dict[str, Any]]:
    from evolution.models import CertifiedResult

    rows = {}
    for payload in CertifiedResult.objects.filter(experiment=experiment).values_list("payload", flat=True):
        for row in payload["trials"]:
            rows[(row["split"], row["task"], row["index"])] = row
    return rows


@scenario(2, "2c-broker-drop", "the broker drops every connection mid-evaluation", needs_worker=True)
def broker_drop(ctx: TrialContext) -> str:
    _suite(ctx).control_digest(ctx.benchmark, "evaluation")
    server = _private_redis(ctx)
    import redis

    client = redis.Redis.from_url(server.url)
    with _suite(ctx).broker(server.url):
        _suite(ctx).start_worker()
        evaluation = _suite(ctx).evaluation_start(ctx.experiment)
        _suite(ctx).wait_until(
            lambda: (
                Trial.objects.filter(evaluation=evaluation, state=Trial.State.RUNNING).exists()
                or Trial.objects.filter(evaluation=evaluation).exclude(state=Trial.State.PENDING).exists()
            ),
            FAULT_TIMEOUT,
            "a trial to start",
            interval=0.02,
        )
        dropped = 0
        # Every connection but this one: the worker's consumer, its beat and its publishers.
        for info in client.client_list():
            with contextlib.suppress(redis.ResponseError):
                dropped += client.client_kill_filter(_id=info["id"], skipme=True)
        _suite(ctx).wait_evaluation(evaluation)
    expect(dropped > 0, "no broker connection was dropped: the fault was not injected")
    return f"{dropped} connection(s) dropped; " + _same_as_control(ctx, "evaluation")


def _private_redis(ctx: TrialContext) -> PrivateRedis:
    try:
        return _suite(ctx).private_redis()
    except FileNotFoundError as exc:
        raise Inapplicable(f"{exc}: cannot run a private broker to disturb") from None


@scenario(
    3, "3-crash-certify", "SIGKILL of the worker inside certification (record written, chain not)", needs_worker=True
)
def crash_certify(ctx: TrialContext) -> str:
    # Alternate the two points inside the one certification transaction:
    # after the record row, before the chain head; and after everything, before commit.
    point = "certify:after_record" if ctx.trial % 2 == 0 else "certify:before_commit"
    return _kill_at(ctx, key="loop", point=point, skip=(ctx.trial // 2) % 3)


@scenario(4, "4-duplicate-delivery", "every task message delivered twice", needs_worker=True)
def duplicate_delivery(ctx: TrialContext) -> str:
    from lab.trust.worker import duplicate_publish
    from rsiweb.celery import app

    _suite(ctx).control_digest(ctx.benchmark, "loop")
    env = {"RSI_FAULT_DUPLICATE_PUBLISH": "1"}
    first = _suite(ctx).start_worker(extra_env=env, hold=True)
    _suite(ctx).start_worker(extra_env=env)
    first.release()
    undo = duplicate_publish(app)
    try:
        run = _suite(ctx).run_start(ctx.experiment)
    finally:
        undo()
    _suite(ctx).wait_run(run)
    # Proof the duplicates were delivered: task ids the workers received twice.
    received = Counter(RECEIVED.findall("".join(worker.log() for worker in _suite(ctx).workers)))
    twice = sum(1 for count in received.values() if count >= 2)
    expect(twice > 0, "no task message was delivered twice: the fault was not injected")
    return f"{twice} of {len(received)} messages delivered twice; " + _same_as_control(ctx, "loop")


@scenario(5, "5-lost-publish", "the web process dies after commit, before its message is sent", needs_worker=True)
def lost_publish(ctx: TrialContext) -> str:
    key = "loop" if ctx.trial % 2 == 0 else "evaluation"
    _suite(ctx).control_digest(ctx.benchmark, key)
    point = "publish:run_advance" if key == "loop" else "publish:trials"
    marker = ctx.workdir / "fault"
    env = _suite(ctx).worker_env(_suite(ctx).fault_env(point, marker))
    standby = _suite(ctx).start_worker(hold=True)
    web = subprocess.Popen(
        [sys.executable, "-m", "lab.trust.web_process", key, str(ctx.experiment.pk)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _suite(ctx).wait_until(
            lambda: marker.exists() or web.poll() is not None, FAULT_TIMEOUT, f"the web process at {point}"
        )
        if not marker.exists():
            output = web.stdout.read().decode(errors="replace") if web.stdout else ""
            raise TrustFailure(f"the web process exited {web.returncode} before {point}:\n{output[-1500:]}")
    finally:
        if web.poll() is None:
            os.killpg(web.pid, signal.SIGKILL)
        web.wait(timeout=20)
    # The work was committed, and its message never sent.
    if key == "loop":
        work: Run | Evaluation = Run.objects.get(experiment=ctx.experiment)
    else:
        work = Evaluation.objects.get(experiment=ctx.experiment)
    standby.release()
    _wait(ctx, work)
    return f"{key} committed, publish lost; " + _same_as_control(ctx, key)


@scenario(6, "6-broker-restart", "the broker is killed and restarted (empty) in the middle of a run", needs_worker=True)
def broker_restart(ctx: TrialContext) -> str:
    _suite(ctx).control_digest(ctx.benchmark, "loop")
    server = _private_redis(ctx)
    with _suite(ctx).broker(server.url):
        _suite(ctx).start_worker()
        run = _suite(ctx).run_start(ctx.experiment)
        _suite(ctx).wait_until(
            lambda: Evaluation.objects.filter(run=run, state=Evaluation.State.CERTIFIED).count() >= 1 + ctx.trial % 2,
            FAULT_TIMEOUT,
            "the run to be under way",
            interval=0.05,
        )
        server.stop(kill=True)
        time.sleep(1.0)
        server.start()
        # A deployment runs its workers under a supervisor that starts a worker
        # again when it exits (systemd Restart=always); so does this scenario,
        # and it says when that was needed.
        restarts: list[str] = []

        def finished_supervised() -> bool:
            if not any(worker.alive() for worker in _suite(ctx).workers):
                reason = next(
                    (
                        line.split("] ", 1)[-1]
                        for w in _suite(ctx).workers
                        for line in w.log().splitlines()
                        if "Unrecoverable error" in line
                    ),
                    "exited",
                )
                restarts.append(reason[:160])
                _suite(ctx).start_worker()
            run.refresh_from_db()
            return run.status in {Run.Status.FINISHED, Run.Status.FAILED, Run.Status.CANCELLED}

        _suite(ctx).wait_until(finished_supervised, FAULT_TIMEOUT, f"run {run.pk} to finish after the broker restart")
        _suite(ctx).wait_run(run)
    note = f"worker exited on the restart and was started again ({restarts[0]}); " if restarts else ""
    return "broker killed and restarted mid-run; " + note + _same_as_control(ctx, "loop")


# The database restart runs a whole inner suite against a private cluster, so
# that the cluster can be stopped without touching the suite's own database.
INNER_PG = "RSI_TRUST_PRIVATE_PG"


@scenario(
    6, "6-db-restart", "PostgreSQL stopped immediately and started in the middle of an evaluation", needs_worker=True
)
def db_restart(ctx: TrialContext) -> str:
    from django.db import connection

    if connection.vendor != "postgresql":
        raise Inapplicable("the suite runs on SQLite; restarting PostgreSQL needs DATABASE_URL=postgres://")
    try:
        cluster = _suite(ctx).private_postgres()
    except FileNotFoundError as exc:
        raise Inapplicable(f"cannot run a private PostgreSQL cluster: {exc}") from None
    except subprocess.SubprocessError as exc:
        raise TrustFailure(f"the private PostgreSQL cluster did not start: {exc}") from None
    env = dict(os.environ)
    env.update(
        DATABASE_URL=cluster.url,
        CELERY_BROKER_URL=_suite(ctx).broker_url,
        **{
            INNER_PG: json.dumps(
                {
                    "bin": str(cluster.bin),
                    "data": str(cluster.data),
                    "folder": str(cluster.folder),
                    "port": cluster.port,
                }
            )
        },
    )
    env.pop("RSI_BROKER_DIR", None)
    argv = [sys.executable, "manage.py", "trust_suite", "-v", "2", "--trials", "1", "--scenario", "6-db-restart-inner"]
    inner = subprocess.Popen(
        [*argv, "--benchmark", ctx.benchmark],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = inner.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        inner.send_signal(signal.SIGTERM)
        output, _ = inner.communicate(timeout=60)
    text = output.decode(errors="replace")
    lines = text.strip().splitlines()
    expect(inner.returncode == 0 and bool(lines) and lines[-1] == "1 passed, 0 failed", f"inner suite:\n{text[-2000:]}")
    detail = next((line for line in lines if line.strip().startswith("trial 1: passed:")), "")
    return (
        "private PostgreSQL stopped (immediate) and started mid-evaluation; " + detail.split("passed:", 1)[-1].strip()
    )


if os.environ.get(INNER_PG):

    @scenario(6, "6-db-restart-inner", "(run by 6-db-restart against its private cluster)", needs_worker=True)
    def db_restart_inner(ctx: TrialContext) -> str:
        from django.db import connection

        from lab.processes import PrivatePostgres

        facts = json.loads(os.environ[INNER_PG])
        cluster = PrivatePostgres.__new__(PrivatePostgres)
        cluster.bin, cluster.data, cluster.folder = Path(facts["bin"]), Path(facts["data"]), Path(facts["folder"])
        cluster.port = facts["port"]
        _suite(ctx).control_digest(ctx.benchmark, "evaluation")
        _suite(ctx).start_worker()
        evaluation = _suite(ctx).evaluation_start(ctx.experiment)
        _suite(ctx).wait_until(
            lambda: Trial.objects.filter(
                evaluation=evaluation, state__in=[Trial.State.DONE, Trial.State.ERROR]
            ).exists(),
            FAULT_TIMEOUT,
            "a first trial to finish",
            interval=0.05,
        )
        connection.close()
        cluster.stop("immediate")
        time.sleep(1.0)
        cluster.start()
        connection.close()
        _suite(ctx).wait_evaluation(evaluation)
        retried = Trial.objects.filter(evaluation=evaluation, attempt__gt=1).count()
        return f"{retried} trial(s) run again; " + _same_as_control(ctx, "evaluation")
