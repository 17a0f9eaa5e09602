"""Who may see and do what: the rules the review screens and the API share.

Roles are Django groups made of model permissions; ``roles_ensure`` keeps
them in step after every migrate. Per-task sealed data (trials, scores per
task, trajectories of sealed trials) needs ``view_sealed_details``; without
it a user sees sealed aggregates only (rates, contributions, counts).

The sealed rule (docs/security.md): a task in the sealed split of ANY
experiment is sealed wherever it appears. Experiments may share a benchmark
with other split seeds, so one experiment's sealed task can be another's
train or gate task; its instruction, trials and trajectories there are
withheld too, or the pages of the second experiment would show the first's
sealed tasks. Every screen, export and API response decides with the
functions below.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBase

from evolution.models import Experiment, SplitMembership, SplitName, Task

VIEW = "evolution.view_experiment"
SEALED = "evolution.view_sealed_details"
REVIEW = "evolution.review_leakage"
OPERATE = "evolution.operate_runs"
ANNOTATE = "evolution.annotate_trials"
# The admin's run list, where operators pause, resume and cancel runs (staff users only).
VIEW_RUNS = "evolution.view_run"

# Granted to existing groups by review/migrations/0003_operators_view_runs.py as well.
ROLES: dict[str, tuple[str, ...]] = {
    "viewer": (VIEW,),
    "annotator": (VIEW, ANNOTATE),
    "reviewer": (VIEW, REVIEW),
    "operator": (VIEW, OPERATE, VIEW_RUNS),
    "admin": (VIEW, ANNOTATE, REVIEW, OPERATE, SEALED, VIEW_RUNS),
}


def roles_ensure(**_: Any) -> None:
    """Create the role groups and give each exactly its permissions (idempotent)."""
    from django.contrib.auth.models import Group, Permission

    for name, perms in ROLES.items():
        group, _created = Group.objects.get_or_create(name=name)
        wanted = []
        for perm in perms:
            app_label, codename = perm.split(".")
            found = Permission.objects.filter(content_type__app_label=app_label, codename=codename).first()
            if found is not None:  # absent only mid-migration, before post_migrate created it
                wanted.append(found)
        group.permissions.set(wanted)


def can_see_sealed(user: Any) -> bool:
    return bool(user.is_authenticated and user.has_perm(SEALED))


def sealed_task_ids() -> QuerySet[Any]:
    """The ids of tasks sealed in any experiment (a subquery: ``task_id__in=``)."""
    return SplitMembership.objects.filter(split=SplitName.SEALED).values("task_id")


def hide_sealed(queryset: QuerySet[Any], user: Any, *, split_field: str = "split") -> QuerySet[Any]:
    """``queryset`` without sealed per-task rows unless ``user`` may see them:
    rows of the sealed split, and rows of any split whose task is sealed in
    some experiment. ``split_field`` names the row's split (``trial__split``);
    its task is the field beside it (``trial__task``).

    Use on every query that returns per-task rows (trials, trajectories,
    per-task scores): lists, filters, counts shown per task and detail pages.
    """
    if can_see_sealed(user):
        return queryset
    task_field = split_field.removesuffix("split") + "task"
    return queryset.exclude(**{split_field: SplitName.SEALED}).exclude(**{f"{task_field}__in": sealed_task_ids()})


def hide_sealed_tasks(tasks: QuerySet[Task], user: Any) -> QuerySet[Task]:
    """``tasks`` without those sealed in any experiment, unless ``user`` may see them."""
    if can_see_sealed(user):
        return tasks
    return tasks.exclude(pk__in=sealed_task_ids())


def sealed_task_names(experiment: Experiment | int) -> frozenset[str]:
    """External ids of the tasks an experiment may show (its benchmark's and
    its held-out benchmarks') that are sealed in some experiment: what a
    certified record's per-task rows, which name tasks by external id, must
    not show without the permission."""
    experiment_id = experiment if isinstance(experiment, int) else experiment.pk
    benchmarks = Experiment.objects.filter(pk=experiment_id).values("benchmark_id")
    heldout = Experiment.heldout_benchmarks.through.objects.filter(experiment_id=experiment_id).values("benchmark_id")
    names = Task.objects.filter(pk__in=sealed_task_ids()).filter(
        models.Q(benchmark_id__in=benchmarks) | models.Q(benchmark_id__in=heldout)
    )
    return frozenset(names.values_list("external_id", flat=True))


def record_payload_visible(
    payload: Any, *, sealed: bool, sealed_tasks: frozenset[str] | None = None
) -> tuple[dict[str, Any], int]:
    """A certified record's payload as a user sees it: sealed per-task rows removed unless ``sealed`` (the user may
    see them): rows of the sealed split, and rows of tasks in ``sealed_tasks``, the record's tasks sealed in some
    experiment (``sealed_task_names``). Returns it with the number of rows removed. The screens and the API both
    show a record so."""
    if sealed:
        return payload, 0
    if not isinstance(payload, dict):  # unreadable: it may hold sealed rows
        return {}, 0
    trials = payload.get("trials") or []
    hidden = sealed_tasks or frozenset()
    kept = [
        row
        for row in trials
        if isinstance(row, dict)
        and row.get("split") != SplitName.SEALED
        and isinstance(row.get("task"), str)
        and row["task"] not in hidden
    ]
    shown = dict(payload)
    shown["trials"] = kept
    return shown, len(trials) - len(kept)


# Any view function; the decorators below keep its own signature.
View = TypeVar("View", bound=Callable[..., HttpResponseBase])


def permission_required(perm: str | None = None) -> Callable[[View], View]:
    """Login required (redirect to the login page), then ``perm`` (403).

    Every screen needs at least the viewer permission; pass a stronger one
    for actions.
    """

    def decorator(view: View) -> View:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if not request.user.has_perm(VIEW) or (perm is not None and not request.user.has_perm(perm)):
                raise PermissionDenied(f"you need the {perm or VIEW} permission for this")
            return view(request, *args, **kwargs)

        # Same arguments and response as ``view`` (wraps copies its name and doc).
        return cast(View, login_required(wrapped))

    return decorator
