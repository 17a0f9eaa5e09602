"""What the review item page (the queue's screen for one flagged candidate) shows of its leakage flags. Reads
only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.utils.text import Truncator

from evolution.flags import flag_matched, flag_task_visible, with_task_access
from evolution.models import Candidate, LeakageFlag, Task

# The task's instruction is shown cut at this many characters beside a flag.
INSTRUCTION_EXCERPT = 280


@dataclass(frozen=True)
class EvidenceFlag:
    """A leakage flag as the review item page shows it: the critic's evidence, the matched text and the task only
    where the reader may see the task (``evolution.flags``); the evidence text names the task ("literal from the
    instruction of evolve task X"), so it is hidden with the task."""

    pk: int
    rule: str
    path: str
    line: str
    edit_id: int | None
    line_number: int | None
    task: Task | None
    task_split: str | None
    task_visible: bool
    shown_matched: str  # "" when the task may not be seen
    evidence_text: str
    evidence_extra: list[tuple[str, str]]  # the evidence's other keys, each value cut at 200 characters
    task_label: str  # the task the evidence names, when the flag has no task row
    instruction_excerpt: str

    @classmethod
    def of(cls, flag: LeakageFlag, user: Any) -> EvidenceFlag:
        """``flag`` comes from ``with_task_access``, with its task loaded."""
        evidence = flag.evidence if isinstance(flag.evidence, dict) else {}
        visible = flag_task_visible(flag, user)
        return cls(
            pk=flag.pk,
            rule=flag.rule,
            path=flag.path,
            line=flag.line,
            edit_id=flag.edit_id,
            line_number=evidence.get("line_number") if isinstance(evidence.get("line_number"), int) else None,
            task=flag.task,
            task_split=getattr(flag, "task_split", None),
            task_visible=visible,
            shown_matched=flag_matched(flag, user) or "",
            evidence_text=str(evidence.get("evidence", "")) if visible else "",
            evidence_extra=[
                (key, str(value)[:200])
                for key, value in sorted(evidence.items())
                if key not in {"line_number", "evidence", "task"}
            ]
            if visible
            else [],
            task_label=evidence.get("task", "") if visible else "",
            instruction_excerpt=Truncator(flag.task.instruction).chars(INSTRUCTION_EXCERPT)
            if visible and flag.task
            else "",
        )


def evidence_flags(*, candidate: Candidate, user: Any) -> list[EvidenceFlag]:
    """The candidate's leakage flags, by path, as ``user`` may see them."""
    flags = with_task_access(LeakageFlag.objects.filter(candidate=candidate)).select_related("task")
    return [EvidenceFlag.of(flag, user) for flag in flags.order_by("path", "pk")]
