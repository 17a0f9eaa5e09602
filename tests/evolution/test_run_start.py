"""Runs start from a chosen candidate and measure everything from it (issue 19); every way to start one goes
through ``lifecycle.run_start`` (issue 38 item 1)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from evolution.access import roles_ensure
from evolution.loop import lifecycle, load
from evolution.models import Candidate, CertifiedResult, Experiment, GateDecision, Run
from evolution.recipes import load_preset
from tests.evolution.test_loop import start, tiny_recipe
from tests.factories import make_tiny_experiment, seed_of
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


# --- lifecycle.run_start: the one way to start a run (issue 38 item 1) ---------------------------------------


def example_experiment() -> Experiment:
    call_command("load_example", verbosity=0)
    return Experiment.objects.get(name="example-routing")


def test_run_start_on_the_example_gives_a_preset_named_the_offline_proposer_and_a_spec_its_own() -> None:
    experiment = example_experiment()
    run = lifecycle.run_start(experiment=experiment, recipe="rrsi", rounds=1, k=1, candidates_per_round=2)
    spec = run.recipe.spec
    assert (spec["name"], spec["proposal"]["operator"], run.rounds) == ("rrsi", "example", 1)
    assert (spec["evaluation"]["trials_per_task"], spec["candidates_per_round"]) == (1, 2)
    assert run.start_candidate_id == experiment.seed_candidate_id and run.status == Run.Status.RUNNING
    assert lifecycle.run_cancel(run=run)
    # A spec is run as given: the preset's llm proposer has no endpoint here, so it is refused.
    with pytest.raises(lifecycle.LoopError, match="the llm proposal operator is not configured"):
        lifecycle.run_start(experiment=experiment, recipe=load_preset("rrsi"))
    with pytest.raises(lifecycle.LoopError, match="the llm proposal operator is not configured"):
        lifecycle.run_start(experiment=experiment, recipe="rrsi", proposer="llm")
    assert Run.objects.filter(experiment=experiment).count() == 1
    # Elsewhere a preset keeps its own proposer.
    tiny = make_tiny_experiment()
    assert lifecycle.default_proposer(experiment=tiny, recipe="rrsi") is None
    assert lifecycle.default_proposer(experiment=experiment, recipe=load_preset("rrsi")) is None


def test_run_start_resolves_an_earlier_runs_recipe_the_experiments_own_and_a_start_by_id() -> None:
    experiment = make_tiny_experiment()
    first = lifecycle.run_start(experiment=experiment, recipe=tiny_recipe("rrsi"))
    assert lifecycle.run_cancel(run=first)
    experiment.refresh_from_db()
    seed = experiment.seed_candidate_id
    again = lifecycle.run_start(experiment=experiment, recipe=f"run-{first.pk}", start=seed)
    assert (again.recipe_id, again.start_candidate_id) == (first.recipe_id, seed)
    assert again.recipe.spec["proposal"]["operator"] == "tiny-test"
    assert lifecycle.run_cancel(run=again)
    own = lifecycle.run_start(experiment=experiment, recipe="own", candidates_per_round=1)
    assert own.recipe.spec["candidates_per_round"] == 1 and own.recipe.spec["proposal"]["operator"] == "tiny-test"


def test_run_start_refuses_with_a_loop_error_and_creates_nothing() -> None:
    experiment = make_tiny_experiment()
    other = make_tiny_experiment(name="other")
    cases = [
        ({"recipe": "nope"}, "unknown recipe 'nope': choose a preset"),
        ({"recipe": "own"}, "it has no recipe of its own yet (its first run sets one): choose a preset"),
        ({"recipe": "run-999999"}, "no run 999999 in this experiment"),
        ({"recipe": tiny_recipe("rrsi"), "start": seed_of(other).pk}, f"no candidate #{seed_of(other).pk} in this"),
        ({"recipe": tiny_recipe("rrsi"), "start": seed_of(other)}, "belongs to another experiment"),
        ({"recipe": tiny_recipe("rrsi"), "proposer": "no-such-proposer"}, "no-such-proposer"),
        ({"recipe": tiny_recipe("rrsi"), "candidates_per_round": 0}, "candidates_per_round"),
    ]
    for kwargs, message in cases:
        with pytest.raises(lifecycle.LoopError) as caught:
            lifecycle.run_start(experiment=experiment, **kwargs)
        assert message in str(caught.value), (kwargs, caught.value)
    assert not Run.objects.exists()
    lifecycle.run_start(experiment=experiment, recipe=tiny_recipe("rrsi"))
    with pytest.raises(lifecycle.LoopError, match="has an active run already"):
        lifecycle.run_start(experiment=experiment, recipe=tiny_recipe("rrsi"))
    assert Run.objects.count() == 1


def operator_user(name: str = "olga", *, staff: bool = False) -> User:
    roles_ensure()
    user = User.objects.create_user(name, is_staff=staff)
    user.groups.add(Group.objects.get(name="operator"))
    return user


def test_the_api_applies_the_default_proposer() -> None:
    """Before run_start the API ran a preset on the example with its llm proposer (refused here: no endpoint)."""
    experiment = example_experiment()
    api = APIClient()
    api.force_authenticate(operator_user())
    response = api.post("/api/v1/runs/", {"experiment": experiment.pk, "recipe": "rrsi", "rounds": 1}, format="json")
    assert response.status_code == 201, response.content
    run = Run.objects.get(experiment=experiment)
    assert response.json()["id"] == run.pk and run.recipe.spec["proposal"]["operator"] == "example"


@pytest.fixture
def refusing_run_start(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """run_start replaced by one that records its arguments and refuses: every caller must go through it."""
    calls: list[dict[str, object]] = []

    def refuse(**kwargs: object) -> Run:
        calls.append(kwargs)
        raise lifecycle.LoopError("refused by run_start")

    monkeypatch.setattr(lifecycle, "run_start", refuse)
    return calls


def test_the_command_starts_through_run_start(refusing_run_start: list[dict[str, object]]) -> None:
    experiment = make_tiny_experiment()
    with pytest.raises(CommandError, match="^refused by run_start$") as caught:
        call_command("run_experiment", str(experiment.pk), "--recipe", "own", "--from", "7", "--rounds", "2")
    assert caught.value.returncode == 2
    assert refusing_run_start == [
        {"experiment": experiment, "recipe": "own", "rounds": 2, "k": None, "proposer": None, "start": 7}
    ]
    assert not Run.objects.exists()


def test_the_admin_action_starts_through_run_start(refusing_run_start: list[dict[str, object]]) -> None:
    experiment = make_tiny_experiment()
    user = operator_user("staff-op", staff=True)
    client = Client()
    client.force_login(user)
    response = client.post(
        reverse("admin:evolution_experiment_changelist"),
        {"action": "start_run", "_selected_action": [experiment.pk], "recipe": "rrsi", "rounds": "3", "start": "Start"},
    )
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"{experiment.name}: no run started: refused by run_start"
    ]
    assert refusing_run_start == [
        {"experiment": experiment, "recipe": "rrsi", "rounds": 3, "proposer": None, "start": None, "user": user}
    ]
    assert not Run.objects.exists()


def test_the_dashboard_starts_through_run_start(refusing_run_start: list[dict[str, object]]) -> None:
    experiment = make_tiny_experiment()
    user = operator_user()
    client = Client()
    client.force_login(user)
    url = reverse("review:run_start", args=[experiment.pk])
    response = client.post(url, {"recipe": "rrsi", "k": "2", "start_number": str(seed_of(experiment).pk)})
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["The run was not started: refused by run_start"]
    assert refusing_run_start == [
        {
            "experiment": experiment,
            "recipe": "rrsi",
            "rounds": None,
            "k": 2,
            "candidates_per_round": None,
            "proposer": None,
            "start": seed_of(experiment).pk,
            "user": user,
        }
    ]
    assert not Run.objects.exists()


def test_the_api_starts_through_run_start_and_a_refusal_is_a_400_detail(
    refusing_run_start: list[dict[str, object]],
) -> None:
    experiment = make_tiny_experiment()
    user = operator_user()
    api = APIClient()
    api.force_authenticate(user)
    body = {"experiment": experiment.pk, "recipe": "run-3", "candidates_per_round": 2, "proposer": "example"}
    response = api.post("/api/v1/runs/", body, format="json")
    assert (response.status_code, response.json()) == (400, {"detail": "refused by run_start"})
    assert refusing_run_start == [
        {
            "experiment": experiment,
            "recipe": "run-3",
            "rounds": None,
            "k": None,
            "candidates_per_round": 2,
            "proposer": "example",
            "start": None,
            "user": user,
        }
    ]
    assert not Run.objects.exists()
