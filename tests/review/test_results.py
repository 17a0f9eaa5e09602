"""Screens 5 and 6: the per-task results matrix, the trial page with its
paged trajectory, and the side-by-side comparison of two trajectories."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from evolution.measurements import COUNTED_PURPOSES
from evolution.models import (
    EVOLVE_SPLITS,
    Candidate,
    SplitMembership,
    SplitName,
    Trajectory,
    TrajectoryStep,
    Trial,
)
from review.views import results
from tests.review.world import grow

pytestmark = pytest.mark.django_db

SEALED = ("evolution.view_sealed_details",)
PAYLOAD = "</script><img src=x onerror=alert(1)>"
ESCAPED = "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
CELL = re.compile(
    r'<td class="cell o-(?P<outcome>\w+)(?P<classes>[^"]*)" data-cell="(?P<candidate>\d+):(?P<task>\d+)"[^>]*>'
    r"(?P<body>.*?)</td>",
    re.S,
)
CELL_LINK = re.compile(r'<a class="cell-link" href="/trials/(?P<trial>\d+)/">(?P<passes>\d+)/(?P<n>\d+)</a>')
STEP = re.compile(r'<li class="step [^"]*" id="step-(\d+)"')


# --- helpers --------------------------------------------------------------------


def _get(client: Any, url: str) -> tuple[Any, int]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    return response, len(queries.captured_queries)


def _html(response: Any) -> str:
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def _cells(html: str) -> dict[tuple[int, int], dict[str, Any]]:
    cells = {}
    for match in CELL.finditer(html):
        link = CELL_LINK.search(match["body"])
        cells[int(match["candidate"]), int(match["task"])] = {
            "outcome": match["outcome"],
            "classes": match["classes"].split(),
            "trial": int(link["trial"]) if link else None,
            "passes": int(link["passes"]) if link else None,
            "n": int(link["n"]) if link else None,
            "body": match["body"],
        }
    return cells


def _rows(html: str) -> list[int]:
    return [int(task) for task in re.findall(r'<tr id="task-(\d+)">', html)]


def _expected_cells(experiment: Any, *, sealed: bool) -> dict[tuple[int, int], dict[str, Any]]:
    """The cells as computed straight from the Trial rows."""
    trials = Trial.objects.filter(candidate__experiment=experiment, evaluation__purpose__in=COUNTED_PURPOSES)
    if not sealed:
        trials = trials.exclude(split=SplitName.SEALED)
    cells: dict[tuple[int, int], dict[str, Any]] = defaultdict(
        lambda: {"passes": 0, "n": 0, "errors": 0, "trial": None, "split": ""}
    )
    for pk, candidate, task, split, state, outcome in trials.values_list(
        "pk", "candidate_id", "task_id", "split", "state", "outcome"
    ):
        cell = cells[candidate, task]
        cell["trial"] = pk if cell["trial"] is None else min(cell["trial"], pk)
        cell["split"] = split
        if state in (Trial.State.DONE, Trial.State.ERROR):
            cell["n"] += 1
            cell["passes"] += outcome == Trial.Outcome.PASS
            cell["errors"] += outcome == Trial.Outcome.ERROR or state == Trial.State.ERROR
    return dict(cells)


def _outcome(cell: dict[str, Any]) -> str:
    if cell["n"] == 0:
        return "none"
    if cell["errors"] == cell["n"]:
        return "error"
    if cell["passes"] == cell["n"]:
        return "pass"
    return "some" if cell["passes"] else "fail"


def _child_trial(experiment: Any) -> Trial:
    """A trial of a proposed candidate, with a trajectory, whose parent has
    a trial of the same task and index."""
    for trial in Trial.objects.filter(
        candidate__experiment=experiment,
        candidate__parent__isnull=False,
        split=SplitName.TRAIN,
        trajectory__isnull=False,
        evaluation__purpose__in=COUNTED_PURPOSES,
    ).order_by("pk"):
        parent_id = trial.candidate.parent_id
        assert parent_id is not None  # filtered on candidate__parent__isnull=False
        if Trial.objects.filter(candidate_id=parent_id, task=trial.task, index=trial.index).exists():
            return trial
    raise AssertionError("the example world has no child trial with a parent trial")


def _parent_trial_of(trial: Trial) -> Trial:
    parent_id = trial.candidate.parent_id
    assert parent_id is not None, "the seed has no parent"
    found = (
        Trial.objects.filter(
            candidate_id=parent_id,
            task=trial.task,
            index=trial.index,
            evaluation__purpose__in=COUNTED_PURPOSES,
        )
        .order_by("evaluation_id", "pk")
        .first()
    )
    assert found is not None, f"no parent trial for trial {trial.pk}"
    return found


def _give_trajectory(trial: Trial, steps: list[dict[str, Any]]) -> Trajectory:
    Trajectory.objects.filter(trial=trial).delete()
    trajectory = Trajectory.objects.create(
        trial=trial,
        schema_version="ATIF-v1.5",
        agent={"name": "test-agent", "version": "9", "model_name": "m-1"},
        final_metrics={"total_prompt_tokens": 10, "total_completion_tokens": 5},
        step_count=len(steps),
    )
    TrajectoryStep.objects.bulk_create(
        TrajectoryStep(trajectory=trajectory, **{"source": "agent", **step}) for step in steps
    )
    return trajectory


def _plain_steps(count: int, **overrides: dict[str, Any]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [{"step_id": n, "message": f"message number {n}."} for n in range(1, count + 1)]
    for step_id, fields in overrides.items():
        steps[int(step_id.removeprefix("s")) - 1].update(fields)
    return steps


# --- screen 5: the matrix -------------------------------------------------------------


def test_matrix_cells_match_the_trial_rows(example_world, client_as) -> None:
    # One trial ended in an error and one is still running, so every colour is checked.
    errored, running = Trial.objects.filter(
        candidate__experiment=example_world, evaluation__purpose="candidate", split=SplitName.TRAIN
    ).order_by("pk")[:2]
    Trial.objects.filter(pk=errored.pk).update(
        state=Trial.State.ERROR, outcome=Trial.Outcome.ERROR, error_kind=Trial.ErrorKind.AGENT_CRASH
    )
    Trial.objects.filter(pk=running.pk).update(state=Trial.State.RUNNING, outcome="")
    client = client_as("viewer", extra_perms=SEALED)
    html = _html(client.get(reverse("review:matrix", args=[example_world.pk])))
    cells = _cells(html)
    expected = _expected_cells(example_world, sealed=True)
    shown = {key: cell for key, cell in cells.items() if cell["trial"] is not None}
    expected = {key: cell for key, cell in expected.items() if cell["n"]}
    assert set(shown) == set(expected)
    for key, cell in expected.items():
        assert (shown[key]["passes"], shown[key]["n"], shown[key]["trial"]) == (
            cell["passes"],
            cell["n"],
            cell["trial"],
        )
        assert shown[key]["outcome"] == _outcome(cell), key
    assert {"pass", "fail", "error"} <= {cell["outcome"] for cell in shown.values() if cell["n"]}
    pending = cells[running.candidate_id, running.task_id]
    assert pending["outcome"] == "running"
    assert f'<a class="cell-link" href="/trials/{running.pk}/">…</a>' in pending["body"]
    assert cells[errored.candidate_id, errored.task_id]["outcome"] == "error"
    # Every task of the experiment is a row, sealed ones included for this user.
    assert len(_rows(html)) == SplitMembership.objects.filter(experiment=example_world).count()


def test_matrix_columns_are_candidates_with_trials_by_round_with_evolve_score(example_world, client_as) -> None:
    client = client_as("viewer")
    html = _html(client.get(reverse("review:matrix", args=[example_world.pk])))
    columns = [int(pk) for pk in re.findall(r'<th scope="col" class="cand [^"]*" data-candidate="(\d+)"', html)]
    with_trials = (
        Candidate.objects.filter(experiment=example_world, trials__evaluation__purpose__in=COUNTED_PURPOSES)
        .distinct()
        .order_by("round", "pk")
    )
    assert columns == list(with_trials.values_list("pk", flat=True))
    without = Candidate.objects.filter(experiment=example_world).exclude(pk__in=columns)
    assert without.exists()  # the flagged candidates never ran
    for candidate in with_trials:
        evolve = Trial.objects.filter(
            candidate=candidate, split__in=EVOLVE_SPLITS, evaluation__purpose__in=COUNTED_PURPOSES
        )
        score = evolve.filter(outcome=Trial.Outcome.PASS).count() / evolve.count()
        header = html.split(f'data-candidate="{candidate.pk}">', 1)[1].split("</th>", 1)[0]
        assert f"S {score:.3f}" in header
        assert reverse("review:candidate", args=[candidate.pk]) in header
        assert f"badge state-{candidate.state}" in header


def test_matrix_filters_by_split(example_world, client_as) -> None:
    client = client_as("viewer", extra_perms=SEALED)
    for split in (SplitName.TRAIN, SplitName.GATE, SplitName.SEALED):
        html = _html(client.get(reverse("review:matrix", args=[example_world.pk]) + f"?split={split}"))
        rows = _rows(html)
        wanted = SplitMembership.objects.filter(experiment=example_world, split=split)
        assert sorted(rows) == sorted(wanted.values_list("task_id", flat=True))
        assert rows


def test_matrix_hides_sealed_rows_from_users_without_the_permission(example_world, client_as) -> None:
    sealed = SplitMembership.objects.filter(experiment=example_world, split=SplitName.SEALED)
    sealed_ids = set(sealed.values_list("task_id", flat=True))
    sealed_names = list(sealed.values_list("task__external_id", flat=True))
    assert sealed_ids
    url = reverse("review:matrix", args=[example_world.pk])

    viewer = _html(client_as("viewer").get(url))
    assert not sealed_ids & set(_rows(viewer))
    assert not any(f">{name}<" in viewer for name in sealed_names)
    assert f"{len(sealed_ids)} sealed tasks hidden (sealed in this or another experiment; aggregates on the" in viewer
    assert _rows(_html(client_as("viewer", username="v2").get(url + "?split=sealed"))) == []

    allowed = _html(client_as("viewer", username="sealed-viewer", extra_perms=SEALED).get(url))
    assert sealed_ids <= set(_rows(allowed))
    assert "sealed tasks hidden" not in allowed


def _changes(example_world: Any) -> dict[str, set[int]]:
    """Tasks with at least one improved / regressed / unchanged cell, from the Trial rows."""
    cells = _expected_cells(example_world, sealed=True)
    parents = dict(Candidate.objects.filter(experiment=example_world).values_list("pk", "parent_id"))
    changes: dict[str, set[int]] = {"improved": set(), "regressed": set(), "unchanged": set()}
    for (candidate, task), cell in cells.items():
        parent_id = parents.get(candidate)
        parent = cells.get((parent_id, task)) if parent_id is not None else None
        if parent is None or not cell["n"] or not parent["n"]:
            continue
        mine, theirs = cell["passes"] / cell["n"], parent["passes"] / parent["n"]
        kind = "improved" if mine > theirs else "regressed" if mine < theirs else "unchanged"
        changes[kind].add(task)
    return changes


def test_matrix_filters_by_change_against_the_parent(example_world, client_as) -> None:
    # Make one regression for sure: a child's passing trial fails where its parent passed.
    trial = next(
        t
        for t in _child_trial_candidates(example_world)
        if _parent_trial_of(t) is not None and _parent_trial_of(t).outcome == Trial.Outcome.PASS
    )
    Trial.objects.filter(pk=trial.pk).update(outcome=Trial.Outcome.FAIL, score=0.0)
    changes = _changes(example_world)
    assert trial.task_id in changes["regressed"]
    client = client_as("viewer", extra_perms=SEALED)
    url = reverse("review:matrix", args=[example_world.pk])
    for change, tasks in changes.items():
        html = _html(client.get(f"{url}?change={change}"))
        assert set(_rows(html)) == tasks, change
        cells = _cells(html)
        for task in tasks:
            row = [cell for (candidate, t), cell in cells.items() if t == task]
            assert any(f"chg-{change}" in cell["classes"] and "dim" not in cell["classes"] for cell in row)
    regressed = _cells(_html(client.get(f"{url}?change=regressed")))[trial.candidate_id, trial.task_id]
    assert "chg-regressed" in regressed["classes"]
    assert "▼" in regressed["body"]


def _child_trial_candidates(example_world: Any) -> list[Trial]:
    return list(
        Trial.objects.filter(
            candidate__experiment=example_world,
            candidate__parent__isnull=False,
            outcome=Trial.Outcome.PASS,
            evaluation__purpose__in=COUNTED_PURPOSES,
        ).select_related("candidate")
    )


def test_matrix_cells_link_to_every_trial_when_there_are_several(example_world, client_as) -> None:
    grow(example_world, candidates=2, steps=3)
    long = Trial.objects.get(steps=3, index=1)
    url = reverse("review:matrix", args=[example_world.pk]) + f"?candidates={long.candidate_id}"
    html = _html(client_as("viewer").get(url))
    cell = _cells(html)[long.candidate_id, long.task_id]
    siblings = Trial.objects.filter(candidate_id=long.candidate_id, task_id=long.task_id).order_by("index")
    assert [t.pk for t in siblings] == [cell["trial"], long.pk]
    links = re.findall(r'<a href="/trials/(\d+)/" class="o-(\w+)"', cell["body"])
    assert links == [(str(t.pk), t.outcome) for t in siblings]
    assert len(re.findall(r'data-candidate="(\d+)"', html)) == 1


def test_matrix_rejects_bad_filters_with_a_message(example_world, client_as) -> None:
    client = client_as("viewer")
    url = reverse("review:matrix", args=[example_world.pk])
    for query, words in (
        ("?split=bogus", "unknown split"),
        ("?change=worse", "unknown change"),
        ("?candidates=1,x", "comma-separated list"),
        ("?cpage=0", "cpage must be 1 or more"),
    ):
        response = client.get(url + query)
        assert response.status_code == 400
        assert words in response.content.decode()


def test_matrix_pages_candidates_with_a_constant_number_of_queries(example_world, client_as) -> None:
    client = client_as("viewer", extra_perms=SEALED)
    url = reverse("review:matrix", args=[example_world.pk])
    response, small = _get(client, url)
    _html(response)
    grow(example_world, candidates=40)
    total = Candidate.objects.filter(experiment=example_world, trials__isnull=False).distinct().count()
    assert total > results.CANDIDATES_PER_PAGE
    response, large = _get(client, url)
    html = _html(response)
    assert large == small
    assert len(re.findall(r'data-candidate="\d+"', html)) == results.CANDIDATES_PER_PAGE
    assert f"Candidates 1–{results.CANDIDATES_PER_PAGE} of {total}" in html
    response, second = _get(client, url + "?cpage=2")
    assert second == small
    assert len(re.findall(r'data-candidate="\d+"', _html(response))) == total - results.CANDIDATES_PER_PAGE


# --- screen 6: the trial page ---------------------------------------------------------


def test_trial_page_shows_the_trial_and_every_step_with_an_anchor(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    html = _html(client_as("viewer").get(reverse("review:trial", args=[trial.pk])))
    assert trial.task.external_id in html
    assert f'<span class="split {trial.split}">' in html
    assert reverse("review:candidate", args=[trial.candidate_id]) in html
    assert f"{trial.tokens:,}" in html
    assert "Lease attempts" in html
    ids = list(trial.trajectory.steps.order_by("step_id").values_list("step_id", flat=True))
    assert [int(i) for i in STEP.findall(html)] == ids
    for step_id in ids:
        assert f"?step={step_id}#step-{step_id}" in html
    assert trial.trajectory.agent["name"] in html
    parent = _parent_trial_of(trial)
    assert reverse("review:trial_compare", args=[trial.pk]) in html
    assert reverse("review:trial", args=[parent.pk]) in html
    assert f'hx-get="{reverse("review:trial_annotations", args=[trial.pk])}" hx-trigger="load" id="annotations"' in html
    # A short trajectory has no next page to load.
    assert 'hx-trigger="revealed"' not in html


def test_long_trajectories_are_paged_and_loaded_on_scroll(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    _give_trajectory(trial, _plain_steps(350))
    client = client_as("viewer")
    html = _html(client.get(reverse("review:trial", args=[trial.pk])))
    assert [int(i) for i in STEP.findall(html)] == list(range(1, 101))
    steps_url = reverse("review:trial_steps", args=[trial.pk])
    assert f'hx-get="{steps_url}?page=2" hx-trigger="revealed"' in html
    assert f'href="{reverse("review:trial", args=[trial.pk])}?page=2#steps"' in html

    second = _html(client.get(f"{steps_url}?page=2"))
    assert [int(i) for i in STEP.findall(second)] == list(range(101, 201))
    assert f'hx-get="{steps_url}?page=3"' in second
    assert "<html" not in second
    last = _html(client.get(f"{steps_url}?page=4"))
    assert [int(i) for i in STEP.findall(last)] == list(range(301, 351))
    assert 'hx-trigger="revealed"' not in last
    assert client.get(f"{steps_url}?page=5").status_code == 404
    assert client.get(f"{steps_url}?page=abc").status_code == 400

    plain = _html(client.get(reverse("review:trial", args=[trial.pk]) + "?page=3"))
    assert [int(i) for i in STEP.findall(plain)] == list(range(201, 301))


def test_a_link_to_a_step_opens_the_page_that_holds_it(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    # Step ids need not be positions: every step id is doubled here.
    _give_trajectory(trial, [{"step_id": 2 * n, "message": f"m{n}"} for n in range(1, 351)])
    client = client_as("viewer")
    html = _html(client.get(reverse("review:trial", args=[trial.pk]) + "?step=500"))
    ids = [int(i) for i in STEP.findall(html)]
    assert 500 in ids
    assert ids == [2 * n for n in range(201, 301)]
    missing = _html(client.get(reverse("review:trial", args=[trial.pk]) + "?step=501"))
    assert "Step 501 is not in this trajectory." in missing


def test_long_step_content_is_collapsed(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    long_output = "\n".join(f"output line {n}" for n in range(1, 81))
    _give_trajectory(
        trial,
        _plain_steps(
            3,
            s2={
                "observation": {"results": [{"source_call_id": "c1", "content": long_output}]},
                "tool_calls": [{"tool_call_id": "c1", "function_name": "bash", "arguments": {"cmd": "seq 80"}}],
            },
        ),
    )
    html = _html(client_as("viewer").get(reverse("review:trial", args=[trial.pk])))
    step2 = html.split('id="step-2"', 1)[1].split('id="step-3"', 1)[0]
    assert '<details class="long">' in step2
    assert "show all 80 lines" in step2
    assert "output line 80" in step2  # inside the expander, not dropped
    step1 = html.split('id="step-1"', 1)[1].split('id="step-2"', 1)[0]
    assert "<details" not in step1


def test_trajectory_content_is_escaped(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    parent = _parent_trial_of(trial)
    trial.task.instruction = f"Do this {PAYLOAD}"
    trial.task.save()
    hostile = {
        "message": PAYLOAD,
        "reasoning_content": PAYLOAD,
        "model_name": PAYLOAD[:60],
        "tool_calls": [{"tool_call_id": PAYLOAD, "function_name": PAYLOAD, "arguments": {"x": PAYLOAD}}],
        "observation": {"results": [{"source_call_id": PAYLOAD, "content": PAYLOAD}]},
        "metrics": {"prompt_tokens": 3, PAYLOAD: PAYLOAD},
        "extra": {"note": PAYLOAD},
    }
    _give_trajectory(trial, _plain_steps(2, s2=hostile))
    _give_trajectory(parent, _plain_steps(2))
    client = client_as("viewer")
    for url in (
        reverse("review:trial", args=[trial.pk]),
        reverse("review:trial_steps", args=[trial.pk]) + "?page=1",
        reverse("review:trial_compare", args=[trial.pk]),
    ):
        html = _html(client.get(url))
        assert "<img" not in html, url
        assert "onerror=alert(1)>" not in html, url
        assert html.count(ESCAPED) >= 6, url


def test_error_steps_are_highlighted_and_listed(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    _give_trajectory(trial, _plain_steps(4, s3={"source": "system", "message": "error: the tool crashed"}))
    html = _html(client_as("viewer").get(reverse("review:trial", args=[trial.pk])))
    assert '<li class="step src-system is-error" id="step-3"' in html
    assert f'href="{reverse("review:trial", args=[trial.pk])}?step=3#step-3">step 3</a>' in html
    assert html.count(" is-error") == 1


def test_a_trial_without_a_trajectory(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    Trajectory.objects.filter(trial=trial).delete()
    client = client_as("viewer")
    html = _html(client.get(reverse("review:trial", args=[trial.pk])))
    assert "No trajectory was recorded for this trial." in html
    assert not STEP.findall(html)
    assert client.get(reverse("review:trial_steps", args=[trial.pk])).status_code == 404
    compare = _html(client.get(reverse("review:trial_compare", args=[trial.pk])))
    assert "no trajectory" in compare


def test_sealed_trials_are_404_for_users_without_the_permission(example_world, client_as) -> None:
    sealed = Trial.objects.filter(candidate__experiment=example_world, split=SplitName.SEALED).first()
    assert sealed is not None
    pages = (
        reverse("review:trial", args=[sealed.pk]),
        reverse("review:trial_steps", args=[sealed.pk]),
        reverse("review:trial_compare", args=[sealed.pk]),
    )
    viewer = client_as("viewer")
    for url in pages:
        assert viewer.get(url).status_code == 404, url
    allowed = client_as("viewer", username="sealed-viewer", extra_perms=SEALED)
    for url in pages:
        assert allowed.get(url).status_code == 200, url


def test_sealed_trials_cannot_be_compared_with_by_users_without_the_permission(example_world, client_as) -> None:
    sealed = Trial.objects.filter(candidate__experiment=example_world, split=SplitName.SEALED).order_by("pk")
    first, second = sealed[0], sealed.filter(task=sealed[0].task).exclude(pk=sealed[0].pk).first()
    assert second is not None
    url = reverse("review:trial_compare", args=[first.pk]) + f"?with={second.pk}"
    assert client_as("viewer").get(url).status_code == 404
    assert client_as("viewer", username="sv", extra_perms=SEALED).get(url).status_code == 200


def test_pages_need_a_login_and_the_viewer_permission(example_world, client, make_user) -> None:
    trial = _child_trial(example_world)
    url = reverse("review:trial", args=[trial.pk])
    assert client.get(url).status_code == 302
    client.force_login(make_user())  # no role at all
    assert client.get(url).status_code == 403
    assert client.get(reverse("review:matrix", args=[example_world.pk])).status_code == 403


def test_trial_page_queries_do_not_grow_with_steps(example_world, client_as) -> None:
    client = client_as("viewer")
    small_trial = _child_trial(example_world)
    response, small = _get(client, reverse("review:trial", args=[small_trial.pk]))
    _html(response)
    grow(example_world, candidates=2, steps=10_000)
    long = Trial.objects.get(steps=10_000)
    response, large = _get(client, reverse("review:trial", args=[long.pk]))
    html = _html(response)
    assert large == small
    assert len(STEP.findall(html)) == results.STEPS_PER_PAGE
    assert html.count('<li class="step ') == results.STEPS_PER_PAGE
    assert "of 10000" in html
    response, later = _get(client, reverse("review:trial", args=[long.pk]) + "?step=9999")
    assert [int(i) for i in STEP.findall(_html(response))] == list(range(9901, 10_001))
    assert later == small + 1  # the one query that finds the step's page


# --- screen 6: compare ------------------------------------------------------------------


def test_compare_defaults_to_the_parents_trial_of_the_same_task_and_index(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    parent = _parent_trial_of(trial)
    html = _html(client_as("viewer").get(reverse("review:trial_compare", args=[trial.pk])))
    assert f'Parent: <a href="{reverse("review:trial", args=[parent.pk])}">trial #{parent.pk}</a>' in html
    assert f"badge outcome-{parent.outcome}" in html
    assert f"badge outcome-{trial.outcome}" in html
    positions = max(parent.trajectory.step_count, trial.trajectory.step_count)
    assert len(re.findall(r'<tr id="pos-\d+"', html)) == positions


def test_compare_marks_the_first_divergence_and_pages_long_trajectories(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    parent = _parent_trial_of(trial)
    call = {"function_name": "bash", "arguments": {"cmd": "ls"}}
    common = {f"s{n}": {"tool_calls": [{**call, "tool_call_id": f"left-{n}"}]} for n in (10, 20)}
    _give_trajectory(parent, _plain_steps(250, **common))
    changed: dict[str, dict[str, Any]] = {
        f"s{n}": {"tool_calls": [{**call, "tool_call_id": f"right-{n}"}]} for n in (10, 20)
    }
    changed["s180"] = {"message": "a different thought"}
    _give_trajectory(trial, _plain_steps(260, **changed))
    client = client_as("viewer")
    url = reverse("review:trial_compare", args=[trial.pk])

    first = _html(client.get(url))
    assert f'<a href="{url}?page=2#pos-180" class="first-divergence">First divergence at row 180</a>' in first
    assert "11 of 260 rows differ" in first  # step 180 and the 10 steps only the trial has
    rows = re.findall(r'<tr id="pos-(\d+)" class="([^"]*)"', first)
    assert [int(p) for p, _ in rows] == list(range(1, 101))
    assert all(cls == "same same" for _, cls in rows)  # call ids differ at 10 and 20: not a divergence
    second = _html(client.get(f"{url}?page=2"))
    by_row = dict(re.findall(r'<tr id="pos-(\d+)" class="([^"]*)"', second))
    assert by_row["180"] == "differs first changed"
    assert [p for p, cls in by_row.items() if cls != "same same"] == ["180"]
    assert '<div class="word-diff"' in second and "<ins>" in second
    third = _html(client.get(f"{url}?page=3"))
    by_row = dict(re.findall(r'<tr id="pos-(\d+)" class="([^"]*)"', third))
    assert {p: cls for p, cls in by_row.items() if cls != "same same"} == {
        str(n): "differs inserted" for n in range(251, 261)
    }
    assert "no counterpart: this step was inserted in this trial" in third
    # The next-difference key goes on past a page: each page names the nearest difference beyond it.
    assert f'data-next-difference="{url}?page=2#pos-180"' in first and "data-previous-difference" not in first
    assert f'data-next-difference="{url}?page=3#pos-251"' in second and "data-previous-difference" not in second
    assert f'data-previous-difference="{url}?page=2#pos-180"' in third and "data-next-difference" not in third
    # Aligned by position on request: the old view, and its pages keep the choice.
    positional = _html(client.get(f"{url}?align=position&page=3"))
    assert "no step 251: this trajectory ended" in positional
    assert f"{url}?align=position&amp;page=2" in positional


def test_compare_says_when_the_trajectories_are_the_same(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    _give_trajectory(_parent_trial_of(trial), _plain_steps(5))
    _give_trajectory(trial, _plain_steps(5))
    html = _html(client_as("viewer").get(reverse("review:trial_compare", args=[trial.pk])))
    assert "The two trajectories are the same step for step" in html
    assert "first-divergence" not in html


def test_compare_with_any_trial_of_the_same_task(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    client = client_as("viewer")
    url = reverse("review:trial_compare", args=[trial.pk])
    same_task = Trial.objects.filter(task=trial.task).exclude(pk=trial.pk).exclude(pk=_parent_trial_of(trial).pk)
    other = same_task.first()
    assert other is not None
    html = _html(client.get(f"{url}?with={other.pk}"))
    assert f'Compared with: <a href="{reverse("review:trial", args=[other.pk])}">trial #{other.pk}</a>' in html
    assert f'<option value="{other.pk}" selected>' in html
    elsewhere = Trial.objects.exclude(task=trial.task).filter(split=SplitName.TRAIN).first()
    assert elsewhere is not None
    response = client.get(f"{url}?with={elsewhere.pk}")
    assert response.status_code == 400
    assert "is of another task" in response.content.decode()
    assert client.get(f"{url}?with=abc").status_code == 400
    assert client.get(f"{url}?with=999999").status_code == 404


def test_compare_of_the_seed_offers_other_trials(example_world, client_as) -> None:
    seed_trial = Trial.objects.filter(candidate=example_world.seed_candidate, split=SplitName.TRAIN).first()
    assert seed_trial is not None
    html = _html(client_as("viewer").get(reverse("review:trial_compare", args=[seed_trial.pk])))
    assert "This is the seed: it has no parent." in html
    assert '<select name="with">' in html
    assert html.count("<option value=") >= 2


def test_compare_queries_do_not_grow_with_steps(example_world, client_as) -> None:
    client = client_as("viewer")
    trial = _child_trial(example_world)
    response, small = _get(client, reverse("review:trial_compare", args=[trial.pk]) + f"?with={trial.pk}")
    _html(response)
    grow(example_world, candidates=1, steps=10_000)
    long = Trial.objects.get(steps=10_000)
    response, large = _get(client, reverse("review:trial_compare", args=[long.pk]) + f"?with={long.pk}")
    html = _html(response)
    assert large == small
    assert len(re.findall(r'<tr id="pos-\d+"', html)) == results.STEPS_PER_PAGE


def test_a_transcript_can_be_searched_and_filtered_by_role_tool_calls_and_errors(example_world, client_as) -> None:
    trial = _child_trial(example_world)
    call = {"tool_call_id": "c1", "function_name": "grep_orders", "arguments": {"pattern": "Lyon"}}
    _give_trajectory(
        trial,
        _plain_steps(
            8,
            s1={"source": "user", "message": "Move order 1042 to Lyon."},
            s3={"tool_calls": [call]},
            s4={"source": "system", "message": "", "observation": {"results": [{"content": "ORDER 1042 lyon"}]}},
            s6={"message": "Error: the address service timed out."},
            s7={"tool_calls": [{**call, "tool_call_id": "c2", "arguments": {"pattern": "Paris"}}]},
        ),
    )
    client = client_as("viewer")
    url = reverse("review:trial", args=[trial.pk])

    def shown(query: str) -> list[int]:
        html = _html(client.get(f"{url}?{query}"))
        return [int(n) for n in re.findall(r'<li class="step[^"]*"[^>]*data-step="(\d+)"', html)]

    # Text anywhere in a step (message, tool call arguments, tool output), any case.
    assert shown("q=lyon") == [1, 3, 4]
    assert shown("q=LYON&source=agent") == [3]
    assert shown("source=user") == [1]
    assert shown("only=tools") == [3, 7]
    assert shown("only=errors") == [6]
    assert shown("q=nothing-like-this") == []
    assert "1 matching step</strong> of 8" in _html(client.get(f"{url}?only=errors"))
    # Unknown values are ignored: the whole transcript, paged as usual.
    assert len(shown("source=robot&only=everything")) == 8
