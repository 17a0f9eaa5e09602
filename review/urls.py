"""Routes of the review application; each screen's module lists its own."""

from __future__ import annotations

from review.views import annotations, candidates, experiments, lineage, queue, results, runs

app_name = "review"

urlpatterns = [
    *experiments.urlpatterns,
    *lineage.urlpatterns,
    *runs.urlpatterns,
    *candidates.urlpatterns,
    *results.urlpatterns,
    *queue.urlpatterns,
    *annotations.urlpatterns,
]
