"""The Harbor-style worked example: a command-line agent run through cli_runner.py, graded by tests/test.sh."""

from __future__ import annotations

import io
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from evolution.agents import cli_runner, harbor, harbor_verify
from evolution.models import CertifiedResult, Evaluation, Experiment, Trajectory, Trial
from evolution.services.records import records_verify
from evolution.services.snapshots import tree_entries
from evolution.surfaces import in_surface, parse_surface
from evolution.trajectory_formats import validate_atif
from tests.factories import evaluate_seed_inline, seed_of

EXAMPLE = Path(cli_runner.__file__).parent / "harbor_example"


def copy_example(tmp_path: Path) -> Path:
    """A copy of evolution/agents/ (the example refers to ../cli_runner.py) to change freely."""
    shutil.copytree(EXAMPLE.parent, tmp_path / "agents", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path / "agents" / "harbor_example"


def load(*args: str) -> str:
    out = io.StringIO()
    call_command("load_harbor_example", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_load_creates_the_experiment_once_with_tests_kept_private() -> None:
    first = load()
    second = load()
    assert "loaded Harbor example experiment 'harbor-example'" in first
    assert "4 tasks (gate 1, sealed 1, train 2)" in first
    assert "nothing to do" in second
    assert Experiment.objects.count() == 1
    experiment = Experiment.objects.get(name="harbor-example")
    task = experiment.benchmark.tasks.get(external_id="sum-numbers")
    # The agent gets the instruction and the workspace files; the tests travel only in `expected`.
    assert task.public_files is not None
    public = {entry.path for entry in tree_entries(tree=task.public_files)}
    assert public == {"workspace/numbers.txt"}
    assert "/logs/verifier/reward.txt" in task.expected["tests"]["test.sh"]
    evaluator_files = {entry.path for entry in tree_entries(tree=experiment.evaluator.files)}
    assert evaluator_files == {"cli_runner.py", "harbor_verify.py"}
    surface = parse_surface(experiment.surface.spec)
    seed_files = [entry.path for entry in tree_entries(tree=seed_of(experiment).tree)]
    assert [path for path in seed_files if in_surface(surface, path)] == ["agent.toml", "prompts/system.md"]


@pytest.mark.django_db
def test_seed_evaluation_runs_the_agent_and_grades_with_the_task_tests() -> None:
    load()
    experiment = Experiment.objects.get(name="harbor-example")
    evaluation = evaluate_seed_inline(experiment)

    assert evaluation.state == Evaluation.State.CERTIFIED, evaluation.error
    assert CertifiedResult.objects.filter(evaluation=evaluation).exists()
    trials = Trial.objects.filter(evaluation=evaluation).select_related("task")
    assert trials.count() == 8
    by_task: dict[str, set[tuple[str, float | None, bool | None]]] = {}
    for trial in trials:
        assert trial.error == "", trial.error
        by_task.setdefault(trial.task.external_id, set()).add((trial.outcome, trial.score, trial.submitted))
    # The seed's rules: a literal file and a sum pass; "count" is mapped to count_lines, so
    # counting words is answered wrongly; nothing covers reversing, so the agent gives up.
    assert by_task == {
        "hello-file": {("pass", 1.0, True)},
        "sum-numbers": {("pass", 1.0, True)},
        "count-words": {("fail", 0.0, True)},
        "reverse-lines": {("fail", 0.0, False)},
    }
    for trial in trials:
        trajectory = Trajectory.objects.get(trial=trial)
        assert trajectory.schema_version == "ATIF-v1.5"
        assert trajectory.step_count == trajectory.steps.count() >= 3
        metered = trajectory.final_metrics
        assert trial.tokens == metered["total_prompt_tokens"] + metered["total_completion_tokens"] > 0
        assert trial.steps == trajectory.step_count
    hello = trials.get(task__external_id="hello-file", index=0).trajectory
    calls = [call["function_name"] for step in hello.steps.order_by("step_id") for call in step.tool_calls]
    assert calls == ["write_file"]
    assert records_verify(experiment=experiment).ok


@pytest.mark.django_db
def test_a_harness_edit_changes_the_outcome(tmp_path: Path) -> None:
    """The rules are the harness: adding a reverse rule makes the agent solve that task."""
    folder = copy_example(tmp_path)
    prompt = folder / "harness" / "prompts" / "system.md"
    prompt.write_text(prompt.read_text() + 'rule: "reverse order" -> reverse_lines\n')
    config = folder / "benchmark.toml"
    config.write_text(config.read_text().replace("k = 2", "k = 1"))
    load("--folder", str(folder), "--name", "edited")
    evaluation = evaluate_seed_inline(Experiment.objects.get(name="edited"), splits=("train",))
    outcomes = dict(Trial.objects.filter(evaluation=evaluation).values_list("task__external_id", "outcome"))
    assert outcomes == {"hello-file": "pass", "reverse-lines": "pass"}


@pytest.mark.django_db
def test_a_task_without_tests_is_refused_naming_the_file(tmp_path: Path) -> None:
    folder = copy_example(tmp_path)
    (folder / "tasks" / "sum-numbers" / "tests" / "test.sh").unlink()
    with pytest.raises(CommandError, match=r"sum-numbers/tests/test.sh: missing"):
        load("--folder", str(folder), "--name", "broken")
    assert not Experiment.objects.exists()


# --- cli_runner and harbor_verify as plain programs (no database) ---------------------------


def run_runner(tmp_path: Path, agent: str, config: str) -> tuple[int, Path]:
    harness, task, output = tmp_path / "harness", tmp_path / "task", tmp_path / "output"
    for folder in (harness, task / "workspace", output):
        folder.mkdir(parents=True)
    (harness / "agent.py").write_text(textwrap.dedent(agent))
    (harness / "agent.toml").write_text(textwrap.dedent(config))
    (task / "instruction.md").write_text("say hi")
    (task / "workspace" / "seed.txt").write_text("x")
    status = cli_runner.main(["--harness", str(harness), "--task", str(task), "--output", str(output)])
    return status, output


def test_runner_converts_openai_messages_and_usage(tmp_path: Path) -> None:
    agent = """
        import json, os, pathlib, sys
        out = pathlib.Path(os.environ["AGENT_OUTPUT"])
        pathlib.Path(sys.argv[1], "hi.txt").write_text(pathlib.Path(sys.argv[2]).read_text())
        messages = [
            {"role": "user", "content": "say hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "write", "arguments": "{\\"path\\": \\"hi.txt\\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "assistant", "content": "done"},
        ]
        (out / "messages.json").write_text(json.dumps(messages))
        (out / "tokens.json").write_text(json.dumps({"prompt_tokens": 70, "completion_tokens": 5}))
    """
    config = """
        command = ["{python}", "{harness}/agent.py", "{workspace}", "{instruction}"]
        trajectory = "{output}/messages.json"
        trajectory_format = "openai-messages"
        usage = "{output}/tokens.json"
    """
    status, output = run_runner(tmp_path, agent, config)
    assert status == 0, (output / "agent.log").read_text()
    assert (output / "workspace" / "hi.txt").read_text() == "say hi"
    assert (output / "workspace" / "seed.txt").read_text() == "x"
    document = json.loads((output / "trajectory.json").read_text())
    assert [step["source"] for step in document["steps"]] == ["user", "agent", "agent"]
    # A message list carries no times: none is made up (the trial page would show 0 s between its steps).
    assert [step.get("timestamp") for step in document["steps"]] == [None, None, None]
    assert validate_atif(document)["steps"][1]["step_id"] == 2
    assert document["steps"][1]["tool_calls"] == [
        {"tool_call_id": "c1", "function_name": "write", "arguments": {"path": "hi.txt"}}
    ]
    assert document["steps"][1]["observation"] == {"results": [{"source_call_id": "c1", "content": "ok"}]}
    usage = json.loads((output / "usage.json").read_text())
    assert usage == {"tokens": 75, "prompt_tokens": 70, "completion_tokens": 5, "steps": 3}


def test_runner_passes_on_the_agents_failure_and_its_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agent = """
        import sys
        print("thinking hard")
        sys.exit(3)
    """
    status, output = run_runner(tmp_path, agent, 'command = ["{python}", "{harness}/agent.py"]\n')
    assert status == 3
    assert "thinking hard" in (output / "agent.log").read_text()
    assert "exited with status 3" in capsys.readouterr().err
    assert not (output / "usage.json").exists()


def test_runner_refuses_a_config_without_a_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _ = run_runner(tmp_path, "", 'command = "python agent.py"\n')
    assert status == 2
    assert "`command` must be a non-empty list of strings" in capsys.readouterr().err


def test_runner_reports_an_agent_that_runs_too_long(tmp_path: Path) -> None:
    agent = "import time\ntime.sleep(30)\n"
    status, _ = run_runner(tmp_path, agent, 'command = ["{python}", "{harness}/agent.py"]\ntimeout_seconds = 0.5\n')
    assert status == 124


def verify(tmp_path: Path, test_sh: str, answer: str | None) -> tuple[int, dict]:
    output, private = tmp_path / "output", tmp_path / "private"
    (output / "workspace").mkdir(parents=True)
    private.mkdir()
    if answer is not None:
        (output / "workspace" / "a.txt").write_text(answer)
    expected = {"expected": {"tests": {"test.sh": test_sh}, "workspace_files": {}}, "criteria": []}
    (private / "expected.json").write_text(json.dumps(expected))
    out = io.StringIO()
    stdout, sys.stdout = sys.stdout, out
    try:
        status = harbor_verify.main(["--output", str(output), "--expected", str(private / "expected.json")])
    finally:
        sys.stdout = stdout
    return status, json.loads(out.getvalue())


GRADE = (
    '[ "$(cat /app/a.txt 2>/dev/null)" = "yes" ] && echo 1 > /logs/verifier/reward.txt'
    " || echo 0 > /logs/verifier/reward.txt\n"
)


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        ("yes", {"passed": True, "score": 1.0, "submitted": True, "valid_output": True}),
        ("no", {"passed": False, "score": 0.0, "submitted": True, "valid_output": True}),
        (None, {"passed": False, "score": 0.0, "submitted": False, "valid_output": False}),
    ],
)
def test_verifier_maps_harbor_paths_and_reads_the_reward(tmp_path: Path, answer: str | None, verdict: dict) -> None:
    status, printed = verify(tmp_path, GRADE, answer)
    assert status == 0
    assert {key: printed[key] for key in verdict} == verdict
    assert printed["criteria"] == [{"id": "reward", "met": verdict["passed"], "value": verdict["score"]}]


@pytest.mark.parametrize(
    ("test_sh", "error"),
    [
        ("exit 0\n", "the tests wrote no reward"),
        ("echo 1.5 > /logs/verifier/reward.txt\n", "outside [0, 1]"),
        ("echo lots > /logs/verifier/reward.txt\n", "reward.txt must hold a number"),
    ],
)
def test_verifier_refuses_a_missing_or_bad_reward(tmp_path: Path, test_sh: str, error: str) -> None:
    status, printed = verify(tmp_path, test_sh, "yes")
    assert status == 2
    assert error in printed["error"]


def test_path_mapping_touches_whole_components_only() -> None:
    mapped = harbor_verify.map_paths(
        "cat /app/x /application/y my/tests/z /tests/t > /logs/verifier/reward.txt",
        workspace=Path("/w"),
        tests=Path("/t"),
        logs=Path("/l"),
    )
    assert mapped == "cat /w/x /application/y my/tests/z /t/t > /l/reward.txt"


def test_reader_keeps_tests_out_of_the_public_files() -> None:
    task = harbor.read_task(EXAMPLE / "tasks" / "count-words")
    assert set(task.files) == {"workspace/essay.txt"}
    assert set(task.expected["tests"]) == {"test.sh"}
    assert task.metadata["format"] == "harbor"
