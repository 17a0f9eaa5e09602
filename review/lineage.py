"""Layout of the candidate tree (pure: no ORM, no HTML).

Columns are rounds, left to right (the seed is round 0); a candidate whose
parent is in the same round (derived by a reviewer from a flagged one) gets
a column of its own right after that round's. Within a column a node sits
at its parent's height when it can, else just below the node above it, so
a family stays together and a round with many proposals stays compact.
Edges run from the right side of the parent to the left side of the child.
"""

from __future__ import annotations

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
    among them are drawn as roots. Runs in O(n log n)."""
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
    taken: dict[int, list[tuple[float, float]]] = {}
    for node in nodes:
        taken.setdefault(node.column, []).append((node.y, node.y + node_height))
    for spans in taken.values():
        spans.sort()
    edges = []
    lowest_lane = 0.0
    for node in nodes:
        placed_parent = placed.get(node.parent_id) if node.parent_id is not None else None
        if placed_parent is None:
            continue
        x1, y1 = placed_parent.x + node_width, placed_parent.y + node_height / 2
        x2, y2 = node.x, node.y + node_height / 2
        if node.column - placed_parent.column > 1:
            crossed = [taken.get(c, []) for c in range(placed_parent.column + 1, node.column)]
            lane = _free_lane(crossed, y1, y2, clearance=row_gap / 2)
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


def _free_lane(columns: list[list[tuple[float, float]]], y1: float, y2: float, *, clearance: float) -> float:
    """A height free of nodes in every one of ``columns`` (each a sorted list of the (top, bottom) its nodes
    take), as near as can be to the edge's ends ``y1`` and ``y2``: their own heights when free, else the middle
    of a gap between two nodes of a column, else just below the lowest node crossed."""

    def free(y: float) -> bool:
        return all(not (top - clearance < y < bottom + clearance) for spans in columns for top, bottom in spans)

    choices = [y1, y2]
    for spans in columns:
        for (_, above), (below, _) in zip(spans, spans[1:], strict=False):
            choices.append((above + below) / 2)
    lowest = max((bottom for spans in columns for _, bottom in spans), default=max(y1, y2))
    choices.append(lowest + 2 * clearance + 4)
    return min((y for y in choices if free(y)), key=lambda y: (abs(y - y1) + abs(y - y2), y))


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
