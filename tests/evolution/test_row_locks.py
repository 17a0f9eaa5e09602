"""Row locks never take the key lock, so a foreign-key check cannot deadlock with them.

PostgreSQL checks a foreign key (deferred, as Django declares them) at COMMIT with ``FOR KEY SHARE`` on the
referenced row. ``SELECT ... FOR UPDATE`` conflicts with that; ``FOR NO KEY UPDATE`` does not. CI saw the
deadlock this causes: ``trial_finish`` (its rows point at the experiment) committing while
``evaluation_certify`` held the experiment ``FOR UPDATE`` and waited for the candidate row ``trial_finish``
held. No code here changes a primary key, so every lock is ``no_key=True``; they still exclude each other.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest
from django.db import connection, transaction

from evolution.models import Evaluation, Experiment
from tests.factories import make_tiny_experiment

REPO = Path(__file__).resolve().parents[2]
APP_DIRS = ("evolution", "review", "api", "lab", "rsiweb")


def test_every_row_lock_in_the_code_is_a_no_key_lock() -> None:
    plain = []
    calls = 0
    for folder in APP_DIRS:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "select_for_update":
                    calls += 1
                    no_key = [k for k in node.keywords if k.arg == "no_key"]
                    if not (no_key and isinstance(no_key[0].value, ast.Constant) and no_key[0].value.value is True):
                        plain.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert calls > 20  # the scan sees the code's locks
    assert plain == [], f"select_for_update without no_key=True (it blocks foreign-key checks): {plain}"


@pytest.mark.django_db(transaction=True)
def test_a_row_pointing_at_a_locked_experiment_commits_while_the_lock_is_held(postgres: None) -> None:
    experiment = make_tiny_experiment(tasks=2)
    assert experiment.seed_candidate is not None
    locked, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold_the_experiment() -> None:
        try:
            with transaction.atomic():
                Experiment.objects.select_for_update(no_key=True).get(pk=experiment.pk)
                locked.set()
                release.wait(30)
        finally:
            connection.close()
            done.set()

    holder = threading.Thread(target=hold_the_experiment)
    holder.start()
    try:
        assert locked.wait(30)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '5s'")  # a key-lock conflict fails here, it does not hang
            Evaluation.objects.create(experiment=experiment, candidate=experiment.seed_candidate, splits=["train"])
        assert not done.is_set()  # committed while the other transaction still held its lock
    finally:
        release.set()
        holder.join(30)
    assert Evaluation.objects.filter(experiment=experiment).count() == 1


def _evaluation(total: int, state: str = Evaluation.State.RUNNING) -> Evaluation:
    experiment = make_tiny_experiment(tasks=2)
    assert experiment.seed_candidate is not None
    return Evaluation.objects.create(
        experiment=experiment, candidate=experiment.seed_candidate, splits=["train"], trials_total=total, state=state
    )


@pytest.mark.django_db
def test_the_finish_that_counts_the_last_trial_completes_the_evaluation_once() -> None:
    from django.utils import timezone

    from evolution.services.evaluation import _evaluation_advance

    evaluation = _evaluation(3)
    now = timezone.now()
    answers = []
    for _ in range(4):  # the fourth: a count past the total (never made by trial_finish) completes nothing again
        with transaction.atomic():
            answers.append(_evaluation_advance(evaluation_id=evaluation.pk, now=now))
    evaluation.refresh_from_db()
    assert answers == [False, False, True, False]
    assert (evaluation.state, evaluation.trials_finished, evaluation.finished_at) == ("complete", 4, now)
    # A cancelled evaluation counts its finished trials and stays cancelled.
    cancelled = _evaluation(1, state=Evaluation.State.CANCELLED)
    with transaction.atomic():
        assert _evaluation_advance(evaluation_id=cancelled.pk, now=now) is False
    cancelled.refresh_from_db()
    assert (cancelled.state, cancelled.trials_finished, cancelled.finished_at) == ("cancelled", 1, None)


@pytest.mark.django_db(transaction=True)
def test_trials_finishing_at_once_complete_their_evaluation_exactly_once(postgres: None) -> None:
    """Twelve finishes racing on one evaluation's row, each in its own transaction: one completion."""
    from django.utils import timezone

    from evolution.services.evaluation import _evaluation_advance

    evaluation = _evaluation(12)
    start = threading.Barrier(12)
    answers: list[bool] = []

    def finish() -> None:
        try:
            start.wait(30)
            with transaction.atomic():
                answers.append(_evaluation_advance(evaluation_id=evaluation.pk, now=timezone.now()))
        finally:
            connection.close()

    threads = [threading.Thread(target=finish) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    evaluation.refresh_from_db()
    assert sorted(answers) == [False] * 11 + [True]
    assert (evaluation.state, evaluation.trials_finished) == ("complete", 12)
