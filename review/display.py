"""What some views attach to model instances for their templates, spelled
out for the type checker.

A few screens annotate the rows they load with display attributes (a
flag's anchor, whether its task may be shown, a gate decision in words)
instead of copying every field into a dataclass. These classes exist only
when type checking (they are never models): a view casts its list once,
where it sets the attributes, and mypy then checks every use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evolution.models import LeakageFlag

    class ShownFlag(LeakageFlag):
        anchor: str
        task_split: str | None
        task_sealed: bool
        task_visible: bool
        shown_matched: str
        line_number: int | None
        evidence_text: str
        evidence_extra: list[tuple[str, str]]
        task_label: str
        instruction_excerpt: str
