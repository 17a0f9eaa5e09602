"""The results matrix's display model: cells (one candidate's trials on one task), columns (candidates) and rows
(tasks), and a row's cells as HTML. Pure: no ORM; ``review.views.results`` fills them from ``review.selectors``."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from django.utils.safestring import SafeString

from evolution.loop import measure

CHANGES = {
    "improved": "improved against the parent",
    "regressed": "regressed against the parent",
    "unchanged": "unchanged against the parent",
}


@dataclass
class Cell:
    """One candidate's trials on one task (noise repeats of the seed left out)."""

    candidate_id: int
    task_id: int
    n: int = 0  # finished trials
    passes: int = 0
    errors: int = 0
    pending: int = 0
    first_trial: int | None = None
    first_href: str = ""  # the first trial's page, built in the view
    parent: Cell | None = None
    has_parent: bool = False
    trials: list[dict[str, Any]] = field(default_factory=list)
    dim: bool = False

    @property
    def rate(self) -> float | None:
        """The cell's pass rate: S under pass@1 over its finished trials."""
        return measure.score(measure.Totals(trials=self.n, passed=self.passes), "pass_at_1")

    @property
    def outcome(self) -> str:
        if not self.n:
            return "running" if self.pending else "none"
        if self.errors == self.n:
            return "error"
        if self.passes == self.n:
            return "pass"
        return "some" if self.passes else "fail"

    @property
    def change(self) -> str:
        """improved / regressed / unchanged against the parent's cell of the
        same task; "" when either side has no finished trial."""
        if self.parent is None or self.rate is None or self.parent.rate is None:
            return ""
        if self.rate > self.parent.rate:
            return "improved"
        if self.rate < self.parent.rate:
            return "regressed"
        return "unchanged"

    @property
    def title(self) -> str:
        if not self.n:
            return "trials still running" if self.pending else "not run on this task"
        words = f"{self.passes} of {self.n} trials passed"
        if self.errors:
            words += f", {self.errors} ended in an error"
        if self.pending:
            words += f", {self.pending} still running"
        if self.parent is not None and self.parent.n:
            words += f"; parent: {self.parent.passes} of {self.parent.n}"
        elif self.has_parent:
            words += "; the parent has no trial here"
        return words


@dataclass
class Column:
    pk: int
    label: str
    round: int | None
    state: str
    origin: str
    parent_id: int | None
    score: float | None = None
    shown_passes: int = 0
    shown_n: int = 0


@dataclass
class Row:
    task_id: int
    external_id: str
    split: str
    cells: list[Cell]
    cells_html: SafeString = SafeString("")  # the row's cells, built by cells_html for the shown rows

    @property
    def passed_by(self) -> int:
        return sum(1 for cell in self.cells if cell.passes)

    @property
    def run_by(self) -> int:
        return sum(1 for cell in self.cells if cell.n)


CHANGE_MARKS = {
    "improved": '<span class="chg up" aria-label="improved against the parent">▲</span>',
    "regressed": '<span class="chg down" aria-label="regressed against the parent">▼</span>',
}
_escape = html.escape  # django.utils.html.escape without its lazy-string wrapper


def cells_html(cells: list[Cell]) -> SafeString:
    """A row's cells as HTML. Built here, not by a template loop: a page of
    the matrix has thousands of cells, and resolving a dozen template
    variables in each cost more than the rest of the page; nor through
    ``format_html``, which took 3.6 times as long (458 against 126 ms for
    200 x 30 cells). Numbers, ids and fixed words only; every string is
    escaped all the same."""
    out = []
    for cell in cells:
        change = cell.change
        classes = f"cell o-{cell.outcome}" + (f" chg-{change}" if change else "") + (" dim" if cell.dim else "")
        if cell.first_trial:
            text = f"{cell.passes}/{cell.n}" if cell.n else "…"
            link = f'<a class="cell-link" href="{_escape(cell.first_href)}">{text}</a>'
        else:
            link = '<span class="muted">–</span>'
        trials = ""
        if len(cell.trials) > 1:
            trials = (
                '<span class="trial-links">'
                + "".join(
                    f'<a href="{_escape(t["href"])}" class="o-{_escape(t["outcome"] or "running")}" '
                    f'title="trial index {t["index"]}: {_escape(t["outcome"] or t["state"])}">{t["index"]}</a>'
                    for t in cell.trials
                )
                + "</span>"
            )
        out.append(
            f'<td class="{classes}" data-cell="{cell.candidate_id}:{cell.task_id}" title="{_escape(cell.title)}">'
            f"{link}{CHANGE_MARKS.get(change, '')}{trials}</td>"
        )
    return SafeString("".join(out))  # every string above is escaped, the rest are numbers
