"""Import of an existing evolution workspace (RSIHub layout) built by the test."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from evolution.access import roles_ensure
from evolution.models import Benchmark, Candidate, CertifiedResult, Evaluation, Experiment, SplitMembership, Trial
from evolution.services.snapshots import tree_entries
from evolution.services.workspaces import WorkspaceError, archive_parse, workspace_import

FP = "sha256:evaluator-fp-1"
TSH = "sha256:taskset-1"


def git(repo: Path, *args: str) -> None:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
        "HOME": str(repo),
        "PATH": "/usr/bin:/bin:/usr/local/bin",
    }
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def commit_generation(repo: Path, genid: str, files: dict[str, str]) -> None:
    target = repo / "target"
    for path, text in files.items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(text)
    git(repo, "add", "-A", "target")
    git(repo, "commit", "-q", "--allow-empty", "-m", f"gen {genid}")
    git(repo, "tag", f"gen/{genid}")


def event(genid: str, parent: str | None, verdict: str, tasks: dict[str, list[str]], **extra: Any) -> dict[str, Any]:
    """An RSIHub-style evaluation event; ``tasks`` maps a task to trial statuses."""
    trials = {task: {"trials": [{"status": status} for status in statuses]} for task, statuses in tasks.items()}
    passed = sum(status == "passed" for statuses in tasks.values() for status in statuses)
    total = sum(len(statuses) for statuses in tasks.values())
    return {
        "event_type": "evaluation",
        "genid": genid,
        "parent": parent,
        "tag": f"gen/{genid}",
        "verdict": verdict,
        "score": passed / total,
        "task_vector": {"schema_version": 1, "tasks": trials},
        "task_set_members": sorted(tasks),
        "cost": {"usd": 0.25, "wall_s": 12.5},
        "evaluator_fingerprint": FP,
        "task_set_hash": TSH,
        **extra,
    }


def write_archive(repo: Path, events: list[dict[str, Any]], *, tail: str = "") -> None:
    (repo / "archive.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + tail)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    repo = tmp_path / "ws-demo"
    repo.mkdir()
    git(repo, "init", "-q")
    commit_generation(repo, "0", {"prompt.md": "seed prompt\n"})
    commit_generation(repo, "1", {"prompt.md": "better prompt\n"})
    commit_generation(repo, "2", {"prompt.md": "better prompt\n", "tools/check.py": "print('x')\n"})
    # Generation 3 branches from generation 1.
    commit_generation(repo, "3", {"prompt.md": "other prompt\n"})
    tasks = ["alpha", "beta"]
    write_archive(
        repo,
        [
            event("0", None, "keep", {t: ["passed", "failed"] for t in tasks}),
            event("1", "0", "keep", {"alpha": ["passed", "passed"], "beta": ["passed", "failed"]}),
            event("2", "1", "discard", {"alpha": ["failed", "failed"], "beta": ["passed", "failed"]}),
            # A later note event of generation 2 cannot rewrite its stamped score.
            {"genid": "2", "note": "regressed on alpha", "score": 1.0},
        ],
    )
    return repo


def add_generation_3(repo: Path) -> None:
    text = (repo / "archive.jsonl").read_text()
    (repo / "archive.jsonl").write_text(
        text
        + json.dumps(event("3", "1", "keep", {"alpha": ["passed", "passed"], "gamma": ["passed", "passed"]}))
        + "\n"
    )


@pytest.mark.django_db
def test_import_creates_candidates_lineage_trees_and_scores(workspace: Path) -> None:
    report = workspace_import(path=workspace)
    experiment = report.experiment
    assert report.created and report.imported == ["0", "1", "2"]
    assert experiment.name == "ws-demo"
    assert experiment.run_settings["imported_from"]["evaluator_fingerprints"] == [FP]

    candidates = {c.label: c for c in Candidate.objects.filter(experiment=experiment)}
    assert sorted(candidates) == ["gen/0", "gen/1", "gen/2"]
    assert all(c.origin == Candidate.Origin.IMPORTED for c in candidates.values())
    assert candidates["gen/0"].parent is None
    assert candidates["gen/1"].parent == candidates["gen/0"]
    assert candidates["gen/2"].parent == candidates["gen/1"]
    assert experiment.seed_candidate == candidates["gen/0"]
    # Never shown as accepted or certified by us.
    assert candidates["gen/1"].state == Candidate.State.EVALUATED
    assert candidates["gen/2"].state == Candidate.State.REJECTED_GATE
    assert all(c.certified_at is None for c in candidates.values())

    files = {entry.path: entry.data for entry in tree_entries(tree=candidates["gen/2"].tree)}
    assert files == {"target/prompt.md": b"better prompt\n", "target/tools/check.py": b"print('x')\n"}

    benchmark = experiment.benchmark
    assert sorted(benchmark.tasks.values_list("external_id", flat=True)) == ["alpha", "beta"]
    assert benchmark.tasks.get(external_id="alpha").instruction == "imported task alpha"
    assert set(SplitMembership.objects.filter(experiment=experiment).values_list("split", flat=True)) == {"train"}

    evaluation = Evaluation.objects.get(candidate=candidates["gen/2"])
    assert evaluation.external and evaluation.state == Evaluation.State.EXTERNAL
    assert not CertifiedResult.objects.filter(experiment=experiment).exists()
    assert evaluation.source["evaluator_fingerprint"] == FP
    assert evaluation.source["task_set_hash"] == TSH
    assert evaluation.source["verdict"] == "discard"
    assert evaluation.source["score"] == 0.25  # the first (stamped) value, not the note's 1.0
    assert evaluation.source["cost"] == {"usd": 0.25, "wall_s": 12.5}
    outcomes = sorted(Trial.objects.filter(evaluation=evaluation).values_list("task__external_id", "index", "outcome"))
    assert outcomes == [("alpha", 0, "fail"), ("alpha", 1, "fail"), ("beta", 0, "pass"), ("beta", 1, "fail")]


@pytest.mark.django_db
def test_reimport_is_idempotent_and_imports_only_new_generations(workspace: Path) -> None:
    first = workspace_import(path=workspace)
    again = workspace_import(path=workspace)
    assert not again.created and again.imported == [] and again.skipped == ["0", "1", "2"]
    assert Candidate.objects.filter(experiment=first.experiment).count() == 3
    assert Evaluation.objects.filter(experiment=first.experiment).count() == 3

    add_generation_3(workspace)
    grown = workspace_import(path=workspace)
    assert grown.imported == ["3"]
    gen3 = Candidate.objects.get(experiment=first.experiment, label="gen/3")
    assert gen3.parent is not None
    assert gen3.parent.label == "gen/1"
    assert Evaluation.objects.filter(experiment=first.experiment).count() == 4
    assert "gamma" in set(first.experiment.benchmark.tasks.values_list("external_id", flat=True))


@pytest.mark.django_db
def test_malformed_line_writes_nothing_and_names_the_line(workspace: Path) -> None:
    (workspace / "archive.jsonl").write_text((workspace / "archive.jsonl").read_text() + '{"genid": "3", oops\n')
    with pytest.raises(WorkspaceError, match=r"archive.jsonl line 5: not valid JSON"):
        workspace_import(path=workspace)
    assert not Experiment.objects.exists()
    assert not Benchmark.objects.exists()
    assert not Candidate.objects.exists()

    with pytest.raises(CommandError, match=r"line 5.*nothing was imported"):
        call_command("import_workspace", str(workspace))
    assert not Experiment.objects.exists()


@pytest.mark.django_db
def test_missing_tag_or_bad_score_is_refused_whole(workspace: Path) -> None:
    add_generation_3(workspace)
    git(workspace, "tag", "-d", "gen/3")
    with pytest.raises(WorkspaceError, match=r"line 5 \(generation 3\).*gen/3"):
        workspace_import(path=workspace)
    assert not Experiment.objects.exists()
    with pytest.raises(WorkspaceError, match=r"line 1.*score 1.5"):
        archive_parse(json.dumps({"genid": "0", "task_vector": {"a": 1.5}}))
    with pytest.raises(WorkspaceError, match=r"line 2: parent '9'"):
        archive_parse('{"genid": "0"}\n{"genid": "1", "parent": "9"}\n')


def test_archive_parse_accepts_plain_task_vectors() -> None:
    generations = archive_parse(
        "\n".join(
            [
                json.dumps({"genid": 0, "task_vector": {"a": 1.0, "b": False, "c": {"score": 0.5, "split": "gate"}}}),
                json.dumps({"generation": "1", "parent": 0, "task_vector": [{"task": "a", "passed": True}]}),
            ]
        )
    )
    assert [g.genid for g in generations] == ["0", "1"]
    assert generations[0].results == [
        {"task": "a", "index": 0, "passed": True, "score": 1.0},
        {"task": "b", "index": 0, "passed": False, "score": 0.0},
        {"task": "c", "index": 0, "passed": False, "score": 0.5},
    ]
    assert generations[0].splits == {"c": "gate"}
    assert generations[1].parent == "0"


@pytest.mark.django_db
def test_candidate_page_renders_imported_candidate_without_certification(workspace: Path) -> None:
    call_command("import_workspace", str(workspace), "--name", "demo import")
    candidate = Candidate.objects.get(experiment__name="demo import", label="gen/1")
    roles_ensure()
    user = User.objects.create_user(username="viewer", password="pw")
    user.groups.add(Group.objects.get(name="viewer"))
    client = Client()
    client.force_login(user)
    response = client.get(reverse("review:candidate", args=[candidate.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    assert "not certified" in html
    assert "certified ✓" not in html
    assert 'class="badge certified"' not in html
    assert "/records/" not in html
