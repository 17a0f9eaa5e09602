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

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import StreamingHttpResponse
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from rest_framework.authtoken.models import Token

from evolution.models import Annotation, AnnotationLabel, LeakageFlag, ReviewItem, SplitName, Task, Trajectory, Trial
from review.access import SEALED
from tests.api.conftest import CANARY, World
from tests.factories import seed_id

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


# Each route name -> the GET paths that exercise it (sealed objects included).
# Routes that only accept POST are fetched too (405, nothing shown); their
# sealed-object behaviour is checked in the POST tests below.
Paths = Callable[[Ids], list[str]]
ROUTES: dict[str, Paths] = {
    "login": lambda i: ["/login/"],
    "logout": lambda i: ["/logout/"],
    "review:home": lambda i: ["/"],
    "review:experiment": lambda i: [f"/experiments/{i.experiment}/"],
    "review:experiment_progress": lambda i: [f"/experiments/{i.experiment}/progress/"],
    "review:experiment_ledger": lambda i: [f"/experiments/{i.experiment}/ledger/"],
    "review:lineage": lambda i: [f"/experiments/{i.experiment}/lineage/"],
    "review:run_start": lambda i: [f"/experiments/{i.experiment}/runs/start/"],
    "review:run_action": lambda i: [f"/runs/{i.run}/pause/"],
    "review:candidate": lambda i: [f"/candidates/{i.seed}/", f"/candidates/{i.flagged}/"],
    "review:candidate_diff": lambda i: [f"/candidates/{i.flagged}/diff/", f"/candidates/{i.flagged}/diff/?partial=1"],
    "review:diff_file": lambda i: [f"/candidates/{i.flagged}/diff/file/?path=notes/a.md"],
    "review:candidate_raw": lambda i: [f"/candidates/{i.flagged}/raw/notes/a.md"],
    "review:diff_viewed": lambda i: ["/diff/viewed/"],
    "review:record": lambda i: [f"/records/{i.record}/"],
    "review:matrix": lambda i: [
        f"/experiments/{i.experiment}/matrix/",
        f"/experiments/{i.experiment}/matrix/?split=sealed",
    ],
    "review:trial": lambda i: [f"/trials/{i.sealed_trial}/", f"/trials/{i.train_trial}/", f"/trials/{i.gate_trial}/"],
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
    """A sealed trial moved to train is shown to a viewer, canary and all: the
    check above sees the data when it is there."""
    Trial.objects.filter(pk=ids.sealed_trial).update(split=SplitName.TRAIN)
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
