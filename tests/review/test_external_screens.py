"""External results on the screens: kept out of the matrix, the parent
comparison and the annotation queue, shown apart (labelled external) on the
candidate page and with a notice on the trial page."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from evolution.models import (
    Annotation,
    AnnotationLabel,
    Candidate,
    CertifiedResult,
    Evaluation,
    Experiment,
    SplitMembership,
    SplitName,
    Trial,
)
from evolution.services.external import external_results_ingest
from review.views.annotations import EXTERNAL_REFUSAL

pytestmark = pytest.mark.django_db

XSS = "</script><img src=x onerror=alert(1)>"
SEALED = ("evolution.view_sealed_details",)
NOTICE = "External result — not run or certified by rsiweb"


def _ingest(candidate: Candidate, *, index: int = 0, source: dict[str, Any] | None = None) -> Evaluation:
    """Failed external results on every task of the candidate's own benchmark
    (failures, so they would land in the annotation queue if let in)."""
    tasks = (
        SplitMembership.objects.filter(experiment_id=candidate.experiment_id)
        .exclude(split=SplitName.HELDOUT)
        .values_list("task__external_id", flat=True)
    )
    results = [{"task": task, "index": index, "passed": False, "score": 0.0, "tokens": 1000} for task in tasks]
    return external_results_ingest(candidate=candidate, results=results, source=source or {"tool": "harbor"})


def _child_with_parent(experiment: Experiment) -> Candidate:
    """A proposed candidate with certified trials whose parent has certified trials too."""
    child = (
        Candidate.objects.filter(
            experiment=experiment,
            origin=Candidate.Origin.PROPOSED,
            certified_results__isnull=False,
            parent__certified_results__isnull=False,
        )
        .select_related("parent")
        .order_by("pk")
        .first()
    )
    assert child is not None, "the example world has a certified child of a certified parent"
    return child


def _html(response: Any) -> str:
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def _section(html: str, heading_id: str) -> str:
    start = html.index(f'aria-labelledby="{heading_id}"')
    return html[start : html.index("</section>", start)]


def _matrix_table(client: Client, experiment: Experiment, **params: str) -> str:
    html = _html(client.get(reverse("review:matrix", args=[experiment.pk]), params))
    return html[html.index("<table") : html.rindex("</table>")]


# --- the matrix -----------------------------------------------------------------------


def test_matrix_cells_and_columns_are_unchanged_by_external_results(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("viewer", extra_perms=SEALED)
    child = _child_with_parent(example_world)
    never_ran = Candidate.objects.filter(experiment=example_world, trials__isnull=True).order_by("pk").first()
    assert never_ran is not None, "the example world has candidates that were never evaluated"
    before = _matrix_table(client, example_world)
    before_improved = _matrix_table(client, example_world, change="improved")
    assert f'data-candidate="{never_ran.pk}"' not in before

    assert child.parent is not None
    ingested = [_ingest(child), _ingest(child.parent), _ingest(never_ran)]
    external_trials = Trial.objects.filter(evaluation__in=ingested)
    assert (
        external_trials.count()
        == 3 * SplitMembership.objects.filter(experiment=example_world).exclude(split=SplitName.HELDOUT).count()
    )

    after = _matrix_table(client, example_world)
    assert after == before
    # Parent comparisons (improved/regressed against the parent) ignore them too.
    assert _matrix_table(client, example_world, change="improved") == before_improved
    # A candidate with external results only is not a column, and no cell links to an external trial.
    assert f'data-candidate="{never_ran.pk}"' not in after
    linked = {int(pk) for pk in re.findall(r'href="/trials/(\d+)/"', after)}
    assert linked
    assert not linked & set(external_trials.values_list("pk", flat=True))


# --- the candidate page ---------------------------------------------------------------


def test_candidate_page_shows_external_results_apart_from_its_certified_record(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("viewer")
    child = _child_with_parent(example_world)
    url = reverse("review:candidate", args=[child.pk])
    before = _html(client.get(url))
    assert "badge external" not in before
    assert 'id="external"' not in before

    first = _ingest(child, source={"tool": "harbor", "job": "job-7"})
    second = _ingest(child, index=1, source={"tool": "harbor", "job": "job-8"})
    html = _html(client.get(url))

    assert '<span class="badge external">external results ×2</span>' in html
    # The certified parts are exactly as before: the record badges, the certification and the results per split.
    records = CertifiedResult.objects.filter(candidate=child).count()
    assert records and html.count("badge certified") == before.count("badge certified") == 1
    assert _section(html, "certification") == _section(before, "certification")
    assert _section(html, "results") == _section(before, "results")

    card = _section(html, "external")
    assert "External results (not certified by rsiweb)" in card
    for evaluation, job in ((first, "job-7"), (second, "job-8")):
        assert f"evaluation #{evaluation.pk}" in card
        assert escape(f'"job": "{job}"') in card
    # Newest first.
    assert card.index(f"evaluation #{second.pk}") < card.index(f"evaluation #{first.pk}")
    shown_tasks = SplitMembership.objects.filter(experiment=example_world).exclude(split=SplitName.HELDOUT).count()
    assert f'<dt>trials</dt><dd class="num">{shown_tasks}</dd>' in card
    assert '<dt>passed</dt><dd class="num">0</dd>' in card
    assert "0.000" in card  # mean score
    assert "1,000" in card  # mean tokens
    # Per-split rows, each labelled external; sealed only as an aggregate row.
    rows = re.findall(
        r'<td><span class="split (\w+)">\w+</span> <span class="badge external">external</span></td>', card
    )
    splits = set(
        SplitMembership.objects.filter(experiment=example_world)
        .exclude(split=SplitName.HELDOUT)
        .values_list("split", flat=True)
    )
    assert sorted(rows) == sorted([*splits, *splits])  # two submissions
    sealed_tasks = SplitMembership.objects.filter(experiment=example_world, split=SplitName.SEALED).values_list(
        "task__external_id", flat=True
    )
    assert sealed_tasks
    for task in sealed_tasks:
        assert task not in card


def test_candidate_page_escapes_the_external_source(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    child = _child_with_parent(example_world)
    _ingest(child, source={"tool": XSS})
    html = _html(client_as("viewer").get(reverse("review:candidate", args=[child.pk])))
    assert XSS not in html
    assert "<img src=x" not in html
    assert escape(XSS) in _section(html, "external")


# --- the trial page -------------------------------------------------------------------


def test_trial_page_of_an_external_trial_says_so_with_its_source(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("viewer")
    child = _child_with_parent(example_world)
    evaluation = _ingest(child, source={"tool": XSS, "job": "job-7"})
    trial = Trial.objects.filter(evaluation=evaluation).exclude(split=SplitName.SEALED).order_by("pk").first()
    assert trial is not None
    html = _html(client.get(reverse("review:trial", args=[trial.pk])))
    assert NOTICE in html  # the badge's title
    assert "external result — not run or certified by rsiweb</span>" in html  # the badge
    notice = html[html.index(NOTICE) :]
    notice = notice[: notice.index('"')]  # to the end of the title attribute
    assert f"evaluation #{evaluation.pk}" in notice
    assert escape('"job": "job-7"') in notice
    assert escape(XSS) in notice
    source_row = html[html.index("<dt>Source</dt>") :]
    assert escape('"job": "job-7"') in source_row[: source_row.index("</dd>")]
    assert XSS not in html

    # A trial we ran has no such notice; a sealed external trial is 404 like any sealed trial.
    ours = Trial.objects.filter(candidate=child, evaluation__external=False).exclude(split=SplitName.SEALED).first()
    assert ours is not None
    assert NOTICE not in _html(client.get(reverse("review:trial", args=[ours.pk])))
    sealed = Trial.objects.filter(evaluation=evaluation, split=SplitName.SEALED).first()
    assert sealed is not None
    assert client.get(reverse("review:trial", args=[sealed.pk])).status_code == 404
    assert (
        client_as("viewer", username="sealer", extra_perms=SEALED)
        .get(reverse("review:trial", args=[sealed.pk]))
        .status_code
        == 200
    )


def test_parent_comparison_never_picks_an_external_trial(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("viewer")
    child = _child_with_parent(example_world)
    # Index 5 exists only in the external submissions: the parent has no trial of ours there.
    assert child.parent is not None
    _ingest(child.parent, index=5)
    evaluation = _ingest(child, index=5)
    trial = Trial.objects.filter(evaluation=evaluation).exclude(split=SplitName.SEALED).order_by("pk").first()
    assert trial is not None
    response = client.get(reverse("review:trial", args=[trial.pk]))
    assert response.status_code == 200
    assert response.context["parent_trial"] is None
    assert "Compare with another trial…" in response.content.decode()
    compare = client.get(reverse("review:trial_compare", args=[trial.pk]))
    assert compare.status_code == 200
    assert compare.context["other"] is None

    # A trial we ran still finds the parent's trial of ours, not the parent's external one.
    ours = Trial.objects.filter(candidate=child, evaluation__external=False, split=SplitName.TRAIN).first()
    assert ours is not None and child.parent is not None
    _ingest(child.parent, index=ours.index)
    parent = client.get(reverse("review:trial", args=[ours.pk])).context["parent_trial"]
    assert parent is not None
    assert Trial.objects.get(pk=parent["pk"]).evaluation.external is False


# --- annotation -----------------------------------------------------------------------


def test_annotation_queue_leaves_external_trials_out(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("annotator", extra_perms=SEALED)
    url = reverse("review:annotate_queue")
    before = client.get(url, {"experiment": example_world.pk}).context["progress"]["total"]
    evaluation = _ingest(_child_with_parent(example_world))
    external = set(Trial.objects.filter(evaluation=evaluation).values_list("pk", flat=True))
    assert external

    response = client.get(url, {"experiment": example_world.pk})
    assert response.status_code == 200
    assert response.context["progress"]["total"] == before
    listed = {trial.pk for trial in response.context["page"].paginator.object_list}
    assert listed
    assert not listed & external
    stats = client.get(reverse("review:annotation_stats", args=[example_world.pk]))
    assert stats.status_code == 200


def test_annotating_an_external_trial_is_refused_with_a_message(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("annotator")
    evaluation = _ingest(_child_with_parent(example_world))
    trial = Trial.objects.filter(evaluation=evaluation, split=SplitName.TRAIN).first()
    assert trial is not None
    url = reverse("review:trial_annotations", args=[trial.pk])
    client.get(reverse("review:annotate_queue"))
    token = client.cookies["csrftoken"].value
    label = AnnotationLabel.objects.get(slug="other", experiment=None)

    html = _html(client.post(url, {"label": label.pk}, HTTP_X_CSRFTOKEN=token, HTTP_HX_REQUEST="true"))
    assert escape(EXTERNAL_REFUSAL) in html
    response = client.post(url, {"label": label.pk}, HTTP_X_CSRFTOKEN=token, follow=True)
    assert f"not saved: {escape(EXTERNAL_REFUSAL)}" in _html(response)
    assert not Annotation.objects.filter(trial=trial).exists()


def test_the_annotation_service_itself_refuses_external_trials(example_world: Experiment, make_user) -> None:
    from evolution.models import AnnotationLabel
    from evolution.services.annotations import AnnotationError, annotation_create

    evaluation = _ingest(_child_with_parent(example_world))
    failed = Trial.objects.filter(evaluation=evaluation, outcome=Trial.Outcome.FAIL).first()
    assert failed is not None
    label = AnnotationLabel.objects.filter(experiment__isnull=True).first()
    with pytest.raises(AnnotationError, match="external result"):
        annotation_create(trial=failed, author=make_user("annotator"), label=label, note="n")
    assert not failed.annotations.exists()
