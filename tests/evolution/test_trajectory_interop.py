"""Trajectories as real producers write them (issue 20): mini-swe-agent 1.x and
2.x, Harbor's ATIF continuations and subagents, streaming JSONL, tau-bench's
lists, unsupported producers named, and the lenient import. Every file is a
real one (tests/fixtures/*/SOURCE.md), imported by the command as a user runs
it, or posted to the API."""

from __future__ import annotations

import json
import shutil
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from evolution.access import roles_ensure
from evolution.models import Trajectory, TrajectoryStep, Trial
from evolution.trajectory_formats import SUPPORTED
from tests.factories import evaluate_seed_inline, make_tiny_experiment

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
MINI = FIXTURES / "mini-swe-agent"
HARBOR = FIXTURES / "harbor"
TAU = FIXTURES / "tau-bench" / "gpt-4o-airline.first-3.json"

pytestmark = pytest.mark.django_db


@pytest.fixture
def trials(db: Any) -> list[Trial]:
    experiment = make_tiny_experiment(tasks=3, k=1, split_lists={"train": ["t00", "t01", "t02"]})
    evaluate_seed_inline(experiment, splits=("train",))
    found = list(Trial.objects.filter(candidate=experiment.seed_candidate).order_by("pk"))
    Trajectory.objects.filter(trial__in=found).delete()  # start from trials with no trajectory
    return found


@pytest.fixture
def trial(trials: list[Trial]) -> Trial:
    return trials[0]


def command(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("import_trajectory", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue() + str(exc)
    return 0, out.getvalue(), err.getvalue()


def stored(trial: Trial) -> list[TrajectoryStep]:
    return list(TrajectoryStep.objects.filter(trajectory__trial=trial).order_by("step_id"))


def tally(steps: list[TrajectoryStep]) -> dict[str, int]:
    return {
        "steps": len(steps),
        "tool_calls": sum(len(step.tool_calls) for step in steps),
        "observations": sum(1 for step in steps if step.observation),
        "with_tokens": sum(1 for step in steps if "prompt_tokens" in step.metrics),
        "with_time": sum(1 for step in steps if step.timestamp),
    }


def test_mini_swe_agent_2_tool_call_run_imports_whole(trial: Trial) -> None:
    path = MINI / "v2.2.7-toolcall-sqlfluff__sqlfluff-2419.traj.json"
    code, out, err = command("--trial", str(trial.pk), str(path))
    assert (code, err) == (0, "")
    assert out == f"imported 46 steps (mini-swe-agent) into trial {trial.pk}; redacted: none\n"
    steps = stored(trial)
    assert tally(steps) == {"steps": 46, "tool_calls": 43, "observations": 42, "with_tokens": 43, "with_time": 43}
    raw = json.loads(path.read_text())
    assert steps[-1].source == "system" and steps[-1].message == raw["messages"][-1]["content"]
    trajectory = Trajectory.objects.get(trial=trial)
    assert trajectory.extra["exit_status"] == "Submitted"
    assert trajectory.final_metrics["total_prompt_tokens"] == 390223
    assert trajectory.final_metrics["total_completion_tokens"] == 5617


def test_mini_swe_agent_2_text_mode_list_imports_with_its_actions(trials: list[Trial]) -> None:
    path = MINI / "v2-text-github_issue.traj.json"
    for trial, fmt in zip(trials[:2], ("mini-swe-agent", "auto"), strict=True):
        code, out, _ = command("--trial", str(trial.pk), "--format", fmt, str(path))
        assert code == 0
        assert out.startswith(f"imported 12 steps (mini-swe-agent) into trial {trial.pk}")
        steps = stored(trial)
        assert tally(steps) == {"steps": 12, "tool_calls": 10, "observations": 10, "with_tokens": 0, "with_time": 0}
        assert steps[-1].tool_calls[0]["arguments"]["command"].startswith("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


def test_mini_swe_agent_1_file_imports(trial: Trial) -> None:
    code, out, _ = command("--trial", str(trial.pk), str(MINI / "v1.13.4-text-rfc.traj.json"))
    assert code == 0
    assert tally(stored(trial)) == {"steps": 5, "tool_calls": 3, "observations": 3, "with_tokens": 3, "with_time": 0}


def test_atif_continuation_is_followed_from_the_same_folder(trial: Trial) -> None:
    code, out, err = command("--trial", str(trial.pk), str(HARBOR / "linear-history" / "trajectory.json"))
    assert (code, err) == (0, "")
    assert out == (
        f"imported 13 steps (atif) into trial {trial.pk}; redacted: none; continued in trajectory.cont-1.json\n"
    )
    cont = json.loads((HARBOR / "linear-history" / "trajectory.cont-1.json").read_text())
    steps = stored(trial)
    assert [step.step_id for step in steps] == list(range(1, 14))
    assert steps[-1].message == cont["steps"][-1]["message"]
    assert sum(step.metrics.get("prompt_tokens", 0) for step in steps[5:]) == sum(
        step.get("metrics", {}).get("prompt_tokens", 0) for step in cont["steps"]
    )
    assert Trajectory.objects.get(trial=trial).final_metrics == cont["final_metrics"]


def test_a_head_without_its_continuation_stores_nothing(trial: Trial, tmp_path: Path) -> None:
    shutil.copy(HARBOR / "linear-history" / "trajectory.json", tmp_path / "trajectory.json")
    code, out, err = command("--trial", str(trial.pk), str(tmp_path / "trajectory.json"))
    assert (code, out) == (1, "")
    assert err == (
        f"{tmp_path / 'trajectory.json'}: the trajectory: its continuation 'trajectory.cont-1.json' is missing "
        "(give the files of the trajectory together)\n1 error(s); nothing was imported"
    )
    assert not Trajectory.objects.filter(trial=trial).exists()


def test_subagent_trajectories_are_linked(trial: Trial) -> None:
    code, out, _ = command("--trial", str(trial.pk), str(HARBOR / "context-summarization" / "trajectory.json"))
    assert code == 0
    assert out.endswith("; 3 subagent trajectories linked\n")
    linked = Trajectory.objects.get(trial=trial).extra["subagent_trajectories"]
    assert [(sub["trajectory_path"], len(sub["steps"])) for sub in linked] == [
        ("trajectory.summarization-1-summary.json", 5),
        ("trajectory.summarization-1-questions.json", 2),
        ("trajectory.summarization-1-answers.json", 7),
    ]


def test_streaming_jsonl_imports(trial: Trial) -> None:
    code, out, _ = command("--trial", str(trial.pk), str(HARBOR / "openhands-hello-world.trajectory.jsonl"))
    assert (code, out) == (0, f"imported 6 steps (atif) into trial {trial.pk}; redacted: none\n")
    whole = json.loads((FIXTURES / "atif" / "hello-world.trajectory.json").read_text())
    assert [step.message for step in stored(trial)] == [step["message"] for step in whole["steps"]]


def test_a_list_without_trials_is_one_line_and_stores_nothing(trial: Trial) -> None:
    code, out, err = command("--trial", str(trial.pk), str(TAU))
    assert (code, out) == (1, "")
    assert err == (
        f"{TAU}: this is a list of 3 tau-bench runs, not one trajectory; import them with --trials ID,ID,... "
        "(3 trials, in order) or POST /api/v1/trajectories/; nothing was imported"
    )
    assert not Trajectory.objects.exists()


def test_a_list_imports_into_trials_in_order(trials: list[Trial]) -> None:
    ids = ",".join(str(trial.pk) for trial in trials)
    code, out, _ = command("--trials", ids, str(TAU))
    assert code == 0
    runs = json.loads(TAU.read_text())
    for trial, run in zip(trials, runs, strict=True):
        trajectory = Trajectory.objects.get(trial=trial)
        assert trajectory.session_id == f"task-{run['task_id']}-trial-{run['trial']}"
        steps = stored(trial)
        assert sum(len(step.tool_calls) for step in steps) == sum(
            len(m.get("tool_calls") or []) for m in run["traj"] if m["role"] == "assistant"
        )
        names = [r["extra"]["name"] for step in steps for r in step.observation.get("results", [])]
        assert names == [m["name"] for m in run["traj"] if m["role"] == "tool"]
    assert out.count("imported ") == 3


def test_a_list_with_the_wrong_number_of_trials_stores_nothing(trials: list[Trial]) -> None:
    code, _, err = command("--trials", f"{trials[0].pk},{trials[1].pk}", str(TAU))
    assert code == 2
    assert err == f"{TAU}: this is a list of 3 trajectories and 2 trials were given; nothing was imported"
    assert not Trajectory.objects.exists()


def test_openhands_output_jsonl_imports_one_instance_per_trial(trials: list[Trial]) -> None:
    path = FIXTURES / "openhands" / "multi-swe-bench-output.first-2.jsonl"
    code, out, err = command("--trial", str(trials[0].pk), str(path))
    assert (code, out) == (1, "")
    assert err.startswith(f"{path}: this is a list of 2 OpenHands instances, not one trajectory; import them with")
    code, out, err = command("--trials", f"{trials[1].pk},{trials[2].pk}", str(path))
    assert (code, err) == (0, "")
    assert out == (
        # The microagent text in the instance's recall shows https://oauth2:${GITLAB_TOKEN}@gitlab.com.
        f"imported 27 steps (openhands) into trial {trials[1].pk}; redacted: url_password: 1\n"
        f"imported 38 steps (openhands) into trial {trials[2].pk}; redacted: none\n"
    )
    instances = [json.loads(line) for line in path.read_text().splitlines()]
    for trial, instance in zip(trials[1:], instances, strict=True):
        assert Trajectory.objects.get(trial=trial).session_id == instance["instance_id"]
    assert tally(stored(trials[1])) == {
        "steps": 27,
        "tool_calls": 23,
        "observations": 22,  # each answer joins its call's step
        "with_tokens": 23,
        "with_time": 27,
    }


def test_tau2_bench_results_import_one_simulation_per_trial(trials: list[Trial]) -> None:
    path = FIXTURES / "tau2-bench" / "whissle-airline_run1.first-2.json"
    code, out, err = command("--trials", f"{trials[0].pk},{trials[1].pk}", str(path))
    assert (code, err) == (0, "")
    assert out == (
        f"imported 14 steps (tau2-bench) into trial {trials[0].pk}; redacted: none\n"
        f"imported 19 steps (tau2-bench) into trial {trials[1].pk}; redacted: none\n"
    )
    rewards = [Trajectory.objects.get(trial=trial).extra["reward"] for trial in trials[:2]]
    assert rewards == [s["reward_info"]["reward"] for s in json.loads(path.read_text())["simulations"]] == [0.0, 1.0]


def test_claude_code_and_codex_sessions_import_from_jsonl(trials: list[Trial]) -> None:
    claude = FIXTURES / "claude-code" / "2.0.64-4c2ddfdc-b619-4525-8d03-1950fb1b0257.jsonl"
    codex = FIXTURES / "codex" / "rollout-2026-01-02T18-39-45-019b7f94-51b4-7593-922e-ba12b5b73b52.jsonl"
    assert command("--trial", str(trials[0].pk), str(claude)) == (
        0,
        f"imported 13 steps (claude-code) into trial {trials[0].pk}; redacted: none\n",
        "",
    )
    assert command("--trial", str(trials[1].pk), str(codex)) == (
        0,
        f"imported 6 steps (codex) into trial {trials[1].pk}; redacted: none\n",
        "",
    )
    assert tally(stored(trials[0]))["tool_calls"] == 6 and tally(stored(trials[1]))["tool_calls"] == 3


def test_swe_agent_traj_imports(trial: Trial) -> None:
    path = FIXTURES / "swe-agent" / "1.x-function-calling-marshmallow-code__marshmallow-1867.traj"
    code, out, err = command("--trial", str(trial.pk), str(path))
    assert (code, err) == (0, "")
    assert out == f"imported 13 steps (swe-agent) into trial {trial.pk}; redacted: none\n"
    assert tally(stored(trial))["tool_calls"] == 11


@pytest.mark.parametrize(
    ("name", "looks_like"),
    [
        ("gemini-cli-session.json", "a gemini-cli session"),
    ],
)
def test_an_unsupported_producer_is_named_in_one_line(trial: Trial, name: str, looks_like: str) -> None:
    code, _, err = command("--trial", str(trial.pk), str(HARBOR / name))
    assert code == 1
    assert err == (
        f"{HARBOR / name}: document: looks like {looks_like}; supported: {SUPPORTED}\n1 error(s); nothing was imported"
    )
    assert not Trajectory.objects.exists()


def test_lenient_import_keeps_off_spec_steps_and_the_page_shows_a_badge(trial: Trial, tmp_path: Path) -> None:
    document = json.loads((FIXTURES / "atif" / "hello-world.trajectory.json").read_text())
    document["steps"][1]["source"] = "environment"
    path = tmp_path / "off-spec.json"
    path.write_text(json.dumps(document))
    code, _, err = command("--trial", str(trial.pk), str(path))
    assert code == 1 and "steps[1].source: must be one of system, user, agent, got 'environment'" in err
    assert err.endswith(
        "1 error(s); nothing was imported; --lenient imports it, keeping each off-spec step's text and listing "
        "the deviations"
    )
    assert not Trajectory.objects.exists()

    code, out, _ = command("--trial", str(trial.pk), "--lenient", str(path))
    assert code == 0 and out.endswith("; lenient: 1 deviation(s) recorded\n")
    trajectory = Trajectory.objects.get(trial=trial)
    assert trajectory.extra["deviations"] == ["steps[1].source: must be one of system, user, agent, got 'environment'"]
    second = stored(trial)[1]
    assert (second.source, second.message) == ("system", document["steps"][1]["message"])

    roles_ensure()
    viewer = User.objects.create_user("viewer")
    viewer.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("review:trial", args=[trial.pk])).content.decode()
    assert 'data-testid="lenient-badge">lenient: 1 deviation</span>' in page
    assert "steps[1].source: must be one of system, user, agent, got &#x27;environment&#x27;" in page


# --- API ----------------------------------------------------------------------------------


@pytest.fixture
def operator(db: Any) -> Client:
    roles_ensure()
    user = User.objects.create_user("op")
    user.groups.add(Group.objects.get(name="operator"))
    client = Client()
    client.force_login(user)
    return client


def post(client: Client, url: str, body: dict[str, Any]) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def test_api_joins_a_continuation_uploaded_beside_it(trial: Trial, operator: Client) -> None:
    head = json.loads((HARBOR / "linear-history" / "trajectory.json").read_text())
    cont = json.loads((HARBOR / "linear-history" / "trajectory.cont-1.json").read_text())
    url = reverse("api:trial-trajectory-import", args=[trial.pk])
    missing = post(operator, url, {"document": head})
    assert missing.status_code == 400
    assert missing.json() == {
        "document": [
            "the trajectory: its continuation 'trajectory.cont-1.json' is missing "
            "(give the files of the trajectory together)"
        ]
    }
    assert not Trajectory.objects.exists()
    response = post(operator, url, {"document": head, "files": {"trajectory.cont-1.json": cont}})
    assert response.status_code == 201
    assert response.json()["step_count"] == 13
    assert response.json()["continuation_files"] == ["trajectory.cont-1.json"]


def test_api_refuses_a_list_naming_its_count(trial: Trial, operator: Client) -> None:
    runs = json.loads(TAU.read_text())
    response = post(operator, reverse("api:trial-trajectory-import", args=[trial.pk]), {"document": runs})
    assert response.status_code == 400
    assert response.json() == {
        "document": [
            "this is a list of 3 tau-bench runs, not one trajectory; import them with POST /api/v1/trajectories/ "
            "(3 items, one trial each)"
        ]
    }
    assert not Trajectory.objects.exists()
    batch = [{"trial": t.pk, "document": run} for t, run in zip(Trial.objects.order_by("pk"), runs, strict=True)]
    assert post(operator, reverse("api:trajectory-batch-import"), {"trajectories": batch}).status_code == 201
    assert Trajectory.objects.count() == 3


def test_api_lenient_flag(trial: Trial, operator: Client) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "function", "content": "old style"}]
    url = reverse("api:trial-trajectory-import", args=[trial.pk])
    strict = post(operator, url, {"document": messages})
    assert strict.json() == {
        "document": ["messages[1].role: must be system, developer, user, assistant or tool, got 'function'"],
        "lenient": ['"lenient": true imports it, keeping each off-spec step\'s text and listing the deviations'],
    }
    assert not Trajectory.objects.exists()
    response = post(operator, url, {"document": messages, "lenient": True})
    assert response.status_code == 201
    assert response.json()["deviations"] == [
        "messages[1].role: must be system, developer, user, assistant or tool, got 'function'"
    ]
    assert [step.message for step in stored(trial)] == ["hi", "old style"]


def test_jsonl_over_the_line_limit_is_refused_and_stores_nothing(trial: Trial, settings: Any) -> None:
    settings.RSI_MAX_JSONL_LINES = 5
    path = HARBOR / "openhands-hello-world.trajectory.jsonl"
    code, out, err = command("--trial", str(trial.pk), str(path))
    assert (code, out) == (2, "")
    assert err == f"7 lines in {path}, over the limit of 5 (RSI_MAX_JSONL_LINES); nothing was imported"
    assert not Trajectory.objects.exists()


def test_an_indented_json_file_longer_than_the_jsonl_limit_imports(trial: Trial, settings: Any) -> None:
    # The line limit is JSONL's; an ordinary indented JSON file has many more lines than steps.
    settings.RSI_MAX_JSONL_LINES = 5
    path = FIXTURES / "atif" / "hello-world.trajectory.json"
    assert path.read_text().count("\n") > 5
    code, out, _ = command("--trial", str(trial.pk), str(path))
    assert (code, out) == (0, f"imported 6 steps (atif) into trial {trial.pk}; redacted: none\n")
