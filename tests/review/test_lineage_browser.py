"""The lineage with several runs in real Chromium (issue 40, defect 6): no edge passes through a node it does not
join (measured on the drawn SVG), and the graph scrolls and zooms instead of being clipped in a fixed box."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from evolution.loop import lifecycle
from evolution.models import Candidate, Experiment
from evolution.recipes import load_preset
from tests.factories import seed_of
from tests.review.test_browser import browser
from tests.review.test_candidates import child
from tests.review.test_keys_browser import Screen, screen

__all__ = ["browser", "screen"]  # the fixtures, imported to be used here

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Each edge sampled every 2 px along its drawn length; a sample inside a node's box that is neither end of the
# edge is a crossing. Node boxes and edges are both in the SVG's own coordinates.
CROSSINGS = """() => {
  const svg = document.querySelector('svg.lineage');
  const boxes = [...svg.querySelectorAll('a.node rect')].map(r => ({
    x: +r.getAttribute('x'), y: +r.getAttribute('y'), w: +r.getAttribute('width'), h: +r.getAttribute('height'),
    href: r.closest('a').getAttribute('href'),
  }));
  const inside = (b, p, pad) => p.x > b.x + pad && p.x < b.x + b.w - pad && p.y > b.y + pad && p.y < b.y + b.h - pad;
  const found = [];
  for (const edge of svg.querySelectorAll('path.edge:not(.derived)')) {
    const length = edge.getTotalLength();
    const start = edge.getPointAtLength(0), end = edge.getPointAtLength(length);
    const ends = boxes.filter(b => inside(b, start, -2) || inside(b, end, -2));
    for (let at = 0; at <= length; at += 2) {
      const p = edge.getPointAtLength(at);
      for (const b of boxes) {
        if (ends.includes(b) || !inside(b, p, 0.5)) continue;
        found.push(`${edge.getAttribute('d')} crosses ${b.href}`);
        break;
      }
    }
  }
  return [...new Set(found)];
}"""


def test_lineage_edges_of_several_runs_go_around_nodes_and_the_graph_scrolls_and_zooms(
    screen: Screen, example_world: Experiment, make_user: Any
) -> None:
    make_user("viewer", username="vera")
    seed = seed_of(example_world)
    # A second run from the seed: its candidates' columns come after every column of the first run, so their
    # edges from the seed skip those columns and the nodes in them.
    second = lifecycle.run_create(experiment=example_world, recipe=load_preset("rrsi"), proposer="example", start=seed)
    made = [child(seed, {f"run2/{n}.txt": f"{n}\n"}, state=Candidate.State.REJECTED_GATE) for n in range(4)]
    made.append(child(made[0], {"run2/more.txt": "more\n"}, state=Candidate.State.REJECTED_GATE))
    Candidate.objects.filter(pk__in=[c.pk for c in made]).update(run=second)
    screen.login("vera")
    page = screen.page
    page.set_viewport_size({"width": 2400, "height": 1000})
    for query in ("", f"?run={second.pk}"):
        screen.go(reverse("review:lineage", args=[example_world.pk]) + query)
        assert page.locator("svg.lineage path.edge").count() > 0
        assert page.evaluate(CROSSINGS) == [], query

    # Scroll and zoom: "+" makes the drawing larger than its box, which then scrolls; "fit" shows all of it.
    screen.go(reverse("review:lineage", args=[example_world.pk]))
    box = page.locator(".lineage-scroll")
    svg = page.locator("svg.lineage")
    base = float(svg.get_attribute("width") or 0)
    for _ in range(6):
        screen.key("+")
    assert float(svg.get_attribute("width") or 0) == pytest.approx(base * 1.25**6, abs=1)
    sizes = box.evaluate("b => [b.scrollWidth, b.clientWidth, b.scrollHeight, b.clientHeight]")
    assert sizes[0] > sizes[1], sizes  # wider than its box: it scrolls (the box grows in height up to the window)
    box.evaluate("b => { b.scrollLeft = b.scrollWidth; }")
    assert box.evaluate("b => b.scrollLeft") > 0
    page.click("button[data-zoom=fit]")
    sizes = box.evaluate("b => [b.scrollWidth, b.clientWidth, b.scrollHeight, b.clientHeight]")
    assert sizes[0] <= sizes[1] and sizes[2] <= sizes[3], sizes
    screen.key("Escape")  # the click left the focus on the button, where page keys rest
    screen.key("0")
    assert float(svg.get_attribute("width") or 0) == pytest.approx(base, abs=1)
    screen.check()
