"""Routes of the review application; each screen's module lists its own."""

from __future__ import annotations

# Aliased: the name ``annotations`` is taken by the __future__ import.
from review.views import annotations as annotation_views
from review.views import candidates, comparisons, experiments, lineage, queue, results, runs

app_name = "review"

urlpatterns = [
    *experiments.urlpatterns,
    *lineage.urlpatterns,
    *runs.urlpatterns,
    *candidates.urlpatterns,
    *results.urlpatterns,
    *queue.urlpatterns,
    *annotation_views.urlpatterns,
    *comparisons.urlpatterns,
]
