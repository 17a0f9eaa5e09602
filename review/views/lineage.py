"""The lineage page: the candidate tree, rounds left to right, nodes coloured by state.

``review.selectors`` reads a window of rounds, ``review.lineage`` lays the tree out and ``review.charts`` writes
its SVG; this module only parses the window and renders.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import path
from django.views.decorators.http import require_GET

from evolution import access, selectors
from evolution.loop import load
from evolution.models import Experiment, Run
from review import charts
from review import lineage as lineage_layout
from review import selectors as review_selectors
from review.views.experiments import url_maker

LINEAGE_MAX_NODES = 400  # candidates drawn at once on the lineage page


def _round_param(request: HttpRequest, name: str) -> int | None:
    raw = request.GET.get(name, "")
    return int(raw) if raw.isdigit() else None


def _node_inputs(
    experiment: Experiment, first: int, last: int, run: Run | None
) -> tuple[list[lineage_layout.NodeInput], dict[int, str]]:
    """The window's candidates (and their parents) as layout inputs with their evolve score S (the experiment's
    evolve splits and metric, ``load.experiment_measure``, as the matrix and the dashboard show it), computed as
    the gate computes it from the totals stored at certification, their run's number and what each was derived
    from; and why each is in its state."""
    shown = review_selectors.lineage_window(experiment=experiment, first=first, last=last, run=run)
    candidates = review_selectors.lineage_nodes(shown=shown)
    numbers = review_selectors.run_numbers(experiment=experiment)
    derived = review_selectors.derived_from(shown=shown)
    splits, metric = load.experiment_measure(experiment)
    scores = selectors.candidate_scores(
        experiment_id=experiment.pk,
        splits=list(splits),
        mean_score=metric == "mean_score",
        candidate_ids=shown.values("pk"),
    )
    rows = [
        lineage_layout.NodeInput(
            id=c["pk"],
            parent_id=c["parent_id"],
            state=c["state"],
            origin=c["origin"],
            round=c["round"],
            label=c["label"],
            score=scores[c["pk"]][0] if c["pk"] in scores else None,
            run=numbers.get(c["run_id"], 0),
            derived_from=derived.get(c["pk"]),
        )
        for c in candidates
    ]
    return rows, {c["pk"]: c["reason"] for c in candidates}


def _window_links(per_round: Counter[int], first: int, last: int, run: Run | None = None) -> dict[str, Any]:
    """Plain links to the rounds before and after the window drawn (of the run shown, if one), and its counts."""
    keep = f"run={run.pk}" if run is not None else ""
    rounds = sorted(per_round)
    earlier = [r for r in rounds if r < first]
    later = [r for r in rounds if r > last]
    return {
        "window_first": first,
        "window_last": last,
        "window_count": sum(per_round[r] for r in rounds if first <= r <= last),
        "candidate_total": sum(per_round.values()),
        "windowed": bool(earlier or later),
        "earlier_url": f"?to={earlier[-1]}&{keep}".rstrip("&") if earlier else "",
        "later_url": f"?from={later[0]}&{keep}".rstrip("&") if later else "",
        "first_url": f"?from={rounds[0]}&{keep}".rstrip("&") if earlier else "",
        "latest_url": f"?{keep}" if later else "",
    }


@require_GET
@access.permission_required()
def lineage(request: HttpRequest, pk: int) -> HttpResponse:
    """The candidate tree, rounds left to right (each run's in its own columns), nodes coloured by state;
    ``?run=<id>`` draws one run's candidates (with its start and their parents).

    A window of consecutive rounds holding at most LINEAGE_MAX_NODES
    candidates is drawn (the latest, or ``?from=R`` / ``?to=R``), with the
    parents of its candidates from earlier rounds; plain links page to
    earlier and later rounds. Four queries whatever the experiment's size."""
    experiment = get_object_or_404(Experiment.objects.select_related("benchmark"), pk=pk)
    runs = list(Run.objects.filter(experiment=experiment).select_related("recipe").order_by("-pk"))
    raw = request.GET.get("run", "")
    only = next((r for r in runs if raw.isdigit() and r.pk == int(raw)), None)
    latest = only or (runs[0] if runs else None)
    per_round: Counter[int] = Counter()
    legend_counts: Counter[str] = Counter()
    for number, state, origin, n in review_selectors.lineage_counts(experiment=experiment, run=only):
        per_round[number or 0] += n
        legend_counts[lineage_layout.category(state=state, origin=origin)] += n
    first, last = lineage_layout.round_window(
        per_round, start=_round_param(request, "from"), end=_round_param(request, "to"), cap=LINEAGE_MAX_NODES
    )
    rows, reasons = _node_inputs(experiment, first, last, only)
    highlight = latest.current_candidate_id if latest else None
    tree = lineage_layout.layout(rows, highlight=highlight, node_width=140)
    nodes_html, edges_html = charts.lineage_svg(
        tree, reasons=reasons, href=url_maker("review:candidate"), highlight=highlight
    )
    context = {
        "experiment": experiment,
        "latest": latest,
        "runs": [(r.pk, number) for r, number in zip(runs, range(len(runs), 0, -1), strict=True)],
        "only": only,
        "tree": tree,
        "tree_width": f"{tree.width:.0f}",
        "tree_height": f"{tree.height:.0f}",
        "columns": [{"x": f"{c.x:.1f}", "title": c.title, "count": c.count} for c in tree.columns],
        "nodes": bool(tree.nodes),
        "nodes_html": nodes_html,
        "edges_html": edges_html,
        "legend": [(key, title, legend_counts.get(key, 0)) for key, title in lineage_layout.CATEGORIES],
        "highlight": highlight,
        "max_nodes": LINEAGE_MAX_NODES,
        **_window_links(per_round, first, last, only),
    }
    return render(request, "review/experiments/lineage.html", context)


urlpatterns = [
    path("experiments/<int:pk>/lineage/", lineage, name="lineage"),
]
