"""What a reader may see of the task behind a leakage flag.

A flag may point at a task (its ``task``, the critic's evidence, which names
the task and quotes its text, and the matched text, a piece of the
candidate's line that the critic found in the task). The rule of the product
(``evolution.access``): only per-task SEALED data needs ``view_sealed_details``,
and a task sealed in any experiment is sealed wherever it appears; train,
gate and held-out tasks are visible to every viewer. A task in no split of
the experiment is treated as sealed: nothing says it may be shown.

Without the permission, a flag about a sealed task shows its rule, file and
line only: no task, no evidence, and no matched text (``matched: null`` in
the API, no marked text on the screens), since which words of a line matched
a sealed task tells what that task says. The candidate page, its diff, the
review queue and the review item page decide with these functions, as the
API does.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, QuerySet, Subquery

from evolution import access
from evolution.models import LeakageFlag, SplitMembership, SplitName

# Splits whose per-task data every viewer may see.
OPEN_SPLITS = frozenset(SplitName.values) - {SplitName.SEALED}


def task_visible(user: Any, split: str | None, *, sealed_anywhere: bool = False) -> bool:
    """Whether ``user`` may see per-task text of a task in ``split`` (None:
    the task is in no split of the experiment); ``sealed_anywhere``: the task
    is in the sealed split of some experiment."""
    return (split in OPEN_SPLITS and not sealed_anywhere) or access.can_see_sealed(user)


def with_task_access(flags: QuerySet[LeakageFlag]) -> QuerySet[LeakageFlag]:
    """``flags`` annotated with what ``flag_task_visible`` reads: ``task_split``
    (the task's split in the flag's experiment) and ``task_sealed`` (sealed in
    some experiment)."""
    split = SplitMembership.objects.filter(
        experiment_id=OuterRef("candidate__experiment_id"), task_id=OuterRef("task_id")
    ).values("split")[:1]
    sealed = SplitMembership.objects.filter(task_id=OuterRef("task_id"), split=SplitName.SEALED)
    return flags.annotate(task_split=Subquery(split), task_sealed=Exists(sealed))


def flag_task_visible(flag: LeakageFlag, user: Any) -> bool:
    """Whether ``user`` may see the task a flag came from, the critic's
    evidence about it and the text it matched. ``flag`` comes from
    ``with_task_access``. A flag that names no task hides nothing."""
    evidence = flag.evidence if isinstance(flag.evidence, dict) else {}
    if flag.task_id is None and not evidence.get("task"):
        return True
    return task_visible(user, getattr(flag, "task_split", None), sealed_anywhere=getattr(flag, "task_sealed", True))


def flag_matched(flag: LeakageFlag, user: Any) -> str | None:
    """The text the flag matched, or None when its task may not be seen."""
    return flag.matched if flag_task_visible(flag, user) else None
