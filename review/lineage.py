"""Layout of the candidate tree (pure: no ORM, no HTML).

Columns are rounds, left to right (the seed is round 0); a candidate whose
parent is in the same round (derived by a reviewer from a flagged one) gets
a column of its own right after that round's. Within a column a node sits
at its parent's height when it can, else just below the node above it, so
a family stays together and a round with many proposals stays compact.
Edges run from the right side of the parent to the left side of the child.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

# Categories shown in the legend, in this order; "other" takes every state not listed.
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("seed", "seed"),
    ("accepted", "accepted by the gate"),
    ("rejected_gate", "rejected by the gate"),
    ("flagged", "flagged, awaiting review"),
    ("rejected_review", "rejected by a reviewer"),
    ("rejected_critic", "rejected by the critic"),
    ("rejected_surface", "out of surface"),
    ("evaluating", "evaluating or awaiting the gate"),
    ("other", "other (frozen, over budget, failed, cancelled)"),
)
CATEGORY_TITLES: dict[str, str] = dict(CATEGORIES)
_IN_PROGRESS = frozenset({"approved", "evaluating", "evaluated", "certified"})


def category(*, state: str, origin: str) -> str:
    """The legend category of a candidate."""
    if origin == "seed":
        return "seed"
    if state in CATEGORY_TITLES and state not in {"seed", "other", "evaluating"}:
        return state
    if state in _IN_PROGRESS:
        return "evaluating"
    return "other"


@dataclass(frozen=True)
class NodeInput:
    id: int
    parent_id: int | None
    state: str
    origin: str = "proposed"
    round: int | None = None
    label: str = ""
    score: float | None = None  # evolve score S, when measured
    run: int = 0  # the run's number within the experiment (1 for the first; 0: no run, the seed)
    derived_from: int | None = None  # the flagged candidate a reviewer derived this one from


@dataclass(frozen=True)
class Node:
    id: int
    parent_id: int | None
    x: float
    y: float
    column: int
    category: str
    state: str
    round: int
    label: str
    score: float | None
    on_path: bool  # an ancestor of (or) the highlighted candidate


@dataclass(frozen=True)
class Edge:
    source: int
    target: int
    path: str  # SVG path data
    on_path: bool
    derived: bool = False  # from a flagged candidate to the one a reviewer derived from it (not a parent)


@dataclass(frozen=True)
class Column:
    x: float
    title: str
    count: int


@dataclass(frozen=True)
class Layout:
    nodes: list[Node]
    edges: list[Edge]
    columns: list[Column]
    width: float
    height: float
    node_width: float
    node_height: float


def layout(
    rows: Iterable[NodeInput],
    *,
    highlight: int | None = None,
    node_width: float = 128,
    node_height: float = 22,
    column_gap: float = 46,
    row_gap: float = 6,
    margin: float = 10,
    header: float = 24,
) -> Layout:
    """Place every candidate. ``highlight`` (e.g. the run's current harness)
    marks it and its ancestors as the main line. Rows whose parent is not
    among them are drawn as roots. Runs in O(n log² n) for a laid-out tree (see ``Lanes``)."""
    by_id = {row.id: row for row in rows}
    children: dict[int | None, list[int]] = {}
    for row in by_id.values():
        children.setdefault(row.parent_id if row.parent_id in by_id else None, []).append(row.id)

    # Column key per node: (run, round, generation within that round), parents first: each run's rounds get
    # their own columns, after the earlier runs' (a later run's round 1 never piles onto an earlier round).
    keys: dict[int, tuple[int, int, int]] = {}
    stack = sorted(children.get(None, []), reverse=True)
    while stack:
        node_id = stack.pop()
        row = by_id[node_id]
        parent = by_id.get(row.parent_id) if row.parent_id is not None else None
        if parent is None:
            keys[node_id] = (row.run, row.round or 0, 0)
        else:
            p_run, p_round, p_gen = keys[parent.id]
            own = (max(row.run, p_run), row.round if row.round is not None else p_round + 1)
            keys[node_id] = (*own, 0) if own > (p_run, p_round) else (p_run, p_round, p_gen + 1)
        stack.extend(sorted(children.get(node_id, []), reverse=True))
    # Nodes in a parent cycle (impossible in the database) are left out rather than looping.

    column_keys = sorted(set(keys.values()))
    column_of = {key: n for n, key in enumerate(column_keys)}
    members: dict[int, list[int]] = {}
    for node_id, key in keys.items():
        members.setdefault(column_of[key], []).append(node_id)

    on_path: set[int] = set()
    cursor = highlight if highlight in by_id else None
    while cursor is not None and cursor not in on_path:
        on_path.add(cursor)
        parent_id = by_id[cursor].parent_id
        cursor = parent_id if parent_id in by_id else None

    pitch = node_height + row_gap
    ys: dict[int | None, float] = {}  # None: a root's parent, never placed
    for column in range(len(column_keys)):
        ordered = sorted(
            members[column],
            key=lambda i: (ys.get(by_id[i].parent_id, -1.0), i),
        )
        floor = header
        for node_id in ordered:
            parent_id = by_id[node_id].parent_id
            wanted = ys.get(parent_id, header) if parent_id is not None else header
            ys[node_id] = max(wanted, floor)
            floor = ys[node_id] + pitch

    def column_x(column: int) -> float:
        return margin + column * (node_width + column_gap)

    nodes = [
        Node(
            id=node_id,
            parent_id=by_id[node_id].parent_id,
            x=column_x(column_of[keys[node_id]]),
            y=ys[node_id],
            column=column_of[keys[node_id]],
            category=category(state=by_id[node_id].state, origin=by_id[node_id].origin),
            state=by_id[node_id].state,
            round=keys[node_id][1],
            label=by_id[node_id].label,
            score=by_id[node_id].score,
            on_path=node_id in on_path,
        )
        for node_id in sorted(keys, key=lambda i: (column_of[keys[i]], ys[i]))
    ]
    placed = {node.id: node for node in nodes}
    # Per column, the rows its nodes take (top, bottom), sorted: an edge that skips columns runs along a lane
    # free in every column it crosses, so it never passes through another node.
    taken: list[list[tuple[float, float]]] = [[] for _ in column_keys]
    for node in nodes:
        taken[node.column].append((node.y, node.y + node_height))
    for spans in taken:
        spans.sort()
    lanes = Lanes(taken, clearance=row_gap / 2)
    edges = []
    lowest_lane = 0.0
    for node in nodes:
        placed_parent = placed.get(node.parent_id) if node.parent_id is not None else None
        if placed_parent is None:
            continue
        x1, y1 = placed_parent.x + node_width, placed_parent.y + node_height / 2
        x2, y2 = node.x, node.y + node_height / 2
        if node.column - placed_parent.column > 1:
            lane = lanes.free_lane(placed_parent.column + 1, node.column - 1, y1, y2)
            lowest_lane = max(lowest_lane, lane)
            # Into the lane within the gap after the parent's column, along it, out of it in the gap before the
            # child's column: the curves stay in the gaps, where no node is.
            a, b = x1 + column_gap, x2 - column_gap
            path = (
                f"M{x1:.1f} {y1:.1f} C{x1 + column_gap / 2:.1f} {y1:.1f} {x1 + column_gap / 2:.1f} {lane:.1f} "
                f"{a:.1f} {lane:.1f} L{b:.1f} {lane:.1f} C{b + column_gap / 2:.1f} {lane:.1f} "
                f"{b + column_gap / 2:.1f} {y2:.1f} {x2:.1f} {y2:.1f}"
            )
        else:
            middle = (x1 + x2) / 2
            path = f"M{x1:.1f} {y1:.1f} C{middle:.1f} {y1:.1f} {middle:.1f} {y2:.1f} {x2:.1f} {y2:.1f}"
        edges.append(
            Edge(
                source=placed_parent.id,
                target=node.id,
                path=path,
                on_path=placed_parent.on_path and node.on_path,
            )
        )
    for node in nodes:
        source = placed.get(by_id[node.id].derived_from or 0)
        if source is None:
            continue
        x1, y1 = source.x + node_width / 2, source.y + node_height
        x2, y2 = node.x + node_width / 2, node.y
        edges.append(
            Edge(
                source=source.id,
                target=node.id,
                path=f"M{x1:.1f} {y1:.1f} L{x2:.1f} {y2:.1f}",
                on_path=False,
                derived=True,
            )
        )
    columns = [
        Column(x=column_x(n), title=_column_title(key), count=len(members[n])) for n, key in enumerate(column_keys)
    ]
    width = margin * 2 + max(len(column_keys), 1) * (node_width + column_gap) - column_gap
    height = max(max((node.y for node in nodes), default=header) + node_height, lowest_lane) + margin
    return Layout(nodes, edges, columns, width, height, node_width, node_height)


class Lanes:
    """Where an edge that skips columns may run: for a range of consecutive columns, a height free of nodes in
    every one of them, as near as can be to the edge's ends (``free_lane``).

    ``taken`` holds, per column, the sorted (top, bottom) its nodes take; no node is nearer a lane than
    ``clearance``. The candidate heights are the edge's own ends, the middle of each gap between two nodes of a
    column crossed and a height just below the lowest node crossed; the chosen one is the free candidate with
    the least ``|y - y1| + |y - y2|`` (on a tie, the one higher on the page). That is what checking every
    candidate against every node crossed chose (tests/review/test_lineage.py keeps that search as the
    reference) whenever the heights add up exactly in floating point, as the layout's whole-pixel sizes do.

    A segment tree over the columns keeps, per range of columns, the merged blocked intervals, the gaps' middles
    and the lowest bottom, so a step of an edge's search costs O(log² n) instead of a pass over every node it
    crosses, and the search takes a step per blocked candidate it passes (a few in a laid-out tree)."""

    def __init__(self, taken: list[list[tuple[float, float]]], *, clearance: float) -> None:
        self.clearance = clearance
        size = 1
        while size < max(len(taken), 1):
            size *= 2
        self.size = size
        # Per tree node: blocked open intervals (merged, sorted) as parallel lists of starts and ends; the gaps'
        # middles, sorted; the lowest bottom (None: no node).
        self.starts: list[list[float]] = [[] for _ in range(2 * size)]
        self.ends: list[list[float]] = [[] for _ in range(2 * size)]
        self.middles: list[list[float]] = [[] for _ in range(2 * size)]
        self.lowest: list[float | None] = [None] * (2 * size)
        for column, spans in enumerate(taken):
            leaf = size + column
            self._blocked(leaf, [(top - clearance, bottom + clearance) for top, bottom in spans])
            self.middles[leaf] = sorted((above + below) / 2 for (_, above), (below, _) in itertools.pairwise(spans))
            self.lowest[leaf] = max((bottom for _, bottom in spans), default=None)
        for index in range(size - 1, 0, -1):
            left, right = 2 * index, 2 * index + 1
            self._blocked(
                index,
                sorted(
                    [
                        *zip(self.starts[left], self.ends[left], strict=True),
                        *zip(self.starts[right], self.ends[right], strict=True),
                    ]
                ),
            )
            self.middles[index] = sorted([*self.middles[left], *self.middles[right]])
            lows = [low for low in (self.lowest[left], self.lowest[right]) if low is not None]
            self.lowest[index] = max(lows, default=None)

    def _blocked(self, index: int, intervals: list[tuple[float, float]]) -> None:
        """Store the union of open ``intervals`` (sorted) at ``index``: overlapping ones merge, touching ones do
        not (the point where they touch is free)."""
        starts, ends = self.starts[index], self.ends[index]
        for start, end in intervals:
            if starts and start < ends[-1]:
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(start)
                ends.append(end)

    def _cover(self, first: int, last: int) -> list[int]:
        """The tree nodes that together hold columns ``first`` to ``last``."""
        found = []
        low, high = first + self.size, last + self.size + 1
        while low < high:
            if low & 1:
                found.append(low)
                low += 1
            if high & 1:
                high -= 1
                found.append(high)
            low //= 2
            high //= 2
        return found

    def _up(self, cover: list[int], y: float) -> float:
        """The least free height >= ``y`` (every height from ``y`` up to it is blocked)."""
        moved = True
        while moved:
            moved = False
            for index in cover:
                at = bisect.bisect_left(self.starts[index], y) - 1
                if at >= 0 and y < self.ends[index][at]:
                    y, moved = self.ends[index][at], True
        return y

    def _down(self, cover: list[int], y: float) -> float:
        """The greatest free height <= ``y`` (every height from it up to ``y`` is blocked)."""
        moved = True
        while moved:
            moved = False
            for index in cover:
                at = bisect.bisect_right(self.ends[index], y)
                if at < len(self.ends[index]) and self.starts[index][at] < y:
                    y, moved = self.starts[index][at], True
        return y

    def free_lane(self, first: int, last: int, y1: float, y2: float) -> float:
        """A height free of nodes in columns ``first`` to ``last``, nearest the ends ``y1`` and ``y2``."""
        cover = self._cover(first, last)
        lows = [low for low in (self.lowest[index] for index in cover) if low is not None]
        below_all = max(lows, default=max(y1, y2)) + 2 * self.clearance + 4
        fixed = sorted({y1, y2, below_all})
        near = min(y1, y2)

        def key(y: float) -> tuple[float, float]:
            return (abs(y - y1) + abs(y - y2), y)

        found: list[float] = []
        # Upwards from the nearer end: the cost does not fall as y grows from there, so the first free
        # candidate is the best of those >= near.
        y = near
        while True:
            y = self._up(cover, y)
            after = [f for f in fixed if f >= y][:1]
            for index in cover:
                at = bisect.bisect_left(self.middles[index], y)
                if at < len(self.middles[index]):
                    after.append(self.middles[index][at])
            if not after:
                break
            y = min(after)
            if self._up(cover, y) == y:
                found.append(y)
                break
        # Downwards from just below it: the cost grows as y falls, so the first free candidate is the best of
        # those < near.
        y, strict = near, True
        while True:
            before = [f for f in fixed if (f < y if strict else f <= y)][-1:]
            for index in cover:
                middles = self.middles[index]
                at = (bisect.bisect_left if strict else bisect.bisect_right)(middles, y) - 1
                if at >= 0:
                    before.append(middles[at])
            if not before:
                break
            y, strict = max(before), False
            free = self._down(cover, y)
            if free == y:
                found.append(y)
                break
            y = free
        return min(found, key=key)


def _column_title(key: tuple[int, int, int]) -> str:
    run, round_number, generation = key
    name = "seed" if round_number == 0 and generation == 0 and run <= 1 else f"round {round_number}"
    if run > 1:
        name = f"run {run} · {name}"
    if generation:
        name += " derived" if generation == 1 else f" derived ×{generation}"
    return name


def round_window(counts: dict[int, int], *, start: int | None, end: int | None, cap: int) -> tuple[int, int]:
    """The rounds ``(first, last)`` to draw: consecutive rounds holding at most
    ``cap`` candidates together (always at least one round). From ``start``
    forwards when given, else back from ``end`` (default: the latest round),
    so a first view is bounded however many candidates there are."""
    rounds = sorted(counts)
    if not rounds:
        return (0, 0)
    if start is not None:
        chosen = [r for r in rounds if r >= start] or rounds[-1:]
    else:
        last = end if end is not None else rounds[-1]
        chosen = list(reversed([r for r in rounds if r <= last])) or rounds[:1]
    total, taken = 0, list[int]()
    for number in chosen:
        if taken and total + counts[number] > cap:
            break
        taken.append(number)
        total += counts[number]
    return (min(taken), max(taken))
