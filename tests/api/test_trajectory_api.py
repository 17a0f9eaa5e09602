"""POST /api/v1/trials/<pk>/trajectory/: import a trajectory over the API."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import override_settings
from django.urls import Resolver404, include, path, resolve
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from api import trajectories
from evolution import access
from evolution.models import Trajectory, Trial
from tests.factories import evaluate_seed_inline, make_tiny_experiment

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
OPENAI_MESSAGES = json.loads((FIXTURES / "trajectories" / "openai-messages.json").read_text())
HARBOR = json.loads((FIXTURES / "atif" / "hello-world.trajectory.json").read_text())
KEY = "sk-ant-api03-" + "Qw3" * 10

# Used only while the API's v1 module does not list these routes yet.
urlpatterns = [path("api/v1/", include(trajectories.urlpatterns))]

pytestmark = pytest.mark.django_db
_names = itertools.count(1)


def _wired() -> bool:
    try:
        view = resolve("/api/v1/trials/1/trajectory/").func
        return getattr(view, "view_class", None) is trajectories.TrajectoryImportView
    except Resolver404:
        return False


@pytest.fixture(autouse=True)
def routes() -> Any:
    if _wired():
        yield
        return
    with override_settings(ROOT_URLCONF=__name__):
        yield


@pytest.fixture
def trials(db: Any) -> dict[str, Trial]:
    experiment = make_tiny_experiment(tasks=2, k=1, split_lists={"train": ["t00"], "sealed": ["t01"]})
    evaluate_seed_inline(experiment, splits=("train", "sealed"))
    found = Trial.objects.filter(candidate=experiment.seed_candidate)
    return {"train": found.get(split="train"), "sealed": found.get(split="sealed")}


def client_for(role: str | None, *, staff: bool = False, perms: tuple[str, ...] = ()) -> APIClient:
    access.roles_ensure()
    user = User.objects.create_user(username=f"{role}-{next(_names)}", is_staff=staff)
    if role:
        user.groups.add(Group.objects.get(name=role))
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def url(trial: Trial) -> str:
    return f"/api/v1/trials/{trial.pk}/trajectory/"


def test_operator_imports_and_gets_the_summary(trials: dict[str, Trial]) -> None:
    document = [*OPENAI_MESSAGES, {"role": "user", "content": f"my key is {KEY}"}]
    response = client_for("operator").post(
        url(trials["train"]), {"format": "auto", "document": document}, format="json"
    )
    assert response.status_code == 201, response.content
    assert response.json() == {
        "trial": trials["train"].pk,
        "format": "openai",
        "step_count": 5,
        "redacted": True,
        "redactions": {"anthropic_api_key": 1},
        "deviations": [],
        "continuation_files": [],
        "subagent_trajectories": 0,
    }
    trajectory = Trajectory.objects.get(trial=trials["train"])
    assert trajectory.steps.get(step_id=5).message == "my key is [REDACTED:anthropic_api_key]"


def test_staff_may_import_a_harbor_file(trials: dict[str, Trial]) -> None:
    response = client_for("viewer", staff=True).post(url(trials["train"]), {"document": HARBOR}, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["format"], response.json()["step_count"], response.json()["redacted"]) == ("atif", 6, False)


def test_invalid_document_is_400_naming_the_field_and_keeps_the_previous(trials: dict[str, Trial]) -> None:
    client = client_for("operator")
    assert client.post(url(trials["train"]), {"document": HARBOR}, format="json").status_code == 201
    broken = json.loads(json.dumps(HARBOR))
    broken["steps"][4]["observation"]["results"][0]["source_call_id"] = "call_missing"
    response = client.post(url(trials["train"]), {"format": "atif", "document": broken}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "document": [
            "steps[4].observation.results[0].source_call_id: 'call_missing' does not name a tool call of step 5"
        ],
        "lenient": ['"lenient": true imports it, keeping each off-spec step\'s text and listing the deviations'],
    }
    assert Trajectory.objects.get(trial=trials["train"]).step_count == 6


def test_bad_format_and_missing_document_are_field_errors(trials: dict[str, Trial]) -> None:
    client = client_for("operator")
    response = client.post(url(trials["train"]), {"format": "yaml", "document": HARBOR}, format="json")
    assert response.status_code == 400 and "format" in response.json()
    response = client.post(url(trials["train"]), {"format": "atif"}, format="json")
    assert response.status_code == 400 and "document" in response.json()
    response = client.post(url(trials["train"]), {"document": None}, format="json")
    assert response.status_code == 400 and "document" in response.json()
    assert not Trajectory.objects.filter(trial=trials["train"], extra__has_key="imported_format").exists()


def test_viewer_and_anonymous_are_refused(trials: dict[str, Trial]) -> None:
    body = {"document": OPENAI_MESSAGES}
    assert client_for("viewer").post(url(trials["train"]), body, format="json").status_code == 403
    assert client_for("annotator").post(url(trials["train"]), body, format="json").status_code == 403
    assert APIClient().post(url(trials["train"]), body, format="json").status_code == 401
    assert not Trajectory.objects.filter(trial=trials["train"], extra__has_key="imported_format").exists()


def test_sealed_trial_is_404_without_the_sealed_permission(trials: dict[str, Trial]) -> None:
    body = {"document": OPENAI_MESSAGES}
    assert client_for("operator").post(url(trials["sealed"]), body, format="json").status_code == 404
    allowed = client_for("operator", perms=(access.SEALED,))
    assert allowed.post(url(trials["sealed"]), body, format="json").status_code == 201
    assert client_for("operator").post("/api/v1/trials/999999/trajectory/", body, format="json").status_code == 404


def test_a_form_posts_the_document_as_json_text(trials: dict[str, Trial]) -> None:
    """A form (multipart) carries the document as JSON text: it is parsed,
    then checked like a JSON body's; text that is not JSON is a field error."""
    client = client_for("operator", perms=(access.OPERATE,))
    response = client.post(url(trials["train"]), {"format": "atif", "document": json.dumps(HARBOR)})
    assert response.status_code == 201, response.content
    assert response.json()["step_count"] == len(HARBOR["steps"])
    response = client.post(url(trials["train"]), {"format": "atif", "document": "{not json"})
    assert response.status_code == 400
    assert "document" in response.json()
    assert Trajectory.objects.get(trial=trials["train"]).step_count == len(HARBOR["steps"])


BATCH = "/api/v1/trajectories/"


def steps_stored(trial: Trial) -> list[tuple[int, str]]:
    return list(Trajectory.objects.get(trial=trial).steps.order_by("step_id").values_list("step_id", "message"))


def test_a_batch_imports_every_trajectory_in_order(trials: dict[str, Trial]) -> None:
    document = [*OPENAI_MESSAGES, {"role": "user", "content": f"my key is {KEY}"}]
    items = [
        {"trial": trials["train"].pk, "document": document},
        {"trial": trials["sealed"].pk, "format": "atif", "document": HARBOR},
    ]
    client = client_for("operator", perms=(access.SEALED,))
    response = client.post(BATCH, {"trajectories": items}, format="json")
    assert response.status_code == 201, response.content
    assert response.json() == {
        "imported": [
            {
                "trial": trials["train"].pk,
                "format": "openai",
                "step_count": 5,
                "redacted": True,
                "redactions": {"anthropic_api_key": 1},
                "deviations": [],
                "continuation_files": [],
                "subagent_trajectories": 0,
            },
            {
                "trial": trials["sealed"].pk,
                "format": "atif",
                "step_count": 6,
                "redacted": False,
                "redactions": {},
                "deviations": [],
                "continuation_files": [],
                "subagent_trajectories": 0,
            },
        ]
    }
    assert steps_stored(trials["train"])[-1] == (5, "my key is [REDACTED:anthropic_api_key]")
    assert [step_id for step_id, _ in steps_stored(trials["sealed"])] == [1, 2, 3, 4, 5, 6]


def test_a_batch_is_all_or_nothing_and_names_each_bad_item(trials: dict[str, Trial]) -> None:
    """One invalid document, one repeated trial, one unknown trial, one
    sealed trial the caller may not see: each is named by its position,
    the last two in the same words, and no trajectory changes."""
    client = client_for("operator")
    assert client.post(url(trials["train"]), {"document": HARBOR}, format="json").status_code == 201
    before = steps_stored(trials["train"])
    broken = json.loads(json.dumps(HARBOR))
    broken["steps"][1]["step_id"] = 9
    items = [
        {"trial": trials["train"].pk, "document": OPENAI_MESSAGES},
        {"trial": trials["train"].pk, "document": OPENAI_MESSAGES},
        {"trial": 999999, "document": OPENAI_MESSAGES},
        {"trial": trials["sealed"].pk, "document": OPENAI_MESSAGES},
    ]
    response = client.post(BATCH, {"trajectories": items}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "trajectories": {
            "1": {"trial": [f"trial {trials['train'].pk} is already in this batch"]},
            "2": {"trial": ["no trial 999999"]},
            "3": {"trial": [f"no trial {trials['sealed'].pk}"]},
        }
    }
    items = [
        {"trial": trials["sealed"].pk, "document": OPENAI_MESSAGES},
        {"trial": trials["train"].pk, "format": "atif", "document": broken},
    ]
    response = client_for("operator", perms=(access.SEALED,)).post(BATCH, {"trajectories": items}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "trajectories": {"1": {"document": ["steps[1].step_id: expected 2 (step ids are sequential from 1), got 9"]}}
    }
    assert steps_stored(trials["train"]) == before
    assert not Trajectory.objects.filter(trial=trials["sealed"]).exists()


def test_a_batch_is_refused_to_viewers_and_bounded(trials: dict[str, Trial]) -> None:
    body = {"trajectories": [{"trial": trials["train"].pk, "document": OPENAI_MESSAGES}]}
    assert client_for("viewer").post(BATCH, body, format="json").status_code == 403
    assert APIClient().post(BATCH, body, format="json").status_code == 401
    client = client_for("operator")
    assert client.post(BATCH, {"trajectories": []}, format="json").status_code == 400
    many = {"trajectories": [{"trial": n, "document": OPENAI_MESSAGES} for n in range(1, trajectories.BATCH_MAX + 2)]}
    response = client.post(BATCH, many, format="json")
    assert response.status_code == 400 and "trajectories" in response.json()
    assert client.post(BATCH, {"trajectories": [{"trial": trials["train"].pk}]}, format="json").status_code == 400
    assert not Trajectory.objects.filter(trial=trials["train"], extra__has_key="imported_format").exists()


@pytest.mark.parametrize("number", ["1e999", "-1e999"])
def test_a_number_out_of_range_is_a_400_in_a_body_a_batch_and_a_form(trials: dict[str, Trial], number: str) -> None:
    """Python reads 1e999 as infinity, which no database stores as JSON:
    refused like NaN, as a bad request, with nothing written."""
    client = client_for("operator")
    document = '[{"role": "user", "content": "hi", "n": ' + number + "}]"
    body = '{"format": "openai", "document": ' + document + "}"
    response = client.post(url(trials["train"]), data=body, content_type="application/json")
    assert response.status_code == 400
    assert "too large for JSON's range" in response.json()["detail"]
    batch = '{"trajectories": [{"trial": ' + str(trials["train"].pk) + ', "document": ' + document + "}]}"
    response = client.post(BATCH, data=batch, content_type="application/json")
    assert response.status_code == 400
    assert "too large for JSON's range" in response.json()["detail"]
    response = client.post(url(trials["train"]), {"format": "openai", "document": document})
    assert response.status_code == 400
    assert response.json() == {"document": ["Value must be valid JSON."]}
    assert not Trajectory.objects.filter(trial=trials["train"]).exists()


def deep_arguments_document(levels: int) -> list[dict[str, Any]]:
    """OpenAI messages whose one tool call's ``arguments`` string holds JSON ``levels`` deep."""
    arguments = '{"a": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]


def test_deep_json_in_a_tool_calls_arguments_is_a_400_naming_the_field_in_a_body_and_a_batch(
    trials: dict[str, Trial],
) -> None:
    """The arguments string is JSON of its own: it was decoded without the
    depth limit (900 levels stored, or a 500 past Python's recursion)."""
    client = client_for("operator")
    error = (
        "messages[1].tool_calls[0].function.arguments: its JSON text is nested more than 100 levels deep "
        "(RSI_MAX_INPUT_DEPTH)"
    )
    for levels in (101, 900, 5000):
        response = client.post(url(trials["train"]), {"document": deep_arguments_document(levels)}, format="json")
        assert (response.status_code, response.json()) == (400, {"document": [error]})
        items = [{"trial": trials["train"].pk, "document": deep_arguments_document(levels)}]
        response = client.post(BATCH, {"trajectories": items}, format="json")
        assert (response.status_code, response.json()) == (400, {"trajectories": {"0": {"document": [error]}}})
    assert not Trajectory.objects.filter(trial=trials["train"]).exists()
    response = client.post(url(trials["train"]), {"document": deep_arguments_document(100)}, format="json")
    assert response.status_code == 201, response.content
    step = Trajectory.objects.get(trial=trials["train"]).steps.get(step_id=2)
    assert step.tool_calls[0]["arguments"] == json.loads('{"a": ' + "[" * 99 + "]" * 99 + "}")
