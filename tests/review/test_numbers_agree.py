"""Every number a candidate shows agrees across the screens, the API and the certified records (issue 39).

The world is the one a team makes: one experiment whose default k (2) is not what its runs use (1); a first rrsi
run from the seed whose two mixed candidates are flagged, one approved and one derived after the run ended (both
evaluated and gated late); a second, unregularized run from an accepted candidate of the first (a second start,
measured again by its baseline); and a third run from the experiment's best, cancelled during its baseline with
some of its trials finished but never certified. Every run is real (trials in subprocesses, the critic, the gate,
certification), driven in this process.

The reference for every number is the certified records themselves: the trials each record binds, of its
baseline, candidate and transfer evaluations (noise repeats only estimate the band), summed by
``evolution.loop.measure``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from evolution.loop import lifecycle, load, measure
from evolution.loop.review import review_decide, review_decide_partial
from evolution.metrics import relative_cost_change
from evolution.models import (
    Candidate,
    CertifiedResult,
    Evaluation,
    Experiment,
    GateDecision,
    LeakageFlag,
    ReviewItem,
    Run,
    Trial,
)
from evolution.services import evaluation as evaluation_services
from tests.evolution.test_late_decisions import settle
from tests.evolution.test_loop import tiny_recipe
from tests.factories import make_tiny_experiment, seed_id
from tests.loop_driver import drive

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # about two minutes: four real runs

EVOLVE = ("train", "gate")


def build_world() -> tuple[Experiment, list[Run]]:
    experiment = make_tiny_experiment(tasks=12, k=2)
    first = drive(
        lifecycle.run_create(
            experiment=experiment, recipe=tiny_recipe("rrsi", proposal={"operator": "review-test-mixed"})
        )
    )
    assert first.status == Run.Status.FINISHED, first.error
    alice = User.objects.create_user("alice")
    approved, mixed = ReviewItem.objects.filter(candidate__run=first, state=ReviewItem.State.OPEN).order_by("pk")
    review_decide(item=approved, user=alice, approve=True, reason="generic enough")
    leaky = mixed.candidate.edits.filter(paths__0__startswith="answers/")
    review_decide_partial(item=mixed, user=alice, rejected_edits=[e.pk for e in leaky], reason="leaks")
    settle(first)

    second_start = (
        Candidate.objects.filter(run=first, state=Candidate.State.ACCEPTED).exclude(pk=seed_id(experiment)).first()
    )
    assert second_start is not None, "the first run accepted nothing but its seed"
    second = drive(lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("unregularized"), start=second_start))
    assert second.status == Run.Status.FINISHED, second.error

    third = lifecycle.run_create(experiment=experiment, recipe=tiny_recipe("rrsi"))
    drive(third, until=lambda run: Trial.objects.filter(evaluation__run=run, state=Trial.State.PENDING).exists())
    baseline = Evaluation.objects.get(run=third, repeat=0)
    for trial_id in Trial.objects.filter(evaluation=baseline).order_by("pk").values_list("pk", flat=True)[:5]:
        evaluation_services.trial_execute_in_process(trial_id=trial_id, owner="inline")
    assert lifecycle.run_cancel(run=third)
    for run in (first, second, third):
        run.refresh_from_db()
    return experiment, [first, second, third]


def certified(candidate_id: int, splits: tuple[str, ...]) -> measure.Totals:
    """The totals of the trials the candidate's certified records bind on ``splits`` (noise repeats left out)."""
    rows = []
    for payload in CertifiedResult.objects.filter(candidate_id=candidate_id).values_list("payload", flat=True):
        if payload["evaluation"]["purpose"] == Evaluation.Purpose.NOISE:
            continue
        rows += [
            measure.TrialRow(t["outcome"], t["score"], t["tokens"], t["valid_output"], t["submitted"])
            for t in payload["trials"]
            if t["split"] in splits
        ]
    return measure.totals(rows)


def s_of(candidate_id: int, splits: tuple[str, ...] = EVOLVE) -> float | None:
    return measure.score(certified(candidate_id, splits), "pass_at_1")


def c_of(candidate_id: int) -> float | None:
    return measure.cost(certified(candidate_id, EVOLVE))


def percent(value: float) -> str:
    return f"{value * 100:.1f}%"


@pytest.fixture
def world() -> tuple[Experiment, list[Run]]:
    return build_world()


def test_every_number_a_candidate_shows_agrees_across_screens_api_and_records(
    world: tuple[Experiment, list[Run]], client_as: Callable[..., Client], make_user: Callable[..., User]
) -> None:
    experiment, (first, second, third) = world
    assert third.status == Run.Status.CANCELLED
    # The cancelled run's start has finished trials in an evaluation that was never certified.
    assert Trial.objects.filter(
        evaluation__run=third, evaluation__state=Evaluation.State.CANCELLED, state=Trial.State.DONE
    ).exists()
    browser = client_as("admin")
    api = APIClient()
    api.force_authenticate(make_user("admin", username="api-admin"))

    measured = sorted(
        pk
        for pk in Candidate.objects.filter(experiment=experiment).values_list("pk", flat=True)
        if s_of(pk) is not None
    )
    assert len(measured) >= 5

    # The matrix and the lineage: S of every measured candidate, as the records give it.
    matrix = browser.get(reverse("review:matrix", args=[experiment.pk]))
    assert matrix.status_code == 200
    matrix_s = {column.pk: column.score for column in matrix.context["columns"]}
    lineage = browser.get(reverse("review:lineage", args=[experiment.pk]))
    assert lineage.status_code == 200
    lineage_s = {node.id: node.score for node in lineage.context["tree"].nodes}
    for pk in measured:
        assert matrix_s[pk] == pytest.approx(s_of(pk), abs=1e-12), f"matrix S of #{pk}"
        assert lineage_s[pk] == pytest.approx(s_of(pk), abs=1e-12), f"lineage S of #{pk}"

    for pk in measured:
        page = browser.get(reverse("review:candidate", args=[pk]))
        assert page.status_code == 200
        # The candidate page's per-split lines: each split's rate and tokens, as the records give them.
        rows = {row.split: row for row in page.context["split_rows"]}
        for split in ("train", "gate", "sealed"):
            totals = certified(pk, (split,))
            if not totals.trials:
                assert split not in rows, f"#{pk} shows {split} without a certified trial there"
                continue
            assert rows[split].trials == totals.trials, f"trials of #{pk} on {split}"
            assert rows[split].rate == percent(totals.passed / totals.trials), f"rate of #{pk} on {split}"
            cost = measure.cost(totals)
            assert rows[split].tokens == (f"{cost:,.0f}" if cost is not None else "n/a"), f"tokens of #{pk}"
        # dS and dC: a decided candidate shows its decision's numbers as the certified decision record holds them,
        # and, where later measurements moved them, the current estimate; both, on the page and in the API, are
        # the records' own numbers.
        detail = api.get(f"/api/v1/candidates/{pk}/")
        assert detail.status_code == 200
        delta, view = detail.json()["delta"], page.context["delta_view"]
        if delta is None:
            assert view is None
        else:
            base = delta["against"]
            s_base, s_new, c_base, c_new = s_of(base), s_of(pk), c_of(base), c_of(pk)
            assert s_base is not None and s_new is not None
            ds = s_new - s_base
            dc = relative_cost_change(c_new, c_base) if c_base is not None and c_new is not None else None
            now = delta
            if delta["at_decision"]:
                decision = GateDecision.objects.select_related("record").get(pk=delta["decision"])
                assert decision.record is not None
                kept = decision.record.payload["gate"]["numbers"]
                assert (delta["dS"], delta["dC"]) == (kept["dS"], kept["dC"]), f"#{pk} at decision"
                assert view.decided_cost == ("" if kept["dC"] is None else f"dC = {kept['dC'] * 100:+.1f}%")
                if delta["current"] is not None:  # measured again since: the current estimate beside it
                    now = delta["current"]
            assert now["dS"] == pytest.approx(ds, abs=1e-12), f"dS of #{pk}"
            assert now["dC"] == pytest.approx(dc, abs=1e-12), f"dC of #{pk}"
            shown_cost = view.current_cost or view.decided_cost
            assert shown_cost == ("" if dc is None else f"dC = {dc * 100:+.1f}%"), f"dC of #{pk} on its page"
        # The diff page speaks of the same parent and the same flags.
        diff = browser.get(reverse("review:candidate_diff", args=[pk]))
        assert diff.status_code == 200
        flags = LeakageFlag.objects.filter(candidate_id=pk).count()
        assert len(diff.context["flags"]) == len(page.context["flags"]) == flags
        against = diff.context["against"]
        assert (against.pk if against is not None else None) == Candidate.objects.get(pk=pk).parent_id

    # The best harness: highest S, then lower cost, then the most recently accepted.
    accepted = list(Candidate.objects.filter(experiment=experiment, state=Candidate.State.ACCEPTED))

    def rank(candidate: Candidate) -> tuple[float, float, int]:
        last_accepted = max(
            GateDecision.objects.filter(candidate=candidate, accepted=True).values_list("pk", flat=True), default=0
        )
        s, c = s_of(candidate.pk), c_of(candidate.pk)
        assert s is not None and c is not None
        return (s, -c, last_accepted)

    best = max(accepted, key=rank)
    dashboard = browser.get(reverse("review:experiment", args=[experiment.pk]))
    assert dashboard.status_code == 200
    shown = dashboard.context["best"]
    assert shown["candidate"].pk == best.pk
    assert shown["score"] == pytest.approx(s_of(best.pk), abs=1e-12)
    assert shown["cost"] == pytest.approx(c_of(best.pk), abs=1e-12)
    assert api.get(f"/api/v1/experiments/{experiment.pk}/").json()["best_candidate"] == best.pk
    assert load.best_candidate(experiment) == best  # the default start of a new run
    assert third.start_candidate_id == best.pk
    html = dashboard.content.decode()
    assert f"the experiment&#x27;s best: #{best.pk}" in html
    assert f"S {s_of(best.pk):.3f}" in shown["label"]

    # Runs, each from its own start: the runs table's cost start -> final, k and the round as each run used them.
    rows = {row["run"].pk: row for row in dashboard.context["run_rows"]}
    for run in (first, second):
        outcome = rows[run.pk]["outcome"]
        assert outcome["start"] == run.start_candidate_id
        assert run.start_candidate_id is not None and run.current_candidate_id is not None
        start_cost, final_cost = c_of(run.start_candidate_id), c_of(run.current_candidate_id)
        assert start_cost is not None and final_cost is not None
        assert outcome["cost"].startswith(f"{start_cost:,.0f} → {final_cost:,.0f}")
        listed = api.get(f"/api/v1/runs/{run.pk}/").json()
        assert listed["current_round"] == run.rounds == 2  # not rounds + 1 once finished
        assert listed["trials_per_task"] == 1
    assert dashboard.context["run_ks"] == [1]
    assert re.search(r"k = 1 <span[^>]*>as every run used it · the experiment's default is 2", html)
    assert api.get(f"/api/v1/experiments/{experiment.pk}/").json()["trials_per_task_used"] == {
        str(first.pk): 1,
        str(second.pk): 1,
        str(third.pk): 1,
    }
    # The second run's views speak of its start, not of the experiment's seed.
    run_view = browser.get(reverse("review:experiment", args=[experiment.pk]), {"run": second.pk})
    start = second.start_candidate_id
    assert start != seed_id(experiment)
    assert f"start #{start}" in str(run_view.context["cost_chart"])
    assert f"and its start #{start}" in run_view.content.decode()
