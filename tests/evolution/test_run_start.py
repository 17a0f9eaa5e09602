"""Runs start from a chosen candidate and measure everything from it (issue 19)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from evolution.access import roles_ensure
from evolution.loop import lifecycle, load
from evolution.models import Candidate, CertifiedResult, GateDecision, Run
from tests.evolution.test_loop import start, tiny_recipe
from tests.loop_driver import drive

pytestmark = pytest.mark.django_db


def certified_pass_rates(candidate: Candidate) -> dict[str, float]:
    """pass@1 per split, read from the candidate's certified records (their payloads), not from the loop."""
    outcomes: dict[str, list[bool]] = {}
    for record in CertifiedResult.objects.filter(candidate=candidate):
        for trial in record.payload["trials"]:
            outcomes.setdefault(trial["split"], []).append(trial["outcome"] == "pass")
    return {split: sum(values) / len(values) for split, values in outcomes.items()}


@pytest.fixture
def two_runs() -> tuple[Run, Run, Candidate]:
    first = drive(start("unregularized"))
    assert first.status == Run.Status.FINISHED, first.error
    best = load.best_candidate(first.experiment)
    assert best is not None and best.pk != first.experiment.seed_candidate_id
    second = drive(lifecycle.run_create(experiment=first.experiment, recipe=tiny_recipe("unregularized")))
    assert second.status == Run.Status.FINISHED, second.error
    return first, second, best


def test_the_best_accepted_candidate_is_the_default_start_and_the_run_measures_from_it(
    two_runs: tuple[Run, Run, Candidate],
) -> None:
    first, second, best = two_runs
    experiment = first.experiment
    # The best when the second run started: the accepted candidate with the highest certified evolve score.
    splits, metric = load.experiment_measure(experiment)
    scores = {
        c.pk: load.candidate_stats(c, splits, metric)
        for c in Candidate.objects.filter(experiment=experiment, state=Candidate.State.ACCEPTED).exclude(run=second)
    }
    assert best.pk == max(scores, key=lambda pk: (scores[pk].score, -pk))  # type: ignore[union-attr]
    assert second.start_candidate_id == best.pk and first.start_candidate_id == experiment.seed_candidate_id
    baseline = GateDecision.objects.get(run=second, round=0)
    assert (baseline.candidate_id, baseline.rule, baseline.accepted) == (best.pk, "start", True)
    # Labels never repeat within the experiment: a later run's carry its number.
    labels = list(Candidate.objects.filter(experiment=experiment).exclude(label="").values_list("label", flat=True))
    assert len(labels) == len(set(labels))
    second_labels = Candidate.objects.filter(run=second, origin=Candidate.Origin.PROPOSED).values_list(
        "label", flat=True
    )
    assert second_labels and all(label.startswith("run2-r") for label in second_labels)
    # Parents only from the run's own lineage: its start and what its own gates accepted.
    lineage = {best.pk} | set(
        GateDecision.objects.filter(run=second, accepted=True).values_list("candidate_id", flat=True)
    )
    parents = set(Candidate.objects.filter(run=second).values_list("parent_id", flat=True))
    assert parents and parents <= lineage
    # The start-versus-final report is measured from the start, and equals its certified records.
    final = second.state["final"]
    assert final["start"] == best.pk and "seed_scores" not in final
    assert final["start_scores"] == pytest.approx(certified_pass_rates(best))
    assert second.state["best_by_round"][0] == pytest.approx(
        load.candidate_stats(best, splits, metric).score  # type: ignore[union-attr]
    )


def test_the_dashboard_and_the_api_report_the_run_from_its_start(two_runs: tuple[Run, Run, Candidate]) -> None:
    first, second, best = two_runs
    roles_ensure()
    user = User.objects.create_user("olga")
    user.groups.add(Group.objects.get(name="operator"))
    client = Client()
    client.force_login(user)
    page = client.get(reverse("review:experiment", args=[first.experiment_id]), {"run": second.pk})
    certified = certified_pass_rates(best)
    comparison = {row["split"]: row["start"] for row in page.context["comparison"]}
    assert comparison and comparison == pytest.approx({s: certified[s] for s in comparison})
    first_row = page.context["rounds"][-1] if page.context["rounds"][-1].number == 0 else page.context["rounds"][0]
    assert first_row.number == 0 and first_row.best == pytest.approx(second.state["best_by_round"][0])
    api = APIClient()
    api.force_authenticate(user)
    assert api.get(f"/api/v1/runs/{second.pk}/").json()["start_candidate"] == best.pk
    # The lineage filtered to the second run: its start, its rounds in their own columns.
    lineage = client.get(reverse("review:lineage", args=[first.experiment_id]), {"run": second.pk})
    titles = [column["title"] for column in lineage.context["columns"]]
    assert "run 2 · round 1" in titles
    earlier = {node.id for node in lineage.context["tree"].nodes if not titles[node.column].startswith("run 2")}
    assert best.pk in earlier and earlier <= {best.pk, best.parent_id}  # the start and its parent, nothing else
    assert api.get(f"/api/v1/experiments/{first.experiment_id}/").json()["best_candidate"] == (
        load.best_candidate(first.experiment).pk  # type: ignore[union-attr]
    )
    # Starting from a candidate through the API.
    created = api.post(
        "/api/v1/runs/",
        {"experiment": first.experiment_id, "recipe": f"run-{second.pk}", "start_candidate": best.pk, "rounds": 1},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert created.json()["start_candidate"] == best.pk


def test_a_run_cannot_start_from_a_candidate_that_was_not_accepted() -> None:
    first = drive(start("unregularized"))
    rejected = Candidate.objects.filter(run=first, state=Candidate.State.REJECTED_GATE).first()
    assert rejected is not None
    runs = Run.objects.count()
    with pytest.raises(lifecycle.LoopError, match="starts from the seed or from an accepted candidate"):
        lifecycle.run_create(experiment=first.experiment, recipe=tiny_recipe("rrsi"), start=rejected)
    with pytest.raises(CommandError, match="accepted candidate"):
        call_command("run_experiment", str(first.experiment_id), "--from", str(rejected.pk), "--proposer", "tiny-test")
    assert Run.objects.count() == runs
    seed = first.experiment.seed_candidate
    assert seed is not None
    call_command("run_experiment", str(first.experiment_id), "--from", str(seed.pk), "--proposer", "tiny-test")
    assert Run.objects.latest("pk").start_candidate_id == seed.pk
