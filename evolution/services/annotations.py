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

import math
from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q, QuerySet
from django.utils.text import slugify

from evolution.models import (
    Annotation,
    AnnotationLabel,
    AnnotationScore,
    AnnotationScoreConfig,
    Experiment,
    TrajectoryStep,
    Trial,
)

FAILED_OUTCOMES = (Trial.Outcome.FAIL, Trial.Outcome.ERROR)
NOTE_MAX_CHARS = 10_000
LABEL_NAME_MAX_CHARS = 120
LABEL_DESCRIPTION_MAX_CHARS = 2_000


class AnnotationError(ValueError):
    """Input that cannot be saved; the message says why, for the user."""


class AnnotationNotYours(AnnotationError):
    """Someone tried to change or delete another person's annotation."""


# What a yes/no score accepts, as typed or posted (a form's radio buttons post "yes" and "no").
YES_WORDS = ("yes", "true", "1", "y")
NO_WORDS = ("no", "false", "0", "n")
# Scores as given: config id (or slug) -> the value as posted, a number or a bool. An empty value = no score.
ScoresGiven = Mapping[Any, str | float | bool | None]


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
    scores: ScoresGiven | None = None,
) -> Annotation:
    """Label a failed trial. One annotation per author and trial: a second
    one raises AnnotationError (update the first instead).

    ``label`` is a label, its id, or the id as posted; it must be a default
    label or one of the trial's experiment. ``step`` is a step id of the
    trial's trajectory (TrajectoryStep.step_id), or empty. ``scores`` maps
    score configs of the experiment (id or slug) to values (see
    ``scores_clean``). Not idempotent: the second call of the same author
    fails with a clear message.
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
    values = scores_clean(scores or {}, experiment_id=trial.candidate.experiment_id)
    if Annotation.objects.filter(trial=trial, author=author).exists():
        raise AnnotationError("you have already annotated this trial; edit your annotation instead")
    try:
        with transaction.atomic():
            created = Annotation.objects.create(trial=trial, author=author, label=resolved, note=cleaned, step=anchor)
            _scores_write(created, values)
            return created
    except IntegrityError as exc:  # a concurrent request of the same author won
        raise AnnotationError("you have already annotated this trial; edit your annotation instead") from exc


def annotation_update(
    *,
    annotation: Annotation,
    author: Any,
    label: AnnotationLabel | int | str | None,
    note: str = "",
    step: int | str | None = None,
    scores: ScoresGiven | None = None,
) -> Annotation:
    """Change one's own annotation (label, note, step, and the scores named in
    ``scores``: an empty value removes that score, configs not named keep
    theirs); same validation as ``annotation_create``. Safe to repeat."""
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
        values = scores_clean(scores or {}, experiment_id=trial.candidate.experiment_id)
        locked.save(update_fields=["label", "step", "note", "updated_at"])
        _scores_write(locked, values)
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


def _named(name: str, description: str, *, what: str) -> tuple[str, str, str]:
    """A label's or score's name (spaces folded), its slug and its description, or AnnotationError."""
    name = " ".join((name or "").split())
    description = (description or "").strip()
    if not name:
        raise AnnotationError(f"a {what} needs a name")
    if len(name) > LABEL_NAME_MAX_CHARS:
        raise AnnotationError(f"the {what} name is too long (at most {LABEL_NAME_MAX_CHARS} characters)")
    if len(description) > LABEL_DESCRIPTION_MAX_CHARS:
        raise AnnotationError(f"the description is too long (at most {LABEL_DESCRIPTION_MAX_CHARS} characters)")
    slug = slugify(name)[:60].strip("-")
    if not slug:
        raise AnnotationError(f"the name {name!r} has no letters or digits to make a slug from")
    return name, slug, description


def label_create(*, experiment: Experiment, name: str, description: str = "") -> AnnotationLabel:
    """Add a team label to ``experiment``; the slug is made from the name.

    A name whose slug (or name, ignoring case) equals a default label's or
    one of this experiment's labels is refused with a clear message, so a
    slug always identifies one label within an experiment.
    """
    name, slug, description = _named(name, description, what="label")
    clash = labels_available(experiment=experiment).filter(Q(slug=slug) | Q(name__iexact=name)).first()
    if clash is not None:
        where = "a default label" if clash.experiment_id is None else "a label of this experiment"
        raise AnnotationError(f"{where} already exists with this name or slug: {clash.name!r} ({clash.slug})")
    try:
        with transaction.atomic():
            return AnnotationLabel.objects.create(experiment=experiment, slug=slug, name=name, description=description)
    except IntegrityError as exc:  # created concurrently
        raise AnnotationError(f"a label with the slug {slug!r} already exists") from exc


# --- scores -------------------------------------------------------------------------

SCORE_MAX_CHARS = 40


def score_configs(*, experiment: Experiment | int) -> QuerySet[AnnotationScoreConfig]:
    """The experiment's score configs, oldest first (the order of the form and the exports)."""
    experiment_id = experiment if isinstance(experiment, int) else experiment.pk
    return AnnotationScoreConfig.objects.filter(experiment_id=experiment_id).order_by("pk")


def score_range_text(config: AnnotationScoreConfig) -> str:
    """What a numeric config accepts, in words: "from 1 to 5", "at least 0", "any number"."""
    low, high = config.minimum, config.maximum
    if low is not None and high is not None:
        return f"from {low:g} to {high:g}"
    if low is not None:
        return f"at least {low:g}"
    if high is not None:
        return f"at most {high:g}"
    return "any number"


def score_value_clean(config: AnnotationScoreConfig, raw: str | float | bool | None) -> float | None:
    """The value ``raw`` stands for under ``config``, or None for no score (empty); AnnotationError names the
    score and what it accepts when ``raw`` does not fit."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if config.kind == AnnotationScoreConfig.Kind.BOOLEAN:
        if isinstance(raw, bool):
            return 1.0 if raw else 0.0
        word = str(raw).strip().lower()
        if word in YES_WORDS:
            return 1.0
        if word in NO_WORDS:
            return 0.0
        raise AnnotationError(f"the score {config.name!r} is yes or no, not {str(raw)[:SCORE_MAX_CHARS]!r}")
    if isinstance(raw, bool):
        raise AnnotationError(f"the score {config.name!r} is a number ({score_range_text(config)}), not yes/no")
    try:
        value = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (ValueError, OverflowError):
        value = math.nan
    if not math.isfinite(value):
        raise AnnotationError(
            f"the score {config.name!r} must be a number {score_range_text(config)}, not {str(raw)[:SCORE_MAX_CHARS]!r}"
        )
    if (config.minimum is not None and value < config.minimum) or (
        config.maximum is not None and value > config.maximum
    ):
        raise AnnotationError(f"the score {config.name!r} must be {score_range_text(config)}, not {value:g}")
    return value


def scores_clean(given: ScoresGiven, *, experiment_id: int) -> dict[AnnotationScoreConfig, float | None]:
    """Every given score checked against the experiment's configs (by id or slug) before anything is written."""
    configs = list(score_configs(experiment=experiment_id))
    by_key: dict[str, AnnotationScoreConfig] = {}
    for config in configs:
        by_key[str(config.pk)] = config
        by_key[config.slug] = config
    cleaned: dict[AnnotationScoreConfig, float | None] = {}
    for key, raw in given.items():
        found = by_key.get(str(key).strip())
        if found is None:
            raise AnnotationError(f"unknown score {str(key)[:SCORE_MAX_CHARS]!r} for this experiment")
        cleaned[found] = score_value_clean(found, raw)
    return cleaned


def _scores_write(annotation: Annotation, values: Mapping[AnnotationScoreConfig, float | None]) -> None:
    """Set or remove the annotation's scores; the caller holds the transaction."""
    for config, value in values.items():
        if value is None:
            AnnotationScore.objects.filter(annotation=annotation, config=config).delete()
        else:
            AnnotationScore.objects.update_or_create(annotation=annotation, config=config, defaults={"value": value})


def score_config_create(
    *,
    experiment: Experiment,
    name: str,
    kind: str,
    minimum: str | float | None = None,
    maximum: str | float | None = None,
    description: str = "",
) -> AnnotationScoreConfig:
    """Add a score config to ``experiment`` (slug made from the name). Bounds only for numeric scores, the
    minimum below the maximum; a name or slug the experiment already has is refused."""
    name, slug, description = _named(name, description, what="score")
    if kind not in AnnotationScoreConfig.Kind.values:
        raise AnnotationError(f"a score is numeric or boolean, not {str(kind)[:SCORE_MAX_CHARS]!r}")
    bounds: list[float | None] = []
    for which, raw in (("minimum", minimum), ("maximum", maximum)):
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            bounds.append(None)
            continue
        if kind == AnnotationScoreConfig.Kind.BOOLEAN:
            raise AnnotationError(f"a yes/no score has no {which}")
        try:
            bound = float(raw)
        except (TypeError, ValueError):
            bound = math.nan
        if not math.isfinite(bound):
            raise AnnotationError(f"the {which} must be a number, not {str(raw)[:SCORE_MAX_CHARS]!r}")
        bounds.append(bound)
    low, high = bounds
    if low is not None and high is not None and low >= high:
        raise AnnotationError(f"the minimum ({low:g}) must be below the maximum ({high:g})")
    clash = score_configs(experiment=experiment).filter(Q(slug=slug) | Q(name__iexact=name)).first()
    if clash is not None:
        raise AnnotationError(f"this experiment already has a score with this name or slug: {clash.name!r}")
    try:
        with transaction.atomic():
            return AnnotationScoreConfig.objects.create(
                experiment=experiment,
                slug=slug,
                name=name,
                kind=kind,
                minimum=low,
                maximum=high,
                description=description,
            )
    except IntegrityError as exc:  # created concurrently
        raise AnnotationError(f"a score with the slug {slug!r} already exists") from exc
