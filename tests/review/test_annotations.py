"""Screen 8: failure annotation (queue, trial panel, labels, statistics, exports)."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.http import StreamingHttpResponse
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evolution.models import Annotation, AnnotationLabel, CertifiedResult, Experiment, Trial
from evolution.services.annotations import annotation_create, label_create
from evolution.services.records import records_verify
from tests.review.world import grow

pytestmark = pytest.mark.django_db

XSS = "</script><img src=x onerror=alert(1)>"
FORMULA = "=cmd|' /C calc'!A0"
SEALED_PERM = ("evolution.view_sealed_details",)


def _csrf(client: Client) -> str:
    client.get(reverse("review:annotate_queue"))
    return client.cookies["csrftoken"].value


def _post(client: Client, url: str, data: dict[str, Any], *, htmx: bool = False) -> Any:
    headers: dict[str, Any] = {"HTTP_X_CSRFTOKEN": _csrf(client)}
    if htmx:
        headers["HTTP_HX_REQUEST"] = "true"
    return client.post(url, data, **headers)


def _failed(experiment: Experiment, *, split: str | None = None) -> Any:
    trials = Trial.objects.filter(candidate__experiment=experiment, outcome__in=["fail", "error"]).order_by("pk")
    return trials.filter(split=split) if split else trials


def _with_steps(experiment: Experiment) -> Trial:
    """A failed, non-sealed trial with a trajectory of at least two steps."""
    return _failed(experiment, split="train").filter(trajectory__step_count__gte=2).first()


def _label(slug: str) -> AnnotationLabel:
    return AnnotationLabel.objects.get(slug=slug, experiment=None)


def _user(name: str) -> User:
    return User.objects.get_or_create(username=name)[0]


def _queue_rows(client: Client, **params: Any) -> list[tuple[int, int]]:
    """(trial id, bucket) of every row of every page of the queue."""
    rows: list[tuple[int, int]] = []
    page = 1
    while True:
        response = client.get(reverse("review:annotate_queue"), {**params, "page": page})
        assert response.status_code == 200
        html = response.content.decode()
        rows += [(int(t), int(b)) for b, t in re.findall(r'<tr class="bucket-(\d)" data-trial="(\d+)">', html)]
        if f"page={page + 1}" not in html:
            return rows
        page += 1


def _certified_state(experiment: Experiment) -> tuple[Any, ...]:
    records = list(CertifiedResult.objects.filter(experiment=experiment).values().order_by("seq"))
    trials = list(
        Trial.objects.filter(candidate__experiment=experiment).values("pk", "outcome", "score").order_by("pk")
    )
    report = records_verify(experiment=experiment)
    return records, trials, report.ok, report.problems


# --- the queue ----------------------------------------------------------------


def test_the_queue_lists_unannotated_trials_first(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    client = client_as("annotator", username="ann")
    failed = list(_failed(example_world, split="train"))
    by_others, by_me, by_both = failed[0], failed[1], failed[2]
    annotation_create(trial=by_others, author=_user("bob"), label=_label("tool-misuse"))
    annotation_create(trial=by_me, author=_user("ann"), label=_label("other"))
    annotation_create(trial=by_both, author=_user("ann"), label=_label("other"))
    annotation_create(trial=by_both, author=_user("bob"), label=_label("other"))

    rows = _queue_rows(client, experiment=example_world.pk)
    ids = [trial_id for trial_id, _ in rows]
    buckets = [bucket for _, bucket in rows]
    assert sorted(ids) == sorted(_failed(example_world).exclude(split="sealed").values_list("pk", flat=True))
    assert buckets == sorted(buckets), "nobody-yet first, then needs-yours, then labelled by me"
    assert dict(rows)[by_others.pk] == 1
    assert dict(rows)[by_me.pk] == 2
    assert dict(rows)[by_both.pk] == 2
    assert buckets.count(0) == len(ids) - 3
    # The last rows are the ones I labelled; the one others labelled comes just before them.
    assert ids[-3] == by_others.pk


def test_the_queue_shows_labels_progress_and_links(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    client = client_as("annotator", username="ann")
    first, second = _failed(example_world, split="gate")[:2]
    annotation_create(trial=first, author=_user("bob"), label=_label("tool-misuse"))
    annotation_create(trial=first, author=_user("cat"), label=_label("judgment-error"))
    annotation_create(trial=second, author=_user("ann"), label=_label("judgment-error"))
    total = _failed(example_world).exclude(split="sealed").count()

    html = client.get(
        reverse("review:annotate_queue"), {"experiment": str(example_world.pk), "show": "mine"}
    ).content.decode()
    assert f'data-trial="{second.pk}"' in html
    assert f'data-trial="{first.pk}"' not in html  # filtered: not labelled by me

    # Labelled trials come after the unlabelled ones: find the page that lists it (the seed's noise repeats
    # give the example world more than one page of failed gate trials).
    for page in range(1, 10):
        html = client.get(
            reverse("review:annotate_queue"), {"experiment": str(example_world.pk), "split": "gate", "page": str(page)}
        ).content.decode()
        if f'data-trial="{first.pk}"' in html:
            break
    row = html[html.index(f'data-trial="{first.pk}"') :]
    row = row[: row.index("</tr>")]
    assert "Tool misuse" in row and "Judgment error (right data, wrong rule)" in row
    assert '<td class="num">2 <span class="muted small">of 2</span></td>' in row  # two annotators of the two wanted
    assert f'href="{reverse("review:trial", args=[first.pk])}#annotations"' in row
    assert f'href="{reverse("review:candidate", args=[first.candidate_id])}"' in row
    assert first.task.external_id in row
    # Progress: 2 of the visible failed trials labelled, 1 by two people, 1 by me; per annotator.
    assert f'<span data-testid="labelled">2 of {total}</span>' in html
    assert '<span data-testid="shared">1</span>' in html
    assert f'<span data-testid="mine">1 of {total}</span>' in html
    for name in ("ann", "bob", "cat"):
        assert f'<tr data-annotator="{name}"><td>{name}' in html


def test_the_queue_hides_sealed_trials_without_the_permission(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    sealed = set(_failed(example_world, split="sealed").values_list("pk", flat=True))
    assert sealed, "the example world has failed sealed trials"
    rows = _queue_rows(client_as("annotator", username="plain"), experiment=example_world.pk)
    assert not sealed & {trial_id for trial_id, _ in rows}
    assert len(rows) == _failed(example_world).exclude(split="sealed").count()

    rows = _queue_rows(client_as("annotator", username="sealer", extra_perms=SEALED_PERM), experiment=example_world.pk)
    assert sealed <= {trial_id for trial_id, _ in rows}
    assert len(rows) == _failed(example_world).count()


def test_an_unknown_experiment_filter_says_so(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    response = client_as("viewer").get(reverse("review:annotate_queue"), {"experiment": "nope"})
    assert response.status_code == 200
    assert "unknown experiment &#x27;nope&#x27;" in response.content.decode()


# --- the panel ----------------------------------------------------------------


def test_the_panel_is_a_fragment_for_htmx_and_a_page_otherwise(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("annotator")
    trial = _with_steps(example_world)
    url = reverse("review:trial_annotations", args=[trial.pk])
    fragment = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in fragment
    assert 'class="annotation-panel"' in fragment
    assert f'hx-post="{url}"' in fragment and 'hx-target="#annotations"' in fragment
    assert "Tool misuse" in fragment and "Other" in fragment  # the default labels in the select
    steps = trial.trajectory.steps.order_by("step_id")
    assert f'min="{steps[0].step_id}" max="{steps.reverse()[0].step_id}"' in fragment
    page = client.get(url).content.decode()
    assert page.startswith("<!doctype html>")
    assert '<div id="annotations">' in page and 'class="annotation-panel"' in page


def test_annotate_with_htmx_as_annotator(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    client = client_as("annotator", username="ann")
    trial = _with_steps(example_world)
    step_id = trial.trajectory.steps.order_by("step_id")[1].step_id
    url = reverse("review:trial_annotations", args=[trial.pk])
    response = _post(client, url, {"label": _label("tool-misuse").pk, "note": XSS, "step": step_id}, htmx=True)
    assert response.status_code == 200
    html = response.content.decode()
    annotation = Annotation.objects.get(trial=trial)
    assert (annotation.author.username, annotation.label.slug, annotation.note) == ("ann", "tool-misuse", XSS)
    assert annotation.step is not None
    assert annotation.step.step_id == step_id
    assert "<html" not in html
    assert "annotation saved" in html
    assert f'href="{reverse("review:trial", args=[trial.pk])}?step={step_id}#step-{step_id}"' in html
    # The note is text, not markup.
    assert XSS not in html
    assert "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<img src=x" not in html
    # The add form is gone (one annotation per person); edit and delete are offered.
    assert "Add your label" not in html
    assert reverse("review:annotation_delete", args=[annotation.pk]) in html
    assert f'name="annotation" value="{annotation.pk}"' in html
    # And the next trial to label is one click away: the queue's first one I have not labelled.
    found = re.search(r'href="/trials/(\d+)/#annotations" data-key="n"[^>]*>next trial to label', html)
    assert found is not None
    next_id = int(found.group(1))
    queue = _queue_rows(client, experiment=example_world.pk)
    assert next_id == next(t for t, bucket in queue if bucket < 2)
    assert next_id != trial.pk


def test_annotate_with_a_plain_post_redirects_to_the_trial(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("annotator", username="ann")
    trial = _failed(example_world, split="gate").first()
    url = reverse("review:trial_annotations", args=[trial.pk])
    response = _post(client, url, {"label": _label("judgment-error").pk, "note": "picked the wrong route"})
    assert response.status_code == 302
    assert response["Location"] == reverse("review:trial", args=[trial.pk]) + "#annotations"
    assert Annotation.objects.get(trial=trial).note == "picked the wrong route"
    page = client.get(url).content.decode()
    assert "annotation saved" in page  # the message, shown on the next page
    assert "picked the wrong route" in page


def test_viewers_read_but_may_not_write(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    trial = _failed(example_world, split="train").first()
    annotation = annotation_create(trial=trial, author=_user("ann"), label=_label("other"), note="seen by all")
    viewer = client_as("viewer")
    url = reverse("review:trial_annotations", args=[trial.pk])
    html = viewer.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert "seen by all" in html
    assert "<form" not in html and "needs the annotator role" in html
    assert "next trial to label" not in html
    assert _post(viewer, url, {"label": _label("other").pk}, htmx=True).status_code == 403
    assert _post(viewer, url, {"label": _label("other").pk}).status_code == 403
    delete = reverse("review:annotation_delete", args=[annotation.pk])
    assert _post(viewer, delete, {}).status_code == 403
    assert _post(viewer, reverse("review:label_add", args=[example_world.pk]), {"name": "Nope"}).status_code == 403
    assert Annotation.objects.count() == 1
    assert not AnnotationLabel.objects.filter(name="Nope").exists()


def test_writes_need_the_csrf_token(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    client = client_as("annotator")
    trial = _failed(example_world, split="train").first()
    response = client.post(reverse("review:trial_annotations", args=[trial.pk]), {"label": _label("other").pk})
    assert response.status_code == 403
    assert not Annotation.objects.exists()


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("999999", "unknown label 999999"),
        ("tool-misuse", "unknown label &#x27;tool-misuse&#x27;"),
        ("", "choose a label"),
        ("foreign", "belongs to another experiment"),
    ],
)
def test_a_bad_label_is_refused_with_a_message(
    example_world: Experiment, client_as: Callable[..., Client], label: str, message: str
) -> None:
    if label == "foreign":
        other = Experiment.objects.create(
            name="elsewhere",
            benchmark=example_world.benchmark,
            evaluator=example_world.evaluator,
            surface=example_world.surface,
        )
        label = str(label_create(experiment=other, name="Their label").pk)
    client = client_as("annotator")
    trial = _failed(example_world, split="train").first()
    url = reverse("review:trial_annotations", args=[trial.pk])
    response = _post(client, url, {"label": label, "note": "kept in the form"}, htmx=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert "Not saved: " in html and message in html
    assert ">kept in the form</textarea>" in html  # what was typed survives
    response = _post(client, url, {"label": label})
    assert response.status_code == 302
    assert message in client.get(url).content.decode()
    assert not Annotation.objects.exists()


def test_the_step_anchor_must_belong_to_the_trials_trajectory(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("annotator")
    trial = _with_steps(example_world)
    last = trial.trajectory.steps.order_by("-step_id")[0].step_id
    # A step of another trial's (longer) trajectory is not a step of this one.
    grow(example_world, candidates=1, steps=last + 5)
    url = reverse("review:trial_annotations", args=[trial.pk])
    for step in (last + 1, last + 5, "abc", -1):
        html = _post(client, url, {"label": _label("other").pk, "step": step}, htmx=True).content.decode()
        assert "Not saved: " in html and "step" in html
    assert not Annotation.objects.exists()
    _post(client, url, {"label": _label("other").pk, "step": last}, htmx=True)
    anchor = Annotation.objects.get().step
    assert anchor is not None and anchor.trajectory.trial_id == trial.pk


def test_a_sealed_trials_panel_needs_the_sealed_permission(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    trial = _failed(example_world, split="sealed").first()
    url = reverse("review:trial_annotations", args=[trial.pk])
    plain = client_as("annotator", username="plain")
    assert plain.get(url, HTTP_HX_REQUEST="true").status_code == 404
    assert _post(plain, url, {"label": _label("other").pk}, htmx=True).status_code == 404
    assert not Annotation.objects.exists()
    sealer = client_as("annotator", username="sealer", extra_perms=SEALED_PERM)
    assert sealer.get(url, HTTP_HX_REQUEST="true").status_code == 200
    assert _post(sealer, url, {"label": _label("other").pk}, htmx=True).status_code == 200
    annotation = Annotation.objects.get()
    # Not even its author's delete goes through without the permission... and with it, it does.
    assert _post(plain, reverse("review:annotation_delete", args=[annotation.pk]), {}).status_code == 404
    assert _post(sealer, reverse("review:annotation_delete", args=[annotation.pk]), {}).status_code == 302


def test_passed_trials_are_not_annotated(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    client = client_as("annotator")
    trial = Trial.objects.filter(candidate__experiment=example_world, outcome="pass", split="train").first()
    assert trial is not None
    url = reverse("review:trial_annotations", args=[trial.pk])
    assert "Only failed trials are annotated" in client.get(url, HTTP_HX_REQUEST="true").content.decode()
    html = _post(client, url, {"label": _label("other").pk}, htmx=True).content.decode()
    assert "only failed trials are annotated" in html
    assert not Annotation.objects.exists()


def test_update_and_delete_only_ones_own(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    trial = _with_steps(example_world)
    url = reverse("review:trial_annotations", args=[trial.pk])
    ann = client_as("annotator", username="ann")
    bob = client_as("annotator", username="bob")
    _post(ann, url, {"label": _label("tool-misuse").pk, "note": "first"}, htmx=True)
    mine = Annotation.objects.get(author__username="ann")

    # Bob's panel offers no edit or delete of Ann's annotation, and the server refuses both.
    html = bob.get(url, HTTP_HX_REQUEST="true").content.decode()
    assert reverse("review:annotation_delete", args=[mine.pk]) not in html
    edit = {"annotation": mine.pk, "label": _label("other").pk, "note": "bob was here"}
    assert _post(bob, url, edit, htmx=True).status_code == 403
    assert _post(bob, reverse("review:annotation_delete", args=[mine.pk]), {}, htmx=True).status_code == 403
    mine.refresh_from_db()
    assert (mine.label.slug, mine.note) == ("tool-misuse", "first")

    step_id = trial.trajectory.steps.order_by("step_id")[0].step_id
    edit = {"annotation": mine.pk, "label": _label("other").pk, "note": "on reflection", "step": step_id}
    html = _post(ann, url, edit, htmx=True).content.decode()
    assert "your annotation was updated" in html
    mine.refresh_from_db()
    assert mine.step is not None
    assert (mine.label.slug, mine.note, mine.step.step_id) == ("other", "on reflection", step_id)
    assert Annotation.objects.count() == 1

    html = _post(ann, reverse("review:annotation_delete", args=[mine.pk]), {}, htmx=True).content.decode()
    assert "your annotation was deleted" in html and "Add your label" in html
    assert not Annotation.objects.exists()


def test_annotating_through_the_screens_never_changes_certified_results(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    before = _certified_state(example_world)
    assert before[0] and before[2] is True, before[3]
    client = client_as("annotator", username="ann", extra_perms=SEALED_PERM)
    trials = list(_failed(example_world)[:3]) + [_failed(example_world, split="sealed").first()]
    for trial in trials:
        _post(client, reverse("review:trial_annotations", args=[trial.pk]), {"label": _label("tool-misuse").pk})
    assert Annotation.objects.count() == 4
    assert _certified_state(example_world) == before
    first = Annotation.objects.order_by("pk").first()
    assert first is not None
    url = reverse("review:trial_annotations", args=[first.trial_id])
    _post(client, url, {"annotation": first.pk, "label": _label("other").pk, "note": "changed"})
    assert _certified_state(example_world) == before
    for annotation in Annotation.objects.all():
        _post(client, reverse("review:annotation_delete", args=[annotation.pk]), {})
    assert not Annotation.objects.exists()
    _post(client, reverse("review:label_add", args=[example_world.pk]), {"name": "Flaky verifier"})
    assert _certified_state(example_world) == before


# --- labels -------------------------------------------------------------------


def test_a_team_adds_a_label_to_its_experiment(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    client = client_as("annotator")
    url = reverse("review:label_add", args=[example_world.pk])
    stats = reverse("review:annotation_stats", args=[example_world.pk])
    response = _post(client, url, {"name": "Wrong unit conversion", "description": "kg <b>vs</b> lb"})
    assert response.status_code == 302 and response["Location"] == stats
    label = AnnotationLabel.objects.get(experiment=example_world)
    assert (label.slug, label.name) == ("wrong-unit-conversion", "Wrong unit conversion")
    html = client.get(stats).content.decode()
    assert "label &#x27;Wrong unit conversion&#x27; (wrong-unit-conversion) added" in html
    assert "kg &lt;b&gt;vs&lt;/b&gt; lb" in html
    # The label is offered on the experiment's trials.
    trial = _failed(example_world, split="train").first()
    panel = client.get(reverse("review:trial_annotations", args=[trial.pk]), HTTP_HX_REQUEST="true").content.decode()
    assert f'<option value="{label.pk}"' in panel and f"Labels of {example_world.name}" in panel

    for name in ("wrong unit conversion", "Tool misuse"):
        _post(client, url, {"name": name})
        assert "label not added" in client.get(stats).content.decode()
    assert AnnotationLabel.objects.filter(experiment=example_world).count() == 1


def test_label_add_goes_back_only_to_this_site(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    client = client_as("annotator")
    url = reverse("review:label_add", args=[example_world.pk])
    response = _post(client, url, {"name": "Ours", "next": "https://evil.example/"})
    assert response["Location"] == reverse("review:annotation_stats", args=[example_world.pk])
    response = _post(client, url, {"name": "Ours too", "next": "/trials/1/#annotations"})
    assert response["Location"] == "/trials/1/#annotations"


# --- statistics ---------------------------------------------------------------


def _labelled_world(experiment: Experiment) -> dict[str, Any]:
    """Four non-sealed failed trials labelled by ann, bob and cat, plus one
    sealed trial labelled by ann (hidden from users without the permission).

    trial  ann  bob  cat
    t0     x    x    y
    t1     y    y    y
    t2     x    y    -
    t3     x    -    -
    ann/bob over t0..t2: kappa 0.4 (see tests/evolution/test_agreement.py);
    ann/cat and bob/cat over t0, t1: kappa 0. Mean 0.4 / 3.
    """
    x, y = _label("tool-misuse"), _label("judgment-error")
    trials = list(_failed(experiment, split="train")[:4])
    plan = {
        0: {"ann": x, "bob": x, "cat": y},
        1: {"ann": y, "bob": y, "cat": y},
        2: {"ann": x, "bob": y},
        3: {"ann": x},
    }
    for index, by in plan.items():
        for name, label in by.items():
            annotation_create(trial=trials[index], author=_user(name), label=label, note=f"{name} on t{index}")
    sealed = _failed(experiment, split="sealed").first()
    annotation_create(trial=sealed, author=_user("ann"), label=_label("other"), note="sealed secret")
    return {"trials": trials, "sealed": sealed}


def test_the_stats_page_counts_labels_and_measures_agreement(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    world = _labelled_world(example_world)
    html = client_as("viewer").get(reverse("review:annotation_stats", args=[example_world.pk])).content.decode()

    def cell(row_attr: str, testid: str) -> str:
        row = html[html.index(row_attr) :]
        found = re.search(rf'data-testid="{testid}">(?:<strong>)?([^<]*)<', row)
        assert found is not None
        return found.group(1)

    # Label counts: 4 x (tool-misuse), 5 y (judgment-error); the sealed "other" is not counted.
    assert cell('data-label="tool-misuse"', "count") == "4"
    assert cell('data-label="judgment-error"', "count") == "5"
    assert cell('data-label="other"', "count") == "0"
    assert "9 annotations in" in html
    # Agreement per pair with n, and the mean.
    assert cell('data-pair="ann|bob"', "kappa") == "0.400"
    assert cell('data-pair="ann|cat"', "kappa") == "0.000"
    assert cell('data-pair="bob|cat"', "kappa") == "0.000"
    pair = html[html.index('data-pair="ann|bob"') :]
    assert re.search(r'<td class="num">3</td>\s*<td class="num">0.67</td>\s*<td class="num">0.44</td>', pair)
    assert re.search(r'data-testid="mean-kappa">0.133<', html)
    assert "3 trials" in html  # shared by two or more
    # Per candidate: every labelled trial is the seed's or another candidate's; counts add up.
    candidates = {t.candidate_id for t in world["trials"]}
    for candidate_id in candidates:
        assert f'data-candidate="{candidate_id}"' in html
    # Progress per annotator (of visible failed trials).
    total = _failed(example_world).exclude(split="sealed").count()
    assert f'<span data-testid="labelled">4 of {total}</span>' in html
    assert '<tr data-annotator="ann"><td>ann</td><td class="num">4</td>' in html
    # Disagreements: t0 and t2.
    assert f"trial #{world['trials'][0].pk}</a>" in html and f"trial #{world['trials'][2].pk}</a>" in html
    assert f"trial #{world['trials'][1].pk}</a>" not in html
    assert "sealed secret" not in html


def test_the_per_candidate_table_counts_each_label(example_world: Experiment, client_as: Callable[..., Client]) -> None:
    trials = list(_failed(example_world, split="train").order_by("candidate_id", "pk"))
    candidate_id = trials[0].candidate_id
    own = [t for t in trials if t.candidate_id == candidate_id]
    annotation_create(trial=own[0], author=_user("ann"), label=_label("tool-misuse"))
    annotation_create(trial=own[0], author=_user("bob"), label=_label("tool-misuse"))
    html = client_as("viewer").get(reverse("review:annotation_stats", args=[example_world.pk])).content.decode()
    row = html[html.index(f'data-candidate="{candidate_id}"') :]
    row = row[: row.index("</tr>")]
    cells = re.findall(r'<td class="num(?: muted)?">(\d+)</td>', row)
    labels = [label.slug for label in AnnotationLabel.objects.filter(experiment=None).order_by("pk")]
    failed = _failed(example_world).exclude(split="sealed").filter(candidate_id=candidate_id).count()
    assert cells[:2] == [str(failed), "1"]  # failed trials, labelled trials
    assert cells[2 + labels.index("tool-misuse")] == "2"
    assert sum(int(c) for c in cells[2:]) == 2


def test_the_stats_page_says_when_agreement_is_undefined(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    trial = _failed(example_world, split="train").first()
    annotation_create(trial=trial, author=_user("ann"), label=_label("other"))
    annotation_create(trial=trial, author=_user("bob"), label=_label("other"))
    html = client_as("viewer").get(reverse("review:annotation_stats", args=[example_world.pk])).content.decode()
    assert "both annotators used one label only (other)" in html
    assert 'data-testid="mean-kappa">undefined<' in html


# --- exports ------------------------------------------------------------------


def _download(client: Client, name: str, experiment: Experiment) -> tuple[Any, str]:
    response = client.get(reverse(name, args=[experiment.pk]))
    assert response.status_code == 200
    assert isinstance(response, StreamingHttpResponse)
    return response, b"".join(response.streaming_content).decode()


def test_the_csv_export_is_complete_and_safe_in_spreadsheets(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    trial = _with_steps(example_world)
    step = trial.trajectory.steps.order_by("step_id").first()
    assert step is not None
    annotation_create(trial=trial, author=_user("ann"), label=_label("tool-misuse"), note=FORMULA, step=step.step_id)
    other = _failed(example_world, split="gate").first()
    annotation_create(trial=other, author=_user("bob"), label=_label("other"), note=XSS)
    for note in ("+1", "-2", "@SUM(A1)"):
        annotation_create(trial=other, author=_user(f"u{note[0]}"), label=_label("other"), note=note)
    sealed = _failed(example_world, split="sealed").first()
    annotation_create(trial=sealed, author=_user("cat"), label=_label("other"), note="sealed secret")

    response, text = _download(client_as("viewer"), "review:annotations_csv", example_world)
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="annotations-example-routing.csv"'
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == [
        "experiment", "candidate_id", "trial_id", "task", "split", "trial_index", "outcome", "label_slug",
        "label_name", "note", "step_id", "author", "created_at", "updated_at",
    ]  # fmt: skip
    assert len(rows) == 5
    assert "sealed secret" not in text
    first = next(r for r in rows if r["author"] == "ann")
    assert first == {
        **first,
        "experiment": "example-routing",
        "candidate_id": str(trial.candidate_id),
        "trial_id": str(trial.pk),
        "task": trial.task.external_id,
        "split": "train",
        "trial_index": str(trial.index),
        "outcome": trial.outcome,
        "label_slug": "tool-misuse",
        "label_name": "Tool misuse",
        "note": "'" + FORMULA,  # a formula becomes text
        "step_id": str(step.step_id),
    }
    notes = {r["author"]: r["note"] for r in rows}
    assert notes["u+"] == "'+1" and notes["u-"] == "'-2" and notes["u@"] == "'@SUM(A1)"
    assert notes["bob"] == XSS  # CSV is data, not HTML: the text is kept as it was
    assert next(r for r in rows if r["author"] == "bob")["step_id"] == ""

    _response, text = _download(
        client_as("viewer", username="sealer", extra_perms=SEALED_PERM), "review:annotations_csv", example_world
    )
    assert "sealed secret" in text and len(list(csv.DictReader(io.StringIO(text)))) == 6


def test_the_jsonl_export_round_trips_and_stays_inert(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    trial = _failed(example_world, split="train").first()
    annotation_create(trial=trial, author=_user("ann"), label=_label("tool-misuse"), note=XSS + " & " + FORMULA)
    sealed = _failed(example_world, split="sealed").first()
    annotation_create(trial=sealed, author=_user("cat"), label=_label("other"), note="sealed secret")

    response, text = _download(client_as("viewer"), "review:annotations_jsonl", example_world)
    assert response["Content-Type"].startswith("application/x-ndjson")
    assert response["Content-Disposition"] == 'attachment; filename="annotations-example-routing.jsonl"'
    assert "</script>" not in text and "<img" not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 1
    row = lines[0]
    assert row["note"] == XSS + " & " + FORMULA  # exact text back after parsing
    assert (row["trial_id"], row["candidate_id"], row["label_slug"], row["author"]) == (
        trial.pk,
        trial.candidate_id,
        "tool-misuse",
        "ann",
    )
    assert row["step_id"] is None and row["split"] == "train" and row["outcome"] == trial.outcome

    _response, text = _download(client_as("admin"), "review:annotations_jsonl", example_world)
    assert len(text.splitlines()) == 2 and "sealed secret" in text


def test_exports_need_login(example_world: Experiment) -> None:
    response = Client().get(reverse("review:annotations_csv", args=[example_world.pk]))
    assert response.status_code == 302 and "/login/" in response["Location"]


# --- query counts -------------------------------------------------------------


def _count_queries(client: Client, url: str, params: dict[str, Any] | None = None) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, params or {})
    assert response.status_code == 200
    return len(queries)


def test_query_counts_do_not_grow_with_the_experiment(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    client = client_as("annotator", username="ann")
    _labelled_world(example_world)
    pages: list[tuple[str, dict[str, Any]]] = [
        (reverse("review:annotate_queue"), {"experiment": example_world.pk}),
        (reverse("review:annotate_queue"), {}),
        (reverse("review:annotation_stats", args=[example_world.pk]), {}),
    ]
    trial = _with_steps(example_world)
    panel: tuple[str, dict[str, Any]] = (reverse("review:trial_annotations", args=[trial.pk]), {})
    client.get(pages[0][0])  # warm the session and permission caches alike
    small = [_count_queries(client, url, params) for url, params in [*pages, panel]]

    grow(example_world, candidates=40, steps=300)
    for trial in _failed(example_world).filter(candidate__label__startswith="grown")[:30]:
        annotation_create(trial=trial, author=_user("bob"), label=_label("tool-misuse"))
        annotation_create(trial=trial, author=_user("cat"), label=_label("other"))
    assert _failed(example_world).count() > 3 * 50  # more than the first page, many candidates
    large = [_count_queries(client, url, params) for url, params in [*pages, panel]]
    assert large == small
