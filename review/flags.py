"""What a reader may see of the task behind a leakage flag.

A flag may point at a task (its ``task`` and the critic's evidence, which
names the task and quotes its text). The rule of the product
(``review.access``): only per-task SEALED data needs ``view_sealed_details``;
train, gate and held-out tasks are visible to every viewer. A task in no
split of the experiment is treated as sealed: nothing says it may be shown.
The candidate page and the review item page both decide with these functions.
"""

from __future__ import annotations

from typing import Any

from evolution.models import LeakageFlag, SplitName
from review import access

# Splits whose per-task data every viewer may see.
OPEN_SPLITS = frozenset(SplitName.values) - {SplitName.SEALED}


def task_visible(user: Any, split: str | None) -> bool:
    """Whether ``user`` may see per-task text of a task in ``split`` (None:
    the task is in no split of the experiment)."""
    return split in OPEN_SPLITS or access.can_see_sealed(user)


def flag_task_visible(flag: LeakageFlag, user: Any, split: str | None) -> bool:
    """Whether ``user`` may see the task a flag came from and the critic's
    evidence about it; ``split`` is that task's split in the flag's
    experiment. A flag that names no task hides nothing."""
    evidence = flag.evidence if isinstance(flag.evidence, dict) else {}
    if flag.task_id is None and not evidence.get("task"):
        return True
    return task_visible(user, split)
