"""Failure annotation of trials: the only writers of Annotation and AnnotationLabel.

Annotations are people's opinions about why a trial failed. They live in
their own tables and never touch trials, evaluations or certified results,
so annotating can never change what was certified (tests assert it).

Every function validates all of its input before writing and writes inside
one transaction, so bad input raises ``AnnotationError`` (a ValueError with
a message fit to show to the user) and leaves nothing half-written.
Permissions (who may annotate, who may see sealed trials) are checked by
the views; ownership of an annotation is checked here.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.utils.text import slugify

from evolution.models import Annotation, AnnotationLabel, Experiment, TrajectoryStep, Trial

FAILED_OUTCOMES = (Trial.Outcome.FAIL, Trial.Outcome.ERROR)
NOTE_MAX_CHARS = 10_000
LABEL_NAME_MAX_CHARS = 120
LABEL_DESCRIPTION_MAX_CHARS = 2_000


class AnnotationError(ValueError):
    """Input that cannot be saved; the message says why, for the user."""


class AnnotationNotYours(AnnotationError):
    """Someone tried to change or delete another person's annotation."""


def labels_available(*, experiment: Experiment | int) -> QuerySet[AnnotationLabel]:
    """The labels usable on ``experiment``'s trials: the shared defaults
    first (in taxonomy order, "other" last), then the team's own, oldest first."""
    experiment_id = experiment if isinstance(experiment, int) else experiment.pk
    return AnnotationLabel.objects.filter(Q(experiment__isnull=True) | Q(experiment_id=experiment_id)).order_by(
        F("experiment_id").asc(nulls_first=True), "pk"
    )


def _label_resolve(*, label: AnnotationLabel | int | str | None, experiment_id: int) -> AnnotationLabel:
    if isinstance(label, AnnotationLabel):
        label_id: Any = label.pk
    elif isinstance(label, int):
        label_id = label
    else:
        text = (label or "").strip()
        if not text:
            raise AnnotationError("choose a label")
        if not text.isdigit():
            raise AnnotationError(f"unknown label {text!r}")
        label_id = int(text)
    found = AnnotationLabel.objects.filter(pk=label_id).first()
    if found is None:
        raise AnnotationError(f"unknown label {label_id!r}")
    if found.experiment_id is not None and found.experiment_id != experiment_id:
        raise AnnotationError(f"the label {found.name!r} belongs to another experiment")
    return found


def _step_resolve(*, step: int | str | None, trial: Trial) -> TrajectoryStep | None:
    if step is None or (isinstance(step, str) and not step.strip()):
        return None
    if isinstance(step, str):
        text = step.strip()
        if not text.isdigit():
            raise AnnotationError(f"the step must be a step number of this trial's trajectory, not {text!r}")
        step = int(text)
    found = TrajectoryStep.objects.filter(trajectory__trial_id=trial.pk, step_id=step).first()
    if found is None:
        raise AnnotationError(f"step {step} is not in this trial's trajectory")
    return found


def _note_clean(note: str | None) -> str:
    note = (note or "").strip()
    if len(note) > NOTE_MAX_CHARS:
        raise AnnotationError(f"the note is too long ({len(note)} characters; at most {NOTE_MAX_CHARS})")
    return note


EXTERNAL_REFUSAL = (
    "this is an external result, not run by rsiweb: external trials are not annotated "
    "(there is no trajectory of ours to anchor a label to)"
)


def _refuse_external(trial: Trial) -> None:
    if trial.evaluation.external:
        raise AnnotationError(EXTERNAL_REFUSAL)


def annotation_create(
    *,
    trial: Trial,
    author: Any,
    label: AnnotationLabel | int | str | None,
    note: str = "",
    step: int | str | None = None,
) -> Annotation:
    """Label a failed trial. One annotation per author and trial: a second
    one raises AnnotationError (update the first instead).

    ``label`` is a label, its id, or the id as posted; it must be a default
    label or one of the trial's experiment. ``step`` is a step id of the
    trial's trajectory (TrajectoryStep.step_id), or empty. Not idempotent:
    the second call of the same author fails with a clear message.
    """
    trial = Trial.objects.select_related("candidate", "evaluation").get(pk=trial.pk)
    _refuse_external(trial)
    if trial.outcome not in FAILED_OUTCOMES:
        raise AnnotationError(
            f"only failed trials are annotated; this one's outcome is {trial.outcome or 'not known yet'}"
        )
    resolved = _label_resolve(label=label, experiment_id=trial.candidate.experiment_id)
    anchor = _step_resolve(step=step, trial=trial)
    cleaned = _note_clean(note)
    if Annotation.objects.filter(trial=trial, author=author).exists():
        raise AnnotationError("you have already annotated this trial; edit your annotation instead")
    try:
        with transaction.atomic():
            return Annotation.objects.create(trial=trial, author=author, label=resolved, note=cleaned, step=anchor)
    except IntegrityError as exc:  # a concurrent request of the same author won
        raise AnnotationError("you have already annotated this trial; edit your annotation instead") from exc


def annotation_update(
    *,
    annotation: Annotation,
    author: Any,
    label: AnnotationLabel | int | str | None,
    note: str = "",
    step: int | str | None = None,
) -> Annotation:
    """Change one's own annotation (label, note, step); same validation as
    ``annotation_create``. Safe to repeat."""
    with transaction.atomic():
        locked = (
            Annotation.objects.select_for_update(no_key=True).select_related("trial__candidate").get(pk=annotation.pk)
        )
        if locked.author_id != author.pk:
            raise AnnotationNotYours("you can only edit your own annotations")
        trial = locked.trial
        _refuse_external(trial)
        locked.label = _label_resolve(label=label, experiment_id=trial.candidate.experiment_id)
        locked.step = _step_resolve(step=step, trial=trial)
        locked.note = _note_clean(note)
        locked.save(update_fields=["label", "step", "note", "updated_at"])
        return locked


def annotation_delete(*, annotation: Annotation, author: Any) -> None:
    """Delete one's own annotation. Deleting one already gone is a no-op."""
    with transaction.atomic():
        locked = Annotation.objects.select_for_update(no_key=True).filter(pk=annotation.pk).first()
        if locked is None:
            return
        if locked.author_id != author.pk:
            raise AnnotationNotYours("you can only delete your own annotations")
        locked.delete()


def label_create(*, experiment: Experiment, name: str, description: str = "") -> AnnotationLabel:
    """Add a team label to ``experiment``; the slug is made from the name.

    A name whose slug (or name, ignoring case) equals a default label's or
    one of this experiment's labels is refused with a clear message, so a
    slug always identifies one label within an experiment.
    """
    name = " ".join((name or "").split())
    description = (description or "").strip()
    if not name:
        raise AnnotationError("a label needs a name")
    if len(name) > LABEL_NAME_MAX_CHARS:
        raise AnnotationError(f"the label name is too long (at most {LABEL_NAME_MAX_CHARS} characters)")
    if len(description) > LABEL_DESCRIPTION_MAX_CHARS:
        raise AnnotationError(f"the description is too long (at most {LABEL_DESCRIPTION_MAX_CHARS} characters)")
    slug = slugify(name)[:60].strip("-")
    if not slug:
        raise AnnotationError(f"the name {name!r} has no letters or digits to make a slug from")
    clash = labels_available(experiment=experiment).filter(Q(slug=slug) | Q(name__iexact=name)).first()
    if clash is not None:
        where = "a default label" if clash.experiment_id is None else "a label of this experiment"
        raise AnnotationError(f"{where} already exists with this name or slug: {clash.name!r} ({clash.slug})")
    try:
        with transaction.atomic():
            return AnnotationLabel.objects.create(experiment=experiment, slug=slug, name=name, description=description)
    except IntegrityError as exc:  # created concurrently
        raise AnnotationError(f"a label with the slug {slug!r} already exists") from exc
