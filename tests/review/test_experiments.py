"""Experiments list, dashboard, lineage and run control (screens 1, 2 and 9)."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Sum
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from evolution.loop import lifecycle
from evolution.models import AtomicEdit, Candidate, Experiment, LedgerEntry, ModelEndpoint, ReviewItem, Run, Trial
from evolution.recipes import load_preset
from evolution.services.evaluation import evaluation_start, trial_claim
from tests.factories import make_tiny_experiment, seed_of
from tests.review.world import grow

if TYPE_CHECKING:  # the test client's response, as django-stubs names it
    from django.test.client import _MonkeyPatchedWSGIResponse as TestResponse

pytestmark = pytest.mark.django_db

PAYLOAD = "</script><img src=x onerror=alert(1)>"
ESCAPED = "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"


def _csrf(client: Client, url: str) -> str:
    client.get(url)
    return client.cookies["csrftoken"].value


def _post(client: Client, url: str, data: dict | None = None, *, page: str = "/") -> TestResponse:
    return client.post(url, data or {}, HTTP_X_CSRFTOKEN=_csrf(client, page))


def _messages(response: TestResponse) -> list[str]:
    return [str(m) for m in response.context["messages"]] if response.context else []


def _active_run(experiment: Experiment, **kwargs: Any) -> Run:
    """A run created like the dashboard creates one, never driven (no worker)."""
    return lifecycle.run_create(experiment=experiment, recipe=load_preset("rrsi"), proposer="example", **kwargs)


def _text(html: bytes) -> str:
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html.decode())))


# --- Experiments list ------------------------------------------------------------------


def test_home_lists_each_experiment_with_its_counts_and_latest_run(example_world, client_as) -> None:
    run = example_world.runs.get()
    accepted = example_world.candidates.filter(state=Candidate.State.ACCEPTED).count()
    records = example_world.certified_results.count()
    response = client_as("viewer").get(reverse("review:home"))
    assert response.status_code == 200
    row = re.search(rf'<tr>\s*<td><a href="/experiments/{example_world.pk}/">.*?</tr>', response.content.decode(), re.S)
    assert row is not None
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)]
    assert cells[3:6] == [str(example_world.candidates.count()), str(accepted), str(records)]
    assert f"run #{run.pk}" in cells[6] and "Finished" in cells[6]
    assert f"{run.rounds} of {run.rounds} rounds gated" in cells[7]
    assert f'href="/experiments/{example_world.pk}/lineage/"' in row.group(0)


def test_home_keeps_an_experiment_finished_when_an_empty_run_is_cancelled_and_says_what_waits_for_review(
    example_world, client_as
) -> None:
    finished = example_world.runs.get()
    empty = lifecycle.run_create(experiment=example_world, recipe=load_preset("rrsi"), proposer="example")
    assert lifecycle.run_cancel(run=empty)
    example_world.refresh_from_db()
    assert example_world.status == Experiment.Status.FINISHED
    waiting = ReviewItem.objects.filter(
        candidate__experiment=example_world, state__in=[ReviewItem.State.OPEN, ReviewItem.State.CLAIMED]
    ).count()
    assert waiting >= 2
    response = client_as("viewer").get(reverse("review:home"))
    row = re.search(rf'<tr>\s*<td><a href="/experiments/{example_world.pk}/">.*?</tr>', response.content.decode(), re.S)
    assert row is not None
    text = _text(row.group(0).encode())
    assert "Finished" in text and "Cancelled" not in text
    assert f"run #{finished.pk}" in text  # the run with evidence, not the empty one
    assert f"{waiting} flagged candidates waiting for review" in text
    assert f'href="/review/?experiment={example_world.pk}"' in row.group(0)

    # An experiment whose only run was cancelled is Cancelled.
    lonely = make_tiny_experiment()
    assert lifecycle.run_cancel(run=_active_run(lonely))
    lonely.refresh_from_db()
    assert lonely.status == Experiment.Status.CANCELLED


def test_home_needs_the_viewer_permission(example_world, client_as) -> None:
    assert client_as().get(reverse("review:home")).status_code == 403
    anonymous = Client().get(reverse("review:home"))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


# --- Dashboard ----------------------------------------------------------------------


def test_dashboard_shows_facts_runs_charts_rounds_and_ledger(example_world, client_as) -> None:
    run = example_world.runs.get()
    response = client_as("viewer").get(reverse("review:experiment", args=[example_world.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    text = _text(response.content)
    accepted = example_world.candidates.filter(state=Candidate.State.ACCEPTED).count()
    assert f'<strong class="accepted-count">{accepted}</strong>' in html
    sizes = {s: example_world.split_memberships.filter(split=s).count() for s in ("train", "gate", "sealed")}
    for split, size in sizes.items():
        assert f"{split} {size}" in text
    assert f"= {sum(sizes.values())} tasks" in text
    # Charts: every measured split is a series, the last values are written out.
    found = re.search(r'<svg class="chart score-chart".*?</svg>', html, re.S)
    assert found is not None
    score_chart = found.group(0)
    final = run.state["final"]["scores"]
    for split in ("train", "gate", "sealed"):
        assert f'class="series split-{split}"' in score_chart
        assert f"{split} {final[split]:.3f}" in score_chart
    assert f"S_best {run.state['best_score']:.3f}" in score_chart
    chosen = list(run.gate_decisions.filter(accepted=True, round__gt=0).values_list("candidate_id", flat=True))
    assert chosen and all(f"#{pk}" in score_chart for pk in chosen)
    found = re.search(r'<svg class="chart cost-chart".*?</svg>', html, re.S)
    assert found is not None
    cost_chart = found.group(0)
    assert (
        cost_chart.count('<circle class="point')
        == example_world.candidates.filter(evaluations__state="certified", evaluations__purpose="candidate")
        .distinct()
        .count()
        + 1
    )  # + the seed
    assert "Pareto front" in cost_chart
    # Progress of a finished run: full bars, no polling.
    total = run.evaluations.aggregate(n=Sum("trials_total"))["n"]
    assert f'<progress value="{total}" max="{total}"' in html
    assert f"{run.rounds} of {run.rounds} rounds" in text
    found = re.search(r'<section id="run-progress".*?>', html, re.S)
    assert found is not None
    assert "hx-trigger" not in found.group(0)
    # Rounds table: one row per gated round, with the chosen candidate linked.
    for number, summary in run.state["rounds"].items():
        if number != "0":
            assert f'<a href="/candidates/{summary["current"]}/">#{summary["current"]}</a>' in html
    # Ledger: every hypothesis of the run, with dS and accepted.
    entries = list(LedgerEntry.objects.filter(run=run))
    assert entries
    assert f"{len(entries)} atomic edits" in text
    for entry in entries:
        assert entry.hypothesis in text
    assert f"{entries[0].delta_score:+.3f}" in html
    # Pruning targets and the never-measured component kinds.
    for target in run.state["pruning_targets"]:
        assert f'<span class="badge warn">{target}</span>' in html


def test_dashboard_hides_run_controls_from_viewers_and_shows_them_to_operators(example_world, client_as) -> None:
    url = reverse("review:experiment", args=[example_world.pk])
    assert reverse("review:run_start", args=[example_world.pk]) not in client_as("viewer").get(url).content.decode()
    html = client_as("operator").get(url).content.decode()
    assert f'action="{reverse("review:run_start", args=[example_world.pk])}"' in html
    for name in ("rrsi", "unregularized", "pareto"):
        assert f'<option value="{name}"' in html


def test_dashboard_warns_when_evolve_scores_rise_while_sealed_falls(example_world, client_as) -> None:
    run = example_world.runs.get()
    state = run.state
    state["final"]["scores"]["sealed"] = 0.25
    state["final"]["divergence"] = "evolve score rose by +0.428 while sealed 0.333 -> 0.250: overfitting?"
    Run.objects.filter(pk=run.pk).update(state=state)
    html = client_as("viewer").get(reverse("review:experiment", args=[example_world.pk])).content.decode()
    found = re.search(r'<div class="notice warning divergence".*?</div>', html, re.S)
    assert found is not None
    notice = found.group(0)
    assert "evolve score rose by +0.428 while sealed 0.333 -&gt; 0.250" in notice
    # The world's start measured sealed 0.333 (6 of 18 sealed tasks).
    assert re.search(r'<tr class="falling">.*?sealed.*?0\.333.*?0\.250.*?-0\.083', notice, re.S)


def test_dashboard_without_divergence_has_no_warning(example_world, client_as) -> None:
    html = client_as("viewer").get(reverse("review:experiment", args=[example_world.pk])).content.decode()
    assert "notice warning divergence" not in html


def test_dashboard_shows_the_error_of_a_failed_run_and_of_its_steps(example_world, client_as) -> None:
    run = example_world.runs.get()
    evaluation = run.evaluations.order_by("pk").last()
    type(evaluation).objects.filter(pk=evaluation.pk).update(state="failed", error="verifier crashed: exit 3")
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED, error="the seed's evaluation failed: disk full")
    html = client_as("viewer").get(reverse("review:experiment", args=[example_world.pk])).content.decode()
    assert "Run failed:" in html and "the seed&#x27;s evaluation failed: disk full" in html
    assert f"evaluation {evaluation.pk}" in html and "verifier crashed: exit 3" in html


def test_trial_errors_are_listed_and_sealed_ones_only_for_sealed_access(example_world, client_as) -> None:
    from evolution.models import Trial

    run = example_world.runs.get()
    train = Trial.objects.filter(evaluation__run=run, split="train").order_by("pk").first()
    assert train is not None
    sealed = Trial.objects.filter(evaluation__run=run, split="sealed").order_by("pk").first()
    assert sealed is not None
    for trial, message in ((train, "agent timed out after 20 s"), (sealed, "sealed verifier crashed")):
        Trial.objects.filter(pk=trial.pk).update(
            state=Trial.State.ERROR, outcome=Trial.Outcome.ERROR, error_kind="agent_timeout", error=message
        )
    url = reverse("review:experiment", args=[example_world.pk])
    viewer = client_as("viewer").get(url).content.decode()
    assert "agent_timeout × 2" in viewer  # the aggregate counts both
    assert f'href="/trials/{train.pk}/"' in viewer and "agent timed out after 20 s" in viewer
    assert f'href="/trials/{sealed.pk}/"' not in viewer and "sealed verifier crashed" not in viewer
    privileged = client_as("viewer", username="sealed-viewer", extra_perms=("evolution.view_sealed_details",))
    html = privileged.get(url).content.decode()
    assert f'href="/trials/{sealed.pk}/"' in html and "sealed verifier crashed" in html


def test_dashboard_escapes_untrusted_text(example_world, client_as) -> None:
    run = example_world.runs.get()
    entry = LedgerEntry.objects.filter(run=run).first()
    assert entry is not None
    LedgerEntry.objects.filter(pk=entry.pk).update(hypothesis=PAYLOAD)
    AtomicEdit.objects.filter(pk=entry.edit_id).update(hypothesis=PAYLOAD)
    Candidate.objects.filter(pk=entry.candidate_id).update(label=PAYLOAD, state_reason=PAYLOAD)
    state = run.state
    state["events"].append({"round": 3, "kind": "stop", "text": PAYLOAD})
    Run.objects.filter(pk=run.pk).update(state=state, error=PAYLOAD, stop_reason=PAYLOAD)
    client = client_as("viewer")
    for url in (
        reverse("review:experiment", args=[example_world.pk]),
        reverse("review:lineage", args=[example_world.pk]),
        reverse("review:home"),
    ):
        html = client.get(url).content.decode()
        assert "<img src=x" not in html, url
        assert ESCAPED in html or "&lt;/script&gt;&lt;img src=x onerror=alert(1…" in html, url


# --- Ledger --------------------------------------------------------------------------


def _ledger(client: Client, experiment: Experiment, **params: str) -> TestResponse:
    return client.get(reverse("review:experiment_ledger", args=[experiment.pk]), params, HTTP_HX_REQUEST="true")


def _ledger_rows(html: str) -> list[list[str]]:
    found = re.search(r"<tbody>(.*?)</tbody>", html, re.S)
    assert found is not None
    body = found.group(1)
    return [
        [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]


def test_ledger_filters_by_component_accepted_and_text(example_world, client_as) -> None:
    run = example_world.runs.get()
    client = client_as("viewer")
    component = LedgerEntry.objects.filter(run=run).values_list("component", flat=True).first()
    assert component is not None
    response = _ledger(client, example_world, run=str(run.pk), component=component)
    assert response.status_code == 200
    assert "<html" not in response.content.decode()  # the partial only
    rows = _ledger_rows(response.content.decode())
    assert len(rows) == LedgerEntry.objects.filter(run=run, component=component).count()
    assert {r[2] for r in rows} == {component}
    assert response["HX-Push-Url"].startswith(f"/experiments/{example_world.pk}/?")
    assert f"component={component}" in response["HX-Push-Url"]

    accepted = _ledger_rows(_ledger(client, example_world, accepted="yes").content.decode())
    assert len(accepted) == LedgerEntry.objects.filter(run=run, accepted=True).count() > 0
    assert {r[6] for r in accepted} == {"yes"}
    # Not accepted is two verdicts: rejected by a rule (refuted), and admissible but not chosen.
    rejected = _ledger_rows(_ledger(client, example_world, accepted="no").content.decode())
    assert len(rejected) == LedgerEntry.objects.filter(run=run, accepted=False, admissible=False).count() > 0
    assert {r[6] for r in rejected} == {"no"}
    admissible = _ledger_rows(_ledger(client, example_world, accepted="admissible").content.decode())
    assert len(admissible) == LedgerEntry.objects.filter(run=run, accepted=False, admissible=True).count()
    assert {r[6] for r in admissible} <= {"admissible, not chosen"}
    assert len(accepted) + len(rejected) + len(admissible) == LedgerEntry.objects.filter(run=run).count()

    word = LedgerEntry.objects.filter(run=run).order_by("pk")[0].hypothesis.split()[1]
    found = _ledger_rows(_ledger(client, example_world, q=word.upper()).content.decode())
    assert len(found) == LedgerEntry.objects.filter(run=run, hypothesis__icontains=word).count() > 0


def test_ledger_sorts_by_ds_and_dc(example_world, client_as) -> None:
    client = client_as("viewer")
    run = example_world.runs.get()
    rows = _ledger_rows(_ledger(client, example_world, sort="-dS").content.decode())
    values = [float(r[4]) for r in rows]
    assert values == sorted(values, reverse=True)
    assert len(values) == LedgerEntry.objects.filter(run=run).count()
    rows = _ledger_rows(_ledger(client, example_world, sort="dC").content.decode())
    costs = [float(r[5].rstrip("%")) for r in rows]
    assert costs == sorted(costs)


def test_ledger_filter_works_without_javascript(example_world, client_as) -> None:
    client = client_as("viewer")
    plain = client.get(reverse("review:experiment_ledger", args=[example_world.pk]), {"accepted": "no"})
    assert plain.status_code == 302
    assert plain["Location"] == f"/experiments/{example_world.pk}/?accepted=no#ledger"
    html = client.get(reverse("review:experiment", args=[example_world.pk]), {"accepted": "no"}).content.decode()
    found = re.search(r'<div id="ledger-table">.*?</div>', html, re.S)
    assert found is not None
    ledger = found.group(0)
    rows = _ledger_rows(ledger)
    assert rows and {r[6] for r in rows} == {"no"}
    assert '<option value="no" selected>' in html


def test_a_bad_ledger_filter_value_is_ignored(example_world, client_as) -> None:
    response = _ledger(client_as("viewer"), example_world, component="nonsense", sort="drop table", page="x")
    assert response.status_code == 200
    assert len(_ledger_rows(response.content.decode())) == LedgerEntry.objects.count()


# --- Live progress -------------------------------------------------------------------


def test_progress_polls_while_the_run_is_unfinished_and_refreshes_the_runs_table(client_as) -> None:
    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    client = client_as("viewer")
    url = reverse("review:experiment_progress", args=[experiment.pk])

    def section(response: TestResponse) -> str:
        found = re.search(r'<section id="run-progress"[^>]*>', response.content.decode(), re.S)
        assert found is not None
        return found.group(0)

    moving = client.get(url, HTTP_HX_REQUEST="true")
    assert 'hx-trigger="every 2s"' in section(moving)
    assert f"?run={run.pk}&amp;was=moving" in section(moving)
    # The runs table comes along out of band, so it shows the same counts as the card.
    assert '<table class="compact" id="runs-table" hx-swap-oob="true">' in moving.content.decode()
    dashboard = client.get(reverse("review:experiment", args=[experiment.pk]))
    assert 'hx-trigger="every 2s"' in section(dashboard)
    assert "hx-swap-oob" not in dashboard.content.decode()
    assert "<progress" in dashboard.content.decode()

    # Paused: its in-flight trials still finish and it may be resumed elsewhere, so it keeps polling, slower,
    # and the page does not reload.
    lifecycle.run_pause(run=run)
    paused = client.get(url, {"run": run.pk, "was": "moving"}, HTTP_HX_REQUEST="true")
    assert 'hx-trigger="every 5s"' in section(paused)
    assert "HX-Refresh" not in paused

    lifecycle.run_cancel(run=run)
    ended = client.get(url, {"run": run.pk, "was": "moving"}, HTTP_HX_REQUEST="true")
    assert ended["HX-Refresh"] == "true"  # the page reloads once, with the final state
    cancelled = client.get(url, {"run": run.pk}, HTTP_HX_REQUEST="true")
    assert "hx-trigger" not in section(cancelled) and "HX-Refresh" not in cancelled
    assert "Cancelled" in cancelled.content.decode()


def test_progress_of_a_fresh_run_counts_rounds_and_planned_trials(client_as) -> None:
    experiment = make_tiny_experiment(tasks=8)
    run = _active_run(experiment, rounds=3, k=2)
    html = client_as("viewer").get(reverse("review:experiment_progress", args=[experiment.pk])).content.decode()
    evolve = experiment.split_memberships.filter(split__in=["train", "gate"]).count()
    sealed = experiment.split_memberships.filter(split="sealed").count()
    recipe = load_preset("rrsi")
    planned = recipe.noise.repeats * evolve * 2 + 3 * recipe.candidates_per_round * evolve * 2 + 2 * sealed * 2
    assert f'<progress value="0" max="{planned}" aria-label="trials finished">' in html
    assert f'<progress value="0" max="{run.rounds}" aria-label="rounds gated">' in html


def test_progress_shows_trials_in_flight_against_the_experiments_and_the_endpoints_limits(client_as) -> None:
    experiment = make_tiny_experiment(tasks=4, k=1)
    run = _active_run(experiment)
    url = reverse("review:experiment_progress", args=[experiment.pk])
    client = client_as("viewer")
    html = _text(client.get(url, {"run": run.pk}).content)
    assert "Trials in flight 0 (no limit for this experiment)" in html
    assert "model endpoint" not in html

    endpoint = ModelEndpoint.objects.create(name="provider-x", max_in_flight=5)
    Experiment.objects.filter(pk=experiment.pk).update(max_trials_in_flight=3, endpoint=endpoint)
    evaluation = evaluation_start(candidate=seed_of(experiment), splits=sorted(experiment.split_digests))
    trials = list(Trial.objects.filter(evaluation=evaluation).order_by("pk"))
    for trial in trials[:2]:
        assert trial_claim(trial_id=trial.pk, owner="w") is not None
    # A third trial of another experiment on the same endpoint counts for the endpoint only.
    other = make_tiny_experiment(tasks=2, k=1)
    Experiment.objects.filter(pk=other.pk).update(endpoint=endpoint)
    other_trial = Trial.objects.filter(
        evaluation=evaluation_start(candidate=seed_of(other), splits=sorted(other.split_digests))
    ).first()
    assert other_trial is not None and trial_claim(trial_id=other_trial.pk, owner="w") is not None
    # A trial whose lease lapsed (its worker died) is no longer in flight.
    Trial.objects.filter(pk=trials[1].pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    html = _text(client.get(url, {"run": run.pk}).content)
    assert "Trials in flight 1 of at most 3 for this experiment" in html
    assert "model endpoint provider-x: 2 of at most 5 (all experiments, all workers)" in html


# --- Run control -----------------------------------------------------------------------


def test_an_operator_starts_a_run_and_a_second_one_is_refused(client_as) -> None:
    experiment = make_tiny_experiment()
    client = client_as("operator")
    page = reverse("review:experiment", args=[experiment.pk])
    url = reverse("review:run_start", args=[experiment.pk])
    form = {"recipe": "rrsi", "rounds": "2", "k": "1", "candidates": "2", "proposer": "example"}
    response = _post(client, url, form, page=page)
    run = Run.objects.get(experiment=experiment)
    assert response.status_code == 302 and response["Location"] == f"{page}?run={run.pk}"
    assert run.status == Run.Status.RUNNING and run.rounds == 2
    assert run.recipe.spec["candidates_per_round"] == 2
    assert run.recipe.spec["evaluation"]["trials_per_task"] == 1
    assert run.recipe.spec["proposal"]["operator"] == "example"
    assert run.started_by is not None
    assert run.started_by.username == "operator"
    followed = client.get(response["Location"])
    assert f"Run #{run.pk} started: recipe rrsi, 2 round(s), k=1, 2 candidate(s) per round" in _messages(followed)[0]

    again = client.post(url, form, HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value, follow=True)
    assert Run.objects.filter(experiment=experiment).count() == 1
    assert any("has an active run already" in m for m in _messages(again))


def test_run_start_of_a_preset_on_the_example_uses_its_offline_proposer(client_as) -> None:
    from django.core.management import call_command

    call_command("load_example", verbosity=0)
    experiment = Experiment.objects.get(name="example-routing")
    client = client_as("operator")
    page = reverse("review:experiment", args=[experiment.pk])
    url = reverse("review:run_start", args=[experiment.pk])
    response = _post(client, url, {"recipe": "rrsi", "rounds": "1"}, page=page)  # the recipe's own proposer
    run = Run.objects.get(experiment=experiment)
    assert response.status_code == 302 and response["Location"] == f"{page}?run={run.pk}"
    assert run.recipe.spec["proposal"]["operator"] == "example"
    assert "proposer example." in _messages(client.get(response["Location"]))[0]
    # Told otherwise, the preset's llm proposer is refused (no endpoint here) and nothing is created.
    assert lifecycle.run_cancel(run=run)
    response = client.post(
        url, {"recipe": "rrsi", "proposer": "llm"}, HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value, follow=True
    )
    shown = _messages(response)
    assert "The run was not started: the llm proposal operator is not configured" in shown[0]
    assert "configure its endpoint" in shown[0] and "the proposer field on the dashboard" in shown[0]
    assert Run.objects.filter(experiment=experiment).count() == 1


def test_the_start_form_lists_the_recent_starts_and_takes_any_other_by_number(client_as, monkeypatch) -> None:
    """An experiment of thousands of accepted candidates must not render them all on every dashboard load
    (issue 23: a select of 2,001 options took a third of the dashboard's time at a million trials)."""
    from review import selectors as review_selectors

    experiment = make_tiny_experiment()
    other = make_tiny_experiment(name="other")
    grow(experiment, candidates=8)
    proposed = list(
        Candidate.objects.filter(experiment=experiment, origin=Candidate.Origin.PROPOSED)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    accepted, rejected = proposed[:6], proposed[6]
    Candidate.objects.filter(pk__in=accepted).update(state=Candidate.State.ACCEPTED, certified_at=timezone.now())
    Candidate.objects.filter(pk=rejected).update(state=Candidate.State.REJECTED_GATE)
    monkeypatch.setattr(review_selectors, "START_CHOICES_SHOWN", 3)
    client = client_as("operator")
    page = reverse("review:experiment", args=[experiment.pk])
    html = client.get(page).content.decode()
    select = re.search(r'<select name="start".*?</select>', html, re.S)
    assert select is not None
    listed = [int(value) for value in re.findall(r'<option value="(\d+)"', select.group(0))]
    assert listed == [seed_of(experiment).pk, *accepted[-3:]]
    assert "give any of the 3 older ones by number" in html

    url = reverse("review:run_start", args=[experiment.pk])
    form = {"recipe": "rrsi", "proposer": "example", "rounds": "1"}
    token = _csrf(client, page)
    for number, expected in (
        (seed_of(other).pk, f"no candidate #{seed_of(other).pk} in this experiment"),
        (rejected, "starts from the seed or from an accepted candidate"),
    ):
        response = client.post(url, {**form, "start_number": str(number)}, HTTP_X_CSRFTOKEN=token, follow=True)
        shown = _messages(response)
        assert shown and "The run was not started" in shown[0] and expected in shown[0], shown
    assert not Run.objects.filter(experiment=experiment).exists()
    # An older accepted candidate by its number, over the list's choice.
    response = client.post(
        url, {**form, "start": str(accepted[-1]), "start_number": str(accepted[0])}, HTTP_X_CSRFTOKEN=token
    )
    run = Run.objects.get(experiment=experiment)
    assert response.status_code == 302 and run.start_candidate_id == accepted[0]
    # And one from the list.
    assert lifecycle.run_cancel(run=run)
    client.post(url, {**form, "start": str(accepted[-2])}, HTTP_X_CSRFTOKEN=token)
    assert Run.objects.filter(experiment=experiment).latest("pk").start_candidate_id == accepted[-2]


def test_run_start_reports_bad_input_and_creates_nothing(client_as) -> None:
    experiment = make_tiny_experiment()
    client = client_as("operator")
    url = reverse("review:run_start", args=[experiment.pk])
    page = reverse("review:experiment", args=[experiment.pk])
    token = _csrf(client, page)
    for form, expected in (
        ({"recipe": "rrsi", "rounds": "0", "proposer": "example"}, "rounds"),
        ({"recipe": "no-such-preset", "proposer": "example"}, "recipe"),
        ({"recipe": "rrsi"}, "llm"),  # the preset's own proposer has no endpoint configured here
        ({"recipe": "rrsi", "candidates": "-1", "proposer": "example"}, "candidates per round"),
    ):
        response = client.post(url, form, HTTP_X_CSRFTOKEN=token, follow=True)
        assert response.status_code == 200
        shown = _messages(response)
        assert shown and "The run was not started" in shown[0] and expected in shown[0], (form, shown)
    assert not Run.objects.filter(experiment=experiment).exists()


def test_viewers_may_not_start_or_control_runs(client_as) -> None:
    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    client = client_as("viewer", "reviewer", "annotator")
    page = reverse("review:experiment", args=[experiment.pk])
    token = _csrf(client, page)
    form = {"recipe": "rrsi", "proposer": "example"}
    assert (
        client.post(reverse("review:run_start", args=[experiment.pk]), form, HTTP_X_CSRFTOKEN=token).status_code == 403
    )
    for action in ("pause", "cancel"):
        response = client.post(reverse("review:run_action", args=[run.pk, action]), HTTP_X_CSRFTOKEN=token)
        assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and Run.objects.count() == 1


def test_run_control_needs_post_and_csrf(client_as) -> None:
    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    client = client_as("operator")
    assert client.get(reverse("review:run_action", args=[run.pk, "pause"])).status_code == 405
    assert client.post(reverse("review:run_action", args=[run.pk, "pause"])).status_code == 403  # no CSRF token
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def test_an_operator_pauses_resumes_and_cancels_a_run(client_as) -> None:
    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    client = client_as("operator")
    page = reverse("review:experiment", args=[experiment.pk])
    token = _csrf(client, page)

    def act(action: str) -> list[str]:
        response = client.post(reverse("review:run_action", args=[run.pk, action]), HTTP_X_CSRFTOKEN=token, follow=True)
        assert response.redirect_chain[-1][0] == f"{page}?run={run.pk}"
        run.refresh_from_db()
        return _messages(response)

    assert act("pause") == [f"Run #{run.pk} paused."] and run.status == Run.Status.PAUSED
    assert "Resume" in client.get(page).content.decode()
    assert (
        act("pause") == [f"Run #{run.pk} was not paused: it is paused, and only a running run can be paused."]
        and run.status == Run.Status.PAUSED
    )
    assert act("resume") == [f"Run #{run.pk} resumed."] and run.status == Run.Status.RUNNING
    assert act("cancel") == [f"Run #{run.pk} cancelled."] and run.status == Run.Status.CANCELLED
    assert run.stop_reason == "cancelled by operator"
    assert act("resume")[0].startswith(f"Run #{run.pk} was not resumed: it is cancelled")
    assert run.status == Run.Status.CANCELLED
    response = client.post(reverse("review:run_action", args=[run.pk, "explode"]), HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 404


# --- Admin actions ---------------------------------------------------------------------


def test_admin_actions_pause_resume_and_cancel_runs() -> None:
    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = reverse("admin:evolution_run_changelist")

    def act(action: str) -> list[str]:
        response = client.post(url, {"action": action, "_selected_action": [run.pk]}, follow=True)
        run.refresh_from_db()
        return [str(m) for m in response.context["messages"]]

    assert act("pause_runs") == [f"Paused: run {run.pk}"] and run.status == Run.Status.PAUSED
    assert act("pause_runs") == [f"Not paused: run {run.pk} (paused)"] and run.status == Run.Status.PAUSED
    assert act("resume_runs") == [f"Resumed: run {run.pk}"] and run.status == Run.Status.RUNNING
    assert act("cancel_runs") == [f"Cancelled: run {run.pk}"] and run.status == Run.Status.CANCELLED
    assert run.stop_reason == "cancelled by root in the admin"


def test_admin_run_actions_need_the_operate_permission() -> None:
    from django.contrib.auth.models import Permission

    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    staff = User.objects.create_user("staff", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_run"))
    client = Client()
    client.force_login(staff)
    url = reverse("admin:evolution_run_changelist")
    assert "pause_runs" not in client.get(url).content.decode()
    client.post(url, {"action": "pause_runs", "_selected_action": [run.pk]})
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING


def _staff(make_user, role: str) -> Client:
    """A logged-in client of a staff user in ``role``'s group (a real user, the group's own permissions)."""
    user = make_user(role, username=f"staff-{role}")
    User.objects.filter(pk=user.pk).update(is_staff=True)
    client = Client()
    client.force_login(user)
    return client


def _start_page(client: Client, experiment: Experiment, **form: object) -> TestResponse:
    url = reverse("admin:evolution_experiment_changelist")
    return client.post(url, {"action": "start_run", "_selected_action": [experiment.pk], **form}, follow=True)


@pytest.mark.parametrize("role", ["operator", "admin"])
def test_staff_operators_and_admins_use_the_admin_run_list_and_its_actions(role: str, make_user) -> None:
    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    client = _staff(make_user, role)
    url = reverse("admin:evolution_run_changelist")
    listing = client.get(url)
    assert listing.status_code == 200
    html = listing.content.decode()
    for action in ("pause_runs", "resume_runs", "cancel_runs"):
        assert f'<option value="{action}">' in html
    assert client.get(reverse("admin:evolution_run_change", args=[run.pk])).status_code == 200

    def act(action: str) -> list[str]:
        response = client.post(url, {"action": action, "_selected_action": [run.pk]}, follow=True)
        assert response.status_code == 200
        run.refresh_from_db()
        return _messages(response)

    assert act("pause_runs") == [f"Paused: run {run.pk}"] and run.status == Run.Status.PAUSED
    assert act("resume_runs") == [f"Resumed: run {run.pk}"] and run.status == Run.Status.RUNNING
    assert act("cancel_runs") == [f"Cancelled: run {run.pk}"] and run.status == Run.Status.CANCELLED
    assert run.stop_reason == f"cancelled by staff-{role} in the admin"
    # The runs are read-only there all the same.
    assert client.post(reverse("admin:evolution_run_change", args=[run.pk]), {"rounds": 99}).status_code == 403


@pytest.mark.parametrize("role", ["viewer", "reviewer", "annotator"])
def test_other_staff_roles_do_not_get_the_admin_run_list(role: str, make_user) -> None:
    experiment = make_tiny_experiment()
    run = _active_run(experiment)
    client = _staff(make_user, role)
    url = reverse("admin:evolution_run_changelist")
    assert client.get(url).status_code == 403
    assert client.post(url, {"action": "pause_runs", "_selected_action": [run.pk]}).status_code == 403
    listing = client.get(reverse("admin:evolution_experiment_changelist"))
    assert listing.status_code == 200 and "start_run" not in listing.content.decode()
    assert _start_page(client, experiment, recipe="archive", start="Start").status_code == 200
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and Run.objects.count() == 1


def test_the_admin_start_action_runs_a_preset_on_the_example_with_its_offline_proposer(make_user) -> None:
    from django.core.management import call_command

    call_command("load_example", verbosity=0)
    experiment = Experiment.objects.get(name="example-routing")  # no run yet: no proposer to keep
    client = _staff(make_user, "operator")
    response = _start_page(client, experiment, recipe="rrsi", rounds="1", start="Start")
    run = Run.objects.get(experiment=experiment)
    assert _messages(response) == [
        f"{experiment.name}: run {run.pk} started (rrsi, 1 round(s), proposer example, "
        f"from candidate {run.start_candidate_id})"
    ]
    assert run.recipe.spec["proposal"]["operator"] == "example"


def test_the_admin_start_action_offers_a_recipe_and_rounds(make_user) -> None:
    experiment = make_tiny_experiment()
    first = _active_run(experiment)
    Run.objects.filter(pk=first.pk).update(status=Run.Status.FINISHED)
    client = _staff(make_user, "operator")

    page = _start_page(client, experiment)
    assert page.status_code == 200 and Run.objects.count() == 1
    html = page.content.decode()
    assert '<option value="own" selected>the experiment&#x27;s own recipe</option>' in html
    for name in ("rrsi", "archive", "pareto", "unregularized"):
        assert f'<option value="{name}">preset: {name}</option>' in html
    assert 'name="rounds"' in html and 'name="proposer"' in html
    assert f'<input type="hidden" name="_selected_action" value="{experiment.pk}">' in html

    response = _start_page(client, experiment, recipe="archive", rounds="2", start="Start")
    run = Run.objects.order_by("-pk").first()
    assert run is not None
    assert _messages(response) == [
        f"{experiment.name}: run {run.pk} started (archive, 2 round(s), proposer example, "
        f"from candidate {run.start_candidate_id})"
    ]
    assert response.redirect_chain == [(reverse("admin:evolution_experiment_changelist"), 302)]
    assert run.status == Run.Status.RUNNING and run.rounds == 2 and run.recipe.name == "archive"
    assert run.recipe.spec["proposal"]["operator"] == "example"  # the last run's proposer
    assert run.started_by is not None
    assert run.started_by.username == "staff-operator"

    refused = _start_page(client, experiment, recipe="own", start="Start")
    assert "has an active run already" in _messages(refused)[0]
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FINISHED)
    response = _start_page(client, experiment, recipe="own", start="Start")
    own = Run.objects.order_by("-pk").first()
    assert own is not None
    assert _messages(response) == [
        f"{experiment.name}: run {own.pk} started (rrsi, 10 round(s), proposer example, "
        f"from candidate {own.start_candidate_id})"
    ]
    experiment.refresh_from_db()
    assert own.recipe_id == experiment.recipe_id == first.recipe_id
    assert Run.objects.count() == 3


def test_the_admin_start_action_refuses_bad_input_and_starts_nothing(make_user) -> None:
    fresh = make_tiny_experiment()
    client = _staff(make_user, "operator")
    page = _start_page(client, fresh)
    # A fresh experiment has no recipe of its own: only the presets are offered.
    assert 'value="own"' not in page.content.decode()
    for form, error in (
        ({"recipe": "rrsi", "rounds": "0"}, "Ensure this value is greater than or equal to 1."),
        ({"recipe": "no-such-preset"}, "Select a valid choice. no-such-preset is not one of the available choices."),
        ({"recipe": "own"}, "Select a valid choice. own is not one of the available choices."),
        (
            {"recipe": "rrsi", "proposer": "nobody"},
            "Select a valid choice. nobody is not one of the available choices.",
        ),
    ):
        response = _start_page(client, fresh, start="Start", **form)
        assert response.status_code == 200 and error in response.content.decode(), form
        assert _messages(response) == []
    # The preset's own proposer (llm) has no endpoint here: a message, no run.
    response = _start_page(client, fresh, recipe="rrsi", start="Start")
    assert _messages(response)[0].startswith(f"{fresh.name}: no run started: ")
    assert "llm" in _messages(response)[0]
    assert not Run.objects.exists()


# --- Lineage ---------------------------------------------------------------------------


def test_lineage_draws_every_candidate_linked_and_coloured_by_state(example_world, client_as) -> None:
    run = example_world.runs.get()
    response = client_as("viewer").get(reverse("review:lineage", args=[example_world.pk]))
    assert response.status_code == 200
    html = response.content.decode()
    candidates = list(example_world.candidates.all())
    for candidate in candidates:
        assert f'<a href="/candidates/{candidate.pk}/" class="node cat-' in html
    flagged = [c for c in candidates if c.state == Candidate.State.FLAGGED]
    assert flagged and all(f'/candidates/{c.pk}/" class="node cat-flagged' in html for c in flagged)
    seed = example_world.seed_candidate_id
    assert f'/candidates/{seed}/" class="node cat-seed main"' in html
    assert f'/candidates/{run.current_candidate_id}/" class="node cat-accepted main"' in html
    parented = sum(1 for c in candidates if c.parent_id)
    assert len(re.findall(r'<path d="[^"]+" class="edge( main)?"', html)) == parented
    ancestry, cursor = [], Candidate.objects.get(pk=run.current_candidate_id)
    while cursor.parent_id:
        ancestry.append(cursor.parent_id)
        assert cursor.parent is not None
        cursor = cursor.parent
    assert len(ancestry) >= 2 and html.count('class="edge main"') == len(ancestry)
    assert 'flagged, awaiting review <span class="muted">' + str(len(flagged)) in html


def test_a_runs_lineage_filter_shows_the_candidates_that_joined_its_gate(example_world, client_as) -> None:
    first = example_world.runs.get()
    second = lifecycle.run_create(experiment=example_world, recipe=load_preset("rrsi"), proposer="example")
    # A candidate of the first run, approved after it ended, is evaluated for the second run's gate.
    joined = example_world.candidates.filter(run=first, state=Candidate.State.FLAGGED).order_by("pk").first()
    assert joined is not None
    Candidate.objects.filter(pk=joined.pk).update(state=Candidate.State.APPROVED)  # as the reviewer's approval
    evaluation_start(candidate=joined, splits=["train", "gate"], run=second)
    client = client_as("viewer")
    html = client.get(reverse("review:lineage", args=[example_world.pk]), {"run": second.pk}).content.decode()
    assert f'<a href="/candidates/{joined.pk}/" class="node cat-' in html
    # Its parent is drawn too, with the edge between them.
    assert f'<a href="/candidates/{joined.parent_id}/" class="node cat-' in html
    other = example_world.candidates.filter(run=first, state=Candidate.State.FLAGGED).exclude(pk=joined.pk).first()
    assert other is not None and f'<a href="/candidates/{other.pk}/" class="node' not in html


# --- Query counts ------------------------------------------------------------------------


def _count(client: Client, url: str, **headers: Any) -> int:
    client.get(url, **headers)  # warm per-process caches (content types, templates)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, **headers)
    assert response.status_code == 200, url
    return len(queries)


def test_query_counts_do_not_grow_with_the_experiment(example_world, client_as) -> None:
    client = client_as("operator", "viewer")
    pk = example_world.pk
    pages = {
        "home": (reverse("review:home"), {}),
        "dashboard": (reverse("review:experiment", args=[pk]), {}),
        "dashboard filtered": (reverse("review:experiment", args=[pk]) + "?q=e&accepted=no", {}),
        "ledger": (reverse("review:experiment_ledger", args=[pk]) + "?sort=-dS", {"HTTP_HX_REQUEST": "true"}),
        "progress": (reverse("review:experiment_progress", args=[pk]), {}),
        "lineage": (reverse("review:lineage", args=[pk]), {}),
    }
    small = {name: _count(client, url, **headers) for name, (url, headers) in pages.items()}
    grow(example_world, candidates=60, steps=0)
    assert example_world.candidates.count() > 60
    large = {name: _count(client, url, **headers) for name, (url, headers) in pages.items()}
    assert large == small
    # The grown rounds and candidates are on the pages.
    html = client.get(reverse("review:lineage", args=[pk])).content.decode()
    assert html.count('class="node cat-') == example_world.candidates.count()


def test_dashboard_says_when_the_evaluator_gives_its_agent_the_network(client_as) -> None:
    offline = make_tiny_experiment(tasks=2, k=1)
    hosted = make_tiny_experiment(tasks=2, k=1, agent_network=True)
    client = client_as("viewer")
    texts = {
        experiment.pk: _text(client.get(reverse("review:experiment", args=[experiment.pk])).content)
        for experiment in (offline, hosted)
    }
    assert "the agent keeps the network" in texts[hosted.pk]
    assert "the agent keeps the network" not in texts[offline.pk]


def test_dashboard_warns_when_one_split_holds_every_task_of_a_kind(client_as) -> None:
    from evolution.example.setup import example_experiment_create
    from evolution.services.experiments import splits_assign

    stratified = example_experiment_create(name="stratified")
    # The same tasks, seed and ratios cut unstratified: all 3 tasks of kind from_ticket land in sealed.
    concentrated = example_experiment_create(name="concentrated")
    splits_assign(experiment=concentrated, stratify_by="")
    even = make_tiny_experiment(tasks=4)

    client = client_as("viewer")
    html = client.get(reverse("review:experiment", args=[concentrated.pk])).content.decode()
    plain = client.get(reverse("review:experiment", args=[even.pk])).content.decode()
    example = client.get(reverse("review:experiment", args=[stratified.pk])).content.decode()

    assert "sealed holds all 3 tasks of kind from_ticket: no other split measures it" in unescape(html)
    assert "each kind cut on its own" not in _text(html.encode())
    assert "split-warning" not in plain
    assert "split-warning" not in example
    assert "train 23 gate 19 sealed 18 = 60 tasks · each kind cut on its own" in _text(example.encode())
