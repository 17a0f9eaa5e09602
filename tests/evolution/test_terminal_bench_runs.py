"""terminal-bench 1.x ``tb run`` folders from the public leaderboard (tests/fixtures/terminal-bench,
SOURCE.md), imported as a user would (``import_job``, and ``import_harbor_job`` that refused them).
Expected counts are read from the raw results.json here, not through the reader."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from evolution.access import roles_ensure
from evolution.models import Candidate, Evaluation, Experiment, Trial
from tests.factories import command_run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "terminal-bench"
CHATERM = FIXTURES / "2025-09-10__19-49-26"  # tokens counted; no trial folders in the submission
DROID = FIXTURES / "tb_rc2_g5_1"  # four trial folders kept


pytestmark = pytest.mark.django_db


def raw(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "results.json").read_text())


def test_a_terminal_bench_run_imports_with_rewards_errors_and_tokens() -> None:
    results = raw(CHATERM)
    code, out = command_run("import_harbor_job", str(CHATERM))
    assert code == 0, out
    experiment = Experiment.objects.get(name="terminal-bench-core@0.1.1")
    candidate = Candidate.objects.get(experiment=experiment)
    assert candidate.label == "terminal-bench:chaterm:2025-09-10__19-49-26"
    evaluation = Evaluation.objects.get(candidate=candidate)
    trials = {t.task.external_id: t for t in evaluation.trials.select_related("task")}
    entries = {entry["task_id"]: entry for entry in results["results"]}
    assert len(trials) == len(entries) == 80
    passed = {task for task, t in trials.items() if t.outcome == Trial.Outcome.PASS}
    assert passed == set(results["resolved_ids"]) and len(passed) == results["n_resolved"] == 37
    errored = {task: t.error for task, t in trials.items() if t.outcome == Trial.Outcome.ERROR}
    assert errored == {
        task: f"{e['failure_mode']}: the tests gave no verdict"
        for task, e in entries.items()
        if e["is_resolved"] is None
    }
    assert len(errored) == 12
    assert {task: t.tokens for task, t in trials.items()} == {
        task: None if e["total_input_tokens"] is None else e["total_input_tokens"] + e["total_output_tokens"]
        for task, e in entries.items()
    }
    source = evaluation.source
    assert (source["kind"], source["accuracy"], source["n_input_tokens"] + source["n_output_tokens"]) == (
        "terminal-bench-run",
        results["accuracy"],
        sum((e["total_input_tokens"] or 0) + (e["total_output_tokens"] or 0) for e in entries.values()),
    )
    assert source["failure_modes"] == dict(Counter(e["failure_mode"] for e in entries.values()))


def test_two_runs_of_one_dataset_are_two_candidates_of_one_experiment() -> None:
    assert command_run("import_job", str(CHATERM))[0] == 0
    code, out = command_run("import_job", str(DROID))
    assert code == 0, out
    experiment = Experiment.objects.get(name="terminal-bench-core@0.1.1")
    labels = sorted(experiment.candidates.values_list("label", flat=True))
    assert labels == ["terminal-bench:Factory Droid:tb_rc2_g5_1", "terminal-bench:chaterm:2025-09-10__19-49-26"]
    droid = Trial.objects.filter(candidate__label="terminal-bench:Factory Droid:tb_rc2_g5_1")
    results = raw(DROID)
    assert droid.filter(outcome=Trial.Outcome.PASS).count() == results["n_resolved"] == 39
    # Factory Droid counts no tokens (0 and 0, or null, in every trial): unknown, not free.
    assert {(e["total_input_tokens"], e["total_output_tokens"]) for e in results["results"]} == {(0, 0), (None, None)}
    assert set(droid.values_list("tokens", flat=True)) == {None}
    assert (
        Evaluation.objects.get(candidate__label="terminal-bench:Factory Droid:tb_rc2_g5_1").source["trial_folders"] == 4
    )
    assert command_run("import_job", str(DROID))[0] == 0  # imported before: nothing added
    assert Evaluation.objects.filter(candidate__experiment=experiment).count() == 2
    roles_ensure()
    viewer = User.objects.create_user(username="viewer", password="pw")
    viewer.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(viewer)
    page = client.get(reverse("review:matrix", args=[experiment.pk])).content.decode()
    assert "External results imported from terminal-bench runs: not run or certified here." in page
    assert len(set(re.findall(r'href="/trials/(\d+)/"', page))) == 160


def test_a_trial_folder_contradicting_the_run_writes_nothing(tmp_path: Path) -> None:
    run_folder = shutil.copytree(DROID, tmp_path / "run")
    trial = run_folder / "eval-mteb" / "eval-mteb.1-of-1.tb_rc2_g5_1" / "results.json"
    entry = json.loads(trial.read_text())
    assert entry["is_resolved"] is True
    entry["is_resolved"] = False
    trial.write_text(json.dumps(entry))
    assert command_run("import_job", str(run_folder)) == (
        1,
        "eval-mteb/eval-mteb.1-of-1.tb_rc2_g5_1/results.json: is_resolved is false but its parser_results say "
        "{'passed': 1}; nothing was imported",
    )
    results = raw(run_folder)
    results["accuracy"] = 0.5
    (run_folder / "results.json").write_text(json.dumps(results))
    trial.write_text(json.dumps({**entry, "is_resolved": True}))
    assert command_run("import_job", str(run_folder)) == (
        1,
        "results.json: accuracy 0.5, but 39 of 80 trials are resolved (0.4875); nothing was imported",
    )
    assert not Experiment.objects.exists()
