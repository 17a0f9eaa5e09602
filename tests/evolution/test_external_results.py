"""External results: ingested as one external evaluation, never certified, never counted as certified."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from evolution import measurements
from evolution.models import CertifiedResult, Evaluation, Experiment, SplitMembership, Trial
from evolution.selectors import candidate_external_results, candidate_metrics
from evolution.services.evaluation import lease_reap
from evolution.services.external import ExternalResultsError, external_results_ingest
from evolution.services.records import records_verify, result_certify
from tests.factories import evaluate_seed_inline, make_tiny_experiment, seed_of

pytestmark = pytest.mark.django_db


def tasks_by_split(experiment: Experiment) -> dict[str, str]:
    return dict(SplitMembership.objects.filter(experiment=experiment).values_list("task__external_id", "split"))


def results_for(experiment: Experiment, *, k: int = 1) -> list[dict[str, Any]]:
    return [
        {"task": task, "index": index, "passed": task.endswith(("0", "2")), "tokens": 100 + index, "steps": 3}
        for task in sorted(tasks_by_split(experiment))
        for index in range(k)
    ]


def test_ingest_stores_an_external_evaluation_with_done_trials() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    seed = seed_of(experiment)
    results = results_for(experiment, k=2)
    results[0]["score"] = 0.25
    results[1]["split"] = tasks_by_split(experiment)[results[1]["task"]]

    evaluation = external_results_ingest(candidate=seed, results=results, source={"tool": "harbor", "job": "j-1"})

    assert (evaluation.external, evaluation.state) == (True, Evaluation.State.EXTERNAL)
    assert evaluation.purpose == Evaluation.Purpose.CANDIDATE
    assert evaluation.source == {"tool": "harbor", "job": "j-1"}
    assert (evaluation.k, evaluation.trials_total, evaluation.trials_finished) == (2, 8, 8)
    assert evaluation.splits == sorted(set(tasks_by_split(experiment).values()))
    trials = Trial.objects.filter(evaluation=evaluation).order_by("task__external_id", "index")
    assert [t.state for t in trials] == [Trial.State.DONE] * 8
    first = trials[0]
    assert (first.task.external_id, first.index, first.outcome, first.score, first.tokens, first.steps) == (
        "t00",
        0,
        Trial.Outcome.PASS,
        0.25,
        100,
        3,
    )
    # A missing score is 1 for a pass and 0 for a fail.
    assert [(t.outcome, t.score) for t in trials if t.task.external_id == "t01"] == [("fail", 0.0)] * 2
    assert not CertifiedResult.objects.exists()
    seed.refresh_from_db()
    assert seed.state == "approved"  # the candidate's own state is untouched


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"task": "nope"}, "results[1].task", "unknown task 'nope'"),
        ({"score": 1.5}, "results[1].score", "must be a number in [0, 1]"),
        ({"score": float("nan")}, "results[1].score", "must be a number in [0, 1]"),
        ({"index": -1}, "results[1].index", "must be an integer"),
        ({"passed": "yes"}, "results[1].passed", "must be true or false"),
        ({"tokens": -5}, "results[1].tokens", "non-negative integer"),
        ({"tokens": 2**63}, "results[1].tokens", "non-negative integer"),
        ({"split": "nowhere"}, "results[1].split", "is in split"),
        ({"colour": "red"}, "results[1]", "unknown field(s) colour"),
    ],
)
def test_bad_results_are_refused_naming_the_field_and_nothing_is_written(
    change: dict[str, Any], field: str, message: str
) -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    results = results_for(experiment)
    results[1].update(change)
    with pytest.raises(ExternalResultsError) as caught:
        external_results_ingest(candidate=seed_of(experiment), results=results, source={})
    assert field in caught.value.errors
    assert message in caught.value.errors[field]
    assert not Evaluation.objects.exists()
    assert not Trial.objects.exists()


def test_duplicate_task_and_index_is_refused() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    results = results_for(experiment)
    results.append(dict(results[2]))
    with pytest.raises(ExternalResultsError) as caught:
        external_results_ingest(candidate=seed_of(experiment), results=results, source={})
    assert caught.value.errors == {"results[4]": "duplicate trial: task 't02' index 0 is also results[2]"}
    assert not Evaluation.objects.exists()


@pytest.mark.parametrize("results", [[], "t00", None])
def test_results_must_be_a_non_empty_list(results: Any) -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    with pytest.raises(ExternalResultsError, match="results: must be a non-empty list"):
        external_results_ingest(candidate=seed_of(experiment), results=results, source={})
    assert not Evaluation.objects.exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"when": object()}, "must be plain JSON"),
        ({"job": "a\x00b"}, "must not contain NUL characters"),
        ({"log": "x" * 20_000}, "over the limit"),
    ],
)
def test_source_must_be_small_plain_json(source: dict[str, Any], message: str) -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    with pytest.raises(ExternalResultsError) as caught:
        external_results_ingest(candidate=seed_of(experiment), results=results_for(experiment), source=source)
    assert message in caught.value.errors["source"]
    assert not Evaluation.objects.exists()


def test_external_results_are_never_certified_nor_counted_as_certified() -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    seed = seed_of(experiment)
    certified = evaluate_seed_inline(experiment)
    assert certified.state == Evaluation.State.CERTIFIED
    counted_before = measurements.candidate_totals(seed.pk, ["train", "gate", "sealed"])
    metrics_before = candidate_metrics(candidate=seed)
    experiment.refresh_from_db()
    chain_before = (experiment.chain_length, experiment.chain_head)

    # Every external trial passes where the certified seed fails half: counting it would show.
    results = [{"task": t, "index": 0, "passed": True, "tokens": 1} for t in tasks_by_split(experiment)]
    external = external_results_ingest(candidate=seed, results=results, source={"tool": "harbor"})

    assert result_certify(evaluation_id=external.pk) is None
    assert lease_reap()["evaluations"] == 0
    external.refresh_from_db()
    assert external.state == Evaluation.State.EXTERNAL
    assert CertifiedResult.objects.count() == 1
    assert not CertifiedResult.objects.filter(evaluation=external).exists()
    experiment.refresh_from_db()
    assert (experiment.chain_length, experiment.chain_head) == chain_before
    assert measurements.candidate_totals(seed.pk, ["train", "gate", "sealed"]) == counted_before
    assert candidate_metrics(candidate=seed) == metrics_before
    report = records_verify(experiment=experiment)
    assert report.ok, report.problems

    listed = candidate_external_results(candidate=seed)
    assert [item.evaluation.pk for item in listed] == [external.pk]
    assert (listed[0].trials, listed[0].passed, listed[0].mean_score, listed[0].mean_tokens) == (4, 4, 1.0, 1.0)
    assert listed[0].source == {"tool": "harbor"}
    assert sum(summary.tasks for summary in listed[0].splits.values()) == 4


def test_the_database_refuses_an_external_evaluation_in_a_certifiable_state() -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    external = external_results_ingest(candidate=seed_of(experiment), results=results_for(experiment), source={})
    for state in (Evaluation.State.COMPLETE, Evaluation.State.CERTIFIED):
        with pytest.raises(IntegrityError), transaction.atomic():
            Evaluation.objects.filter(pk=external.pk).update(state=state)
