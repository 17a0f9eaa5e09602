"""Layout of the candidate tree (pure, no database)."""

from __future__ import annotations

import random
import sys
from types import FrameType
from typing import Any

import pytest

from review import lineage as lineage_module
from review.lineage import CATEGORY_TITLES, Lanes, NodeInput, category, layout


def _tree() -> list[NodeInput]:
    return [
        NodeInput(1, None, "accepted", origin="seed", round=0, label="seed", score=0.45),
        NodeInput(2, 1, "accepted", round=1, label="r1s0", score=0.71),
        NodeInput(3, 1, "rejected_gate", round=1, label="r1s1", score=0.55),
        NodeInput(4, 1, "flagged", round=1, label="r1s2"),
        NodeInput(5, 2, "rejected_surface", round=2, label="r2s0"),
        NodeInput(6, 2, "evaluating", round=2, label="r2s1"),
        NodeInput(7, 4, "approved", origin="derived", round=1, label="derived"),  # derived in the same round
    ]


@pytest.mark.parametrize(
    ("state", "origin", "expected"),
    [
        ("accepted", "seed", "seed"),
        ("accepted", "proposed", "accepted"),
        ("rejected_gate", "proposed", "rejected_gate"),
        ("flagged", "proposed", "flagged"),
        ("rejected_review", "proposed", "rejected_review"),
        ("rejected_surface", "proposed", "rejected_surface"),
        ("evaluating", "proposed", "evaluating"),
        ("certified", "proposed", "evaluating"),
        ("approved", "derived", "evaluating"),
        ("frozen", "proposed", "other"),
        ("cancelled", "proposed", "other"),
        ("rejected_budget", "proposed", "other"),
    ],
)
def test_category_of_each_state(state: str, origin: str, expected: str) -> None:
    assert category(state=state, origin=origin) == expected
    assert expected in CATEGORY_TITLES


def test_columns_follow_rounds_and_derived_candidates_get_their_own() -> None:
    result = layout(_tree())
    column = {n.id: n.column for n in result.nodes}
    assert column == {1: 0, 2: 1, 3: 1, 4: 1, 7: 2, 5: 3, 6: 3}
    assert [c.title for c in result.columns] == ["seed", "round 1", "round 1 derived", "round 2"]
    assert [c.count for c in result.columns] == [1, 3, 1, 2]
    xs = {n.column: n.x for n in result.nodes}
    assert xs[0] < xs[1] < xs[2] < xs[3]


def test_nodes_in_a_column_never_overlap_and_children_start_at_their_parent() -> None:
    result = layout(_tree(), node_height=20, row_gap=4)
    by_id = {n.id: n for n in result.nodes}
    for column in range(len(result.columns)):
        ys = sorted(n.y for n in result.nodes if n.column == column)
        assert all(b - a >= 24 - 1e-9 for a, b in zip(ys, ys[1:], strict=False))
    assert by_id[2].y == by_id[1].y  # first child level with its parent
    assert by_id[5].y == by_id[2].y
    assert by_id[7].y == by_id[4].y
    assert result.height >= max(n.y for n in result.nodes) + 20


def test_edges_join_parent_and_child_and_mark_the_main_line() -> None:
    result = layout(_tree(), highlight=6, node_width=100)
    edges = {(e.source, e.target): e for e in result.edges}
    assert set(edges) == {(1, 2), (1, 3), (1, 4), (2, 5), (2, 6), (4, 7)}
    assert {pair for pair, e in edges.items() if e.on_path} == {(1, 2), (2, 6)}
    assert {n.id for n in result.nodes if n.on_path} == {1, 2, 6}
    by_id = {n.id: n for n in result.nodes}
    path = edges[(1, 2)].path
    assert path.startswith(f"M{by_id[1].x + 100:.1f} ") and path.endswith(f"{by_id[2].x:.1f} {by_id[2].y + 11:.1f}")


def test_a_candidate_whose_parent_is_missing_is_a_root() -> None:
    result = layout([NodeInput(10, 99, "accepted", origin="imported", round=None), NodeInput(11, 10, "flagged")])
    by_id = {n.id: n for n in result.nodes}
    assert by_id[10].column == 0 and by_id[11].column == 1  # no round: the column after its parent
    assert [(e.source, e.target) for e in result.edges] == [(10, 11)]


def test_empty_input_gives_an_empty_layout() -> None:
    result = layout([])
    assert result.nodes == [] and result.edges == [] and result.columns == []
    assert result.width > 0 and result.height > 0


def test_a_large_tree_stays_compact() -> None:
    rows = [NodeInput(1, None, "accepted", origin="seed", round=0)]
    # 10 rounds of 15 proposals each, every round building on the first of the round before.
    for r in range(1, 11):
        parent = 1 if r == 1 else 2 + (r - 2) * 15
        rows += [NodeInput(2 + (r - 1) * 15 + i, parent, "rejected_gate", round=r) for i in range(15)]
    result = layout(rows, node_height=22, row_gap=6)
    assert len(result.nodes) == 151 and len(result.edges) == 150
    assert len(result.columns) == 11
    # Height is set by the fullest column (15 nodes, shifted down by its parent's row), not by the node count.
    assert result.height < 40 * 28
    assert result.width < 12 * (128 + 46)


def test_each_run_gets_its_own_columns_and_derived_candidates_a_dashed_link() -> None:
    rows = [
        NodeInput(1, None, "accepted", origin="seed", round=0),
        NodeInput(2, 1, "accepted", round=1, run=1),
        NodeInput(3, 2, "accepted", round=2, run=1),
        # The second run starts from #3 (round 2 of the first): its round 1 is not piled onto round 2.
        NodeInput(4, 3, "flagged", round=1, run=2),
        NodeInput(5, 3, "accepted", round=1, run=2),
        NodeInput(6, 3, "accepted", origin="derived", round=1, run=2, derived_from=4),
        NodeInput(7, 5, "rejected_gate", round=2, run=2),
    ]
    result = layout(rows)
    assert [c.title for c in result.columns] == ["seed", "round 1", "round 2", "run 2 · round 1", "run 2 · round 2"]
    column = {n.id: n.column for n in result.nodes}
    assert column == {1: 0, 2: 1, 3: 2, 4: 3, 5: 3, 6: 3, 7: 4}
    derived = [(e.source, e.target) for e in result.edges if e.derived]
    assert derived == [(4, 6)]
    parents = {(e.source, e.target) for e in result.edges if not e.derived}
    assert (3, 6) in parents and (4, 6) not in parents


def _points(path: str, samples: int = 40) -> list[tuple[float, float]]:
    """Points along an SVG path of M, C and L commands (as the layout writes them)."""
    tokens = path.replace("M", " M ").replace("C", " C ").replace("L", " L ").split()
    points: list[tuple[float, float]] = []
    here = (0.0, 0.0)
    i = 0
    while i < len(tokens):
        command = tokens[i]
        if command == "M":
            here = (float(tokens[i + 1]), float(tokens[i + 2]))
            i += 3
        elif command == "L":
            end = (float(tokens[i + 1]), float(tokens[i + 2]))
            points += [
                (here[0] + (end[0] - here[0]) * t / samples, here[1] + (end[1] - here[1]) * t / samples)
                for t in range(samples + 1)
            ]
            here, i = end, i + 3
        else:  # C
            c1, c2, end = ((float(tokens[i + k]), float(tokens[i + k + 1])) for k in (1, 3, 5))
            for step in range(samples + 1):
                t = step / samples
                points.append(
                    tuple(  # type: ignore[arg-type]
                        (1 - t) ** 3 * p0 + 3 * (1 - t) ** 2 * t * p1 + 3 * (1 - t) * t**2 * p2 + t**3 * p3
                        for p0, p1, p2, p3 in zip(here, c1, c2, end, strict=True)
                    )
                )
            here, i = end, i + 7
    return points


def test_edges_that_skip_columns_go_around_the_nodes_between() -> None:
    # Two runs: the second starts from #3 (round 2 of the first), so its edges skip run 1's later columns,
    # which are full of nodes.
    rows = [NodeInput(1, None, "accepted", origin="seed", round=0), NodeInput(2, 1, "accepted", round=1, run=1)]
    rows += [NodeInput(10 + n, 1, "rejected_gate", round=1, run=1) for n in range(6)]
    rows += [NodeInput(20 + n, 2, "rejected_gate", round=2, run=1) for n in range(6)]
    rows += [NodeInput(30 + n, 2, "rejected_gate", round=3, run=1) for n in range(6)]
    rows += [NodeInput(40, 1, "accepted", round=1, run=2), NodeInput(41, 40, "accepted", round=2, run=2)]
    result = layout(rows)
    crossing = []
    for edge in result.edges:
        others = [n for n in result.nodes if n.id not in (edge.source, edge.target)]
        for x, y in _points(edge.path):
            for n in others:
                if n.x < x < n.x + result.node_width and n.y < y < n.y + result.node_height:
                    crossing.append((edge.source, edge.target, n.id))
    assert sorted(set(crossing)) == []
    skipping = [e for e in result.edges if (e.source, e.target) == (1, 40)]
    assert len(skipping) == 1 and " L" in skipping[0].path
    assert all(y <= result.height for e in result.edges for _, y in _points(e.path))


def _free_lane_reference(columns: list[list[tuple[float, float]]], y1: float, y2: float, *, clearance: float) -> float:
    """The lane search as first written (commit 2982ff1), by exhaustion: every candidate height checked against
    every node crossed. The specification ``Lanes`` must meet; far too slow for 400 candidates."""

    def free(y: float) -> bool:
        return all(not (top - clearance < y < bottom + clearance) for spans in columns for top, bottom in spans)

    choices = [y1, y2]
    for spans in columns:
        for (_, above), (below, _) in zip(spans, spans[1:], strict=False):
            choices.append((above + below) / 2)
    lowest = max((bottom for spans in columns for _, bottom in spans), default=max(y1, y2))
    choices.append(lowest + 2 * clearance + 4)
    return min((y for y in choices if free(y)), key=lambda y: (abs(y - y1) + abs(y - y2), y))


def _random_runs(rng: random.Random, size: int) -> list[NodeInput]:
    """A seed and ``size`` candidates over three runs, each built on any earlier candidate: many edges skip
    columns, across runs and within one."""
    rows = [NodeInput(1, None, "accepted", origin="seed", round=0)]
    for n in range(size):
        parent = rng.choice(rows)
        run = max(parent.run, rng.choice([1, 1, 2, 3]))
        low = (parent.round or 0) + 1 if run == parent.run else 1
        rows.append(NodeInput(2 + n, parent.id, "rejected_gate", round=rng.randint(low, low + 4), run=run))
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_each_lane_is_the_one_the_exhaustive_search_picks(seed: int) -> None:
    # What is drawn does not change: every edge that skips columns runs at the height the exhaustive search over
    # the columns it crosses chooses.
    result = layout(_random_runs(random.Random(seed), 120))
    spans: dict[int, list[tuple[float, float]]] = {}
    for node in result.nodes:
        spans.setdefault(node.column, []).append((node.y, node.y + result.node_height))
    by_id = {n.id: n for n in result.nodes}
    lanes = 0
    for edge in result.edges:
        source, target = by_id[edge.source], by_id[edge.target]
        if edge.derived or target.column - source.column < 2:
            continue
        crossed = [sorted(spans.get(c, [])) for c in range(source.column + 1, target.column)]
        y1, y2 = source.y + result.node_height / 2, target.y + result.node_height / 2
        expected = _free_lane_reference(crossed, y1, y2, clearance=3)
        assert edge.path.split(" L")[1].split()[1] == f"{expected:.1f}", (edge.source, edge.target)
        lanes += 1
    assert lanes > 40


@pytest.mark.parametrize("seed", range(4))
def test_lanes_agree_with_the_exhaustive_search_off_the_grid(seed: int) -> None:
    # Columns whose nodes are not on the layout's row grid, overlapping blocked zones between columns, ends in
    # free and in blocked places, ranges of one column and of many.
    rng = random.Random(seed)
    for _ in range(60):
        taken = []
        for _column in range(rng.randint(1, 9)):
            ys, floor = [], 0.0
            for row in sorted(rng.sample(range(30), rng.randint(0, 8))):
                ys.append(max(row * rng.choice([7.5, 28.0]), floor))
                floor = ys[-1] + 28
            taken.append([(y, y + 22.0) for y in ys])
        lanes = Lanes(taken, clearance=3)
        for _query in range(10):
            first = rng.randint(0, len(taken) - 1)
            last = rng.randint(first, len(taken) - 1)
            y1 = 35 + rng.randint(0, 26) * 28 + rng.randint(-40, 40) / 2
            y2 = rng.choice([y1, 35 + rng.randint(0, 26) * 28])
            expected = _free_lane_reference(taken[first : last + 1], y1, y2, clearance=3)
            assert lanes.free_lane(first, last, y1, y2) == expected, (taken[first : last + 1], y1, y2)


def _bench_shaped(rounds: int) -> list[NodeInput]:
    """The shape ``bench pages`` draws: five proposals a round, all from the seed, so each edge skips the columns
    of every round before its own."""
    rows = [NodeInput(1, None, "accepted", origin="seed", round=0, run=1)]
    return rows + [NodeInput(2 + n, 1, "rejected_gate", round=1 + n // 5, run=1) for n in range(rounds * 5)]


class _TooMuchWork(Exception):
    pass


def _lines_run(rows: list[NodeInput], *, budget: int) -> int:
    """How many lines of review/lineage.py laying ``rows`` out runs (a count of work, not a time); stops once
    past ``budget``."""
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if frame.f_code.co_filename != lineage_module.__file__:
            return None
        count += 1
        if count > budget:
            raise _TooMuchWork
        return trace

    sys.settrace(trace)
    try:
        layout(rows)
    except _TooMuchWork:
        pass
    finally:
        sys.settrace(None)
    return count


def test_routing_work_grows_as_n_log_n_not_as_a_power_of_n() -> None:
    # 401 candidates in 81 columns (what the lineage page draws at most), then four times as many: the lines run
    # per candidate may grow with log n, not with n. The exhaustive search ran 8,836 lines a candidate for 101
    # candidates and 34,623 for 201.
    small, large = (_lines_run(_bench_shaped(rounds), budget=2_000 * (rounds * 5 + 1)) for rounds in (80, 320))
    assert small <= 1_000 * 401
    assert large / 1601 <= 1.5 * small / 401
