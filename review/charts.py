"""Server-rendered SVG charts of the experiment dashboard.

Pure functions, no ORM: the view gathers plain numbers, these functions lay
them out and return SVG built with ``format_html`` only (every label, id and
link is escaped). Charts must be readable without hovering: axes carry
ticks and titles, every series has a legend entry and its last value
written next to it; ``<title>`` tooltips only add detail. The CSP forbids
``style=`` attributes, so colours are presentation attributes (``fill=``,
``stroke=``) plus CSS classes for the screen's stylesheet.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from django.utils.safestring import SafeString

from review.hidden import reveal_text
from review.lineage import Layout

# One colour per split, shared with the dashboard's tables (dashboard.css).
SPLIT_COLOURS: dict[str, str] = {
    "train": "#0969da",
    "gate": "#8250df",
    "sealed": "#bf8700",
    "heldout": "#cf222e",
}
SPLIT_TITLES: dict[str, str] = {
    "train": "train (evolve)",
    "gate": "gate (evolve)",
    "sealed": "sealed (transfer)",
    "heldout": "held-out (transfer)",
}
BEST_COLOUR = "#1d2330"
BAND_COLOUR = "#8c959f"

# Candidate categories (review.lineage.category) -> colour; as static/review/app.css --st-*.
CATEGORY_COLOURS: dict[str, str] = {
    "seed": "#6639ba",
    "accepted": "#1a7f37",
    "rejected_gate": "#cf222e",
    "flagged": "#bf8700",
    "rejected_review": "#a40e26",
    "rejected_critic": "#a40e26",
    "rejected_surface": "#57606a",
    "evaluating": "#0969da",
    "other": "#8c959f",
}

FONT = "system-ui, -apple-system, Segoe UI, sans-serif"


# --- Scales and ticks -----------------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Linear map from the domain [d0, d1] to the range [r0, r1]."""

    d0: float
    d1: float
    r0: float
    r1: float

    def __call__(self, value: float) -> float:
        if self.d1 == self.d0:
            return (self.r0 + self.r1) / 2
        return self.r0 + (value - self.d0) * (self.r1 - self.r0) / (self.d1 - self.d0)


def format_html(format_string: str, *args: Any) -> SafeString:
    """``django.utils.html.format_html`` with positional arguments: each one
    escaped unless it is already safe HTML, the same output. Without
    Django's lazy-string wrappers around each escape, which a chart of
    hundreds of points calls thousands of times."""
    return SafeString(
        format_string.format(*(a.__html__() if hasattr(a, "__html__") else html.escape(str(a)) for a in args))
    )


def nice_step(span: float, count: int) -> float:
    """A step of 1, 2, 2.5 or 5 times a power of ten giving about ``count`` intervals over ``span``."""
    if span <= 0 or count < 1:
        return 1.0
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if raw <= factor * power + 1e-12:
            return factor * power
    return 10 * power


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (the first <= lo, the last >= hi)."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, count)
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    value = start
    while value < hi - 1e-9 * step:
        ticks.append(round(value, 10))
        value += step
    ticks.append(round(value, 10))
    return ticks


def tick_label(value: float, step: float | None = None) -> str:
    """A short label: 12k for 12000, 1.5M; with ``step``, as many decimals as
    the step needs, so every tick of an axis has the same (0.4, 0.6, 1.0)."""
    magnitude = abs(value)
    if magnitude >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if magnitude >= 1_000:
        return f"{value / 1_000:g}k"
    if step is not None and 0 < step < 1:
        decimals = max(1, math.ceil(-math.log10(step) - 1e-9))
        while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
            decimals += 1
        return f"{value:.{decimals}f}"
    return f"{round(value, 6):g}"


def spread_labels(positions: Sequence[float], *, gap: float, lo: float, hi: float) -> list[float]:
    """Move label positions apart so no two are closer than ``gap``, keeping
    their order and staying within [lo, hi] where the space allows it."""
    if not positions:
        return []
    order = sorted(range(len(positions)), key=lambda i: positions[i])
    placed = [positions[i] for i in order]
    for n in range(1, len(placed)):
        placed[n] = max(placed[n], placed[n - 1] + gap)
    overflow = placed[-1] - hi
    if overflow > 0:
        placed[-1] -= overflow
        for n in range(len(placed) - 2, -1, -1):
            placed[n] = min(placed[n], placed[n + 1] - gap)
    shift = lo - placed[0]
    if shift > 0:
        placed = [p + shift for p in placed]
    result = [0.0] * len(positions)
    for rank, index in enumerate(order):
        result[index] = placed[rank]
    return result


def _n(value: float) -> str:
    """A coordinate for an SVG attribute."""
    return f"{value:.1f}"


def _y_grid(x: Scale, y: Scale, ticks: Sequence[tuple[float, str]]) -> list[SafeString]:
    """Per y tick (value, label): a light grid line across the plot box the
    scales' ranges span, and the label left of it."""
    return [
        format_html(
            '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}" stroke="#eaeef2"/>'
            '<text x="{}" y="{}" text-anchor="end" font-size="11" fill="#5b6475">{}</text>',
            x.r0,
            _n(x.r1),
            _n(y(tick)),
            _n(y(tick)),
            x.r0 - 6,
            _n(y(tick) + 4),
            label,
        )
        for tick, label in ticks
    ]


def _axes(x: Scale, y: Scale, *, height: float, x_title: str, y_title: str) -> SafeString:
    """The axis lines along the bottom and left of the plot box that the
    scales' ranges span (y's range runs bottom to top), with their titles:
    the x title at the foot of a chart ``height`` high, the y title turned
    along its left edge."""
    x0, x1, y1, y0 = x.r0, x.r1, y.r0, y.r1
    middle_y = _n((y0 + y1) / 2)
    return format_html(
        '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#8c959f"/>'
        '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#8c959f"/>'
        '<text x="{}" y="{}" text-anchor="middle" font-size="12" fill="#1d2330">{}</text>'
        '<text x="12" y="{}" text-anchor="middle" font-size="12" fill="#1d2330" '
        'transform="rotate(-90 12 {})">{}</text>',
        x0,
        _n(x1),
        y1,
        y1,
        x0,
        x0,
        y0,
        y1,
        _n((x0 + x1) / 2),
        height - 6,
        x_title,
        middle_y,
        middle_y,
        y_title,
    )


# --- Score over rounds --------------------------------------------------------------


@dataclass(frozen=True)
class RoundScores:
    """Scores after one round: per split (pass@1 of the round's current
    harness), the best evolve score S_best, and the candidates accepted in it."""

    round: int
    splits: dict[str, float]
    best: float | None = None
    accepted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Segment:
    points: tuple[tuple[float, float], ...]
    measured_between: bool  # False: rounds in between were not measured (dashed)


def series_segments(points: Sequence[tuple[int, float]]) -> list[Segment]:
    """Split a series at gaps: consecutive rounds are joined by a solid line,
    a jump over unmeasured rounds by a dashed one."""
    ordered = sorted(points)
    segments: list[Segment] = []
    for (r0, v0), (r1, v1) in zip(ordered, ordered[1:], strict=False):
        consecutive = r1 - r0 == 1
        if segments and segments[-1].measured_between == consecutive and segments[-1].points[-1] == (r0, v0):
            segments[-1] = Segment((*segments[-1].points, (r1, v1)), consecutive)
        else:
            segments.append(Segment(((r0, v0), (r1, v1)), consecutive))
    return segments


def score_series(rounds: Sequence[RoundScores]) -> dict[str, list[tuple[int, float]]]:
    """Per split, the (round, score) points in round order (splits in a fixed order)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for split in SPLIT_COLOURS:
        points = [(r.round, r.splits[split]) for r in sorted(rounds, key=lambda r: r.round) if split in r.splits]
        if points:
            series[split] = points
    return series


def score_chart(
    rounds: Sequence[RoundScores],
    *,
    delta: float | None,
    total_rounds: int | None = None,
    width: int = 760,
    height: int = 300,
) -> SafeString:
    """Train, gate, sealed and held-out pass@1 per round, S_best as a dashed
    step line with the noise band (S_best +/- delta) around it, accepted
    candidates marked on it. Empty string when there is nothing to draw."""
    series = score_series(rounds)
    best = [(r.round, r.best) for r in sorted(rounds, key=lambda r: r.round) if r.best is not None]
    if not series and not best:
        return SafeString("")
    band = max(float(delta or 0.0), 0.0)
    legend_entries: list[tuple[str, str, str]] = [(SPLIT_TITLES[s], SPLIT_COLOURS[s], "line") for s in series]
    if best:
        legend_entries.append(("S_best (evolve)", BEST_COLOUR, "dash"))
        if band > 0:
            legend_entries.append((f"noise band ±δ, δ={band:.3f}", BAND_COLOUR, "band"))
        else:
            legend_entries.append(("δ = 0: no noise band", BAND_COLOUR, "none"))
    if any(r.accepted for r in rounds):
        legend_entries.append(("accepted", "#1a7f37", "diamond"))
    left, right, bottom = 48, 150, 40
    legend, lines = _legend(legend_entries, x0=left, y0=14, x1=width - 10)
    top = 20 + 16 * lines
    height += 16 * (lines - 1)
    last_round = max([r.round for r in rounds] + [total_rounds or 0, 1])
    x = Scale(0, last_round, left, width - right)
    y = Scale(0.0, 1.0, height - bottom, top)
    parts: list[SafeString] = []

    # Grid and axes.
    parts.extend(_y_grid(x, y, [(tick, f"{tick:.1f}") for tick in nice_ticks(0.0, 1.0, 5)]))
    step = 1 if last_round <= 20 else int(nice_step(last_round, 10))
    for tick in range(0, last_round + 1, step):
        parts.append(
            format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#8c959f"/>'
                '<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="#5b6475">{}</text>',
                _n(x(tick)),
                _n(x(tick)),
                height - bottom,
                height - bottom + 4,
                _n(x(tick)),
                height - bottom + 16,
                tick,
            )
        )
    parts.append(_axes(x, y, height=height, x_title="round (0 = start)", y_title="pass@1"))

    # Noise band around S_best, then the S_best step line.
    if best:
        upper = [(x(r), y(min(1.0, b + band))) for r, b in best]
        lower = [(x(r), y(max(0.0, b - band))) for r, b in best]
        if band > 0:
            outline = _step_points(upper) + list(reversed(_step_points(lower)))
            parts.append(
                format_html(
                    '<polygon class="noise-band" points="{}" fill="{}" fill-opacity="0.18" stroke="none">'
                    "<title>noise band: S_best ± δ (δ = {})</title></polygon>",
                    " ".join(f"{_n(px)},{_n(py)}" for px, py in outline),
                    BAND_COLOUR,
                    f"{band:.3f}",
                )
            )
        parts.append(
            format_html(
                '<polyline class="series best" points="{}" fill="none" stroke="{}" stroke-width="2" '
                'stroke-dasharray="6 3"><title>S_best: the best evolve score so far</title></polyline>',
                " ".join(f"{_n(px)},{_n(py)}" for px, py in _step_points([(x(r), y(b)) for r, b in best])),
                BEST_COLOUR,
            )
        )

    # Split series: solid between consecutive rounds, dashed across unmeasured ones.
    for split, points in series.items():
        colour = SPLIT_COLOURS[split]
        for segment in series_segments(points):
            parts.append(
                format_html(
                    '<polyline class="series split-{}" points="{}" fill="none" stroke="{}" stroke-width="2" '
                    'stroke-dasharray="{}"/>',
                    split,
                    " ".join(f"{_n(x(r))},{_n(y(v))}" for r, v in segment.points),
                    colour,
                    "none" if segment.measured_between else "2 4",
                )
            )
        for r, v in points:
            parts.append(
                format_html(
                    '<circle cx="{}" cy="{}" r="3.5" fill="{}"><title>{} after round {}: {}</title></circle>',
                    _n(x(r)),
                    _n(y(v)),
                    colour,
                    SPLIT_TITLES[split],
                    r,
                    f"{v:.3f}",
                )
            )

    # Accepted candidates: a diamond on S_best, labelled with the candidates.
    best_at = dict(best)
    for entry in rounds:
        if not entry.accepted:
            continue
        value = best_at.get(entry.round)
        if value is None:
            value = max(entry.splits.values(), default=0.0)
        cx, cy = x(entry.round), y(value)
        names = ", ".join(entry.accepted)
        parts.append(
            format_html(
                '<g class="accepted-mark"><path d="M{} {} l5 5 l-5 5 l-5 -5 z" fill="#1a7f37" stroke="#fff"/>'
                '<text x="{}" y="{}" text-anchor="middle" font-size="10.5" fill="#1a7f37" font-weight="600">{}</text>'
                "<title>accepted in round {}: {}</title></g>",
                _n(cx),
                _n(cy - 5),
                _n(cx),
                _n(cy - 9),
                names,
                entry.round,
                names,
            )
        )

    # The last value of every series, written at the right edge.
    ends: list[tuple[str, str, float, float]] = []
    for split, points in series.items():
        r, v = points[-1]
        ends.append((SPLIT_TITLES[split].split(" ")[0], SPLIT_COLOURS[split], v, y(v)))
    if best:
        ends.append(("S_best", BEST_COLOUR, best[-1][1], y(best[-1][1])))
    placed = spread_labels([e[3] for e in ends], gap=13, lo=top, hi=height - bottom)
    for (name, colour, value, _), label_y in zip(ends, placed, strict=True):
        parts.append(
            format_html(
                '<text class="end-label" x="{}" y="{}" font-size="11.5" fill="{}" font-weight="600">{} {}</text>',
                _n(width - right + 16),
                _n(label_y + 4),
                colour,
                name,
                f"{value:.3f}",
            )
        )

    parts.append(legend)

    return format_html(
        '<svg class="chart score-chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="pass@1 per split after each round" font-family="{}">{}</svg>',
        width,
        height,
        width,
        height,
        FONT,
        _join(parts),
    )


RUN_COLOURS = ("#0969da", "#1a7f37", "#bf8700", "#8250df", "#cf222e", "#1b7c83", "#57606a", "#a40e26")


@dataclass(frozen=True)
class RunCurve:
    """One run's S_best after each round (round 0: its start), for the experiment's overlay."""

    name: str  # e.g. "run 2 (#7)"
    best_by_round: tuple[float, ...]


def runs_chart(curves: Sequence[RunCurve], *, width: int = 760, height: int = 240) -> SafeString:
    """S_best over rounds of every run, overlaid on one score axis, each from its own start (its round 0):
    where each run began and how far it climbed. Empty when no run has a gated round."""
    drawn = [curve for curve in curves if len(curve.best_by_round) >= 2]
    if not drawn:
        return SafeString("")
    values = [v for curve in drawn for v in curve.best_by_round]
    ticks = nice_ticks(min(values), max(values), 4)
    rounds = max(len(curve.best_by_round) for curve in drawn) - 1
    legend, lines = _legend(
        [(curve.name, RUN_COLOURS[n % len(RUN_COLOURS)], "line") for n, curve in enumerate(drawn)],
        x0=64,
        y0=14,
        x1=width - 16,
    )
    top = 14 + 16 * lines
    x = Scale(0, max(rounds, 1), 64, width - 16)
    y = Scale(ticks[0], ticks[-1], height - 36, top)
    grid = _y_grid(x, y, [(t, tick_label(t, _step(ticks))) for t in ticks])
    x_ticks = [
        format_html(
            '<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="#5b6475">{}</text>',
            _n(x(r)),
            _n(y.r0 + 14),
            r,
        )
        for r in range(0, rounds + 1, max(1, math.ceil(rounds / 10)))
    ]
    paths = [
        format_html(
            '<polyline class="run-curve" data-run="{}" fill="none" stroke="{}" stroke-width="2" points="{}"/>',
            curve.name,
            RUN_COLOURS[n % len(RUN_COLOURS)],
            " ".join(f"{_n(x(r))},{_n(y(v))}" for r, v in enumerate(curve.best_by_round)),
        )
        for n, curve in enumerate(drawn)
    ]
    return format_html(
        '<svg class="chart runs-chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="S_best over rounds of each run" font-family="{}">{}{}{}{}{}</svg>',
        width,
        height,
        width,
        height,
        FONT,
        _join(grid),
        _axes(x, y, height=height, x_title="round of its run", y_title="S_best"),
        _join(x_ticks),
        _join(paths),
        legend,
    )


def _step_points(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points of a step line: the value holds until the next round."""
    result: list[tuple[float, float]] = []
    for n, (px, py) in enumerate(points):
        if n:
            result.append((px, result[-1][1]))
        result.append((px, py))
    return result


def _legend(entries: Sequence[tuple[str, str, str]], *, x0: float, y0: float, x1: float) -> tuple[SafeString, int]:
    """Legend entries left to right, wrapping before ``x1``; returns the SVG and the number of lines."""
    parts: list[SafeString] = []
    cursor, line_y, lines = x0, y0, 1
    for text, colour, kind in entries:
        needed = 20 + 6.4 * len(text)
        if cursor > x0 and cursor + needed > x1:
            cursor, line_y, lines = x0, line_y + 16, lines + 1
        if kind == "line":
            mark = format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="2.5"/>',
                _n(cursor),
                _n(cursor + 16),
                line_y,
                line_y,
                colour,
            )
        elif kind == "dash":
            mark = format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="2" stroke-dasharray="5 2"/>',
                _n(cursor),
                _n(cursor + 16),
                line_y,
                line_y,
                colour,
            )
        elif kind == "band":
            mark = format_html(
                '<rect x="{}" y="{}" width="16" height="10" fill="{}" fill-opacity="0.3"/>',
                _n(cursor),
                line_y - 5,
                colour,
            )
        elif kind == "diamond":
            mark = format_html('<path d="M{} {} l5 5 l-5 5 l-5 -5 z" fill="{}"/>', _n(cursor + 8), line_y - 5, colour)
        elif kind == "dot":
            mark = format_html('<circle cx="{}" cy="{}" r="4.5" fill="{}"/>', _n(cursor + 8), line_y, colour)
        else:
            mark = SafeString("")
        parts.append(
            format_html(
                '{}<text x="{}" y="{}" font-size="11.5" fill="#1d2330">{}</text>',
                mark,
                _n(cursor + 20),
                line_y + 4,
                text,
            )
        )
        cursor += needed + 14
    return format_html('<g class="legend">{}</g>', _join(parts)), lines


def _join(parts: Iterable[SafeString]) -> SafeString:
    return SafeString("".join(parts))


# --- Cost versus score --------------------------------------------------------------


@dataclass(frozen=True)
class CostPoint:
    """One evaluated candidate: mean policy tokens per trial and evolve score S."""

    candidate_id: int
    cost: float
    score: float
    category: str
    name: str  # shown next to labelled points, e.g. "#6" or "start #6"
    href: str = ""
    label: bool = False  # write the name next to the point
    detail: str = ""  # tooltip text


class Plotted(Protocol):
    """What the Pareto front and the sample look at: a ``CostPoint``, or a
    lighter tuple with the same names when thousands are measured."""

    @property
    def candidate_id(self) -> int: ...
    @property
    def cost(self) -> float: ...
    @property
    def score(self) -> float: ...
    @property
    def category(self) -> str: ...
    @property
    def label(self) -> bool: ...


PointT = TypeVar("PointT", bound=Plotted)


def pareto_front(points: Sequence[PointT]) -> list[PointT]:
    """The points no other point beats on both axes (lower or equal cost and
    higher or equal score, one of them strictly), by increasing cost."""
    front: list[PointT] = []
    for point in sorted(points, key=lambda p: (p.cost, -p.score, p.candidate_id)):
        if not front or point.score > front[-1].score:
            front.append(point)
    return front


@dataclass(frozen=True)
class Axis:
    lo: float
    hi: float
    ticks: list[float] = field(default_factory=list)


def data_axis(values: Sequence[float], *, clamp: tuple[float, float] | None = None, count: int = 5) -> Axis:
    """Nice ticks around the values (a little padding), inside ``clamp``."""
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.08 or (abs(hi) * 0.1 or 0.1)
    lo, hi = lo - pad, hi + pad
    if clamp is not None:
        lo, hi = max(lo, clamp[0]), min(hi, clamp[1])
    ticks = nice_ticks(lo, hi, count)
    if clamp is not None:
        ticks = [t for t in ticks if clamp[0] - 1e-9 <= t <= clamp[1] + 1e-9]
    return Axis(min(ticks[0], lo), max(ticks[-1], hi), ticks)


def _step(ticks: Sequence[float]) -> float | None:
    return ticks[1] - ticks[0] if len(ticks) > 1 else None


def cost_chart(
    points: Sequence[CostPoint], *, category_titles: dict[str, str], width: int = 760, height: int = 320
) -> SafeString:
    """Each candidate at (tokens per trial, S), coloured by state, labelled
    where asked, with the Pareto front (cheapest for its score) as a step
    line. Empty string when there is nothing to draw."""
    if not points:
        return SafeString("")
    front = pareto_front(points)
    present = [c for c in CATEGORY_COLOURS if any(p.category == c for p in points)]
    legend_entries = [(category_titles.get(c, c), CATEGORY_COLOURS[c], "dot") for c in present]
    if len(front) > 1:
        legend_entries.append(("Pareto front", "#1d2330", "dash"))
    left, right, bottom = 56, 24, 42
    legend, lines = _legend(legend_entries, x0=left, y0=14, x1=width - 10)
    top = 24 + 16 * lines
    height += 16 * (lines - 1)
    x_axis = data_axis([p.cost for p in points], clamp=(0.0, math.inf))
    y_axis = data_axis([p.score for p in points], clamp=(0.0, 1.0))
    x = Scale(x_axis.lo, x_axis.hi, left, width - right)
    y = Scale(y_axis.lo, y_axis.hi, height - bottom, top)
    parts: list[SafeString] = []
    y_step = _step(y_axis.ticks)
    parts.extend(_y_grid(x, y, [(tick, tick_label(tick, y_step)) for tick in y_axis.ticks]))
    for tick in x_axis.ticks:
        parts.append(
            format_html(
                '<line x1="{}" x2="{}" y1="{}" y2="{}" stroke="#eaeef2"/>'
                '<text x="{}" y="{}" text-anchor="middle" font-size="11" fill="#5b6475">{}</text>',
                _n(x(tick)),
                _n(x(tick)),
                top,
                height - bottom,
                _n(x(tick)),
                height - bottom + 15,
                tick_label(tick, _step(x_axis.ticks)),
            )
        )
    parts.append(
        _axes(
            x,
            y,
            height=height,
            x_title="cost C: mean policy tokens per trial (evolve splits)",
            y_title="evolve score S",
        )
    )
    if len(front) > 1:
        line = _step_points([(x(p.cost), y(p.score)) for p in front])
        parts.append(
            format_html(
                '<polyline class="pareto" points="{}" fill="none" stroke="#1d2330" stroke-width="1.5" '
                'stroke-dasharray="4 3"><title>Pareto front: no candidate is both cheaper and better</title>'
                "</polyline>",
                " ".join(f"{_n(px)},{_n(py)}" for px, py in line),
            )
        )
    on_front = {p.candidate_id for p in front}
    labelled = [p for p in points if p.label]
    label_y = spread_labels([y(p.score) - 8 for p in labelled], gap=12, lo=top, hi=height - bottom)
    for point in sorted(points, key=lambda p: (p.category == "accepted", p.candidate_id)):
        colour = CATEGORY_COLOURS.get(point.category, CATEGORY_COLOURS["other"])
        dot = format_html(
            '<circle class="point cat-{}" cx="{}" cy="{}" r="{}" fill="{}" stroke="{}" stroke-width="1.5">'
            "<title>{} · S {} · {} tokens/trial{}</title></circle>",
            point.category,
            _n(x(point.cost)),
            _n(y(point.score)),
            5.5 if point.label else 4.5,
            colour,
            "#1d2330" if point.candidate_id in on_front else "#fff",
            point.name,
            f"{point.score:.3f}",
            f"{point.cost:,.0f}",
            f" · {point.detail}" if point.detail else "",
        )
        if point.href:
            dot = format_html('<a href="{}">{}</a>', point.href, dot)
        parts.append(dot)
    # Every point in a grid of 80 x 14 px cells: a label looks only at the
    # cells where a neighbour would crowd it, not at every point of the chart.
    grid: dict[tuple[int, int], list[tuple[float, float, int]]] = defaultdict(list)
    for index, other in enumerate(points):
        ox, oy = x(other.cost), y(other.score)
        grid[(int(ox // 80), int(oy // 14))].append((ox, oy, index))
    position = {id(p): index for index, p in enumerate(points)}
    for point, ly in zip(labelled, label_y, strict=True):
        px = x(point.cost)
        me = position[id(point)]
        near = (
            near_point
            for cx in (int(px // 80), int(px // 80) + 1)
            for cy in range(int((ly - 14) // 14), int((ly + 14) // 14) + 1)
            for near_point in grid.get((cx, cy), ())
        )
        # Write the label on the left when a neighbour sits where it would go on the right.
        crowded = px > width - right - 80 or any(
            index != me and 0 < ox - px < 80 and abs(oy - ly) < 14 for ox, oy, index in near
        )
        parts.append(
            format_html(
                '<text class="point-label" x="{}" y="{}" text-anchor="{}" font-size="11" font-weight="600" '
                'fill="{}">{} {}</text>',
                _n(px - 7 if crowded else px + 7),
                _n(ly),
                "end" if crowded else "start",
                CATEGORY_COLOURS.get(point.category, CATEGORY_COLOURS["other"]),
                point.name,
                f"{point.score:.3f}",
            )
        )
    parts.append(legend)
    return format_html(
        '<svg class="chart cost-chart" viewBox="0 0 {} {}" width="{}" height="{}" role="group" '
        'aria-label="cost versus evolve score of each evaluated candidate" font-family="{}">{}</svg>',
        width,
        height,
        width,
        height,
        FONT,
        _join(parts),
    )


def _evenly(items: Sequence[Any], count: int) -> list[Any]:
    """``count`` items spread evenly over ``items`` (first and last included)."""
    if count <= 0 or not items:
        return []
    if len(items) <= count:
        return list(items)
    if count == 1:
        return [items[0]]
    step = (len(items) - 1) / (count - 1)
    return [items[round(n * step)] for n in range(count)]


def thin_cost_points(points: Sequence[PointT], limit: int) -> list[PointT]:
    """At most ``limit`` points to draw (beyond the Pareto front and the seed,
    which are always kept): labelled points (accepted ones) evenly sampled
    up to half of the rest, the others evenly sampled in candidate order, so a
    chart of thousands of candidates stays light and keeps its shape. The
    caller says on the page when points were left out."""
    if len(points) <= limit:
        return list(points)
    keep = {p.candidate_id for p in pareto_front(points)} | {p.candidate_id for p in points if p.category == "seed"}
    room = max(limit - len(keep), 0)
    labelled = [p for p in points if p.label and p.candidate_id not in keep]
    keep |= {p.candidate_id for p in _evenly(labelled, room // 2)}
    others = [p for p in points if p.candidate_id not in keep]
    keep |= {p.candidate_id for p in _evenly(others, max(limit - len(keep), 0))}
    return [p for p in points if p.candidate_id in keep]


def thin_rounds(rounds: Sequence[RoundScores], limit: int) -> list[RoundScores]:
    """At most ``limit`` rounds to plot, evenly sampled (the first and the
    last kept), so the lines keep their shape over thousands of rounds."""
    return _evenly(rounds, limit)


# --- Lineage tree ---------------------------------------------------------------------

LIGHT_CATEGORIES = frozenset({"flagged", "other"})  # dark text on these node colours


def lineage_svg(
    tree: Layout, *, reasons: dict[int, str], href: Callable[[int], str], highlight: int | None
) -> tuple[SafeString, SafeString]:
    """The nodes and the edges of a ``review.lineage.layout`` as SVG (the template wraps them in ``<svg>``).

    Written here, not by a template loop: hundreds of nodes with a dozen attributes each cost more in a template
    loop than the rest of the page; nor through ``format_html``, which took 2.3 times as long (33 against 15 ms
    for 400 nodes). Labels, states, reasons and links are escaped; the rest are numbers formatted here and this
    module's colours. ``reasons``: candidate id -> why it is in its state; ``href``: candidate id -> its page."""
    escape = html.escape
    node_width, node_height = f"{tree.node_width:.0f}", f"{tree.node_height:.0f}"
    parts = []
    for node in tree.nodes:
        score = f"{node.score:.3f}" if node.score is not None else ""
        # SVG text takes no marker spans: a hidden character shows as its label (<U+202E>).
        reason = reveal_text(reasons.get(node.id, ""))
        full_label = reveal_text(node.label)
        label = reveal_text(node.label if len(node.label) <= 12 else node.label[:11] + "…")
        title = (
            f"#{node.id} {full_label} · {node.state} · round {node.round}"
            + (f" · S {score}" if score else "")
            + (f" · {reason}" if reason else "")
        )
        colour = CATEGORY_COLOURS.get(node.category, CATEGORY_COLOURS["other"])
        ink = "#1d2330" if node.category in LIGHT_CATEGORIES else "#fff"
        stroke = "#1d2330" if node.id == highlight else "none"
        text_y = f"{node.y + tree.node_height / 2 + 4:.1f}"
        parts.append(
            f'<a href="{escape(href(node.id))}" class="node cat-{escape(node.category)}'
            f'{" main" if node.on_path else ""}" aria-label="candidate {node.id} {escape(full_label)}, '
            f'{escape(node.state)}"><title>{escape(title)}</title>'
            f'<rect x="{node.x:.1f}" y="{node.y:.1f}" width="{node_width}" height="{node_height}" rx="4" '
            f'fill="{colour}" stroke="{stroke}" stroke-width="2"/>'
            f'<text x="{node.x + 6:.1f}" y="{text_y}" font-size="11" fill="{ink}" font-weight="600">#{node.id} '
            f'<tspan font-weight="400">{escape(label)}</tspan></text>'
            + (
                f'<text x="{node.x + tree.node_width - 6:.1f}" y="{text_y}" font-size="10.5" fill="{ink}" '
                f'text-anchor="end">{score}</text>'
                if score
                else ""
            )
            + "</a>"
        )
    edges = "".join(
        (
            f'<path d="{escape(edge.path)}" class="edge derived" stroke="#bf8700" stroke-width="1.2" '
            f'stroke-dasharray="4 3" data-from="{edge.source}" data-to="{edge.target}">'
            f"<title>#{edge.target} derived from #{edge.source} by a reviewer</title></path>"
        )
        if edge.derived
        else (
            f'<path d="{escape(edge.path)}" class="edge{" main" if edge.on_path else ""}" '
            f'stroke="{"#1a7f37" if edge.on_path else "#afb8c1"}" stroke-width="{"2.5" if edge.on_path else "1.2"}"/>'
        )
        for edge in tree.edges
    )
    return SafeString("".join(parts)), SafeString(edges)  # every string from a candidate went through escape
