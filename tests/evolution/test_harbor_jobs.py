"""Import of Harbor job folders written by Harbor itself (tests/fixtures/harbor, SOURCE.md)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.urls import reverse

from evolution.access import roles_ensure
from evolution.models import Blob, Candidate, Evaluation, Experiment, Task, Trajectory, Trial
from evolution.services.experiments import split_digests_compute
from evolution.services.records import records_verify
from tests.factories import evaluate_seed_inline, make_tiny_experiment

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harbor"
CARELESS = FIXTURES / "adder-careless"
CAREFUL = FIXTURES / "adder-careful"


def job_rewards(job: Path) -> dict[str, float]:
    """task name -> reward, from the job's own result.json (JobStats reward_stats) and trial folder names."""
    result = json.loads((job / "result.json").read_text())
    rewards = {}
    for stats in result["stats"]["evals"].values():
        for value, trial_names in stats["reward_stats"]["reward"].items():
            for name in trial_names:
                rewards[name.split("__")[0]] = float(value)
    return rewards


def trial_results(job: Path) -> dict[str, dict]:
    return {data["task_name"]: data for data in (json.loads(p.read_text()) for p in sorted(job.glob("*/result.json")))}


@pytest.mark.django_db
def test_harbor_job_imports_rewards_errors_tokens_and_trajectories() -> None:
    call_command("import_harbor_job", str(CARELESS), "--experiment", "adders")
    experiment = Experiment.objects.get(name="adders")
    candidate = Candidate.objects.get(experiment=experiment)
    assert (candidate.label, candidate.state, candidate.origin) == (
        "harbor:adder-careless",
        Candidate.State.EVALUATED,
        Candidate.Origin.IMPORTED,
    )
    evaluation = Evaluation.objects.get(candidate=candidate)
    assert (evaluation.external, evaluation.state) == (True, Evaluation.State.EXTERNAL)
    trials = {t.task.external_id: t for t in evaluation.trials.select_related("task")}
    # Per-task rewards equal the job's result.json.
    expected = job_rewards(CARELESS)
    assert expected == {"task-0": 1.0, "task-1": 1.0, "task-3": 0.0, "task-4": 0.0}
    assert {task: t.score for task, t in trials.items() if t.score is not None} == expected
    assert {task: t.outcome for task, t in trials.items()} == {
        "task-0": Trial.Outcome.PASS,
        "task-1": Trial.Outcome.PASS,
        "task-2": Trial.Outcome.ERROR,
        "task-3": Trial.Outcome.FAIL,
        "task-4": Trial.Outcome.FAIL,
    }
    assert (trials["task-2"].state, trials["task-2"].error) == (
        Trial.State.ERROR,
        "ValueError: scripted-adder cannot compute '-'",
    )
    results = trial_results(CARELESS)
    tokens = {
        task: data["agent_result"]["n_input_tokens"] + data["agent_result"]["n_output_tokens"]
        for task, data in results.items()
        if data["exception_info"] is None
    }
    assert tokens == {"task-0": 122, "task-1": 123, "task-3": 121, "task-4": 120}
    assert {task: t.tokens for task, t in trials.items()} == {**tokens, "task-2": None}
    stats = json.loads((CARELESS / "result.json").read_text())["stats"]
    source = evaluation.source
    assert (source["n_input_tokens"], source["n_output_tokens"], source["cost_usd"], source["n_errored_trials"]) == (
        stats["n_input_tokens"],
        stats["n_output_tokens"],
        stats["cost_usd"],
        stats["n_errored_trials"],
    )
    trajectory = Trajectory.objects.get(trial=trials["task-3"])
    assert trajectory.step_count == 3
    step = trajectory.steps.get(step_id=2)
    assert step.tool_calls[0]["arguments"] == {"command": "printf '12\\n' > answer.txt && cat answer.txt"}
    assert not Trajectory.objects.filter(trial=trials["task-2"]).exists()


@pytest.mark.django_db
def test_two_harbor_jobs_compare_task_by_task_in_the_matrix() -> None:
    call_command("import_harbor_job", str(CARELESS), "--experiment", "adders")
    call_command("import_harbor_job", str(CAREFUL), "--experiment", "adders")
    experiment = Experiment.objects.get(name="adders")
    careless, careful = experiment.candidates.order_by("pk")
    assert (careless.label, careful.label, careful.parent_id) == (
        "harbor:adder-careless",
        "harbor:adder-careful",
        careless.pk,
    )
    assert job_rewards(CAREFUL) == dict.fromkeys(["task-0", "task-1", "task-2", "task-3", "task-4"], 1.0)
    roles_ensure()
    user = User.objects.create_user(username="viewer", password="pw")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    html = client.get(reverse("review:matrix", args=[experiment.pk])).content.decode()
    assert "External results imported from Harbor jobs: not run or certified here." in html
    assert f'data-candidate="{careless.pk}"' in html and f'data-candidate="{careful.pk}"' in html
    linked = {int(pk) for pk in re.findall(r'href="/trials/(\d+)/"', html)}
    assert linked == set(Trial.objects.filter(candidate__experiment=experiment).values_list("pk", flat=True))
    assert len(linked) == 10


@pytest.mark.django_db
def test_harbor_job_reimport_adds_nothing() -> None:
    call_command("import_harbor_job", str(CARELESS))
    call_command("import_harbor_job", str(CARELESS))
    assert Experiment.objects.get().name == "adder-careless"
    assert (Candidate.objects.count(), Evaluation.objects.count(), Trial.objects.count()) == (1, 1, 5)


@pytest.mark.django_db
def test_harbor_trial_reward_contradicting_the_job_result_writes_nothing(tmp_path: Path) -> None:
    job = shutil.copytree(CARELESS, tmp_path / "job")
    trial = next(job.glob("task-3__*/result.json"))
    data = json.loads(trial.read_text())
    data["verifier_result"]["rewards"]["reward"] = 1.0
    trial.write_text(json.dumps(data))
    with pytest.raises(CommandError) as error:
        call_command("import_harbor_job", str(job))
    assert error.value.returncode == 1
    assert str(error.value) == (
        f"{trial.parent.name}/result.json: reward 1.0, but the job's result.json lists 0.0; nothing was imported"
    )
    assert (Experiment.objects.count(), Candidate.objects.count(), Trial.objects.count()) == (0, 0, 0)


@pytest.mark.django_db
def test_harbor_trajectory_over_the_limit_is_refused_whole() -> None:
    with override_settings(RSI_MAX_TRAJECTORY_BYTES=1000), pytest.raises(CommandError) as error:
        call_command("import_harbor_job", str(CARELESS))
    assert error.value.returncode == 2
    assert "trajectory.json is larger than the limit of 1000 bytes (RSI_MAX_TRAJECTORY_BYTES)" in str(error.value)
    assert (Experiment.objects.count(), Trajectory.objects.count()) == (0, 0)


@pytest.mark.django_db
def test_not_a_harbor_job_folder_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(CommandError) as error:
        call_command("import_harbor_job", str(tmp_path))
    assert (error.value.returncode, str(error.value)) == (
        1,
        f"{tmp_path}: a folder with neither config.json and result.json (a Harbor job) nor run_metadata.json and "
        "results.json (a terminal-bench run); nothing was imported",
    )


@pytest.mark.django_db
def test_harbor_trial_trajectory_continued_in_another_file_is_joined(tmp_path: Path) -> None:
    # Harbor's own terminus-2 continuation pair (tests/fixtures/harbor/linear-history, 5 + 8 steps) in a trial folder.
    job = shutil.copytree(CARELESS, tmp_path / "job")
    agent = next(job.glob("task-0__*")) / "agent"
    shutil.copyfile(FIXTURES / "linear-history" / "trajectory.json", agent / "trajectory.json")
    shutil.copyfile(FIXTURES / "linear-history" / "trajectory.cont-1.json", agent / "trajectory.cont-1.json")
    call_command("import_harbor_job", str(job))
    trajectory = Trajectory.objects.get(trial__task__external_id="task-0")
    assert trajectory.step_count == 13
    assert trajectory.extra["continuation_files"] == ["trajectory.cont-1.json"]
    assert Trial.objects.get(task__external_id="task-0").steps == 13


def job_with_tasks(tmp_path: Path, job: Path, names: dict[str, str]) -> Path:
    """A copy of the Harbor job ``job`` whose trials name other tasks (old task name -> new)."""
    copy = shutil.copytree(job, tmp_path / f"{job.name}-renamed")
    for trial in copy.glob("*/result.json"):
        data = json.loads(trial.read_text())
        data["task_name"] = names.get(data["task_name"], data["task_name"])
        trial.write_text(json.dumps(data))
    return copy


def experiment_state(experiment: Experiment) -> tuple[object, ...]:
    experiment.refresh_from_db()
    counts = (Task.objects.count(), Candidate.objects.count(), Evaluation.objects.count(), Trial.objects.count())
    return (
        *counts,
        experiment.split_digests,
        experiment.run_settings,
        sorted(experiment.split_memberships.values_list("task__external_id", "split")),
    )


LOOP_REFUSED = (
    "experiment {name!r} was not made by Harbor job imports: a job may only create an experiment or add to one "
    "that Harbor imports made; import into another experiment name; nothing was imported"
)


@pytest.mark.django_db
def test_harbor_job_into_an_experiment_the_loop_made_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    experiment = make_tiny_experiment(tasks=6, k=1)
    evaluate_seed_inline(experiment)
    # The job's trials name tasks the experiment has, so no task is missing.
    job = job_with_tasks(tmp_path, CARELESS, {f"task-{i}": f"t0{i}" for i in range(5)})
    before = experiment_state(experiment)
    with pytest.raises(CommandError) as error:
        call_command("import_harbor_job", str(job), "--experiment", experiment.name)
    assert (error.value.returncode, str(error.value)) == (2, LOOP_REFUSED.format(name=experiment.name))
    assert experiment_state(experiment) == before
    assert records_verify(experiment=experiment).problems == []


@pytest.mark.django_db
def test_harbor_job_cannot_add_a_task_to_a_loop_experiment_marked_imported(tmp_path: Path) -> None:
    # What a first job left behind before imports were refused: the loop's experiment marked as imported.
    experiment = make_tiny_experiment(tasks=6, k=1)
    evaluate_seed_inline(experiment)
    experiment.run_settings = {**experiment.run_settings, "imported_from": {"format": "harbor-job", "jobs": {}}}
    experiment.save(update_fields=["run_settings"])
    job = job_with_tasks(tmp_path, CARELESS, {"task-4": "t\u202e99"})
    before = experiment_state(experiment)
    # The mark itself may differ from the certified run settings; no task set may, before or after.
    problems = records_verify(experiment=experiment).problems
    assert [p for p in problems if "task set" in p] == []
    with pytest.raises(CommandError) as error:
        call_command("import_harbor_job", str(job), "--experiment", experiment.name)
    assert (error.value.returncode, str(error.value)) == (2, LOOP_REFUSED.format(name=experiment.name))
    assert experiment_state(experiment) == before
    assert not Task.objects.filter(external_id="t\u202e99").exists()
    assert records_verify(experiment=experiment).problems == problems


@pytest.mark.django_db
def test_a_later_harbor_job_adds_its_new_tasks_to_an_experiment_harbor_imports_made(tmp_path: Path) -> None:
    call_command("import_harbor_job", str(CARELESS), "--experiment", "adders")
    call_command(
        "import_harbor_job", str(job_with_tasks(tmp_path, CAREFUL, {"task-4": "task-5"})), "--experiment", "adders"
    )
    experiment = Experiment.objects.get(name="adders")
    tasks = sorted(experiment.benchmark.tasks.values_list("external_id", flat=True))
    assert tasks == ["task-0", "task-1", "task-2", "task-3", "task-4", "task-5"]
    assert experiment.split_digests == split_digests_compute(experiment=experiment)
    assert list(experiment.split_digests) == ["train"]


@pytest.mark.parametrize(
    "linked",
    [
        "config.json",
        "result.json",
        "task-3__HE3qUYS",
        "task-3__HE3qUYS/result.json",
        "task-3__HE3qUYS/agent",
        "task-3__HE3qUYS/agent/trajectory.json",
    ],
)
@pytest.mark.django_db
def test_a_symbolic_link_in_a_harbor_job_folder_is_refused_and_nothing_is_read(tmp_path: Path, linked: str) -> None:
    job = shutil.copytree(CARELESS, tmp_path / "job")
    # The file (or folder) moves elsewhere on this machine; a link to it takes its place.
    elsewhere = tmp_path / "elsewhere" / linked
    elsewhere.parent.mkdir(parents=True)
    (job / linked).rename(elsewhere)
    (job / linked).symlink_to(elsewhere)
    blobs = Blob.objects.count()
    with pytest.raises(CommandError) as error:
        call_command("import_harbor_job", str(job))
    assert (error.value.returncode, str(error.value)) == (
        2,
        f"{linked}: a symbolic link (links are not followed); nothing was imported",
    )
    assert (Experiment.objects.count(), Candidate.objects.count(), Blob.objects.count()) == (0, 0, blobs)
