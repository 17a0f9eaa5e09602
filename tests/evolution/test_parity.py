"""Parity (``manage.py parity``): direct runs against the platform, with a verdict.

The comparison's rule is tested without a database; the command runs the
real agent and verifier as subprocesses, directly and through
``evaluation_start``/``trial_execute``.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from evolution import parity, trials
from evolution.example.setup import example_experiment_create
from evolution.models import Candidate, Evaluation, ParityCheck, Trial
from evolution.services import evaluation as evaluation_services
from evolution.services.snapshots import tree_store
from evolution.trees import FileEntry
from evolution.trials import TrialResult, TrialSpec
from tests.conftest import REPO_ROOT, database_url_for_subprocess
from tests.factories import make_tiny_experiment, seed_of

# --- the rule, without a database ------------------------------------------------------


def run_of(outcomes: dict[str, list[str]]) -> dict[tuple[str, int], str]:
    return {(task, index): outcome for task, row in outcomes.items() for index, outcome in enumerate(row)}


def test_binomial_upper_tail_matches_the_exact_sums() -> None:
    assert parity.binomial_upper_tail(0, 0, 1 / 3) == 1.0
    assert parity.binomial_upper_tail(5, 0, 1 / 3) == 1.0
    assert parity.binomial_upper_tail(3, 4, 1 / 3) == 0.0
    assert math.isclose(parity.binomial_upper_tail(4, 4, 1 / 3), 1 / 81)
    # P(X >= 2), X ~ Bin(3, 1/3): 3 * (1/3)^2 * (2/3) + (1/3)^3 = 7/27
    assert math.isclose(parity.binomial_upper_tail(3, 2, 1 / 3), 7 / 27)
    # Thousands of trials neither overflow nor lose the tail.
    assert math.isclose(parity.binomial_upper_tail(3000, 1000, 1 / 3), 0.5, abs_tol=0.02)


def test_identical_runs_pass_with_zero_rates() -> None:
    run = run_of({"a": ["pass", "fail"], "b": ["fail", "fail"]})
    report = parity.parity_compare([(run, dict(run), dict(run))])
    assert report.passed
    assert report.trials.direct_vs_direct == parity.Rate(0, 4)
    assert report.trials.platform_vs_direct == parity.Rate(0, 8)
    assert report.tasks.platform_vs_direct == parity.Rate(0, 4)
    assert (report.trials.discordant, report.trials.p_value) == (0, 1.0)


def test_a_platform_that_is_always_the_odd_run_fails() -> None:
    tasks = [f"t{i}" for i in range(3)]
    direct = run_of({t: ["pass", "fail"] for t in tasks})
    flipped = run_of({t: ["fail", "pass"] for t in tasks})
    report = parity.parity_compare([(direct, flipped, dict(direct))] * 2)
    assert not report.passed
    assert report.trials.platform_odd == report.trials.discordant == 12
    assert report.trials.platform_vs_direct == parity.Rate(24, 24)
    assert report.trials.direct_vs_direct == parity.Rate(0, 12)
    # Each task keeps one pass and one fail: the task level sees nothing, the trial level fails alone.
    assert report.tasks.discordant == 0 and report.tasks.passed(report.alpha)
    assert report.as_dict()["verdict"] == "fail"


def test_a_platform_no_noisier_than_the_direct_runs_passes() -> None:
    # Direct runs disagree on some trials; the platform is the odd run no more often than A or B.
    a = run_of({"t0": ["pass", "pass"], "t1": ["fail", "pass"], "t2": ["fail", "fail"], "t3": ["pass", "fail"]})
    p = run_of({"t0": ["pass", "fail"], "t1": ["fail", "pass"], "t2": ["fail", "fail"], "t3": ["pass", "pass"]})
    b = run_of({"t0": ["pass", "pass"], "t1": ["pass", "pass"], "t2": ["fail", "pass"], "t3": ["pass", "pass"]})
    report = parity.parity_compare([(a, p, b)])
    assert report.passed
    assert (report.trials.discordant, report.trials.platform_odd) == (4, 1)
    # The rates differ by exactly (u - v/2) / N: the quantity the binomial test is about.
    n = report.trials.direct_vs_direct.of
    difference = (report.trials.platform_vs_direct.rate or 0) - (report.trials.direct_vs_direct.rate or 0)
    u, v = report.trials.platform_odd, report.trials.discordant - report.trials.platform_odd
    assert math.isclose(difference, (u - v / 2) / n)


def test_errors_are_outcomes_and_task_outcomes_count_them() -> None:
    direct = run_of({"t0": ["pass", "fail"]})
    errored = run_of({"t0": ["pass", "error"]})
    report = parity.parity_compare([(direct, errored, dict(direct))])
    assert report.trials.platform_vs_direct == parity.Rate(2, 4)
    assert report.tasks.platform_vs_direct == parity.Rate(2, 2)
    assert report.runs == [
        {
            "direct_a": {"pass": 1, "fail": 1, "error": 0},
            "platform": {"pass": 1, "fail": 0, "error": 1},
            "direct_b": {"pass": 1, "fail": 1, "error": 0},
        }
    ]


def test_runs_over_different_trials_are_refused() -> None:
    a = run_of({"t0": ["pass"]})
    with pytest.raises(ValueError, match="same trials"):
        parity.parity_compare([(a, run_of({"t1": ["pass"]}), dict(a))])
    with pytest.raises(ValueError, match="at least one"):
        parity.parity_compare([])


# --- the command ---------------------------------------------------------------------


def parity_command(*args: str) -> tuple[str, int]:
    out = io.StringIO()
    try:
        call_command("parity", *args, stdout=out, stderr=io.StringIO())
    except SystemExit as exc:
        return out.getvalue(), int(exc.code or 0)
    return out.getvalue(), 0


@pytest.mark.django_db
def test_parity_on_the_example_prints_the_table_and_the_json_and_leaves_no_trace() -> None:
    experiment = example_experiment_create(name="parity example", task_limit=4)
    seed = seed_of(experiment)
    table, status = parity_command("--experiment", str(experiment.pk), "--iterations", "1")
    assert status == 0, table
    assert "direct vs direct" in table and "platform vs direct" in table
    # 4 tasks x k=2: A against B on 8 trials (4 tasks), the platform against A and B on 16 (8).
    assert re.search(r"^direct vs direct +0 of 8 +0\.0% +0 of 4 +0\.0%$", table, re.MULTILINE), table
    assert re.search(r"^platform vs direct +0 of 16 +0\.0% +0 of 8 +0\.0%$", table, re.MULTILINE), table
    assert "verdict: pass: the platform adds no disagreement beyond what direct runs show among themselves" in table

    document, status = parity_command("--experiment", str(experiment.pk), "--iterations", "2", "--json")
    assert status == 0
    numbers = json.loads(document)
    assert numbers["verdict"] == "pass"
    assert numbers["candidate"] == seed.pk and numbers["iterations"] == 2 and numbers["k"] == 2
    assert numbers["trials_per_run"] == 8 and numbers["seeds"] == [0, 1]
    assert numbers["trials"]["direct_vs_direct"] == {"disagree": 0, "of": 16, "rate": 0.0}
    assert numbers["tasks"]["platform_vs_direct"] == {"disagree": 0, "of": 16, "rate": 0.0}
    # The example's agent is deterministic given its seed: every run of an iteration has the same outcomes,
    # and they are real outcomes, not errors.
    for run in numbers["runs"]:
        assert run["direct_a"] == run["platform"] == run["direct_b"]
        assert run["platform"]["error"] == 0 and sum(run["platform"].values()) == 8

    checks = ParityCheck.objects.filter(evaluator=experiment.evaluator).order_by("pk")
    assert [c.verdict for c in checks] == ["pass", "pass"]
    assert checks.last().numbers["trials"] == numbers["trials"]  # type: ignore[union-attr]
    # The platform's evaluations were rolled back: no rows, the seed's state untouched.
    assert not Evaluation.objects.filter(experiment=experiment).exists()
    assert not Trial.objects.filter(candidate=seed).exists()
    seed.refresh_from_db()
    assert seed.state == Candidate.State.APPROVED


@pytest.mark.django_db
def test_a_platform_that_changes_outcomes_fails_the_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    experiment = make_tiny_experiment(tasks=6, k=2)
    real_run_trial = trials.run_trial
    flipped = []

    def run_trial_flipping(spec: TrialSpec, **kwargs: Any) -> TrialResult:
        # A broken platform: the first trial of every task reports the opposite outcome.
        result = real_run_trial(spec, **kwargs)
        if spec.trial_index == 0 and result.outcome in ("pass", "fail"):
            result.outcome = "fail" if result.outcome == "pass" else "pass"
            flipped.append(spec.seed)
        return result

    # Only the platform's trial_execute calls run_trial through this name; direct runs do not.
    monkeypatch.setattr(evaluation_services, "run_trial", run_trial_flipping)
    document, status = parity_command("--experiment", str(experiment.pk), "--iterations", "1", "--json")
    numbers = json.loads(document)
    assert status == 1
    assert len(flipped) == 6
    assert numbers["verdict"] == "fail"
    assert numbers["trials"]["direct_vs_direct"] == {"disagree": 0, "of": 12, "rate": 0.0}
    assert numbers["trials"]["platform_vs_direct"] == {"disagree": 12, "of": 24, "rate": 0.5}
    assert (numbers["trials"]["platform_odd"], numbers["trials"]["discordant"]) == (6, 6)
    assert numbers["trials"]["p_value"] < 0.025
    assert ParityCheck.objects.get(evaluator=experiment.evaluator).verdict == ParityCheck.Verdict.FAIL

    table, status = parity_command("--experiment", str(experiment.pk), "--iterations", "1")
    assert status == 1
    assert re.search(r"^platform vs direct +12 of 24 +50\.0% +\d+ of 12 ", table, re.MULTILINE), table
    assert "verdict: fail: the platform adds disagreement beyond what direct runs show among themselves" in table


@pytest.mark.django_db
def test_bad_input_is_refused_with_status_2_before_anything_runs() -> None:
    experiment = make_tiny_experiment(tasks=2)
    other = make_tiny_experiment(tasks=2)
    frozen = Candidate.objects.create(
        experiment=other,
        tree=tree_store(entries=[FileEntry("default.txt", "100644", b"no\n")]),
        parent=seed_of(other),
        origin=Candidate.Origin.PROPOSED,
    )
    cases = [
        (["--experiment", "999999"], "no experiment with id 999999"),
        (["--experiment", str(experiment.pk), "--candidate", "999999"], "no candidate with id 999999"),
        (
            ["--experiment", str(experiment.pk), "--candidate", str(seed_of(other).pk)],
            f"belongs to experiment {other.pk}",
        ),
        (["--experiment", str(experiment.pk), "--splits", "nonesuch"], "has no split(s) nonesuch"),
        (
            ["--experiment", str(other.pk), "--candidate", str(frozen.pk)],
            f"candidate {frozen.pk} is frozen; the platform does not evaluate it",
        ),
        (["--experiment", str(experiment.pk), "--iterations", "0"], "iterations must be at least 1"),
    ]
    for args, message in cases:
        with pytest.raises(CommandError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
            call_command("parity", *args, stdout=io.StringIO(), stderr=io.StringIO())
        assert caught.value.returncode == 2
    assert not ParityCheck.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_command_as_a_process_exits_0_on_a_pass_and_2_on_an_unknown_experiment() -> None:
    experiment = make_tiny_experiment(tasks=2, k=1)
    env = {k: v for k, v in os.environ.items() if k.startswith("RSI_") or k in {"HOME", "LANG", "PATH"}}
    env["DATABASE_URL"] = database_url_for_subprocess()

    def manage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "manage.py", "parity", *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    passed = manage("--experiment", str(experiment.pk), "--iterations", "1", "--json")
    assert passed.returncode == 0, passed.stderr
    assert json.loads(passed.stdout)["verdict"] == "pass"
    assert "iteration 1 of 1" in passed.stderr  # progress goes to stderr, the JSON alone to stdout

    unknown = manage("--experiment", "999999")
    assert unknown.returncode == 2
    assert unknown.stdout == ""
    assert unknown.stderr.strip() == "CommandError: no experiment with id 999999"
