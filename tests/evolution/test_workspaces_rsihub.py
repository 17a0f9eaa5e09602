"""Import of a workspace written by RSIHub's own code (tests/fixtures/rsihub, SOURCE.md).

The expected values are what RSIHub's own merged rows and ``format_status``
report for the same archive (expected.json, computed by RSIHub's code): the
scores, outcomes, verdicts, costs and lineage in rsiweb must equal them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from evolution.models import Candidate, Evaluation, Experiment, Trial

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rsihub"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())


def workspace(tmp_path: Path, stage: str) -> Path:
    """The fixture's git history (tags gen/0, gen/1, gen/3) with the archive of ``stage``."""
    path = tmp_path / "rsihub-smoke"
    if not path.exists():
        subprocess.run(
            ["git", "clone", "-q", str(FIXTURES / "workspace.bundle"), str(path)], check=True, capture_output=True
        )
        subprocess.run(["git", "-C", str(path), "fetch", "-q", "--tags"], check=True, capture_output=True)
    shutil.copyfile(FIXTURES / f"{stage}.archive.jsonl", path / "archive.jsonl")
    return path


def state_for(row: dict[str, Any]) -> str:
    """rsiweb's state for an RSIHub row: a provisional verdict awaits the gate."""
    if row["pending_gate_record"] is True:
        return Candidate.State.EVALUATED
    return Candidate.State.EVALUATED if row["verdict"] == "keep" else Candidate.State.REJECTED_GATE


def assert_equals_rsihub(experiment: Experiment, stage: str) -> None:
    rows = EXPECTED[stage]["rows"]
    origin = experiment.run_settings["imported_from"]
    rejected = origin["proposals_rejected"]
    candidates = {c.label: c for c in experiment.candidates.all()}
    evaluated = {genid: row for genid, row in rows.items() if row["trials"]}
    assert sorted(candidates) == sorted(f"gen/{genid}" for genid in evaluated)
    assert sorted(rejected) == sorted(genid for genid, row in rows.items() if not row["trials"])
    for genid, row in rows.items():
        if genid in rejected:
            assert (rejected[genid]["status"], rejected[genid]["reason"], rejected[genid]["parent"]) == (
                row["status"],
                row["reason"],
                row["parent"],
            )
            continue
        candidate = candidates[f"gen/{genid}"]
        parent = candidate.parent.label if candidate.parent else None
        assert parent == (f"gen/{row['parent']}" if row["parent"] is not None else None)
        assert candidate.state == state_for(row), genid
        evaluation = Evaluation.objects.get(candidate=candidate, external=True)
        source = evaluation.source
        assert (source["score"], source["cost"], source["verdict"], source["pending_gate_record"]) == (
            row["score"],
            row["cost"],
            row["verdict"],
            row["pending_gate_record"],
        )
        trials: dict[str, list[Trial]] = {}
        for trial in evaluation.trials.select_related("task").order_by("task__external_id", "index"):
            trials.setdefault(trial.task.external_id, []).append(trial)
        assert sorted(trials) == sorted(row["trials"])
        scored: list[float] = []
        for task, expected in row["trials"].items():
            for trial, (status, reward) in zip(trials[task], expected, strict=True):
                if status == "benchmark_complete":
                    assert (trial.outcome, trial.score) == (
                        Trial.Outcome.PASS if reward >= 1 else Trial.Outcome.FAIL,
                        reward,
                    )
                    scored.append(reward)
                else:
                    assert (trial.outcome, trial.state, trial.score) == (Trial.Outcome.ERROR, Trial.State.ERROR, None)
                    assert trial.error.startswith(status)
        # RSIHub's score is the mean reward of its scored trials; ours of the same trials.
        assert sum(scored) / len(scored) == pytest.approx(row["score"], abs=1e-12)


@pytest.mark.django_db
def test_rsihub_workspace_imports_as_rsihub_reports_it(tmp_path: Path) -> None:
    call_command("import_workspace", str(workspace(tmp_path, "pending")))
    experiment = Experiment.objects.get(name="rsihub-smoke")
    assert_equals_rsihub(experiment, "pending")
    gen1 = experiment.candidates.get(label="gen/1")
    assert gen1.state_reason == "imported: evaluated, awaiting the source's gate; not certified here"
    # Generation 0's cost is the genesis evaluation's, not the set-up placeholder's 0.
    gen0 = Evaluation.objects.get(candidate__label="gen/0", candidate__experiment=experiment)
    assert gen0.source["cost"] == {"usd": 0.42, "wall_s": 61.5}
    assert experiment.run_settings["imported_from"]["proposals_rejected"]["2"]["reason"] == "no changes to commit"


@pytest.mark.django_db
def test_rsihub_workspace_grown_reimport_applies_the_gate_and_new_rejections(tmp_path: Path) -> None:
    call_command("import_workspace", str(workspace(tmp_path, "pending")))
    experiment = Experiment.objects.get(name="rsihub-smoke")
    evaluations = Evaluation.objects.filter(experiment=experiment).count()
    call_command("import_workspace", str(workspace(tmp_path, "final")))
    experiment.refresh_from_db()
    assert_equals_rsihub(experiment, "final")
    gen1 = experiment.candidates.get(label="gen/1")
    assert (gen1.state, gen1.state_reason) == (
        Candidate.State.EVALUATED,
        "imported: the source kept it (verdict 'keep'); not certified here",
    )
    rejected = experiment.run_settings["imported_from"]["proposals_rejected"]["4"]
    assert (rejected["status"], rejected["surface_violations"]) == ("invalid_proposal", ["evaluator/README.md"])
    # Nothing measured twice: the re-import updated, it did not add evaluations.
    assert Evaluation.objects.filter(experiment=experiment).count() == evaluations
    call_command("import_workspace", str(workspace(tmp_path, "final")))
    assert Evaluation.objects.filter(experiment=experiment).count() == evaluations
    assert_equals_rsihub(experiment, "final")


def test_expected_values_are_rsihubs_own_status_report() -> None:
    # expected.json holds RSIHub's format_status too: its budget is the sum of
    # the merged rows' costs, so gen 0's genesis cost (not 0) is in it.
    final = EXPECTED["final"]
    assert "budget_spent_usd: 1.4\n" in final["format_status"]
    assert round(sum(row["cost"]["usd"] for row in final["rows"].values()), 6) == 1.4
