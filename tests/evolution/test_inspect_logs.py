"""Inspect AI eval logs written by Inspect itself (tests/fixtures/inspect, SOURCE.md), imported as a
user would: as a job (``import_job``) and as trajectories (``import_trajectory``). Expected counts are
read from the raw files here with zipfile and json, not through the reader."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest

from evolution.models import Candidate, Evaluation, Experiment, Trajectory, TrajectoryStep, Trial
from tests.factories import command_run, evaluate_seed_inline, make_tiny_experiment

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "inspect"
EVAL = FIXTURES / "2025-02-11T15-18-04-05-00_popularity_mj7khqpMM4GBCfVQozKgzB.eval"
TOOLS = FIXTURES / "log_message_deduplication.eval"
JSON = FIXTURES / "2025-05-12T20-28-13-04-00_popularity.json"
OLD_JSON = FIXTURES / "log_formats.json"
EPOCHS = FIXTURES / "log_streaming.eval"
LETTERS = {"C": 1.0, "I": 0.0}  # the scores these logs hold


pytestmark = pytest.mark.django_db


def raw_samples(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, samples) straight from the file."""
    if path.suffix == ".eval":
        with zipfile.ZipFile(path) as archive:
            header = json.loads(archive.read("header.json"))
            names = [n for n in archive.namelist() if n.startswith("samples/")]
            return header, [json.loads(archive.read(n)) for n in names]
    document = json.loads(path.read_text())
    return document, document["samples"]


def test_an_eval_log_imports_as_a_job_with_each_samples_score_tokens_and_trajectory() -> None:
    header, samples = raw_samples(EVAL)
    assert (len(samples), header["eval"]["packages"]["inspect_ai"]) == (10, "0.3.58.dev16+g6a87748b")
    code, out = command_run("import_job", str(EVAL))
    assert code == 0, out
    experiment = Experiment.objects.get(name="popularity")
    candidate = Candidate.objects.get(experiment=experiment)
    assert candidate.label == "inspect:popularity openai/gpt-4o-mini"
    evaluation = Evaluation.objects.get(candidate=candidate)
    trials = {t.task.external_id: t for t in evaluation.trials.select_related("task")}
    expected = {str(s["id"]): LETTERS[s["scores"]["match"]["value"]] for s in samples}
    assert {task: t.score for task, t in trials.items()} == expected
    assert sum(expected.values()) / len(expected) == header["results"]["scores"][0]["metrics"]["accuracy"]["value"]
    tokens = {
        str(s["id"]): sum(u["input_tokens"] + u["output_tokens"] for u in s["model_usage"].values()) for s in samples
    }
    assert {task: t.tokens for task, t in trials.items()} == tokens
    assert sum(tokens.values()) == sum(
        u["input_tokens"] + u["output_tokens"] for u in header["stats"]["model_usage"].values()
    )
    source = evaluation.source
    assert (source["kind"], source["total_samples"], source["scorer"]) == ("inspect-log", 10, "match")
    # Each sample's messages are its steps; the assistant's time and tokens are its model event's.
    for sample in samples:
        trajectory = Trajectory.objects.get(trial=trials[str(sample["id"])])
        assert trajectory.step_count == len(sample["messages"])
        assert trajectory.extra["inspect"]["sample"]["scores"] == sample["scores"]
        (event,) = [e for e in sample["events"] if e["event"] == "model"]
        agent = TrajectoryStep.objects.get(trajectory=trajectory, source="agent")
        assert (agent.timestamp, agent.metrics["prompt_tokens"], agent.metrics["completion_tokens"]) == (
            event.get("completed") or event["timestamp"],
            event["output"]["usage"]["input_tokens"],
            event["output"]["usage"]["output_tokens"],
        )
    # Safe to repeat.
    assert command_run("import_job", str(EVAL))[0] == 0
    assert Evaluation.objects.filter(candidate__experiment=experiment).count() == 1


def test_the_epochs_of_a_sample_are_its_attempts() -> None:
    header, samples = raw_samples(EPOCHS)
    assert command_run("import_job", str(EPOCHS), "--experiment", "epochs")[0] == 0
    trials = Trial.objects.filter(candidate__experiment__name="epochs").select_related("task")
    assert {(t.task.external_id, t.index): t.score for t in trials} == {
        (str(s["id"]), s["epoch"] - 1): LETTERS[s["scores"]["match"]["value"]] for s in samples
    }
    assert len(trials) == header["results"]["total_samples"] == 4
    assert Experiment.objects.get(name="epochs").trials_per_task == 2


def test_tool_calls_of_an_eval_log_are_steps_with_their_observations_and_times() -> None:
    _, (sample,) = raw_samples(TOOLS)
    code, out = command_run("import_job", str(TOOLS), "--experiment", "guess")
    assert code == 0, out
    trial = Trial.objects.get(candidate__experiment__name="guess")
    assert (trial.outcome, trial.score) == (Trial.Outcome.FAIL, sample["scores"]["closeness_log"]["value"])
    steps = list(TrajectoryStep.objects.filter(trajectory__trial=trial).order_by("step_id"))
    calls = [c for m in sample["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    results = [m for m in sample["messages"] if m["role"] == "tool"]
    assert (len(steps), len(calls), len(results)) == (7, 5, 5)
    assert len(steps) == len(sample["messages"]) - len(results)
    assert [c for s in steps for c in s.tool_calls] == [
        {"tool_call_id": c["id"], "function_name": c["function"], "arguments": c["arguments"]} for c in calls
    ]
    assert [r["content"] for s in steps for r in s.observation.get("results", [])] == [m["content"] for m in results]
    completed = {
        e["output"]["choices"][0]["message"]["id"]: e["completed"] for e in sample["events"] if e["event"] == "model"
    }
    assistants = [m for m in sample["messages"] if m["role"] == "assistant"]
    assert [s.timestamp for s in steps if s.source == "agent"] == [completed[m["id"]] for m in assistants]


def test_a_json_log_imports_as_a_job_and_an_older_one_as_a_trajectory() -> None:
    header, samples = raw_samples(JSON)
    assert (header["status"], len(samples)) == ("cancelled", 3)
    assert command_run("import_job", str(JSON), "--experiment", "popularity-json")[0] == 0
    trials = Trial.objects.filter(candidate__experiment__name="popularity-json").select_related("task")
    assert {t.task.external_id: t.score for t in trials} == {
        str(s["id"]): LETTERS[s["scores"]["match"]["value"]] for s in samples
    }
    assert {t.task.external_id: len(t.trajectory.steps.all()) for t in trials} == {
        str(s["id"]): len(s["messages"]) for s in samples
    }
    # inspect_ai 0.3.41 wrote events under ``transcript``; its one sample imports into a trial.
    _, (old,) = raw_samples(OLD_JSON)
    experiment = make_tiny_experiment(tasks=1, k=1, split_lists={"train": ["t00"]})
    evaluate_seed_inline(experiment, splits=("train",))
    trial = Trial.objects.filter(candidate=experiment.seed_candidate).first()
    assert trial is not None
    code, out = command_run("import_trajectory", "--trial", str(trial.pk), str(OLD_JSON))
    assert (code, out.strip()) == (0, f"imported 3 steps (inspect) into trial {trial.pk}; redacted: none")
    agent = TrajectoryStep.objects.get(trajectory__trial=trial, source="agent")
    (event,) = [e for e in old["transcript"]["events"] if e["event"] == "model"]
    assert (agent.message, agent.timestamp) == (old["messages"][-1]["content"], event["timestamp"])


def test_a_many_sample_log_given_to_import_trajectory_is_named_in_one_line(tmp_path: Path) -> None:
    experiment = make_tiny_experiment(tasks=3, k=1, split_lists={"train": ["t00", "t01", "t02"]})
    evaluate_seed_inline(experiment, splits=("train",))
    ids = [
        str(pk)
        for pk in Trial.objects.filter(candidate=experiment.seed_candidate)
        .order_by("pk")[:3]
        .values_list("pk", flat=True)
    ]
    code, out = command_run("import_trajectory", "--trial", ids[0], str(EVAL))
    assert code == 1
    assert out == (
        f"{EVAL}: this is an Inspect AI eval log (.eval, 10 samples), not one trajectory; import its samples with "
        "--trials ID,ID,... (10 trials, in order), or the whole log as a job with manage.py import_job; "
        "nothing was imported"
    )
    code, out = command_run("import_trajectory", "--trials", ",".join(ids), str(JSON))
    assert code == 0, out
    assert out.count("steps (inspect)") == 3
    # A zip that is not an Inspect log, and one that is damaged: one line each, no codec error.
    other = tmp_path / "other.eval"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("data.csv", "a,b\n")
    assert command_run("import_trajectory", "--trial", ids[0], str(other)) == (
        1,
        f"{other}: a zip archive without header.json or _journal/start.json (holds data.csv), not an Inspect AI "
        "eval log; nothing was imported",
    )
    code, out = command_run("import_job", str(other))
    assert (code, "utf-8" in out, out.count("\n")) == (1, False, 0)
    damaged = tmp_path / "damaged.eval"
    damaged.write_bytes(EVAL.read_bytes()[:2000])
    code, out = command_run("import_trajectory", "--trial", ids[0], str(damaged))
    assert (code, out.startswith(f"{damaged}: a damaged zip archive"), "utf-8" in out) == (1, True, False)


def test_a_log_whose_samples_contradict_its_results_writes_nothing(tmp_path: Path) -> None:
    document = json.loads(JSON.read_text())
    document["results"]["scores"][0]["metrics"]["accuracy"]["value"] = 1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(document))
    code, out = command_run("import_job", str(bad))
    assert (code, out) == (
        1,
        "bad.json: results: match accuracy is 1.0, but its samples' scores average 0.6666666666666666; "
        "nothing was imported",
    )
    assert not Experiment.objects.exists()
