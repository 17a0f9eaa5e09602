"""A query compiled once (``evolution.prepared``) returns what Django's own ``get`` returns."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Count, F, Model
from django.utils import timezone

from evolution.models import Evaluation, Trial
from evolution.prepared import PreparedGet, PreparedUpdate
from evolution.services import evaluation as evaluation_services
from evolution.services.evaluation import _claimed_trial
from tests.factories import make_tiny_experiment, seed_of

pytestmark = pytest.mark.django_db(transaction=True)


def _claimed_queryset() -> Any:
    # The claim's own queryset, evaluated by Django's get: the reference.
    return _claimed_trial._build()


def _loaded(instance: Model) -> dict[str, Any]:
    """Every loaded column's value, and which ones are deferred."""
    deferred = instance.get_deferred_fields()
    values = {
        field.attname: getattr(instance, field.attname)
        for field in instance._meta.concrete_fields
        if field.attname not in deferred
    }
    return {"class": type(instance), "deferred": deferred, "values": values, "db": instance._state.db}


def _cached(instance: Any, name: str) -> Any:
    # Read through the field cache only: a lazy load would hide a missing related object.
    return instance._meta.get_field(name).get_cached_value(instance)


def _graph(trial: Trial) -> dict[str, Any]:
    evaluation = _cached(trial, "evaluation")
    experiment = _cached(evaluation, "experiment")
    return {
        "trial": _loaded(trial),
        "task": _loaded(_cached(trial, "task")),
        "candidate": _loaded(_cached(trial, "candidate")),
        "evaluation": _loaded(evaluation),
        "experiment": _loaded(experiment),
        "evaluator": _loaded(_cached(experiment, "evaluator")),
    }


def _started_trials() -> list[int]:
    experiment = make_tiny_experiment(tasks=4, k=2)
    evaluation = evaluation_services.evaluation_start(
        candidate=seed_of(experiment), splits=["train", "gate"], purpose=Evaluation.Purpose.BASELINE
    )
    return list(Trial.objects.filter(evaluation=evaluation).order_by("pk").values_list("pk", flat=True))


def test_the_claims_prepared_query_returns_what_djangos_get_returns_for_every_trial() -> None:
    trials = _started_trials()
    claimed = evaluation_services.trial_claim(trial_id=trials[1], owner="test")
    assert claimed is not None
    graphs = [_graph(_claimed_trial.get(pk)) for pk in trials]
    # Each trial's own row, not the first one compiled: the key is bound per call.
    assert [graph["trial"]["values"]["id"] for graph in graphs] == trials
    assert len({graph["trial"]["values"]["seed"] for graph in graphs}) > 1
    for pk, graph in zip(trials, graphs, strict=True):
        assert graph == _graph(_claimed_queryset().get(pk=pk))
    # The claim's own result, with the state and lease it just wrote.
    assert _graph(claimed) == _graph(_claimed_queryset().get(pk=trials[1]))
    assert claimed.state == Trial.State.RUNNING and claimed.lease_owner == "test" and claimed.attempt == 1
    # JSON columns come back decoded, as Django's converters give them.
    assert isinstance(claimed.task.expected, dict) and claimed.task.expected["answer"] in ("yes", "no")
    assert isinstance(claimed.evaluation.experiment.evaluator.runner_argv, list)


def test_a_missing_key_raises_does_not_exist() -> None:
    with pytest.raises(Trial.DoesNotExist):
        _claimed_trial.get(10**9)


def test_threads_share_one_compiled_query_each_on_its_own_connection() -> None:
    trials = _started_trials()
    prepared = PreparedGet(_claimed_queryset)
    seen: dict[int, int] = {}
    errors: list[BaseException] = []

    def read(pk: int) -> None:
        try:
            seen[pk] = prepared.get(pk).seed
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=read, args=(pk,)) for pk in trials]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert seen == {pk: Trial.objects.get(pk=pk).seed for pk in trials}
    assert len(prepared._compiled) == 1


def test_a_queryset_with_annotations_is_refused() -> None:
    prepared = PreparedGet(lambda: Trial.objects.annotate(notes=Count("annotations")))
    with pytest.raises(ValueError, match="annotations"):
        prepared.get(1)


def test_a_prepared_update_writes_what_djangos_update_writes() -> None:
    # The finish's statement against QuerySet.update on two trials alike: JSON, floats, datetimes, None.
    experiment = make_tiny_experiment(tasks=4, k=2)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    mine, reference, untouched = (trial.pk for trial in evaluation.trials.order_by("pk")[:3])
    when = timezone.now()
    values = {
        "state": Trial.State.DONE.value,
        "criteria_results": [{"id": "answer", "met": True, "note": "ü"}],
        "score": 0.5,
        "tokens": None,
        "finished_at": when,
    }
    update = PreparedUpdate(Trial, fields=tuple(values), also="attempt = attempt + 1", where="id = %s AND state = %s")

    assert update.execute(tuple(values.values()), (mine, Trial.State.PENDING.value)) == 1
    assert update.execute(tuple(values.values()), (mine, Trial.State.PENDING.value)) == 0  # no longer pending
    Trial.objects.filter(pk=reference).update(**values, attempt=F("attempt") + 1)

    columns = [*values, "attempt", "lease_owner"]
    written, expected = (Trial.objects.filter(pk=pk).values(*columns).get() for pk in (mine, reference))
    assert written == expected and written["finished_at"] == when and written["attempt"] == 1
    assert Trial.objects.get(pk=untouched).state == Trial.State.PENDING


def test_a_prepared_updates_where_compares_datetimes_as_the_column_stores_them() -> None:
    # On SQLite a datetime is stored as text: the parameter must be written the same way to compare.
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluation = evaluation_services.evaluation_start(candidate=seed_of(experiment), splits=["train"])
    trial = evaluation.trials.order_by("pk")[0]
    expires = trial.lease_expires_at
    assert expires is not None
    update = PreparedUpdate(Trial, fields=("lease_owner",), where="id = %s AND lease_expires_at < %s")

    assert update.execute(("early",), (trial.pk, expires)) == 0
    assert update.execute(("late",), (trial.pk, expires + timedelta(microseconds=1))) == 1
    assert Trial.objects.get(pk=trial.pk).lease_owner == "late"
