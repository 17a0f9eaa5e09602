"""Behaviour and permissions of /api/v1/."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from evolution.access import SEALED
from evolution.loop import lifecycle
from evolution.models import (
    Annotation,
    AnnotationLabel,
    Candidate,
    LedgerEntry,
    ReviewDecision,
    Run,
    SplitMembership,
    SplitName,
    Task,
    Trial,
)
from evolution.recipes import load_preset
from evolution.services.annotations import score_config_create
from tests.api.conftest import CANARY, World
from tests.factories import seed_of

pytestmark = pytest.mark.django_db

V1 = "/api/v1"


def _all(client: APIClient, url: str) -> list[dict[str, Any]]:
    """Every row of a cursor-paginated list."""
    rows: list[dict[str, Any]] = []
    while url:
        response = client.get(url)
        assert response.status_code == 200, response.content
        rows += response.json()["results"]
        url = response.json()["next"]
    return rows


# --- Authentication ---------------------------------------------------------------


def test_anonymous_is_refused_everywhere(api_world: World) -> None:
    anonymous = APIClient()
    for url in ("/experiments/", "/trials/", f"/trials/{api_world.train_trial.pk}/trajectory/", "/annotations/"):
        assert anonymous.get(V1 + url).status_code == 401
    assert anonymous.post(V1 + "/runs/", {}, format="json").status_code == 401


def test_bad_token_is_refused_and_good_token_works(api_world: World, api_as: Any) -> None:
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert bad.get(V1 + "/experiments/").status_code == 401
    viewer = api_as("viewer")
    response = viewer.get(V1 + "/experiments/")
    assert response.status_code == 200
    assert [row["name"] for row in response.json()["results"]] == [api_world.experiment.name]


def test_user_without_a_role_is_refused(api_world: World, api_as: Any) -> None:
    assert api_as().get(V1 + "/experiments/").status_code == 403


def test_session_auth_needs_csrf_for_writes(api_world: World, make_user: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(make_user("operator"))
    assert client.get(V1 + "/runs/").status_code == 200
    body = json.dumps({"experiment": api_world.experiment.pk, "recipe": "rrsi", "proposer": "example"})
    response = client.post(V1 + "/runs/", body, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert not Run.objects.exists()


# --- Benchmarks, tasks, experiments -----------------------------------------------


def test_tasks_never_expose_expected(api_world: World, api_as: Any) -> None:
    viewer = api_as("viewer")
    rows = _all(viewer, f"{V1}/tasks/?benchmark={api_world.experiment.benchmark_id}")
    # A viewer gets the tasks no experiment seals; the sealed ones are withheld.
    sealed = set(SplitMembership.objects.filter(split=SplitName.SEALED).values_list("task_id", flat=True))
    assert sealed and {row["id"] for row in rows} == set(
        Task.objects.filter(benchmark_id=api_world.experiment.benchmark_id)
        .exclude(pk__in=sealed)
        .values_list("pk", flat=True)
    )
    task = Task.objects.get(pk=rows[0]["id"])
    assert rows[0]["instruction"] == task.instruction
    assert rows[0]["criteria_ids"] == ["answer"]
    assert "expected" not in rows[0]
    detail = viewer.get(f"{V1}/tasks/{task.pk}/").json()
    assert "expected" not in detail
    assert '"answer": "no"' not in json.dumps(detail) and '"answer": "yes"' not in json.dumps(detail)
    assert viewer.get(f"{V1}/benchmarks/{task.benchmark_id}/").json()["task_count"] == 4


def test_experiment_detail_has_split_sizes_and_digests(api_world: World, api_as: Any) -> None:
    detail = api_as("viewer").get(f"{V1}/experiments/{api_world.experiment.pk}/").json()
    assert detail["split_sizes"] == {"train": 2, "gate": 1, "sealed": 1}
    assert detail["split_digests"] == api_world.experiment.split_digests
    assert detail["chain_length"] == 1


def test_bad_filter_value_is_400_naming_the_parameter(api_world: World, api_as: Any) -> None:
    response = api_as("viewer").get(f"{V1}/trials/?outcome=maybe&experiment=x")
    assert response.status_code == 400
    assert set(response.json()) == {"outcome", "experiment"}


# --- Sealed hiding ----------------------------------------------------------------


def test_sealed_trials_are_hidden_from_viewers_in_list_filter_and_detail(api_world: World, api_as: Any) -> None:
    viewer = api_as("viewer")
    rows = _all(viewer, f"{V1}/trials/?experiment={api_world.experiment.pk}")
    visible = Trial.objects.filter(candidate__experiment=api_world.experiment).exclude(split=SplitName.SEALED)
    assert sorted(row["id"] for row in rows) == sorted(visible.values_list("pk", flat=True))
    assert viewer.get(f"{V1}/trials/?split=sealed").json()["results"] == []
    assert viewer.get(f"{V1}/trials/{api_world.sealed_trial.pk}/").status_code == 404
    assert viewer.get(f"{V1}/trials/{api_world.sealed_trial.pk}/trajectory/").status_code == 404
    seen = json.dumps(rows)
    assert CANARY not in seen


def test_sealed_trials_are_shown_with_the_permission(api_world: World, api_as: Any) -> None:
    admin = api_as("viewer", extra_perms=(SEALED,))
    rows = admin.get(f"{V1}/trials/?split=sealed").json()["results"]
    assert api_world.sealed_trial.pk in [row["id"] for row in rows]
    steps = admin.get(f"{V1}/trials/{api_world.sealed_trial.pk}/trajectory/").json()
    assert CANARY in steps["results"][0]["message"]


def test_record_payload_hides_sealed_rows_without_the_permission(api_world: World, api_as: Any) -> None:
    url = f"{V1}/results/{api_world.record.pk}/"
    shown = api_as("viewer").get(url).json()
    sealed_rows = [row for row in api_world.record.payload["trials"] if row["split"] == SplitName.SEALED]
    assert sealed_rows
    assert shown["hidden_rows"] == len(sealed_rows)
    assert all(row["split"] != SplitName.SEALED for row in shown["payload"]["trials"])
    full = api_as("admin").get(url).json()
    assert full["hidden_rows"] == 0
    assert full["payload"] == api_world.record.payload


def test_flag_of_a_sealed_task_hides_task_and_evidence(api_world: World, api_as: Any) -> None:
    viewer_rows = api_as("viewer").get(f"{V1}/flags/?candidate={api_world.flagged.pk}").json()["results"]
    assert len(viewer_rows) == 1
    assert viewer_rows[0]["task_visible"] is False
    assert viewer_rows[0]["task"] is None and viewer_rows[0]["evidence"] is None
    assert CANARY not in json.dumps(viewer_rows)
    admin_rows = api_as("admin").get(f"{V1}/flags/?candidate={api_world.flagged.pk}").json()["results"]
    assert admin_rows[0]["task"] == api_world.sealed_trial.task_id


# --- Trajectories and candidates --------------------------------------------------


def test_trajectory_steps_are_paginated(api_world: World, api_as: Any) -> None:
    viewer = api_as("viewer")
    first = viewer.get(f"{V1}/trials/{api_world.train_trial.pk}/trajectory/?page_size=2").json()
    assert first["trajectory"]["step_count"] == 3
    assert [s["step_id"] for s in first["results"]] == [1, 2]
    second = viewer.get(first["next"]).json()
    assert [s["step_id"] for s in second["results"]] == [3]
    assert second["next"] is None


def test_candidate_detail_diff_tree_and_files(api_world: World, api_as: Any) -> None:
    viewer = api_as("viewer")
    cand = api_world.flagged
    detail = viewer.get(f"{V1}/candidates/{cand.pk}/").json()
    assert detail["digest"] == cand.tree_id
    assert [e["hypothesis"] for e in detail["edits"]] == ["note a helps", "note b helps"]
    diff = viewer.get(f"{V1}/candidates/{cand.pk}/diff/")
    assert diff.status_code == 200 and diff["Content-Type"].startswith("text/plain")
    text = diff.content.decode()
    assert "+generic advice" in text and "default.txt" not in text
    against_self = viewer.get(f"{V1}/candidates/{cand.pk}/diff/?against={cand.pk}")
    assert against_self.content.decode() == ""
    assert viewer.get(f"{V1}/candidates/{cand.pk}/diff/?against=999999").json() == {"against": ["no candidate 999999"]}
    tree = viewer.get(f"{V1}/candidates/{cand.pk}/tree/").json()["results"]
    assert [(e["path"], e["mode"], e["size"]) for e in tree] == [
        ("default.txt", "100644", 4),
        ("notes/a.md", "100644", 15),
        ("notes/b.md", "100644", 12),
    ]
    assert len(tree[0]["digest"]) == 64
    content = viewer.get(f"{V1}/candidates/{cand.pk}/files/notes/a.md")
    assert content.status_code == 200 and content.content == b"generic advice\n"
    assert viewer.get(f"{V1}/candidates/{cand.pk}/files/notes/missing.md").status_code == 404


def test_candidate_filters(api_world: World, api_as: Any) -> None:
    viewer = api_as("viewer")
    rows = viewer.get(f"{V1}/candidates/?experiment={api_world.experiment.pk}&state=flagged").json()["results"]
    assert [row["id"] for row in rows] == [api_world.flagged.pk]
    rows = viewer.get(f"{V1}/candidates/?origin=seed").json()["results"]
    assert [row["id"] for row in rows] == [api_world.experiment.seed_candidate_id]
    assert viewer.get(f"{V1}/candidates/?round=1").json()["results"][0]["id"] == api_world.flagged.pk


# --- Runs -------------------------------------------------------------------------


def test_viewer_cannot_start_a_run(api_world: World, api_as: Any) -> None:
    body = {"experiment": api_world.experiment.pk, "recipe": "rrsi", "proposer": "example"}
    assert api_as("viewer").post(f"{V1}/runs/", body, format="json").status_code == 403
    assert not Run.objects.exists()


def test_operator_starts_pauses_resumes_and_cancels(api_world: World, api_as: Any) -> None:
    operator = api_as("operator")
    body = {
        "experiment": api_world.experiment.pk,
        "recipe": "rrsi",
        "proposer": "example",
        "rounds": 2,
        "k": 1,
        "candidates_per_round": 2,
    }
    response = operator.post(f"{V1}/runs/", body, format="json")
    assert response.status_code == 201, response.content
    run = Run.objects.get()
    assert response.json()["id"] == run.pk and run.rounds == 2 and run.started_by == operator.user
    assert run.recipe.spec["candidates_per_round"] == 2
    assert run.recipe.spec["evaluation"]["trials_per_task"] == 1
    assert operator.post(f"{V1}/runs/{run.pk}/pause/").json()["status"] == "paused"
    assert operator.post(f"{V1}/runs/{run.pk}/pause/").status_code == 409
    assert operator.post(f"{V1}/runs/{run.pk}/resume/").json()["status"] == "running"
    assert operator.post(f"{V1}/runs/{run.pk}/cancel/").json()["status"] == "cancelled"
    assert api_as("viewer").post(f"{V1}/runs/{run.pk}/resume/").status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_viewer_cannot_pause(api_world: World, api_as: Any) -> None:
    run = lifecycle.run_create(experiment=api_world.experiment, recipe=load_preset("rrsi"), proposer="example")
    assert api_as("viewer").post(f"{V1}/runs/{run.pk}/pause/").status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_run_start_bad_input_is_400_by_field_and_creates_nothing(api_world: World, api_as: Any) -> None:
    operator = api_as("operator")
    response = operator.post(f"{V1}/runs/", {"experiment": 999999, "rounds": 0}, format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"experiment", "recipe", "rounds"}
    response = operator.post(f"{V1}/runs/", {"experiment": api_world.experiment.pk, "recipe": "nope"}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("unknown recipe 'nope': choose a preset")
    assert not Run.objects.exists()


def test_oversized_body_is_413_and_creates_nothing(api_world: World, api_as: Any) -> None:
    operator = api_as("operator")
    body = {"experiment": api_world.experiment.pk, "recipe": "rrsi", "proposer": "x" * 3000}
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        response = operator.post(f"{V1}/runs/", body, format="json")
    assert response.status_code == 413
    assert not Run.objects.exists()


# --- Review -----------------------------------------------------------------------


def test_viewer_cannot_decide(api_world: World, api_as: Any) -> None:
    body = {"candidate": api_world.flagged.pk, "verdict": "approve", "reason": "generic"}
    assert api_as("viewer").post(f"{V1}/review-decisions/", body, format="json").status_code == 403
    assert not ReviewDecision.objects.exists()


def test_reviewer_decides_and_a_second_decision_conflicts(api_world: World, api_as: Any) -> None:
    reviewer = api_as("reviewer")
    body = {"candidate": api_world.flagged.pk, "verdict": "reject", "reason": "names a sealed task"}
    response = reviewer.post(f"{V1}/review-decisions/", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["verdict"] == "reject"
    api_world.flagged.refresh_from_db()
    assert api_world.flagged.state == Candidate.State.REJECTED_REVIEW
    again = reviewer.post(f"{V1}/review-decisions/", {**body, "verdict": "approve"}, format="json")
    assert again.status_code == 409
    assert ReviewDecision.objects.count() == 1
    listed = api_as("viewer").get(f"{V1}/review-decisions/?candidate={api_world.flagged.pk}").json()["results"]
    assert [row["reviewer"] for row in listed] == ["reviewer"]


def test_review_bad_input_is_400_by_field(api_world: World, api_as: Any) -> None:
    reviewer = api_as("reviewer")
    response = reviewer.post(f"{V1}/review-decisions/", {"verdict": "maybe"}, format="json")
    assert response.status_code == 400 and set(response.json()) == {"candidate", "verdict", "reason"}
    body = {"candidate": api_world.flagged.pk, "verdict": "approve", "reason": "  "}
    response = reviewer.post(f"{V1}/review-decisions/", body, format="json")
    assert response.status_code == 400 and response.json() == {"reason": ["a reason is required"]}
    body = {"candidate": api_world.flagged.pk, "verdict": "reject_edits", "reason": "leaks", "rejected_edits": []}
    assert set(reviewer.post(f"{V1}/review-decisions/", body, format="json").json()) == {"rejected_edits"}
    assert not ReviewDecision.objects.exists()
    api_world.flagged.refresh_from_db()
    assert api_world.flagged.state == Candidate.State.FLAGGED


# --- Ledger -----------------------------------------------------------------------


def test_ledger_filters(api_world: World, api_as: Any) -> None:
    run = lifecycle.run_create(experiment=api_world.experiment, recipe=load_preset("rrsi"), proposer="example")
    for accepted, edit in zip((True, False), api_world.edits, strict=True):
        LedgerEntry.objects.create(
            run=run,
            edit=edit,
            candidate=api_world.flagged,
            round=1,
            component=edit.component,
            hypothesis=edit.hypothesis,
            delta_score=0.1,
            delta_cost=0.0,
            accepted=accepted,
        )
    viewer = api_as("viewer")
    rows = viewer.get(f"{V1}/ledger/?run={run.pk}&component=memory&accepted=true").json()["results"]
    assert [row["edit"] for row in rows] == [api_world.edits[0].pk]
    assert viewer.get(f"{V1}/ledger/?component=prompt").json()["results"] == []


# --- Annotations ------------------------------------------------------------------


def _label() -> AnnotationLabel:
    return AnnotationLabel.objects.filter(experiment__isnull=True).order_by("pk")[0]


def test_annotator_creates_updates_and_deletes_own(api_world: World, api_as: Any) -> None:
    annotator = api_as("annotator")
    body = {"trial": api_world.train_trial.pk, "label": _label().pk, "note": "forgot the rule", "step": 2}
    response = annotator.post(f"{V1}/annotations/", body, format="json")
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["step"] == 2 and created["author"] == "annotator"
    url = f"{V1}/annotations/{created['id']}/"
    assert annotator.patch(url, {"note": "changed"}, format="json").json()["note"] == "changed"
    step = Annotation.objects.get().step
    assert step is not None and step.step_id == 2  # PATCH kept the step
    other = api_as("annotator", username="someone-else")
    assert other.patch(url, {"note": "mine now"}, format="json").status_code == 403
    assert other.delete(url).status_code == 403
    assert Annotation.objects.get().note == "changed"
    listed = api_as("viewer").get(f"{V1}/annotations/?label={_label().slug}&author=annotator").json()["results"]
    assert [row["id"] for row in listed] == [created["id"]]
    assert annotator.delete(url).status_code == 204
    assert not Annotation.objects.exists()


def test_annotation_scores_through_the_api(api_world: World, api_as: Any) -> None:
    score_config_create(experiment=api_world.experiment, name="Solved", kind="boolean")
    grade = score_config_create(experiment=api_world.experiment, name="Grade", kind="numeric", minimum=0, maximum=10)
    annotator = api_as("annotator")
    body = {"trial": api_world.train_trial.pk, "label": _label().pk, "scores": {"solved": True, str(grade.pk): 11}}
    response = annotator.post(f"{V1}/annotations/", body, format="json")
    assert response.status_code == 400
    assert response.json() == {"scores": ["the score 'Grade' must be from 0 to 10, not 11"]}
    assert not Annotation.objects.exists()
    body["scores"] = {"solved": True, "grade": 7.5}
    created = annotator.post(f"{V1}/annotations/", body, format="json").json()
    assert created["scores"] == {"solved": True, "grade": 7.5}
    url = f"{V1}/annotations/{created['id']}/"
    assert annotator.patch(url, {"scores": {"solved": None}}, format="json").json()["scores"] == {"grade": 7.5}
    assert api_as("viewer").get(url).json()["scores"] == {"grade": 7.5}


def test_viewer_cannot_annotate(api_world: World, api_as: Any) -> None:
    body = {"trial": api_world.train_trial.pk, "label": _label().pk}
    assert api_as("viewer").post(f"{V1}/annotations/", body, format="json").status_code == 403
    assert not Annotation.objects.exists()


def test_annotation_bad_input_is_400_by_field(api_world: World, api_as: Any) -> None:
    annotator = api_as("annotator")
    body = {"trial": api_world.train_trial.pk, "label": _label().pk, "step": 99}
    response = annotator.post(f"{V1}/annotations/", body, format="json")
    assert response.status_code == 400 and list(response.json()) == ["step"]
    response = annotator.post(f"{V1}/annotations/", {"trial": api_world.train_trial.pk, "label": 999999}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["label"]
    response = annotator.post(f"{V1}/annotations/", {"label": "x"}, format="json")
    assert response.status_code == 400 and list(response.json()) == ["label"]
    # A sealed trial does not exist for an annotator without the sealed permission.
    body = {"trial": api_world.sealed_trial.pk, "label": _label().pk}
    response = annotator.post(f"{V1}/annotations/", body, format="json")
    assert response.status_code == 400 and list(response.json()) == ["trial"]
    assert not Annotation.objects.exists()


def test_annotations_on_sealed_trials_are_hidden(api_world: World, api_as: Any, make_user: Any) -> None:
    Trial.objects.filter(pk=api_world.sealed_trial.pk).update(outcome=Trial.Outcome.FAIL)
    Annotation.objects.create(
        trial=api_world.sealed_trial, author=make_user("admin"), label=_label(), note=f"see {CANARY}"
    )
    viewer = api_as("viewer")
    assert viewer.get(f"{V1}/annotations/").json()["results"] == []
    assert api_as("viewer", username="v2", extra_perms=(SEALED,)).get(f"{V1}/annotations/").json()["results"]


def test_api_docs_page_loads_with_local_assets(db: Any, make_user: Any) -> None:
    client = Client()
    client.force_login(make_user("viewer"))
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "swagger" in html.lower()
    assert "https://" not in html and "http://" not in html.replace("http://testserver", "")
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert "/api/v1/trials/{id}/trajectory/" in schema.json()["paths"]


def test_trajectory_url_reads_with_get_and_imports_with_post(api_world: World, api_as: Any) -> None:
    """One URL, two views (api/v1.py): GET is ours, POST reaches the import view."""
    url = f"{V1}/trials/{api_world.train_trial.pk}/trajectory/"
    assert api_as("viewer").get(url).status_code == 200
    assert api_as("viewer", username="v2").post(url, {}, format="json").status_code == 403
    response = api_as("operator").post(url, {"format": "openai"}, format="json")
    assert response.status_code == 400 and "document" in response.json()


# --- External results -------------------------------------------------------------


def test_trials_expose_external_and_filter_on_it(api_world: World, api_as: Any) -> None:
    from evolution.services.external import external_results_ingest

    experiment = api_world.experiment
    ours = set(Trial.objects.filter(candidate__experiment=experiment).values_list("pk", flat=True))
    tasks = Task.objects.filter(split_memberships__experiment=experiment).values_list("external_id", flat=True)
    evaluation = external_results_ingest(
        candidate=seed_of(experiment),
        results=[{"task": task, "index": 0, "passed": True} for task in tasks],
        source={"tool": "harbor", "job": "job-7"},
    )
    external = Trial.objects.filter(evaluation=evaluation)
    visible_external = set(external.exclude(split=SplitName.SEALED).values_list("pk", flat=True))
    visible_ours = set(Trial.objects.filter(pk__in=ours).exclude(split=SplitName.SEALED).values_list("pk", flat=True))
    assert visible_external and visible_ours

    viewer = api_as("viewer")
    rows = {row["id"]: row for row in _all(viewer, f"{V1}/trials/?experiment={experiment.pk}")}
    assert set(rows) == visible_external | visible_ours
    for pk in visible_external:
        assert rows[pk]["external"] is True
        assert rows[pk]["source"] == {"tool": "harbor", "job": "job-7"}
        assert rows[pk]["evaluation"] == evaluation.pk
    for pk in visible_ours:
        assert rows[pk]["external"] is False
        assert rows[pk]["source"] == {}

    only_external = _all(viewer, f"{V1}/trials/?experiment={experiment.pk}&external=true")
    assert {row["id"] for row in only_external} == visible_external  # sealed ones still hidden
    only_ours = _all(viewer, f"{V1}/trials/?experiment={experiment.pk}&external=false")
    assert {row["id"] for row in only_ours} == visible_ours
    pk = next(iter(visible_external))
    detail = viewer.get(f"{V1}/trials/{pk}/").json()
    assert (detail["external"], detail["source"]) == (True, {"tool": "harbor", "job": "job-7"})
    bad = viewer.get(f"{V1}/trials/?external=maybe")
    assert bad.status_code == 400 and set(bad.json()) == {"external"}
