"""Object-level permissions on per-task sealed data, over every route.

Every URL pattern of the project is enumerated (``get_resolver``); each named
route must be listed in ``ROUTES`` with the requests that exercise it on the
world below, so a new screen or endpoint without an entry fails
``test_every_route_is_covered``. A canary string is planted in all sealed
per-task data (the sealed task's text, expected answer, criteria and
metadata, the sealed trial's error, its trajectory, an annotation note on
it, and a leakage flag's evidence pointing at it). Users in every role
without ``view_sealed_details`` fetch every route and must never receive the
canary; a user with the permission must see it where sealed data is shown.

Admin routes (``admin:*``) are staff-only as a whole: a role user is sent to
the admin login on every one of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.authtoken.models import Token

from evolution.access import SEALED
from evolution.models import (
    Annotation,
    AnnotationLabel,
    LeakageFlag,
    ReviewItem,
    SplitMembership,
    SplitName,
    Task,
    Trajectory,
    Trial,
)
from tests.api.conftest import CANARY, World
from tests.factories import seed_id, seed_of

pytestmark = pytest.mark.django_db

UNPRIVILEGED = [
    ("viewer",),
    ("annotator",),
    ("reviewer",),
    ("operator",),
    ("viewer", "annotator", "reviewer", "operator"),
]


@dataclass
class Ids:
    experiment: int
    seed: int
    flagged: int
    train_trial: int
    sealed_trial: int
    gate_trial: int
    record: int
    item: int
    sealed_annotation: int
    train_annotation: int
    sealed_task: int
    train_task: int
    benchmark: int
    run: int
    comparison: int = 999999  # no world here has one (a comparison shows aggregates only): its routes 404


# Each route name -> the GET paths that exercise it (sealed objects included).
# Routes that only accept POST are fetched too (405, nothing shown); their
# sealed-object behaviour is checked in the POST tests below.
Paths = Callable[[Ids], list[str]]
ROUTES: dict[str, Paths] = {
    "login": lambda i: ["/login/"],
    "logout": lambda i: ["/logout/"],
    "review:home": lambda i: ["/"],
    "favicon": lambda i: ["/favicon.ico"],
    "review:experiment": lambda i: [f"/experiments/{i.experiment}/"],
    "review:comparison": lambda i: [f"/comparisons/{i.comparison}/"],
    "review:comparison_json": lambda i: [f"/comparisons/{i.comparison}/json/"],
    "api:comparison-list": lambda i: ["/api/v1/comparisons/"],
    "api:comparison-detail": lambda i: [f"/api/v1/comparisons/{i.comparison}/"],
    "review:experiment_progress": lambda i: [f"/experiments/{i.experiment}/progress/"],
    "review:experiment_ledger": lambda i: [f"/experiments/{i.experiment}/ledger/"],
    "review:lineage": lambda i: [f"/experiments/{i.experiment}/lineage/"],
    "review:run_start": lambda i: [f"/experiments/{i.experiment}/runs/start/"],
    "review:run_action": lambda i: [f"/runs/{i.run}/pause/"],
    "review:candidate": lambda i: [f"/candidates/{i.seed}/", f"/candidates/{i.flagged}/"],
    "review:candidate_diff": lambda i: [f"/candidates/{i.flagged}/diff/", f"/candidates/{i.flagged}/diff/?partial=1"],
    "review:diff_file": lambda i: [f"/candidates/{i.flagged}/diff/file/?path=notes/a.md"],
    "review:diff_context": lambda i: [
        f"/candidates/{i.flagged}/diff/context/?path=notes/a.md&layout=unified&first=1&last=200&shift=0"
    ],
    "review:candidate_raw": lambda i: [f"/candidates/{i.flagged}/raw/notes/a.md"],
    "review:candidate_evaluate": lambda i: [f"/candidates/{i.seed}/evaluate/"],  # POST only
    "review:diff_viewed": lambda i: ["/diff/viewed/"],
    "review:record": lambda i: [f"/records/{i.record}/"],
    "review:matrix": lambda i: [
        f"/experiments/{i.experiment}/matrix/",
        f"/experiments/{i.experiment}/matrix/?split=sealed",
    ],
    "review:trial": lambda i: [
        f"/trials/{i.sealed_trial}/",
        f"/trials/{i.train_trial}/",
        f"/trials/{i.gate_trial}/",
        f"/trials/{i.sealed_trial}/?q=a&only=tools",
    ],
    "review:trial_steps": lambda i: [f"/trials/{i.sealed_trial}/steps/", f"/trials/{i.train_trial}/steps/"],
    "review:trial_compare": lambda i: [
        f"/trials/{i.sealed_trial}/compare/",
        f"/trials/{i.train_trial}/compare/?with={i.sealed_trial}",
    ],
    "review:queue": lambda i: ["/review/", f"/review/?experiment={i.experiment}"],
    "review:review_item": lambda i: [f"/review/{i.item}/"],
    "review:review_claim": lambda i: [f"/review/{i.item}/claim/"],
    "review:review_release": lambda i: [f"/review/{i.item}/release/"],
    "review:review_decide": lambda i: [f"/review/{i.item}/decide/"],
    "review:review_undo": lambda i: [f"/review/{i.item}/undo/"],  # POST only
    "review:review_correct": lambda i: [f"/review/{i.item}/correct/"],  # POST only
    "review:annotate_queue": lambda i: ["/annotate/", f"/annotate/?experiment={i.experiment}&split=sealed"],
    "review:trial_annotations": lambda i: [
        f"/trials/{i.sealed_trial}/annotations/",
        f"/trials/{i.train_trial}/annotations/",
    ],
    "review:annotation_delete": lambda i: [f"/annotations/{i.sealed_annotation}/delete/"],
    "review:annotation_stats": lambda i: [f"/experiments/{i.experiment}/annotations/"],
    "review:annotations_csv": lambda i: [f"/experiments/{i.experiment}/annotations.csv"],
    "review:annotations_jsonl": lambda i: [f"/experiments/{i.experiment}/annotations.jsonl"],
    "review:label_add": lambda i: [f"/experiments/{i.experiment}/labels/"],
    "review:score_config_add": lambda i: [f"/experiments/{i.experiment}/scores/"],
    "api:schema": lambda i: ["/api/schema/"],
    "api:docs": lambda i: ["/api/docs/"],
    "api:benchmark-list": lambda i: ["/api/v1/benchmarks/"],
    "api:benchmark-detail": lambda i: [f"/api/v1/benchmarks/{i.benchmark}/"],
    "api:task-list": lambda i: ["/api/v1/tasks/", f"/api/v1/tasks/?benchmark={i.benchmark}"],
    "api:task-detail": lambda i: [f"/api/v1/tasks/{i.sealed_task}/", f"/api/v1/tasks/{i.train_task}/"],
    "api:experiment-list": lambda i: ["/api/v1/experiments/"],
    "api:experiment-detail": lambda i: [f"/api/v1/experiments/{i.experiment}/"],
    "api:run-list": lambda i: ["/api/v1/runs/"],
    "api:run-detail": lambda i: [f"/api/v1/runs/{i.run}/"],
    "api:run-cancel": lambda i: [f"/api/v1/runs/{i.run}/cancel/"],
    "api:run-pause": lambda i: [f"/api/v1/runs/{i.run}/pause/"],
    "api:run-resume": lambda i: [f"/api/v1/runs/{i.run}/resume/"],
    "api:candidate-list": lambda i: ["/api/v1/candidates/", f"/api/v1/candidates/?experiment={i.experiment}"],
    "api:candidate-detail": lambda i: [f"/api/v1/candidates/{i.seed}/", f"/api/v1/candidates/{i.flagged}/"],
    "api:candidate-diff": lambda i: [f"/api/v1/candidates/{i.flagged}/diff/"],
    "api:candidate-evaluate": lambda i: [f"/api/v1/candidates/{i.seed}/evaluate/"],  # POST only
    "api:candidate-tree": lambda i: [f"/api/v1/candidates/{i.flagged}/tree/"],
    "api:candidate-file": lambda i: [f"/api/v1/candidates/{i.flagged}/files/notes/a.md"],
    "api:result-list": lambda i: ["/api/v1/results/", f"/api/v1/results/?experiment={i.experiment}"],
    "api:result-detail": lambda i: [f"/api/v1/results/{i.record}/"],
    "api:trial-list": lambda i: [
        "/api/v1/trials/",
        "/api/v1/trials/?split=sealed",
        f"/api/v1/trials/?experiment={i.experiment}",
    ],
    "api:trial-detail": lambda i: [f"/api/v1/trials/{i.sealed_trial}/", f"/api/v1/trials/{i.train_trial}/"],
    "api:trial-trajectory": lambda i: [
        f"/api/v1/trials/{i.sealed_trial}/trajectory/",
        f"/api/v1/trials/{i.train_trial}/trajectory/",
    ],
    "api:trial-trajectory-import": lambda i: [f"/api/v1/trials/{i.sealed_trial}/trajectory/"],
    "api:trajectory-batch-import": lambda i: ["/api/v1/trajectories/"],
    "api:ledger-list": lambda i: ["/api/v1/ledger/"],
    "api:ledger-detail": lambda i: ["/api/v1/ledger/1/"],
    "api:flag-list": lambda i: ["/api/v1/flags/", f"/api/v1/flags/?candidate={i.flagged}"],
    "api:flag-detail": lambda i: [f"/api/v1/flags/{pk}/" for pk in _flag_pks()],
    "api:review-decision-list": lambda i: ["/api/v1/review-decisions/"],
    "api:review-decision-detail": lambda i: ["/api/v1/review-decisions/1/"],
    "api:annotation-list": lambda i: ["/api/v1/annotations/", f"/api/v1/annotations/?trial={i.sealed_trial}"],
    "api:annotation-detail": lambda i: [
        f"/api/v1/annotations/{i.sealed_annotation}/",
        f"/api/v1/annotations/{i.train_annotation}/",
    ],
    "api:external-results": lambda i: [f"/api/v1/candidates/{i.flagged}/external-results/"],
    # Write-only (POST a Harbor job's files); a GET is refused and shows nothing.
    "api:harbor-jobs": lambda i: ["/api/v1/harbor-jobs/"],
}

# Pages that show sealed per-task data to a user who may see it (the canary
# must appear there, which proves the planted data reaches the pages at all).
SHOWS_SEALED = [
    lambda i: f"/trials/{i.sealed_trial}/",
    lambda i: f"/trials/{i.sealed_trial}/steps/",
    lambda i: f"/trials/{i.sealed_trial}/annotations/",
    lambda i: f"/review/{i.item}/",
    lambda i: f"/experiments/{i.experiment}/annotations.jsonl",
    lambda i: f"/api/v1/trials/{i.sealed_trial}/",
    lambda i: f"/api/v1/trials/{i.sealed_trial}/trajectory/",
    lambda i: f"/api/v1/annotations/{i.sealed_annotation}/",
]


def _flag_pks() -> list[int]:
    from evolution.models import LeakageFlag

    return list(LeakageFlag.objects.values_list("pk", flat=True))


def route_names(patterns: list[Any] | None = None, namespace: str = "") -> Iterator[tuple[str, Any]]:
    """(qualified name, pattern) of every route, nested includes walked."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            inner = namespace
            if entry.namespace:
                inner = f"{namespace}:{entry.namespace}" if namespace else entry.namespace
            yield from route_names(entry.url_patterns, inner)
        elif isinstance(entry, URLPattern):
            yield (f"{namespace}:{entry.name}" if namespace else str(entry.name)), entry


def admin_paths(trial_pk: int) -> list[str]:
    """One concrete path per admin route, objects being the sealed trial."""
    paths = set()
    for name, entry in route_names():
        if not name.startswith("admin:") and name != "admin-login":
            continue
        if name == "admin:None":  # the admin's unnamed catch-all
            paths.add("/admin/evolution/trial/x/y/z/")
            continue
        params = set(getattr(entry.pattern, "converters", {}) or {}) | set(entry.pattern.regex.groupindex)
        values = {"object_id": str(trial_pk), "app_label": "evolution", "content_type_id": "1", "url": "x", "id": "1"}
        if not params <= set(values):
            pytest.fail(f"{name}: unknown admin route parameters {params - set(values)}")
        paths.add(reverse(name, kwargs={key: values[key] for key in params}))
    return sorted(paths)


@pytest.fixture
def ids(api_world: World, make_user: Callable[..., User]) -> Ids:
    """The API world with the canary planted in every piece of sealed per-task data."""
    world = api_world
    sealed = world.sealed_trial
    Task.objects.filter(pk=sealed.task_id).update(
        instruction=f"Sealed instruction {CANARY}",
        expected={"answer": f"{CANARY}-answer"},
        criteria=[{"id": "c", "text": f"criterion {CANARY}"}],
        metadata={"note": CANARY},
    )
    Trial.objects.filter(pk=sealed.pk).update(criteria_results=[{"id": "c", "met": True, "note": CANARY}])
    Trajectory.objects.filter(trial=sealed).update(notes=f"notes {CANARY}")
    # The critic's evidence quotes the sealed task (sealed data); the matched
    # text is, as the critic makes it, a piece of the candidate's own line,
    # which every viewer of the diff sees anyway.
    LeakageFlag.objects.filter(candidate=world.flagged).update(
        matched="generic", evidence={"task": sealed.task.external_id, "evidence": f"task text {CANARY}"}
    )
    author = make_user("admin", username="annie")
    label = AnnotationLabel.objects.first() or AnnotationLabel.objects.create(slug="other", name="Other")
    sealed_note = Annotation.objects.create(trial=sealed, author=author, label=label, note=f"sealed note {CANARY}")
    train_note = Annotation.objects.create(trial=world.train_trial, author=author, label=label, note="train note")
    trials = Trial.objects.filter(candidate__experiment=world.experiment)
    from evolution.models import Run

    run = Run.objects.filter(experiment=world.experiment).first()  # this world has none: its routes 404
    return Ids(
        experiment=world.experiment.pk,
        seed=seed_id(world.experiment),
        flagged=world.flagged.pk,
        train_trial=world.train_trial.pk,
        sealed_trial=sealed.pk,
        gate_trial=trials.filter(split=SplitName.GATE).order_by("pk").values_list("pk", flat=True)[0],
        record=world.record.pk,
        item=ReviewItem.objects.get(candidate=world.flagged).pk,
        sealed_annotation=sealed_note.pk,
        train_annotation=train_note.pk,
        sealed_task=sealed.task_id,
        train_task=world.train_trial.task_id,
        benchmark=world.experiment.benchmark_id,
        run=run.pk if run else 999999,
    )


def session_and_token(user: User) -> tuple[Client, Client]:
    session = Client()
    session.force_login(user)
    token = Client(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return session, token


def fetch_all(client: Client, paths: list[str]) -> dict[str, tuple[int, str]]:
    seen = {}
    token_only = "HTTP_AUTHORIZATION" in client.defaults
    for path in paths:
        if token_only and not path.startswith("/api/"):
            continue  # a token authenticates the API only; the screens are covered by the session
        response = client.get(path)
        body = b"".join(response.streaming_content) if isinstance(response, StreamingHttpResponse) else response.content
        seen[path] = (response.status_code, body.decode(errors="replace"))
    return seen


def all_paths(ids: Ids) -> list[str]:
    return [path for paths in ROUTES.values() for path in paths(ids)]


def test_every_route_is_covered() -> None:
    names = {name for name, _ in route_names() if not name.startswith("admin:") and name != "admin-login"}
    unknown = sorted(names - set(ROUTES))
    assert not unknown, f"routes without a sealed-data check (add them to ROUTES): {unknown}"
    stale = sorted(set(ROUTES) - names)
    assert not stale, f"ROUTES lists routes that no longer exist: {stale}"


@pytest.mark.parametrize("roles", UNPRIVILEGED, ids=["+".join(r) for r in UNPRIVILEGED])
def test_no_route_gives_sealed_per_task_data_to_a_user_without_the_permission(
    roles: tuple[str, ...], ids: Ids, make_user: Callable[..., User]
) -> None:
    assert_no_route_leaks(roles, ids, make_user)


def assert_no_route_leaks(roles: tuple[str, ...], ids: Ids, make_user: Callable[..., User]) -> None:
    """Every route, by session and by token, for a user in ``roles``: no
    canary, no server error, the sealed trial's pages not found and the train
    trial's open."""
    user = make_user(*roles, username="u-" + "-".join(roles))
    assert not user.has_perm(SEALED)
    paths = all_paths(ids)
    for client in session_and_token(user):
        seen = fetch_all(client, paths)
        leaks = [path for path, (_, body) in seen.items() if CANARY in body]
        assert not leaks, f"{roles}: the sealed canary reached {leaks}"
        errors = [f"{path}: {status}" for path, (status, _) in seen.items() if status >= 500]
        assert not errors, errors
        # The sealed objects themselves are not found (not merely emptied).
        screens = [
            f"/trials/{ids.sealed_trial}/",
            f"/trials/{ids.sealed_trial}/steps/",
            f"/trials/{ids.sealed_trial}/annotations/",
        ]
        for path in [
            *(screens if "/trials/" + str(ids.train_trial) + "/" in seen else []),
            f"/api/v1/trials/{ids.sealed_trial}/",
            f"/api/v1/trials/{ids.sealed_trial}/trajectory/",
            f"/api/v1/annotations/{ids.sealed_annotation}/",
        ]:
            assert seen[path][0] in (403, 404), f"{path}: {seen[path][0]}"
        # ... while the same pages of a train trial open: the refusal is about the split.
        assert seen.get(f"/trials/{ids.train_trial}/", (200,))[0] == 200
        assert seen[f"/api/v1/trials/{ids.train_trial}/"][0] == 200


def test_a_user_with_the_permission_sees_the_sealed_data(ids: Ids, make_user: Callable[..., User]) -> None:
    assert_the_permission_shows_it(ids, make_user)


def assert_the_permission_shows_it(ids: Ids, make_user: Callable[..., User]) -> None:
    user = make_user("viewer", username="trusted", extra_perms=(SEALED,))
    paths = [page(ids) for page in SHOWS_SEALED]
    for client in session_and_token(user):
        seen = fetch_all(client, paths)
        for path, (status, body) in seen.items():
            assert status == 200, f"{path}: {status}"
            assert CANARY in body, f"{path} does not show the sealed data to a user who may see it"
        # And no route fails for them either.
        errors = [f"{p}: {s}" for p, (s, _) in fetch_all(client, all_paths(ids)).items() if s >= 500]
        assert not errors, errors


def test_admin_routes_are_staff_only(ids: Ids, make_user: Callable[..., User]) -> None:
    paths = admin_paths(ids.sealed_trial)
    assert len(paths) > 50  # every registered model's routes
    user = make_user("viewer", "annotator", "reviewer", "operator", username="no-staff")
    client = Client()
    client.force_login(user)
    for path, (status, body) in fetch_all(client, paths).items():
        assert CANARY not in body, path
        if path == "/admin/login/":
            assert status == 200
        elif path != "/admin/logout/":
            assert status == 302, f"{path}: {status}"


def test_posting_to_a_sealed_trial_without_the_permission_is_not_found(
    ids: Ids, make_user: Callable[..., User]
) -> None:
    annotator = Client()
    annotator.force_login(make_user("annotator", "operator", username="ann"))
    label = AnnotationLabel.objects.first()
    assert label is not None
    before = Annotation.objects.filter(trial_id=ids.sealed_trial).count()
    response = annotator.post(f"/trials/{ids.sealed_trial}/annotations/", {"label": label.pk, "note": "mine"})
    assert response.status_code == 404
    response = annotator.post(f"/annotations/{ids.sealed_annotation}/delete/")
    assert response.status_code in (403, 404)
    assert Annotation.objects.filter(trial_id=ids.sealed_trial).count() == before
    steps = list(Trajectory.objects.get(trial_id=ids.sealed_trial).steps.values_list("message", flat=True))
    response = annotator.post(
        f"/api/v1/trials/{ids.sealed_trial}/trajectory/",
        {"format": "openai", "document": [{"role": "user", "content": "hi"}]},
        content_type="application/json",
    )
    assert response.status_code == 404
    assert CANARY not in response.content.decode()
    # In a batch, the same words as for a trial that does not exist.
    response = annotator.post(
        "/api/v1/trajectories/",
        {
            "trajectories": [
                {"trial": ids.sealed_trial, "format": "openai", "document": [{"role": "user", "content": "hi"}]}
            ]
        },
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json() == {"trajectories": {"0": {"trial": [f"no trial {ids.sealed_trial}"]}}}
    assert list(Trajectory.objects.get(trial_id=ids.sealed_trial).steps.values_list("message", flat=True)) == steps


def test_the_canary_check_can_fail(ids: Ids, make_user: Callable[..., User]) -> None:
    """A sealed task moved to train (its trial and its split) is shown to a
    viewer, canary and all: the check above sees the data when it is there."""
    Trial.objects.filter(pk=ids.sealed_trial).update(split=SplitName.TRAIN)
    SplitMembership.objects.filter(task_id=ids.sealed_task).update(split=SplitName.TRAIN)
    client = Client()
    client.force_login(make_user("viewer", username="v2"))
    seen = fetch_all(client, [f"/trials/{ids.sealed_trial}/steps/"])
    assert CANARY in seen[f"/trials/{ids.sealed_trial}/steps/"][1]


def test_the_task_api_hides_sealed_tasks_without_the_permission(ids: Ids, make_user: Callable[..., User]) -> None:
    client = Client()
    client.force_login(make_user("viewer", username="v3"))
    paths = ROUTES["api:task-list"](ids) + ROUTES["api:task-detail"](ids)
    seen = fetch_all(client, paths)
    assert not [path for path, (_, body) in seen.items() if CANARY in body]
    # With the permission the same routes give the sealed task.
    client.force_login(make_user("admin", username="a3"))
    seen = fetch_all(client, paths)
    assert CANARY in seen["/api/v1/tasks/"][1]
    assert [path for path, (_, body) in seen.items() if CANARY in body and "/tasks/" in path and path[-2].isdigit()]


# --- One sealed rule: a task sealed in any experiment is sealed everywhere ------------
#
# Experiment B shares A's benchmark with another split seed, under which A's
# sealed task is a train task of B. B's trial of that task, its trajectory,
# an annotation on it and a flag of B pointing at it carry the canary, and
# the task's own text carries it too: without the permission no route of B
# may show them, as the task API already refused the task itself.

SHARED_RATIOS = {"train": 0.5, "gate": 0.25, "sealed": 0.25}


def _build_shared_world() -> None:
    from evolution.models import Candidate, Experiment
    from evolution.services.experiments import experiment_twin, splits_assign
    from tests.api.conftest import _build_world, _trajectory
    from tests.factories import evaluate_seed_inline

    _build_world()
    first = Experiment.objects.get()
    shared = SplitMembership.objects.get(experiment=first, split=SplitName.SEALED).task
    other = experiment_twin(like=first, name="same benchmark, another split seed")
    for seed in range(1, 100):  # the first split seed that puts first's sealed task in other's train split
        splits_assign(experiment=other, seed=seed, ratios=SHARED_RATIOS)
        if SplitMembership.objects.filter(experiment=other, task=shared, split=SplitName.TRAIN).exists():
            break
    assert SplitMembership.objects.get(experiment=other, task=shared).split == SplitName.TRAIN
    assert other.split_seed != first.split_seed
    evaluate_seed_inline(other)
    trial = Trial.objects.get(candidate__experiment=other, task=shared)
    Trial.objects.filter(pk=trial.pk).update(
        error=f"shared detail {CANARY}", criteria_results=[{"id": "c", "met": True, "note": CANARY}]
    )
    _trajectory(trial, f"shared {CANARY}")
    flagged = Candidate.objects.create(
        experiment=other,
        parent=seed_of(other),
        tree=Candidate.objects.get(experiment=first, state=Candidate.State.FLAGGED).tree,
        origin=Candidate.Origin.PROPOSED,
        state=Candidate.State.FLAGGED,
        round=1,
    )
    LeakageFlag.objects.create(
        candidate=flagged,
        rule="literal",
        path="notes/a.md",
        line="generic advice",
        matched="generic",
        task=shared,
        evidence={"task": shared.external_id, "evidence": f"task text {CANARY}"},
    )
    ReviewItem.objects.create(candidate=flagged)


@pytest.fixture(scope="session")
def shared_world_rows(django_db_setup: Any, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.worlds import world_dump, world_rows

    path = tmp_path_factory.mktemp("shared-world") / "world.json"
    world_dump(_build_shared_world, path=path, django_db_blocker=django_db_blocker)
    return world_rows(path)


@pytest.fixture
def shared_ids(db: Any, shared_world_rows: Any, make_user: Callable[..., User]) -> Ids:
    """The ids of experiment B, its 'sealed' objects being those of the task
    sealed in A (a train task of B), with the canary planted in them."""
    from evolution.models import CertifiedResult, Experiment
    from tests.worlds import world_load

    world_load(shared_world_rows)
    other = Experiment.objects.get(name="same benchmark, another split seed")
    shared = SplitMembership.objects.get(split=SplitName.SEALED, experiment__in=Experiment.objects.exclude(pk=other.pk))
    Task.objects.filter(pk=shared.task_id).update(
        instruction=f"Sealed instruction {CANARY}",
        expected={"answer": f"{CANARY}-answer"},
        criteria=[{"id": "c", "text": f"criterion {CANARY}"}],
        metadata={"note": CANARY},
    )
    trials = Trial.objects.filter(candidate__experiment=other)
    shared_trial = trials.get(task_id=shared.task_id)
    sealed_anywhere = SplitMembership.objects.filter(split=SplitName.SEALED).values("task_id")
    open_trial = trials.filter(split=SplitName.TRAIN).exclude(task_id__in=sealed_anywhere).order_by("pk").first()
    assert shared_trial.split == SplitName.TRAIN and open_trial is not None
    author = make_user("admin", username="annie")
    label = AnnotationLabel.objects.first() or AnnotationLabel.objects.create(slug="other", name="Other")
    shared_note = Annotation.objects.create(trial=shared_trial, author=author, label=label, note=f"note {CANARY}")
    open_note = Annotation.objects.create(trial=open_trial, author=author, label=label, note="train note")
    return Ids(
        experiment=other.pk,
        seed=seed_id(other),
        flagged=other.candidates.get(state="flagged").pk,
        train_trial=open_trial.pk,
        sealed_trial=shared_trial.pk,
        gate_trial=trials.filter(split=SplitName.GATE).order_by("pk").values_list("pk", flat=True)[0],
        record=CertifiedResult.objects.get(experiment=other).pk,
        item=ReviewItem.objects.get(candidate__experiment=other).pk,
        sealed_annotation=shared_note.pk,
        train_annotation=open_note.pk,
        sealed_task=shared.task_id,
        train_task=open_trial.task_id,
        benchmark=other.benchmark_id,
        run=999999,
    )


@pytest.mark.parametrize("roles", UNPRIVILEGED, ids=["+".join(r) for r in UNPRIVILEGED])
def test_a_task_sealed_in_one_experiment_is_sealed_on_every_route_of_another(
    roles: tuple[str, ...], shared_ids: Ids, make_user: Callable[..., User]
) -> None:
    assert_no_route_leaks(roles, shared_ids, make_user)


def test_a_user_with_the_permission_sees_the_task_sealed_elsewhere(
    shared_ids: Ids, make_user: Callable[..., User]
) -> None:
    assert_the_permission_shows_it(shared_ids, make_user)


def test_the_other_experiment_hides_the_task_in_its_matrix_and_record_but_keeps_its_score(
    shared_ids: Ids, make_user: Callable[..., User]
) -> None:
    """The task sealed elsewhere is left out of B's matrix rows and record rows
    for a viewer (named as hidden), while the aggregates count it."""
    from evolution.models import CertifiedResult

    name = Task.objects.get(pk=shared_ids.sealed_task).external_id
    viewer, admin = Client(), Client()
    viewer.force_login(make_user("viewer", username="v-shared"))
    admin.force_login(make_user("admin", username="a-shared"))
    matrix = f"/experiments/{shared_ids.experiment}/matrix/"
    record = f"/api/v1/results/{shared_ids.record}/"
    seen, full = fetch_all(viewer, [matrix, record]), fetch_all(admin, [matrix, record])
    assert f">{name}<" not in seen[matrix][1] and f">{name}<" in full[matrix][1]
    sealed_here = SplitMembership.objects.filter(experiment_id=shared_ids.experiment, split=SplitName.SEALED).count()
    assert f"{sealed_here + 1} sealed tasks hidden (sealed in this or another experiment" in seen[matrix][1]
    rows = CertifiedResult.objects.get(pk=shared_ids.record).payload["trials"]
    shown = json.loads(seen[record][1])["payload"]["trials"]
    assert [row["task"] for row in shown] == [r["task"] for r in rows if r["split"] != "sealed" and r["task"] != name]
    assert len(json.loads(full[record][1])["payload"]["trials"]) == len(rows)
    # The column's evolve score is the same for both: an aggregate counts every trial.
    score = re.compile(r'class="score[^"]*"[^>]*>([^<]+)<')
    assert score.findall(seen[matrix][1]) == score.findall(full[matrix][1]) != []


# --- Sealed evidence: screens follow the API's matched: null ---------------------------


def test_screens_mark_the_text_a_sealed_flag_matched_only_where_the_api_gives_it(
    ids: Ids, make_user: Callable[..., User]
) -> None:
    """The world's flag points at the sealed task and matched 'generic' in the
    added line 'generic advice'. Which words matched tells what the sealed
    task says: the API gives matched null without the permission, and the
    candidate page, its diff, the review queue and the review item page mark
    nothing, while the line itself stays on the diff."""
    marks = {
        f"/candidates/{ids.flagged}/": '<mark class="leak">generic</mark>',
        f"/candidates/{ids.flagged}/diff/": '<mark class="leak" title="leakage flag: rule task_id',
        f"/review/{ids.item}/": "<mark>generic</mark>",
        "/review/": "<code>generic</code>",
    }
    for roles, shown in ((("viewer", "reviewer"), False), (("admin",), True)):
        client = Client()
        client.force_login(make_user(*roles, username="-".join(roles)))
        flags = client.get(f"/api/v1/flags/?candidate={ids.flagged}").json()["results"]
        assert [flag["matched"] for flag in flags] == (["generic"] if shown else [None])
        seen = fetch_all(client, list(marks))
        for path, mark in marks.items():
            assert seen[path][0] == 200, path
            assert (mark in seen[path][1]) is shown, f"{'-'.join(roles)} {path}"
        diff = re.sub(r"<[^>]+>", "", seen[f"/candidates/{ids.flagged}/diff/"][1])
        assert "generic advice" in diff
