"""Hidden characters in names, labels, reasons and ids: every screen that
shows one of these user- or import-supplied strings shows each hidden
character as a visible marker (``<U+202E>``), never raw; so does the
annotations CSV, as plain text a spreadsheet shows."""

from __future__ import annotations

import csv
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from django.test import Client
from django.urls import reverse

from evolution.models import (
    Candidate,
    Evaluation,
    Experiment,
    LedgerEntry,
    Run,
    Task,
    Trajectory,
    Trial,
)
from evolution.services.annotations import annotation_create, label_create
from evolution.services.harbor_jobs import harbor_job_import
from review import hidden
from review.charts import lineage_svg
from review.lineage import NodeInput, layout
from tests.review.test_candidates import page
from tests.review.test_queue import multi_edit_item
from tests.review.test_results import _child_trial, _give_trajectory, _plain_steps

pytestmark = pytest.mark.django_db

# A right-to-left override and a zero-width space between ASCII letters: both hidden.
HOSTILE = "evil\u202etxt.exe\u200bname"
RAW = ("\u202e", "\u200b")
MARKERS = ("&lt;U+202E&gt;", "&lt;U+200B&gt;")
HARBOR = Path(__file__).resolve().parents[1] / "fixtures" / "harbor" / "adder-careless"

Screens = list[tuple[str, str]]  # (url, role)


def url(name: str, *args: object) -> str:
    return reverse(name, args=list(args))


def raw_left(html: str) -> list[str]:
    """Each hidden character still in ``html``, with the text before it (to find the template)."""
    return [f"U+{ord(c):04X} after {html[max(0, html.index(c) - 120) : html.index(c)]!r}" for c in RAW if c in html]


def assert_marked(client_for: Callable[[str], Client], screens: Screens) -> None:
    for address, role in screens:
        html = page(client_for(role).get(address))
        assert raw_left(html) == [], address
        assert [m for m in MARKERS if m not in html] == [], address


def _world_trial(world: Experiment) -> Trial:
    return _child_trial(world)


def _experiment_name(world: Experiment) -> Screens:
    Experiment.objects.filter(pk=world.pk).update(name=HOSTILE)
    trial = _world_trial(world)
    item = multi_edit_item(world)
    return [
        (url("review:home"), "viewer"),
        (url("review:experiment", world.pk), "viewer"),
        (url("review:lineage", world.pk), "viewer"),
        (url("review:matrix", world.pk), "viewer"),
        (url("review:candidate", trial.candidate_id), "viewer"),
        (url("review:trial", trial.pk), "viewer"),
        (url("review:trial_compare", trial.pk), "viewer"),
        (url("review:queue"), "viewer"),
        (url("review:queue") + f"?experiment={world.pk}", "viewer"),
        (url("review:review_item", item.pk), "reviewer"),
        (url("review:annotate_queue"), "viewer"),
        (url("review:annotate_queue") + f"?experiment={world.pk}", "viewer"),
        (url("review:annotation_stats", world.pk), "viewer"),
        (url("review:trial_annotations", trial.pk), "annotator"),
    ]


def _experiment_description(world: Experiment) -> Screens:
    Experiment.objects.filter(pk=world.pk).update(description=HOSTILE)
    return [(url("review:home"), "viewer"), (url("review:experiment", world.pk), "viewer")]


def _benchmark_title(world: Experiment) -> Screens:
    type(world.benchmark).objects.filter(pk=world.benchmark_id).update(title=HOSTILE)
    return [(url("review:experiment", world.pk), "viewer")]


def _candidate_label(world: Experiment) -> Screens:
    trial = _world_trial(world)
    Candidate.objects.filter(pk=trial.candidate_id).update(label=HOSTILE)
    entry = LedgerEntry.objects.filter(candidate_id=trial.candidate_id).first()
    assert entry is not None, "the example world's candidate has no ledger entry"
    return [
        (url("review:experiment", world.pk) + f"?run={entry.run_id}", "viewer"),  # ledger and best harness
        (url("review:lineage", world.pk), "viewer"),
        (url("review:matrix", world.pk), "viewer"),
        (url("review:candidate", trial.candidate_id), "viewer"),
        (url("review:candidate_diff", trial.candidate_id), "viewer"),
        (url("review:trial", trial.pk), "viewer"),
        (url("review:trial_compare", trial.pk), "viewer"),
    ]


def _flagged_candidate_label(world: Experiment) -> Screens:
    item = multi_edit_item(world)
    Candidate.objects.filter(pk=item.candidate_id).update(label=HOSTILE)
    return [(url("review:queue"), "viewer"), (url("review:review_item", item.pk), "reviewer")]


def _candidate_state_reason(world: Experiment) -> Screens:
    trial = _world_trial(world)
    Candidate.objects.filter(pk=trial.candidate_id).update(state_reason=HOSTILE)
    return [(url("review:candidate", trial.candidate_id), "viewer"), (url("review:lineage", world.pk), "viewer")]


def _failed_candidate(world: Experiment) -> Screens:
    trial = _world_trial(world)
    Candidate.objects.filter(pk=trial.candidate_id).update(
        state=Candidate.State.FAILED, state_reason=HOSTILE, label=HOSTILE
    )
    run_id = Candidate.objects.get(pk=trial.candidate_id).run_id
    return [(url("review:experiment", world.pk) + f"?run={run_id}", "viewer")]  # the run's error list


def _run_stop_reason(world: Experiment) -> Screens:
    Run.objects.filter(experiment=world).update(stop_reason=HOSTILE, error="")
    return [(url("review:home"), "viewer"), (url("review:experiment", world.pk), "viewer")]


def _run_error(world: Experiment) -> Screens:
    Run.objects.filter(experiment=world).update(error=HOSTILE)
    return [(url("review:home"), "viewer"), (url("review:experiment", world.pk), "viewer")]


def _criteria_id(world: Experiment) -> Screens:
    trial = _world_trial(world)
    Trial.objects.filter(pk=trial.pk).update(criteria_results=[{"id": HOSTILE, "met": True}])
    return [(url("review:trial", trial.pk), "viewer")]


def _task_id(world: Experiment) -> Screens:
    trial = _world_trial(world)
    Task.objects.filter(pk=trial.task_id).update(external_id=HOSTILE)
    failed = Trial.objects.filter(candidate__experiment=world, outcome="fail", split="train").first()
    assert failed is not None
    Task.objects.filter(pk=failed.task_id).update(external_id=HOSTILE + "-failed")
    return [
        (url("review:matrix", world.pk), "viewer"),
        (url("review:trial", trial.pk), "viewer"),
        (url("review:trial_compare", trial.pk), "viewer"),
        (url("review:annotate_queue"), "viewer"),
        (url("review:trial_annotations", failed.pk), "annotator"),
    ]


def _trajectory_agent(field: str) -> Callable[[Experiment], Screens]:
    def setter(world: Experiment) -> Screens:
        trial = _world_trial(world)
        trajectory = _give_trajectory(trial, _plain_steps(2))
        if field == "session_id":
            trajectory.session_id = HOSTILE
        else:
            trajectory.agent = {**trajectory.agent, field: HOSTILE}
        trajectory.save()
        return [(url("review:trial", trial.pk), "viewer")]

    return setter


def _annotation_label(world: Experiment) -> Screens:
    trial = Trial.objects.filter(candidate__experiment=world, outcome="fail", split="train").order_by("pk").first()
    assert trial is not None
    label = label_create(experiment=world, name="team label", description=HOSTILE)
    type(label).objects.filter(pk=label.pk).update(name=HOSTILE)
    label.refresh_from_db()
    author = User.objects.create_user(username="ann")
    annotation_create(trial=trial, author=author, label=label, note=HOSTILE)
    return [
        (url("review:annotation_stats", world.pk), "viewer"),
        (url("review:trial_annotations", trial.pk), "annotator"),
    ]


FIELDS: dict[str, Callable[[Experiment], Screens]] = {
    "experiment name": _experiment_name,
    "experiment description": _experiment_description,
    "benchmark title": _benchmark_title,
    "candidate label": _candidate_label,
    "flagged candidate label": _flagged_candidate_label,
    "candidate state reason": _candidate_state_reason,
    "failed candidate label and reason": _failed_candidate,
    "run stop reason": _run_stop_reason,
    "run error": _run_error,
    "criteria id": _criteria_id,
    "task id": _task_id,
    "trajectory agent.name": _trajectory_agent("name"),
    "trajectory agent.version": _trajectory_agent("version"),
    "trajectory agent.model_name": _trajectory_agent("model_name"),
    "trajectory session_id": _trajectory_agent("session_id"),
    "annotation label and note": _annotation_label,
}


@pytest.mark.parametrize("field", list(FIELDS))
def test_a_hidden_character_in_a_name_is_a_marker_on_every_screen(
    field: str, example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    screens = FIELDS[field](example_world)
    clients: dict[str, Client] = {}

    def client_for(role: str) -> Client:
        if role not in clients:
            clients[role] = client_as(role, username=f"{role}-user")
        return clients[role]

    assert_marked(client_for, screens)


def _harbor_job(tmp_path: Path) -> Path:
    """The careless adder job with a hidden character in its name, one task
    id and that trial's agent name, model name and session id."""
    job = shutil.copytree(HARBOR, tmp_path / "job")
    config = json.loads((job / "config.json").read_text())
    (job / "config.json").write_text(json.dumps({**config, "job_name": HOSTILE}))
    trial = next(job.glob("task-0__*"))
    result = json.loads((trial / "result.json").read_text())
    (trial / "result.json").write_text(json.dumps({**result, "task_name": HOSTILE}))
    document = json.loads((trial / "agent" / "trajectory.json").read_text())
    document["session_id"] = HOSTILE
    document["agent"] = {**document["agent"], "name": HOSTILE, "model_name": HOSTILE}
    (trial / "agent" / "trajectory.json").write_text(json.dumps(document))
    return job


def test_an_imported_harbor_jobs_names_and_task_ids_are_markers(
    tmp_path: Path, client_as: Callable[..., Client]
) -> None:
    report = harbor_job_import(path=_harbor_job(tmp_path))
    experiment, candidate = report.experiment, report.candidate
    # What the import made of the names: kept as they came, for the API and the records.
    assert (experiment.name, candidate.label, experiment.benchmark.title) == (
        HOSTILE,
        f"harbor:{HOSTILE}",
        f"Harbor tasks of {HOSTILE}",
    )
    trial = Trial.objects.get(candidate=candidate, task__external_id=HOSTILE)
    trajectory = Trajectory.objects.get(trial=trial)
    assert (trajectory.session_id, trajectory.agent["name"], trajectory.agent["model_name"]) == (HOSTILE,) * 3
    assert Evaluation.objects.get(candidate=candidate).source["job_name"] == HOSTILE
    client = client_as("viewer")
    assert_marked(
        lambda role: client,
        [
            (url("review:home"), "viewer"),
            (url("review:experiment", experiment.pk), "viewer"),
            (url("review:matrix", experiment.pk), "viewer"),
            (url("review:candidate", candidate.pk), "viewer"),
            (url("review:lineage", experiment.pk), "viewer"),
            (url("review:trial", trial.pk), "viewer"),
        ],
    )


def download(client: Client, name: str, experiment: Experiment) -> str:
    response = client.get(reverse(name, args=[experiment.pk]))
    assert response.status_code == 200 and isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode()


def test_the_annotations_csv_writes_hidden_characters_as_labels(
    example_world: Experiment, client_as: Callable[..., Client]
) -> None:
    trial = Trial.objects.filter(candidate__experiment=example_world, outcome="fail", split="train").first()
    assert trial is not None
    Experiment.objects.filter(pk=example_world.pk).update(name=HOSTILE)
    Task.objects.filter(pk=trial.task_id).update(external_id=HOSTILE)
    label = label_create(experiment=example_world, name="team label")
    type(label).objects.filter(pk=label.pk).update(name=HOSTILE)
    author = User.objects.create_user(username="ann")
    annotation_create(trial=trial, author=author, label=label.pk, note="=\u202eSUM(A1)")
    client = client_as("viewer")
    text = download(client, "review:annotations_csv", example_world)
    assert [c for c in RAW if c in text] == []
    (row,) = list(csv.DictReader(io.StringIO(text)))
    shown = "evil<U+202E>txt.exe<U+200B>name"
    assert (row["experiment"], row["task"], row["label_name"], row["note"]) == (
        shown,
        shown,
        shown,
        "'=<U+202E>SUM(A1)",  # still a text cell, not a formula
    )
    # The JSONL export is data for programs: the text as it was stored.
    jsonl = download(client, "review:annotations_jsonl", example_world)
    assert json.loads(jsonl)["note"] == "=\u202eSUM(A1)"


def test_reveal_text_writes_labels_as_plain_text() -> None:
    assert hidden.reveal_text(HOSTILE) == "evil<U+202E>txt.exe<U+200B>name"
    assert hidden.reveal_text("plain – text") == "plain – text"


def test_the_lineage_svg_writes_hidden_characters_in_labels_and_reasons_as_labels() -> None:
    tree = layout([NodeInput(id=7, parent_id=None, state="accepted", origin="seed", round=0, label="a\u202eb")])
    nodes, _edges = lineage_svg(tree, reasons={7: "why\u200b"}, href=lambda pk: f"/c/{pk}/", highlight=None)
    assert "\u202e" not in nodes and "\u200b" not in nodes
    assert nodes.count("a&lt;U+202E&gt;b") == 3  # the aria label, the title and the text
    assert "why&lt;U+200B&gt;</title>" in nodes
