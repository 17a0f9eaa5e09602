"""Failure annotation services: validation, ownership, and that annotations
never touch what was certified."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User

from evolution.models import (
    Annotation,
    AnnotationLabel,
    AnnotationScore,
    CertifiedResult,
    Experiment,
    Trajectory,
    TrajectoryStep,
    Trial,
)
from evolution.services.annotations import (
    AnnotationError,
    AnnotationNotYours,
    annotation_create,
    annotation_delete,
    annotation_update,
    label_create,
    labels_available,
    score_config_create,
)
from evolution.services.records import records_verify
from tests.factories import evaluate_seed_inline, make_tiny_experiment

pytestmark = pytest.mark.django_db

DEFAULT_SLUGS = {
    "judgment-error",
    "data-processing-error",
    "information-forgotten",
    "sources-combined-wrongly",
    "tool-misuse",
    "environment-or-timeout",
    "other",
}


@pytest.fixture
def world() -> dict[str, Any]:
    """A tiny experiment whose seed was evaluated and certified: half its
    trials failed; the first failed trial gets a three-step trajectory."""
    experiment = make_tiny_experiment(tasks=4, k=1)
    evaluate_seed_inline(experiment, splits=("train", "gate"))
    failed = Trial.objects.filter(candidate__experiment=experiment, outcome=Trial.Outcome.FAIL).order_by("pk")
    passed = Trial.objects.filter(candidate__experiment=experiment, outcome=Trial.Outcome.PASS).first()
    trial = failed.first()
    assert trial is not None
    trajectory = Trajectory.objects.create(trial=trial, step_count=3)
    for step_id in (1, 2, 3):
        TrajectoryStep.objects.create(trajectory=trajectory, step_id=step_id, source="agent", message=f"m{step_id}")
    other = make_tiny_experiment(tasks=2, k=1)
    return {
        "experiment": experiment,
        "trial": trial,
        "passed": passed,
        "other_trial": failed.exclude(pk=trial.pk).first(),
        "label": AnnotationLabel.objects.get(slug="tool-misuse", experiment=None),
        "foreign_label": label_create(experiment=other, name="Only over there"),
        "ann": User.objects.create_user("ann"),
        "bob": User.objects.create_user("bob"),
    }


def _certified_state(experiment: Experiment) -> tuple[Any, ...]:
    records = list(CertifiedResult.objects.filter(experiment=experiment).values().order_by("seq"))
    trials = list(
        Trial.objects.filter(candidate__experiment=experiment).values("pk", "outcome", "score", "state").order_by("pk")
    )
    experiment.refresh_from_db()
    report = records_verify(experiment=experiment)
    return records, trials, (experiment.chain_length, experiment.chain_head), report.ok, report.problems


def test_the_default_taxonomy_is_installed_by_the_migration() -> None:
    defaults = AnnotationLabel.objects.filter(experiment__isnull=True)
    assert set(defaults.values_list("slug", flat=True)) == DEFAULT_SLUGS
    assert defaults.get(slug="judgment-error").name == "Judgment error (right data, wrong rule)"
    assert all(label.description for label in defaults)


def test_create_an_annotation_anchored_to_a_step(world: dict[str, Any]) -> None:
    annotation = annotation_create(
        trial=world["trial"], author=world["ann"], label=str(world["label"].pk), note="  used grep wrong  ", step="2"
    )
    annotation.refresh_from_db()
    assert annotation.label == world["label"]
    assert annotation.note == "used grep wrong"
    assert annotation.step is not None
    assert annotation.step.step_id == 2
    assert annotation.step is not None
    assert annotation.step.trajectory.trial_id == world["trial"].pk


@pytest.mark.parametrize(
    ("label_key", "message"),
    [
        ("missing", "choose a label"),
        ("unknown", "unknown label"),
        ("text", "unknown label"),
        ("foreign", "belongs to another experiment"),
    ],
)
def test_a_bad_label_is_refused_and_nothing_is_written(world: dict[str, Any], label_key: str, message: str) -> None:
    label = {"missing": "", "unknown": 999999, "text": "tool-misuse<script>", "foreign": world["foreign_label"]}[
        label_key
    ]
    with pytest.raises(AnnotationError, match=message):
        annotation_create(trial=world["trial"], author=world["ann"], label=label)
    assert not Annotation.objects.exists()


@pytest.mark.parametrize("step", ["4", "0", "-1", "two", 99])
def test_a_step_outside_the_trajectory_is_refused(world: dict[str, Any], step: Any) -> None:
    with pytest.raises(AnnotationError, match="step"):
        annotation_create(trial=world["trial"], author=world["ann"], label=world["label"], step=step)
    assert not Annotation.objects.exists()


def test_a_step_of_another_trials_trajectory_is_refused(world: dict[str, Any]) -> None:
    # The other failed trial has no trajectory; step 1 exists only in the first trial's.
    with pytest.raises(AnnotationError, match="step 1 is not in this trial's trajectory"):
        annotation_create(trial=world["other_trial"], author=world["ann"], label=world["label"], step=1)
    assert not Annotation.objects.exists()


def test_only_failed_trials_are_annotated(world: dict[str, Any]) -> None:
    with pytest.raises(AnnotationError, match="only failed trials"):
        annotation_create(trial=world["passed"], author=world["ann"], label=world["label"])
    assert not Annotation.objects.exists()


def test_one_annotation_per_author_and_trial(world: dict[str, Any]) -> None:
    annotation_create(trial=world["trial"], author=world["ann"], label=world["label"])
    with pytest.raises(AnnotationError, match="already annotated"):
        annotation_create(trial=world["trial"], author=world["ann"], label=world["label"], note="again")
    annotation_create(trial=world["trial"], author=world["bob"], label=world["label"])
    assert Annotation.objects.count() == 2


def test_a_too_long_note_is_refused(world: dict[str, Any]) -> None:
    with pytest.raises(AnnotationError, match="too long"):
        annotation_create(trial=world["trial"], author=world["ann"], label=world["label"], note="x" * 10_001)
    assert not Annotation.objects.exists()


def test_update_and_delete_only_ones_own(world: dict[str, Any]) -> None:
    annotation = annotation_create(trial=world["trial"], author=world["ann"], label=world["label"], step=1)
    other = AnnotationLabel.objects.get(slug="other", experiment=None)
    with pytest.raises(AnnotationNotYours):
        annotation_update(annotation=annotation, author=world["bob"], label=other, note="mine now")
    with pytest.raises(AnnotationNotYours):
        annotation_delete(annotation=annotation, author=world["bob"])
    annotation.refresh_from_db()
    assert annotation.step is not None
    assert (annotation.label_id, annotation.note, annotation.step.step_id) == (world["label"].pk, "", 1)

    updated = annotation_update(annotation=annotation, author=world["ann"], label=other, note="on reflection", step="")
    updated.refresh_from_db()
    assert (updated.label_id, updated.note, updated.step) == (other.pk, "on reflection", None)
    with pytest.raises(AnnotationError, match="another experiment"):
        annotation_update(annotation=annotation, author=world["ann"], label=world["foreign_label"])
    updated.refresh_from_db()
    assert updated.label_id == other.pk

    annotation_delete(annotation=annotation, author=world["ann"])
    assert not Annotation.objects.exists()
    annotation_delete(annotation=annotation, author=world["ann"])  # already gone: no-op


def test_annotations_never_change_certified_results(world: dict[str, Any]) -> None:
    experiment = world["experiment"]
    before = _certified_state(experiment)
    assert before[3] is True, before[4]
    assert before[0], "the seed evaluation was certified"

    annotation = annotation_create(trial=world["trial"], author=world["ann"], label=world["label"], note="n", step=3)
    annotation_create(trial=world["other_trial"], author=world["bob"], label=world["label"])
    assert _certified_state(experiment) == before
    other = AnnotationLabel.objects.get(slug="other", experiment=None)
    annotation_update(annotation=annotation, author=world["ann"], label=other, note="changed", step=1)
    assert _certified_state(experiment) == before
    annotation_delete(annotation=annotation, author=world["ann"])
    assert _certified_state(experiment) == before
    label_create(experiment=experiment, name="Flaky verifier")
    assert _certified_state(experiment) == before


def test_label_create_makes_a_slug_and_refuses_duplicates(world: dict[str, Any]) -> None:
    experiment = world["experiment"]
    label = label_create(experiment=experiment, name="  Wrong   unit  conversion ", description=" kg vs lb ")
    assert (label.slug, label.name, label.description) == ("wrong-unit-conversion", "Wrong unit conversion", "kg vs lb")
    assert label in labels_available(experiment=experiment)
    assert world["foreign_label"] not in labels_available(experiment=experiment)

    count = AnnotationLabel.objects.count()
    for name, message in [
        ("wrong unit conversion", "a label of this experiment already exists"),
        ("Wrong-Unit-Conversion!", "a label of this experiment already exists"),
        ("Tool misuse", "a default label already exists"),
        ("tool misuse", "a default label already exists"),
        ("", "needs a name"),
        ("!!!", "no letters or digits"),
        ("x" * 121, "too long"),
    ]:
        with pytest.raises(AnnotationError, match=message):
            label_create(experiment=experiment, name=name)
    assert AnnotationLabel.objects.count() == count
    # The same name is fine in another experiment.
    assert label_create(experiment=world["foreign_label"].experiment, name="Wrong unit conversion").pk


def test_a_team_label_can_be_used_on_its_experiment(world: dict[str, Any]) -> None:
    label = label_create(experiment=world["experiment"], name="Flaky verifier")
    annotation = annotation_create(trial=world["trial"], author=world["ann"], label=label.pk)
    assert annotation.label == label


# --- scores -------------------------------------------------------------------------


def test_scores_are_saved_updated_and_removed_with_the_annotation(world: dict[str, Any]) -> None:
    solvable = score_config_create(experiment=world["experiment"], name="Task solvable", kind="boolean")
    severity = score_config_create(
        experiment=world["experiment"], name="Severity", kind="numeric", minimum=1, maximum=5
    )
    annotation = annotation_create(
        trial=world["trial"], author=world["ann"], label=world["label"], scores={solvable.pk: "yes", "severity": "2.5"}
    )
    assert {s.config.slug: s.value for s in annotation.scores.all()} == {"task-solvable": 1.0, "severity": 2.5}
    # An update names the scores it changes; an empty value removes one, others keep theirs.
    annotation_update(annotation=annotation, author=world["ann"], label=world["label"], scores={"task-solvable": ""})
    assert {s.config.slug: s.value for s in annotation.scores.all()} == {"severity": 2.5}
    # False is not a number: refused, the saved score is kept.
    with pytest.raises(AnnotationError, match="is a number"):
        annotation_update(annotation=annotation, author=world["ann"], label=world["label"], scores={severity.pk: False})
    assert {s.config.slug: s.value for s in annotation.scores.all()} == {"severity": 2.5}


@pytest.mark.parametrize(
    ("scores", "message"),
    [
        ({"severity": "7"}, "the score 'Severity' must be from 1 to 5, not 7"),
        ({"severity": "0.5"}, "the score 'Severity' must be from 1 to 5, not 0.5"),
        ({"severity": "four"}, "the score 'Severity' must be a number from 1 to 5, not 'four'"),
        ({"severity": "nan"}, "the score 'Severity' must be a number from 1 to 5, not 'nan'"),
        ({"task-solvable": "maybe"}, "the score 'Task solvable' is yes or no, not 'maybe'"),
        ({"elsewhere": "1"}, "unknown score 'elsewhere' for this experiment"),
    ],
)
def test_a_bad_score_is_refused_and_nothing_is_written(
    world: dict[str, Any], scores: dict[str, str], message: str
) -> None:
    score_config_create(experiment=world["experiment"], name="Task solvable", kind="boolean")
    score_config_create(experiment=world["experiment"], name="Severity", kind="numeric", minimum=1, maximum=5)
    with pytest.raises(AnnotationError) as refused:
        annotation_create(trial=world["trial"], author=world["ann"], label=world["label"], note="n", scores=scores)
    assert str(refused.value) == message
    assert not Annotation.objects.exists() and not AnnotationScore.objects.exists()


def test_a_score_of_another_experiment_is_unknown(world: dict[str, Any]) -> None:
    other = world["foreign_label"].experiment
    foreign = score_config_create(experiment=other, name="Elsewhere", kind="boolean")
    with pytest.raises(AnnotationError, match="unknown score"):
        annotation_create(trial=world["trial"], author=world["ann"], label=world["label"], scores={foreign.pk: "yes"})
    assert not Annotation.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "", "kind": "boolean"}, "a score needs a name"),
        ({"name": "Solved", "kind": "stars"}, "a score is numeric or boolean, not 'stars'"),
        ({"name": "Solved", "kind": "boolean", "maximum": "1"}, "a yes/no score has no maximum"),
        (
            {"name": "Grade", "kind": "numeric", "minimum": "5", "maximum": "1"},
            "the minimum (5) must be below the maximum (1)",
        ),
        ({"name": "Grade", "kind": "numeric", "minimum": "low"}, "the minimum must be a number, not 'low'"),
    ],
)
def test_a_bad_score_config_is_refused(world: dict[str, Any], kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(AnnotationError) as refused:
        score_config_create(experiment=world["experiment"], **kwargs)
    assert str(refused.value) == message
    score_config_create(experiment=world["experiment"], name="Grade", kind="numeric")
    with pytest.raises(AnnotationError, match="already has a score"):
        score_config_create(experiment=world["experiment"], name="grade", kind="boolean")
