"""The dashboard's SVG charts: pure layout functions and their escaping."""

from __future__ import annotations

import re

import pytest

from review import charts
from review.charts import CostPoint, RoundScores


def test_nice_ticks_cover_the_range_with_round_steps() -> None:
    assert charts.nice_ticks(0.0, 1.0, 5) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert charts.nice_ticks(3300, 9500, 5) == [2000, 4000, 6000, 8000, 10000]
    assert charts.nice_ticks(0.42, 0.93, 5) == [0.4, 0.6, 0.8, 1.0]  # at most about 5 intervals
    assert charts.nice_ticks(0.42, 0.93, 10) == [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    single = charts.nice_ticks(5, 5)  # a single value still gets an axis around it
    assert len(single) > 2 and single[0] < 5 < single[-1] and 5.0 in single


def test_tick_labels_are_short_and_evenly_precise() -> None:
    assert charts.tick_label(12000) == "12k"
    assert charts.tick_label(2_500_000) == "2.5M"
    assert [charts.tick_label(v, 0.25) for v in (0.25, 0.5, 1.0)] == ["0.25", "0.50", "1.00"]
    assert [charts.tick_label(v, 0.2) for v in (0.4, 1.0)] == ["0.4", "1.0"]


def test_spread_labels_keeps_order_gap_and_bounds() -> None:
    placed = charts.spread_labels([50.0, 52.0, 51.0, 200.0], gap=12, lo=0, hi=100)
    ordered = sorted(placed)
    assert all(b - a >= 12 - 1e-9 for a, b in zip(ordered, ordered[1:], strict=False))
    assert placed[0] < placed[2] < placed[1]  # the input order of equal-ish values is kept
    assert max(placed) <= 100
    assert charts.spread_labels([], gap=10, lo=0, hi=1) == []


def test_series_segments_dash_across_unmeasured_rounds() -> None:
    segments = charts.series_segments([(0, 0.4), (1, 0.5), (2, 0.6), (5, 0.7)])
    assert [(s.points, s.measured_between) for s in segments] == [
        (((0, 0.4), (1, 0.5), (2, 0.6)), True),
        (((2, 0.6), (5, 0.7)), False),
    ]
    assert charts.series_segments([(0, 0.4)]) == []


def test_pareto_front_keeps_only_undominated_points() -> None:
    points = [
        CostPoint(1, cost=100, score=0.5, category="seed", name="seed"),
        CostPoint(2, cost=200, score=0.7, category="accepted", name="#2"),
        CostPoint(3, cost=250, score=0.6, category="rejected_gate", name="#3"),  # dearer and worse than #2
        CostPoint(4, cost=150, score=0.5, category="rejected_gate", name="#4"),  # dearer than the seed, no better
        CostPoint(5, cost=300, score=0.9, category="accepted", name="#5"),
    ]
    assert [p.candidate_id for p in charts.pareto_front(points)] == [1, 2, 5]


def _rounds() -> list[RoundScores]:
    return [
        RoundScores(0, {"train": 0.4, "gate": 0.5, "sealed": 0.39}, best=0.45),
        RoundScores(1, {"train": 0.75, "gate": 0.67}, best=0.71, accepted=("#2",)),
        RoundScores(2, {"train": 0.88, "gate": 0.94, "sealed": 0.89}, best=0.9, accepted=("#6",)),
    ]


def test_score_chart_draws_each_split_with_its_last_value_written() -> None:
    svg = str(charts.score_chart(_rounds(), delta=0.05, total_rounds=4))
    assert svg.startswith('<svg class="chart score-chart"')
    for split, last in (("train", "0.880"), ("gate", "0.940"), ("sealed", "0.890")):
        assert f'class="series split-{split}"' in svg
        assert f">{split} {last}</text>" in svg
    assert ">S_best 0.900</text>" in svg
    assert "heldout" not in svg  # no held-out data, no held-out series
    # Sealed was not measured in round 1: its line is dotted across it.
    sealed = re.search(r'class="series split-sealed" points="([^"]+)"[^>]*stroke-dasharray="([^"]+)"', svg)
    assert sealed is not None
    assert sealed.group(1).count(",") == 2 and sealed.group(2) == "2 4"
    # The noise band and its legend, accepted candidates marked, axes labelled, x ticks up to total_rounds.
    assert 'class="noise-band"' in svg and "δ=0.050" in svg
    assert svg.count('class="accepted-mark"') == 2 and ">#2</text>" in svg and ">#6</text>" in svg
    assert ">round (0 = start)</text>" in svg and ">pass@1</text>" in svg
    assert 'text-anchor="middle" font-size="11" fill="#5b6475">4</text>' in svg


def test_score_chart_without_noise_says_so_and_without_data_is_empty() -> None:
    svg = str(charts.score_chart(_rounds(), delta=0.0))
    assert 'class="noise-band"' not in svg and "δ = 0: no noise band" in svg
    assert str(charts.score_chart([], delta=0.1)) == ""


def test_noise_band_stays_inside_zero_and_one() -> None:
    svg = str(charts.score_chart([RoundScores(0, {"train": 1.0}, best=0.99)], delta=0.5, height=300))
    found = re.search(r'class="noise-band" points="([^"]+)"', svg)
    assert found is not None
    points = found.group(1).split()
    ys = [float(p.split(",")[1]) for p in points]
    grid = [float(v) for v in re.findall(r'<line class="grid" x1="\d+" x2="[\d.]+" y1="([\d.]+)"', svg)]
    assert len(grid) == 6 and min(ys) >= min(grid) - 1e-6 and max(ys) <= max(grid) + 1e-6


def test_cost_chart_labels_accepted_points_and_links_each_one() -> None:
    points = [
        CostPoint(1, 3900, 0.45, "seed", "seed", href="/candidates/1/", label=True),
        CostPoint(2, 7950, 0.71, "accepted", "#2", href="/candidates/2/", label=True),
        CostPoint(3, 5265, 0.55, "rejected_gate", "#3", href="/candidates/3/"),
    ]
    svg = str(charts.cost_chart(points, category_titles={"seed": "seed", "accepted": "accepted by the gate"}))
    assert svg.count('<circle class="point') == 3
    for pk in (1, 2, 3):
        assert f'<a href="/candidates/{pk}/"><circle' in svg
    assert ">seed 0.450</text>" in svg and ">#2 0.710</text>" in svg
    assert ">#3 0.550</text>" not in svg  # only accepted ones (and the seed) are labelled
    assert "accepted by the gate" in svg and "rejected_gate" in svg  # legend, an untitled category by key
    assert 'class="pareto"' in svg
    assert "mean policy tokens per trial" in svg and "evolve score S" in svg
    assert str(charts.cost_chart([], category_titles={})) == ""


@pytest.mark.parametrize("payload", ["</script><img src=x onerror=alert(1)>", '"><svg onload=alert(1)>'])
def test_chart_text_is_escaped(payload: str) -> None:
    point = CostPoint(1, 100, 0.5, "accepted", payload, href=f"/x/{payload}", label=True, detail=payload)
    svg = str(charts.cost_chart([point], category_titles={"accepted": payload}))
    assert payload not in svg
    assert "&lt;" in svg or "&quot;" in svg
    svg = str(charts.score_chart([RoundScores(1, {"train": 0.5}, best=0.5, accepted=(payload,))], delta=0.1))
    assert payload not in svg
    assert "&lt;" in svg


def test_charts_format_html_escapes_exactly_as_django_does() -> None:
    from django.utils.html import format_html as django_format_html
    from django.utils.safestring import SafeString, mark_safe

    template = '<a href="{}" title="{}">{}{}</a><text x="{}">{}</text>'
    args = (
        "/c/1/?a=1&b=<2>",
        'it\'s "quoted"',
        mark_safe("<b>safe</b>"),
        "</script><img src=x onerror=alert(1)>",
        12.5,
        None,
    )
    ours = charts.format_html(template, *args)
    assert isinstance(ours, SafeString)
    assert ours == django_format_html(template, *args)
    assert "<img" not in ours and "<b>safe</b>" in ours


def test_pareto_front_and_sample_take_light_tuples_like_cost_points() -> None:
    from typing import NamedTuple

    class Light(NamedTuple):
        candidate_id: int
        cost: float
        score: float
        category: str
        label: bool

    full = [
        CostPoint(
            candidate_id=n,
            cost=100.0 + (n * 37) % 500,
            score=((n * 53) % 100) / 100,
            category="seed" if n == 0 else ("accepted" if n % 5 == 0 else "rejected"),
            name=f"#{n}",
            label=n % 5 == 0,
        )
        for n in range(3000)
    ]
    light = [Light(p.candidate_id, p.cost, p.score, p.category, p.label) for p in full]
    assert [p.candidate_id for p in charts.pareto_front(light)] == [p.candidate_id for p in charts.pareto_front(full)]
    assert [p.candidate_id for p in charts.thin_cost_points(light, 400)] == [
        p.candidate_id for p in charts.thin_cost_points(full, 400)
    ]
