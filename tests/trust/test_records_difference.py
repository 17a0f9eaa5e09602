"""The words the crash scenarios fail with: what differs between two
experiments' certified records."""

from __future__ import annotations

import pytest

from lab.records import records_difference, records_digest
from tests.factories import evaluate_seed_inline, make_tiny_experiment

pytestmark = pytest.mark.django_db


def test_equal_records_have_equal_digests_and_a_difference_names_fields_and_trials() -> None:
    control = make_tiny_experiment(tasks=4, k=1, name="control")
    twin = make_tiny_experiment(name="twin", like=control)
    other = make_tiny_experiment(name="other", like=control)
    evaluate_seed_inline(control, ("train", "gate"))
    evaluate_seed_inline(twin, ("train", "gate"))
    assert records_digest(control) == records_digest(twin)

    # The same candidate evaluated on one split only: the record differs in
    # its evaluation fields and lacks the gate trials.
    evaluate_seed_inline(other, ("train",))
    assert records_digest(control) != records_digest(other)
    words = records_difference(control, other)
    gate = sorted(row["task"] for row in control.certified_results.get().payload["trials"] if row["split"] == "gate")
    assert words.startswith("1 records in the control, 1 here")
    assert "'evaluation'" in words
    assert f"{gate[0]}#0: " in words and "-> None" in words


def test_a_difference_names_the_errors_and_retries_behind_it() -> None:
    from evolution.models import Trial

    control = make_tiny_experiment(tasks=4, k=1, name="control")
    twin = make_tiny_experiment(name="twin", like=control)
    evaluate_seed_inline(control, ("train",))
    evaluate_seed_inline(twin, ("train",))
    trial = Trial.objects.filter(evaluation__experiment=twin).order_by("pk").first()
    assert trial is not None
    Trial.objects.filter(pk=trial.pk).update(error_kind="infra", error="gave up after 3 attempts", attempt=4)
    words = records_difference(control, twin)
    assert f"error here: {trial.task.external_id}#0 attempt 4 infra: 'gave up after 3 attempts'" in words
    assert words.endswith("1 trial(s) here ran more than once (attempt > 1)")
