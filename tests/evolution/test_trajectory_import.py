"""Importing trajectories into trials: service, management command, and the trial page."""

from __future__ import annotations

import html
import json
import random
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from evolution.access import roles_ensure
from evolution.models import Annotation, AnnotationLabel, Trajectory, TrajectoryStep, Trial
from evolution.services.evaluation import _store_trajectory
from evolution.services.trajectories import (
    TrajectoryFormatError,
    _lone_surrogate_escaped,
    trajectory_import,
    trajectory_store,
)
from tests.factories import evaluate_seed_inline, make_tiny_experiment

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ATIF_FILES = sorted((FIXTURES / "atif").glob("*.json"))
MINI = FIXTURES / "trajectories" / "mini-swe-agent.traj.json"
OPENAI = FIXTURES / "trajectories" / "openai-messages.json"
OPENAI_KEY = "sk-proj-AbCdEfGh0123456789IjKlMnOpQr"

pytestmark = pytest.mark.django_db


@pytest.fixture
def trial(db: Any) -> Trial:
    experiment = make_tiny_experiment(tasks=1, k=1, split_lists={"train": ["t00"]})
    evaluate_seed_inline(experiment, splits=("train",))
    return Trial.objects.filter(candidate=experiment.seed_candidate).order_by("pk")[0]


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def steps_of(trial: Trial) -> list[TrajectoryStep]:
    return list(TrajectoryStep.objects.filter(trajectory__trial=trial).order_by("step_id"))


def first_line_of_last_message(document: dict[str, Any]) -> str:
    message = [step["message"] for step in document["steps"] if step.get("message")][-1]
    return message.strip().splitlines()[0][:40]


@pytest.mark.parametrize("path", ATIF_FILES, ids=lambda p: p.name)
def test_every_harbor_file_imports_and_renders(trial: Trial, path: Path) -> None:
    document = load(path)
    trajectory = trajectory_import(trial=trial, document=document)
    assert trajectory.step_count == len(document["steps"])
    assert trajectory.schema_version == "ATIF-v1.5"
    assert trajectory.agent == document["agent"]
    assert trajectory.extra["imported_format"] == "atif"
    stored = steps_of(trial)
    assert [step.step_id for step in stored] == [step["step_id"] for step in document["steps"]]
    assert [step.message for step in stored] == [step["message"] for step in document["steps"]]
    assert stored[-1].tool_calls == (document["steps"][-1].get("tool_calls") or [])

    roles_ensure()
    viewer = User.objects.create_user("viewer")
    viewer.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(viewer)
    response = client.get(reverse("review:trial", args=[trial.pk]))
    assert response.status_code == 200
    assert html.escape(first_line_of_last_message(document)) in response.content.decode()


def test_unknown_step_fields_are_kept_in_extra(trial: Trial) -> None:
    document = load(FIXTURES / "atif" / "hello-world-context-summarization.trajectory.summarization-1-summary.json")
    trajectory_import(trial=trial, document=document)
    second = steps_of(trial)[1]
    assert second.extra["is_copied_context"] is True
    assert second.extra["extra"] == document["steps"][1]["extra"]


@pytest.mark.parametrize(("path", "fmt", "steps"), [(MINI, "mini-swe-agent", 5), (OPENAI, "openai", 4)])
def test_converted_formats_import(trial: Trial, path: Path, fmt: str, steps: int) -> None:
    trajectory = trajectory_import(trial=trial, document=load(path))
    assert (trajectory.step_count, trajectory.extra["imported_format"]) == (steps, fmt)
    agent_step = steps_of(trial)[2]
    assert agent_step.source == "agent"
    assert agent_step.tool_calls[0]["function_name"] == "bash"
    assert agent_step.observation["results"][0]["source_call_id"] == agent_step.tool_calls[0]["tool_call_id"]


def test_import_replaces_the_previous_trajectory(trial: Trial) -> None:
    trajectory_import(trial=trial, document=load(ATIF_FILES[0]))
    trajectory_import(trial=trial, document=load(OPENAI))
    assert Trajectory.objects.filter(trial=trial).count() == 1
    assert len(steps_of(trial)) == 4


def test_replacing_a_trajectory_keeps_annotations_unanchored_and_other_trials_whole(trial: Trial) -> None:
    """The old steps go in one statement, not one instance each, with the
    model's rules kept: an annotation on one of them stays, without its
    anchor; another trial's trajectory is untouched."""
    other_experiment = make_tiny_experiment(tasks=1, k=1, split_lists={"train": ["t00"]})
    evaluate_seed_inline(other_experiment, splits=("train",))
    other = Trial.objects.filter(candidate=other_experiment.seed_candidate).get()
    trajectory_import(trial=trial, document=load(ATIF_FILES[0]))
    trajectory_import(trial=other, document=load(ATIF_FILES[0]))
    other_steps = [(step.pk, step.message) for step in steps_of(other)]
    author = User.objects.create_user("annotator")
    label = AnnotationLabel.objects.filter(experiment=None).order_by("pk")[0]
    anchored = Annotation.objects.create(
        trial=trial, author=author, label=label, note="see here", step=steps_of(trial)[1]
    )
    replaced = {step.pk for step in steps_of(trial)}

    trajectory_import(trial=trial, document=load(OPENAI))

    anchored.refresh_from_db()
    assert (anchored.note, anchored.step) == ("see here", None)
    assert len(steps_of(trial)) == 4
    assert not TrajectoryStep.objects.filter(pk__in=replaced).exists()
    assert Trajectory.objects.filter(trial=trial).count() == 1
    assert [(step.pk, step.message) for step in steps_of(other)] == other_steps


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda d: d["steps"][1].update(step_id=7), "steps[1].step_id: expected 2"),
        (lambda d: d["steps"][0].update(timestamp="noon"), "steps[0].timestamp: is not an ISO 8601 date-time"),
        (lambda d: d["steps"][0].update(message={"x": 1}), "steps[0].message: must be a string"),
    ],
)
def test_invalid_document_stores_nothing_and_keeps_the_previous(trial: Trial, mutate: Any, error: str) -> None:
    trajectory_import(trial=trial, document=load(OPENAI))
    before = [(step.step_id, step.message) for step in steps_of(trial)]
    document = load(ATIF_FILES[-1])
    mutate(document)
    with pytest.raises(TrajectoryFormatError) as info:
        trajectory_import(trial=trial, document=document)
    assert any(message.startswith(error) for message in info.value.errors), info.value.errors
    assert [(step.step_id, step.message) for step in steps_of(trial)] == before
    assert Trajectory.objects.get(trial=trial).extra["imported_format"] == "openai"


def test_secrets_are_redacted_everywhere_and_recorded(trial: Trial) -> None:
    aws = "AKIAIOSFODNN7EXAMPLE"
    document = {
        "schema_version": "ATIF-v1.5",
        "session_id": "s",
        "agent": {"name": "a", "version": "1", "extra": {"token": "ghp_" + "x1Y2" * 9}},
        "steps": [
            {"step_id": 1, "source": "user", "message": f"use key {OPENAI_KEY} (not task-sk-1)"},
            {
                "step_id": 2,
                "source": "agent",
                "message": "calling",
                "tool_calls": [
                    {
                        "tool_call_id": "c",
                        "function_name": "http",
                        "arguments": {"headers": {"Authorization": "Bearer abcdefghij0123456789XYZ"}},
                    }
                ],
                "observation": {"results": [{"source_call_id": "c", "content": f"AWS_ACCESS_KEY_ID={aws}"}]},
                "extra": {"env": f"OPENAI_API_KEY={OPENAI_KEY}"},
            },
        ],
        "extra": {"note": "AKIA alone is fine"},
    }
    trajectory = trajectory_import(trial=trial, document=document)
    assert trajectory.redacted is True
    assert trajectory.extra["redactions"] == {
        "aws_access_key_id": 1,
        "bearer_token": 1,
        "github_token": 1,
        "openai_api_key": 2,
    }
    assert trajectory.extra["note"] == "AKIA alone is fine"
    assert trajectory.agent["extra"]["token"] == "[REDACTED:github_token]"
    user, agent = steps_of(trial)
    assert user.message == "use key [REDACTED:openai_api_key] (not task-sk-1)"
    assert agent.tool_calls[0]["arguments"]["headers"]["Authorization"] == "Bearer [REDACTED:bearer_token]"
    assert agent.observation["results"][0]["content"] == "AWS_ACCESS_KEY_ID=[REDACTED:aws_access_key_id]"
    assert agent.extra["extra"]["env"] == "OPENAI_API_KEY=[REDACTED:openai_api_key]"
    stored = json.dumps(
        [
            list(Trajectory.objects.filter(trial=trial).values()),
            list(TrajectoryStep.objects.filter(trajectory__trial=trial).values()),
        ],
        default=str,
    )
    assert OPENAI_KEY not in stored and aws not in stored


def test_mini_swe_agent_config_secrets_are_redacted(trial: Trial) -> None:
    trajectory = trajectory_import(trial=trial, document=load(MINI), fmt="mini-swe-agent")
    assert trajectory.extra["redactions"] == {"openai_api_key": 1}
    assert trajectory.extra["info"]["config"]["environment"]["env"]["OPENAI_API_KEY"] == "[REDACTED:openai_api_key]"


def test_clean_trajectory_is_not_marked_redacted(trial: Trial) -> None:
    trajectory = trajectory_import(trial=trial, document=load(OPENAI))
    assert trajectory.redacted is False
    assert "redactions" not in trajectory.extra


def test_the_worker_stores_through_the_same_function(trial: Trial) -> None:
    # Lenient about the agent's own file, but still redacted and replacing.
    _store_trajectory(trial, {"steps": [{"step_id": 1, "source": "agent", "message": OPENAI_KEY, "x": 1}]})
    trajectory = Trajectory.objects.get(trial=trial)
    assert (trajectory.redacted, trajectory.extra) == (True, {"redactions": {"openai_api_key": 1}})
    assert [(s.message, s.extra) for s in steps_of(trial)] == [("[REDACTED:openai_api_key]", {"x": 1})]
    # Repeated ids in an agent's file are renumbered rather than failing the trial.
    trajectory_store(trial=trial, document={"steps": [{"step_id": 1, "message": "a"}, {"step_id": 1, "message": "b"}]})
    assert [(s.step_id, s.message) for s in steps_of(trial)] == [(1, "a"), (2, "b")]


def test_empty_or_missing_json_columns_are_stored_as_empty_lists_and_objects(trial: Trial) -> None:
    # The worker's file is stored leniently: any falsy value is an empty column.
    steps = [
        {"step_id": 1, "message": "a"},
        {"step_id": 2, "message": "b", "tool_calls": None, "observation": "", "metrics": 0},
        {"step_id": 3, "message": "c", "tool_calls": [], "observation": {}, "metrics": {}, "extra": {}},
        {"step_id": 4, "message": "d", "tool_calls": [1], "observation": {"o": 0}, "metrics": [0], "extra": False},
    ]
    trajectory_store(trial=trial, document={"steps": steps})
    assert [(s.tool_calls, s.observation, s.metrics, s.extra) for s in steps_of(trial)] == [
        ([], {}, {}, {}),
        ([], {}, {}, {}),
        ([], {}, {}, {"extra": {}}),
        ([1], {"o": 0}, [0], {"extra": False}),
    ]


# --- management command -----------------------------------------------------------


def command(*args: str) -> tuple[int, str, str]:
    """Run the command as from the shell (CommandError becomes an exit code and a message on stderr)."""
    from django.core.management import CommandError

    out, err = StringIO(), StringIO()
    try:
        call_command("import_trajectory", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue() + str(exc)
    return 0, out.getvalue(), err.getvalue()


def test_command_imports_each_format(trial: Trial) -> None:
    code, out, _ = command("--trial", str(trial.pk), str(ATIF_FILES[0]))
    assert code == 0
    assert f"imported 10 steps (atif) into trial {trial.pk}; redacted: none" in out
    code, out, _ = command("--trial", str(trial.pk), "--format", "mini-swe-agent", str(MINI))
    assert (code, "redacted: openai_api_key: 1" in out) == (0, True)
    code, out, _ = command("--trial", str(trial.pk), "--format", "openai", str(OPENAI))
    assert code == 0 and Trajectory.objects.get(trial=trial).step_count == 4


def test_command_invalid_document_exits_1_naming_the_field(trial: Trial, tmp_path: Path) -> None:
    document = load(ATIF_FILES[-1])
    document["steps"][2]["step_id"] = 9
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    code, _, err = command("--trial", str(trial.pk), str(bad))
    assert code == 1
    assert f"{bad}: steps[2].step_id: expected 3 (step ids are sequential from 1), got 9" in err
    assert "nothing was imported" in err
    assert not Trajectory.objects.filter(trial=trial, extra__imported_format="atif").exists()


def test_command_json_syntax_error_names_the_line(trial: Trial, tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{\n  "steps": [\n    {"step_id": 1,,}\n  ]\n}\n')
    code, _, err = command("--trial", str(trial.pk), str(bad))
    assert code == 1
    assert f"{bad}: line 3, column" in err


def test_command_wrong_format_exits_1(trial: Trial) -> None:
    code, _, err = command("--trial", str(trial.pk), "--format", "atif", str(OPENAI))
    assert code == 1
    assert "document: must be a JSON object, got a list" in err


def test_command_unusable_input_exits_2(trial: Trial, tmp_path: Path) -> None:
    code, _, err = command("--trial", "999999", str(OPENAI))
    assert (code, "no trial with id 999999" in err) == (2, True)
    code, _, err = command("--trial", str(trial.pk), str(tmp_path / "missing.json"))
    assert (code, "cannot read" in err) == (2, True)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    assert command("--trial", str(trial.pk), str(binary))[0] == 2


def test_command_deep_tool_call_arguments_exit_1_naming_the_field_with_nothing_imported(
    trial: Trial, tmp_path: Path
) -> None:
    """900 levels inside an ``arguments`` string were stored (and past
    Python's recursion, a traceback) despite the 100-level limit."""
    command("--trial", str(trial.pk), str(OPENAI))
    arguments = '{"a": ' + "[" * 900 + "]" * 900 + "}"
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    deep = tmp_path / "deep.json"
    deep.write_text(json.dumps([{"role": "assistant", "content": "", "tool_calls": [call]}]))
    code, _, err = command("--trial", str(trial.pk), str(deep))
    assert code == 1
    assert (
        f"{deep}: messages[0].tool_calls[0].function.arguments: its JSON text is nested more than 100 levels deep "
        "(RSI_MAX_INPUT_DEPTH)"
    ) in err
    assert "nothing was imported" in err and "Traceback" not in err
    assert Trajectory.objects.get(trial=trial).step_count == 4


def test_command_an_integer_of_5000_digits_exits_2_in_one_line(trial: Trial, tmp_path: Path) -> None:
    command("--trial", str(trial.pk), str(OPENAI))
    big = tmp_path / "big.json"
    big.write_text('[{"role": "user", "content": "hi", "n": ' + "7" * 5000 + "}]")
    code, _, err = command("--trial", str(trial.pk), str(big))
    assert (code, err) == (
        2,
        f"{big} holds an integer of more than 4300 digits (Python's int_max_str_digits); nothing was imported",
    )
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"n": ' + "7" * 5000 + "}"}}
    big.write_text(json.dumps([{"role": "assistant", "content": "", "tool_calls": [call]}]))
    code, _, err = command("--trial", str(trial.pk), str(big))
    assert code == 1
    assert "messages[0].tool_calls[0].function.arguments: its JSON text holds an integer of more than 4300" in err
    assert Trajectory.objects.get(trial=trial).step_count == 4


def test_nul_characters_are_replaced_so_any_database_can_store_them(trial: Trial) -> None:
    document = [{"role": "user", "content": "a\x00b"}, {"role": "assistant", "content": "ok", "x\x00": "y\x00"}]
    trajectory_import(trial=trial, document=document)
    user, agent = steps_of(trial)
    assert user.message == "a\ufffdb"
    assert agent.extra == {"extra": {"x\ufffd": "y\ufffd"}}


def test_lone_surrogates_are_replaced_and_pairs_kept(trial: Trial) -> None:
    """A lone surrogate (valid JSON, "\\ud800", but not Unicode) cannot be
    encoded for any database: it is stored as U+FFFD, like NUL, where it
    used to fail the whole import. A character beyond the BMP is kept."""
    text = '[{"role": "user", "content": "a\\ud800b \\udc00 \\ud83d\\ude00"}, {"role": "assistant", "content": "ok"}]'
    trajectory_import(trial=trial, document=json.loads(text))
    user, _agent = steps_of(trial)
    assert user.message == "a\ufffdb \ufffd \U0001f600"


@pytest.mark.parametrize("with_backslashes", [False, True])
def test_the_lone_surrogate_scan_agrees_with_decoding_the_json(with_backslashes: bool) -> None:
    """The scan that lets a document skip the walk replacing lone
    surrogates: compared with what json.loads makes of 3,000 strings built
    of pairs, lone halves in every order, and other escapes. It may only
    err towards the walk (an escaped backslash before "ud800"), never miss."""
    pieces = ["\\ud83d", "\\ude00", "\\udbff", "\\udc00", "\\ud800\\udfff", "a", "\\u00e9", "\\ud7ff", "\\ue000"]
    if with_backslashes:
        pieces.append("\\\\")
    chooser = random.Random(20261130)
    missed: list[str] = []
    extra: list[str] = []
    for _ in range(3000):
        text = "".join(chooser.choice(pieces) for _ in range(chooser.randint(0, 6)))
        lone = any("\ud800" <= char <= "\udfff" for char in json.loads(f'"{text}"'))
        found = _lone_surrogate_escaped(text)
        (missed if lone and not found else extra if found and not lone else []).append(text)
    assert missed == []
    if with_backslashes:
        assert all("\\\\" in text for text in extra)
    else:
        assert extra == []


def test_a_lone_surrogate_posted_to_the_api_is_stored_not_a_server_error(trial: Trial) -> None:
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    admin = get_user_model().objects.create_user(username="surrogate-admin", is_staff=True, is_superuser=True)
    client = APIClient()
    client.force_authenticate(admin)
    body = '{"format": "openai", "document": [{"role": "user", "content": "x\\udfffy"}]}'
    response = client.post(f"/api/v1/trials/{trial.pk}/trajectory/", data=body, content_type="application/json")
    assert response.status_code == 201, response.content
    assert [step.message for step in steps_of(trial)] == ["x\ufffdy"]


def test_every_step_column_is_stored_as_given_even_with_escapes(trial: Trial) -> None:
    # Tabs, newlines, backslashes and quotes are what COPY's text format
    # escapes; none may be lost on the way into any column.
    awkward = 'tab\there\nnew line \\N \\. back\\slash "quoted" \u00e9\u4e2d\U0001f600'
    call = {"tool_call_id": "c\t1", "function_name": "bash", "arguments": {"cmd": awkward}}
    step = {
        "step_id": 1,
        "timestamp": "2025-01-02T03:04:05Z",
        "source": "agent",
        "model_name": "m\\odel",
        "message": awkward,
        "reasoning_content": awkward,
        "tool_calls": [call],
        "observation": {"results": [{"source_call_id": "c\t1", "content": awkward}]},
        "metrics": {"prompt_tokens": 3, "cost_usd": 0.5},
        "custom": [awkward, None, 1.5],
    }
    document = {"schema_version": "ATIF-v1.5", "session_id": "s", "agent": {"name": "a", "version": "1"}}
    trajectory_import(trial=trial, document={**document, "steps": [step]})
    (stored,) = steps_of(trial)
    assert (stored.step_id, stored.timestamp, stored.source, stored.model_name) == (
        1,
        "2025-01-02T03:04:05Z",
        "agent",
        "m\\odel",
    )
    assert (stored.message, stored.reasoning_content) == (awkward, awkward)
    assert stored.tool_calls == [call]
    assert stored.observation == step["observation"]
    assert stored.metrics == {"prompt_tokens": 3, "cost_usd": 0.5}
    assert stored.extra == {"custom": [awkward, None, 1.5]}


def test_a_batch_finds_its_new_ids_where_a_bulk_insert_returns_none(
    trial: Trial, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that returns no ids from a bulk insert (SQLite before
    3.35): the steps still go to their own trajectories."""
    from django.db import connection

    from evolution.services.trajectories import trajectories_import

    other_experiment = make_tiny_experiment(tasks=1, k=1, split_lists={"train": ["t00"]})
    evaluate_seed_inline(other_experiment, splits=("train",))
    other = Trial.objects.filter(candidate=other_experiment.seed_candidate).get()
    monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)
    stored = trajectories_import([(trial, load(OPENAI), "auto"), (other, load(ATIF_FILES[0]), "atif")])
    assert [trajectory.trial_id for trajectory in stored] == [trial.pk, other.pk]
    assert [len(steps_of(trial)), len(steps_of(other))] == [4, len(load(ATIF_FILES[0])["steps"])]
    assert all(step.trajectory_id == stored[0].pk for step in steps_of(trial))


def test_numbers_that_are_not_finite_are_stored_as_null(trial: Trial) -> None:
    """An agent's own file read by Python may hold infinity (1e999) or NaN,
    which neither database stores as JSON: the worker's lenient store keeps
    the trajectory and writes null in their place."""
    document = json.loads(
        '{"steps": [{"step_id": 1, "source": "agent", "message": "m", "metrics": {"cost_usd": 1e999},'
        ' "extra": {"score": NaN, "ok": 0.5}}], "final_metrics": {"total_cost_usd": -1e999}}'
    )
    trajectory = trajectory_store(trial=trial, document=document)
    (step,) = steps_of(trial)
    assert step.metrics == {"cost_usd": None}
    assert step.extra == {"extra": {"score": None, "ok": 0.5}}
    assert Trajectory.objects.get(pk=trajectory.pk).final_metrics == {"total_cost_usd": None}
