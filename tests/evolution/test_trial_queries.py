"""What a trial costs the database on the worker's path, pinned.

A trial worker runs every trial through ``trial_execute``: claim, read the
claimed trial, write its inputs out, run it, record the result, store its
trajectory and count it on its evaluation. Every statement there is paid
by every trial of every host (issue 44: on a 2-core machine each
millisecond of the worker's CPU a trial competes with the trials). These
tests fail when a statement a trial is added to that path; if one is
needed, change the figure here and say why in the commit.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evolution.models import Tree, Trial
from evolution.services import evaluation as evaluation_services
from evolution.trees import MODE_FILE, FileEntry
from tests.factories import TINY_AGENT, make_tiny_experiment, seed_of

pytestmark = pytest.mark.django_db

# The tiny agent, also writing a trajectory of two steps as the worker stores it.
AGENT_WITH_TRAJECTORY = (
    TINY_AGENT
    + """
(out / "trajectory.json").write_text(json.dumps({"schema_version": "ATIF-v1.5", "session_id": "s", "steps": [
    {"step_id": 1, "source": "user", "message": "task"},
    {"step_id": 2, "source": "agent", "message": "answer", "metrics": {"prompt_tokens": 3}}]}))
"""
)


def _statements(trial_id: int) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        assert evaluation_services.trial_execute(trial_id=trial_id, owner="test")
    # An executemany is logged once, as "N times: <sql>".
    return [query["sql"].split(" times: ")[-1].split(None, 1)[0].upper() for query in queries.captured_queries]


def test_a_trial_costs_the_worker_a_fixed_number_of_statements() -> None:
    # The process's tree cache is keyed by content: an earlier test's identical files would already be in it.
    evaluation_services.tree_cache_clear()
    experiment = make_tiny_experiment(tasks=4, k=2, agent=AGENT_WITH_TRAJECTORY)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    # Two tasks of the train split, two trials each: (a, 0), (a, 1), (b, 0), (b, 1).
    trials = list(evaluation.trials.order_by("pk").values_list("pk", "task_id"))
    assert len(trials) == 4 and trials[0][1] == trials[1][1] != trials[2][1]
    first, same_task, other_task, last = (pk for pk, _task in trials)
    # The first trial reads the candidate's, the evaluator's and the task's files (each process keeps them).
    _statements(first)

    warm = _statements(same_task)
    # Claim, read the claimed trial; in one transaction (here a savepoint in the test's own), record the
    # result, look for a trajectory to replace, insert the new one and its steps, count the trial on its
    # evaluation (one statement on PostgreSQL, two elsewhere). PostgreSQL's steps go by COPY, which is not
    # logged as a query.
    postgres = connection.vendor == "postgresql"
    assert warm == [
        "UPDATE",
        "SELECT",
        "SAVEPOINT",
        "UPDATE",
        "SELECT",
        "INSERT",
        *([] if postgres else ["INSERT"]),
        *(["WITH"] if postgres else ["UPDATE", "UPDATE"]),
        "RELEASE",
    ]
    # A task not seen yet: its files in one more query, nothing else.
    cold = _statements(other_task)
    assert len(cold) == len(warm) + 1 and cold.count("SELECT") == 3
    # The last trial completes the evaluation: the candidate locked and the certification sent, as before.
    _statements(last)
    assert list(evaluation.trials.values_list("state", flat=True).distinct()) == [Trial.State.DONE]
    assert Trial.objects.filter(evaluation=evaluation, trajectory__step_count=2).count() == 4


@pytest.mark.skipif(connection.vendor != "postgresql", reason="statements are prepared on PostgreSQL")
def test_the_statements_of_every_trial_are_prepared_once_per_connection() -> None:
    evaluation_services.tree_cache_clear()
    experiment = make_tiny_experiment(tasks=4, k=2, agent=AGENT_WITH_TRAJECTORY)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    for trial_id in evaluation.trials.order_by("pk").values_list("pk", flat=True):
        _statements(trial_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements")
        prepared = sorted((statement.split(None, 1)[0].upper(), runs) for statement, runs in cursor.fetchall())
    # The claim's UPDATE and SELECT, the finish's UPDATE, the trajectory's lookup and INSERT, the evaluation's
    # count (WITH): each planned once on this connection and run for each of the four trials; the trees' read,
    # once for each of the four trees (the candidate's, the evaluator's, the two tasks').
    assert prepared == [
        ("INSERT", 4),
        ("SELECT", 4),
        ("SELECT", 4),
        ("SELECT", 4),
        ("UPDATE", 4),
        ("UPDATE", 4),
        ("WITH", 4),
    ]


@pytest.mark.django_db(transaction=True)
def test_a_migration_that_changes_a_column_under_a_prepared_statement_does_not_stop_the_trials(
    postgres: None,
) -> None:
    """A migration run while workers run (another connection) widened a
    column the claim's prepared SELECT returns: PostgreSQL then refuses that
    statement ("cached plan must not change result type"), on every later
    run of a connection outside a transaction, until it reconnects. The
    statement is deallocated and prepared anew, and the trials go on."""
    evaluation_services.tree_cache_clear()
    experiment = make_tiny_experiment(tasks=4, k=2)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    first, *rest = evaluation.trials.order_by("pk").values_list("pk", flat=True)
    assert evaluation_services.trial_execute(trial_id=first, owner="test")
    params = {
        key: value
        for key, value in connection.get_connection_params().items()
        if key in ("dbname", "user", "host", "port", "password")
    }
    column = "ALTER TABLE evolution_trial ALTER COLUMN lease_owner TYPE varchar({})"
    with psycopg.connect(**params, autocommit=True) as migration:
        migration.execute(column.format(201))
    try:
        for trial_id in rest:
            assert evaluation_services.trial_execute(trial_id=trial_id, owner="test")
    finally:
        with psycopg.connect(**params, autocommit=True) as migration:
            migration.execute(column.format(200))
    assert list(evaluation.trials.values_list("state", flat=True).distinct()) == [Trial.State.DONE]
    with connection.cursor() as cursor:  # prepared anew: the claim's SELECT is there again, run since
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'SELECT%%lease_owner%%'")
        assert cursor.fetchone() == (1,)


def test_threads_asking_for_one_tree_at_once_read_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Slots that start together need the same trees: the first reads, the others wait for its entries.
    evaluation_services.tree_cache_clear()
    reads: list[str] = []
    started = threading.Event()

    def slow_read(*, tree: Tree) -> list[FileEntry]:
        reads.append(tree.digest)
        started.set()
        time.sleep(0.2)
        return [FileEntry(path="a.txt", mode=MODE_FILE, data=tree.digest.encode())]

    monkeypatch.setattr(evaluation_services, "tree_entries", slow_read)
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(evaluation_services._tree_entries_cached, "d1")
        assert started.wait(5)
        results = [pool.submit(evaluation_services._tree_entries_cached, "d1") for _ in range(6)]
        other = pool.submit(evaluation_services._tree_entries_cached, "d2")
        entries = [first.result(), *(result.result() for result in results)]
    assert sorted(reads) == ["d1", "d2"] and other.result()[0].data == b"d2"
    assert all(found is entries[0] for found in entries)
    # Kept: later asks read nothing.
    assert evaluation_services._tree_entries_cached("d1") is entries[0] and len(reads) == 2
    evaluation_services.tree_cache_clear()
