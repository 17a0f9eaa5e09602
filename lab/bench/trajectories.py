"""Trajectory import: ATIF files posted to the API in batches versus parsing
them with ``json`` and storing the same rows with the database's own bulk
path.

The files are built from the real ATIF fixtures (the OpenHands hello-world
trajectory, whose steps are repeated and renumbered up to the size wanted)
and posted to ``POST /api/v1/trials/<id>/trajectory/`` with an operator's
token through the whole Django stack: authentication, permissions,
validation, conversion, redaction, storage, one file a request (printed);
then to other trials in batches (``POST /api/v1/trajectories/``), which the
verdict is on.

The baseline is ``json.loads`` of the files plus writing the rows the
batches stored (read back from the database, one trajectory row and its step
rows a file) into two scratch tables identical to the trajectory and step
tables (columns, indexes, unique and check constraints, foreign keys), one
transaction a batch: a raw ``COPY`` a table on PostgreSQL; on SQLite, which
has no ``COPY``, one ``executemany`` ``INSERT`` a table, its fastest bulk path.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, models, transaction
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from evolution import selectors
from evolution.models import Evaluation, Experiment, SplitMembership, Trajectory, TrajectoryStep, Trial
from lab.bench import BenchResult, benchmark, stopwatch
from lab.bench.orchestration import SPLITS, with_bench_experiment

FIXTURE = "hello-world.trajectory.json"


def fixture_path() -> Path:
    """The real ATIF fixture kept with the tests (tests/fixtures/atif)."""
    return Path(settings.BASE_DIR) / "tests" / "fixtures" / "atif" / FIXTURE


def atif_document(*, steps: int, number: int) -> dict[str, Any]:
    """The fixture with its steps after the system prompt repeated until
    there are ``steps``, renumbered; ``number`` makes each file distinct."""
    base = json.loads(fixture_path().read_text())
    head, cycle = base["steps"][:1], base["steps"][1:]
    out = copy.deepcopy(head)
    while len(out) < steps:
        step = copy.deepcopy(cycle[(len(out) - 1) % len(cycle)])
        if isinstance(step.get("message"), str):
            step["message"] = f"{step['message']} [file {number}, step {len(out) + 1}]"
        out.append(step)
    for position, step in enumerate(out, start=1):
        step["step_id"] = position
    document = dict(base)
    document["session_id"] = f"bench-{number}"
    document["steps"] = out[:steps]
    return document


def finished_trials(experiment: Experiment, *, count: int) -> list[int]:
    """``count`` finished trials of the seed (one evaluation), ids in order."""
    memberships = list(SplitMembership.objects.filter(experiment=experiment).select_related("task"))
    evaluation = Evaluation.objects.create(
        experiment=experiment,
        candidate=selectors.experiment_seed(experiment),
        purpose=Evaluation.Purpose.BASELINE,
        splits=SPLITS,
        k=max(1, -(-count // len(memberships))),
        seed=11,
        state=Evaluation.State.COMPLETE,
        trials_total=count,
        trials_finished=count,
    )
    Trial.objects.bulk_create(
        Trial(
            evaluation=evaluation,
            candidate=experiment.seed_candidate,
            task=memberships[number % len(memberships)].task,
            split=memberships[number % len(memberships)].split,
            index=number // len(memberships),
            seed=number,
            state=Trial.State.DONE,
            outcome=Trial.Outcome.FAIL,
            score=0.0,
            tokens=300,
            steps=1,
            valid_output=True,
            submitted=True,
        )
        for number in range(count)
    )
    return list(Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True))


@contextmanager
def scratch_tables() -> Iterator[tuple[str, str]]:
    """Two new tables identical to the trajectory and step tables (the steps'
    foreign key pointing at the first), dropped on the way out. Yields their
    names (trajectories, steps)."""
    tag = uuid.uuid4().hex[:8]
    trajectories, steps = f"bench_scratch_trajectory_{tag}", f"bench_scratch_trajectorystep_{tag}"
    renames = {Trajectory._meta.db_table: trajectories, TrajectoryStep._meta.db_table: steps}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            for source, target in renames.items():
                cursor.execute(f"CREATE TABLE {target} (LIKE {source} INCLUDING ALL)")
            for source, target in renames.items():
                # LIKE copies everything but the foreign keys: the same definitions, pointed at the copies.
                cursor.execute(
                    "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = %s::regclass "
                    "AND contype = 'f' ORDER BY conname",
                    [source],
                )
                for (definition,) in cursor.fetchall():
                    definition = definition.replace(
                        f"REFERENCES {Trajectory._meta.db_table}(", f"REFERENCES {trajectories}("
                    )
                    cursor.execute(f"ALTER TABLE {target} ADD {definition}")
        else:
            # SQLite keeps each table's and index's DDL: the same, renamed.
            cursor.execute(
                "SELECT sql FROM sqlite_master WHERE tbl_name IN (%s, %s) AND sql IS NOT NULL "
                "ORDER BY type = 'index', name",
                list(renames),
            )
            statements = [row[0] for row in cursor.fetchall()]
            for statement in statements:
                # The longer name first: the step table's name starts with the trajectory table's.
                statement = statement.replace(TrajectoryStep._meta.db_table, steps)
                statement = statement.replace(Trajectory._meta.db_table, trajectories)
                cursor.execute(statement)
    try:
        yield trajectories, steps
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql" and connection.in_atomic_block:
                # Inside a caller's transaction (a test's) the rows' deferred foreign-key
                # checks are still pending, and PostgreSQL drops no table with pending checks.
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(f"DROP TABLE {steps}")
            cursor.execute(f"DROP TABLE {trajectories}")


def _stored_rows(model: type[models.Model], where: str, ids: list[int]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """``model``'s stored rows whose ``where`` column is in ``ids``, every
    concrete column as the database gives it (JSON as text), in id order."""
    meta = model._meta
    columns = [field.column for field in meta.concrete_fields if field.column is not None]
    json_columns = {field.column for field in meta.concrete_fields if isinstance(field, models.JSONField)}
    cast = "::text" if connection.vendor == "postgresql" else ""
    select = ", ".join(f"{column}{cast}" if column in json_columns else column for column in columns)
    marks = ", ".join(["%s"] * len(ids))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {select} FROM {meta.db_table} WHERE {where} IN ({marks}) ORDER BY id", ids)
        return columns, cursor.fetchall()


def raw_store(batches: list[list[int]], *, tables: tuple[str, str]) -> tuple[float, int, int]:
    """Write the trajectory and step rows stored for the trials of each batch
    into ``tables`` (see ``scratch_tables``), one transaction a batch, with
    the driver's cursor: ``COPY`` on PostgreSQL, ``executemany`` elsewhere.
    Only the writing is timed (seconds, trajectories, steps)."""
    prepared = []
    for trial_ids in batches:
        trajectory_columns, trajectories = _stored_rows(Trajectory, "trial_id", trial_ids)
        step_columns, steps = _stored_rows(TrajectoryStep, "trajectory_id", [row[0] for row in trajectories])
        prepared.append(((trajectory_columns, trajectories), (step_columns, steps)))
    connection.ensure_connection()
    raw = connection.connection
    with stopwatch() as elapsed:
        for batch in prepared:
            with transaction.atomic():
                cursor = raw.cursor()
                for table, (columns, rows) in zip(tables, batch, strict=True):
                    names = ", ".join(columns)
                    if connection.vendor == "postgresql":
                        with cursor.copy(f"COPY {table} ({names}) FROM STDIN") as copy_in:
                            for row in rows:
                                copy_in.write_row(row)
                    else:
                        marks = ", ".join("?" for _ in columns)
                        cursor.executemany(f"INSERT INTO {table} ({names}) VALUES ({marks})", rows)
                cursor.close()
    stored = [sum(len(batch[index][1]) for batch in prepared) for index in (0, 1)]
    return elapsed[0], stored[0], stored[1]


@benchmark(
    "trajectory-import",
    "1,000 ATIF files of 200 steps imported through the API in batches of 50 vs json.loads plus a raw COPY",
    quick={"files": 20, "steps": 50, "batch": 8},
)
def trajectory_import_benchmark(*, files: int = 1000, steps: int = 200, batch: int = 50) -> BenchResult:
    def body(experiment: Experiment, _scratch: Path) -> BenchResult:
        warm_up, *trial_ids = finished_trials(experiment, count=2 * files + 1)
        trial_ids, batch_ids = trial_ids[:files], trial_ids[files:]
        texts = [json.dumps(atif_document(steps=steps, number=number)).encode() for number in range(files)]
        bodies = [b'{"format": "atif", "document": ' + text + b"}" for text in texts]
        user = get_user_model().objects.create_user(
            username=f"bench-{uuid.uuid4().hex[:10]}", is_staff=True, is_superuser=True
        )
        try:
            client = APIClient(HTTP_HOST="localhost")
            client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
            # One untimed request first: the URLconf and the views are imported lazily.
            client.post(f"/api/v1/trials/{warm_up}/trajectory/", data=bodies[0], content_type="application/json")
            with stopwatch() as parsed:
                for text in texts:
                    json.loads(text)
            statuses: dict[int, int] = {}
            with stopwatch() as imported:
                for trial_id, request_body in zip(trial_ids, bodies, strict=True):
                    response = client.post(
                        f"/api/v1/trials/{trial_id}/trajectory/", data=request_body, content_type="application/json"
                    )
                    statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            # The same files again, into other trials, ``batch`` to a request.
            batch_bodies = [
                b'{"trajectories": ['
                + b", ".join(
                    b'{"trial": %d, "format": "atif", "document": %s}' % (trial_id, text)
                    for trial_id, text in zip(
                        batch_ids[start : start + batch], texts[start : start + batch], strict=True
                    )
                )
                + b"]}"
                for start in range(0, files, batch)
            ]
            batch_statuses: dict[int, int] = {}
            with stopwatch() as batched:
                for request_body in batch_bodies:
                    response = client.post("/api/v1/trajectories/", data=request_body, content_type="application/json")
                    batch_statuses[response.status_code] = batch_statuses.get(response.status_code, 0) + 1
        finally:
            Token.objects.filter(user=user).delete()
            user.delete()
        with scratch_tables() as tables:
            copied, copied_trajectories, copied_steps = raw_store(
                [batch_ids[start : start + batch] for start in range(0, files, batch)], tables=tables
            )
        baseline = parsed[0] + copied
        bulk = "COPY" if connection.vendor == "postgresql" else "executemany INSERT"
        stored = Trajectory.objects.filter(trial_id__in=trial_ids, step_count=steps).count()
        stored_steps = TrajectoryStep.objects.filter(trajectory__trial_id__in=trial_ids).count()
        batch_stored = Trajectory.objects.filter(trial_id__in=batch_ids, step_count=steps).count()
        batch_stored_steps = TrajectoryStep.objects.filter(trajectory__trial_id__in=batch_ids).count()
        size = sum(len(text) for text in texts)
        return BenchResult(
            ratio=batched[0] / baseline,
            target=3.0,
            label=f"trajectory-import: API import in batches / (json.loads + raw {bulk})",
            lines=[
                f"files: {files} ATIF documents of {steps} steps, {size / 1e6:.1f} MB",
                f"json.loads:  {parsed[0]:8.3f} s",
                f"raw {bulk} of the rows the batches stored into identical scratch tables, one transaction "
                f"a batch of {batch}: {copied:8.3f} s ({copied_trajectories} trajectories, {copied_steps} steps)",
                f"baseline (json.loads + raw {bulk}): {baseline:8.3f} s",
                f"API import, one file a request: {imported[0]:8.3f} s  ({1000 * imported[0] / files:.1f} ms per "
                f"file, {imported[0] / baseline:.3f} x the baseline); responses {dict(sorted(statuses.items()))}; "
                f"stored {stored} trajectories, {stored_steps} steps",
                f"API import in batches of {batch} (POST /api/v1/trajectories/): {batched[0]:8.3f} s  "
                f"({1000 * batched[0] / files:.1f} ms per file); "
                f"responses {dict(sorted(batch_statuses.items()))}; "
                f"stored {batch_stored} trajectories, {batch_stored_steps} steps",
            ],
            checks={
                "all imported": statuses == {201: files} and stored == files and stored_steps == files * steps,
                "all imported in batches": batch_statuses == {201: len(batch_bodies)}
                and batch_stored == files
                and batch_stored_steps == files * steps,
                "baseline wrote every row": copied_trajectories == files and copied_steps == files * steps,
            },
        )

    tasks = max(1, min(files, 100))
    return with_bench_experiment("trajectories", tasks, 1, body)
