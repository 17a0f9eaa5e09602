"""Version 1 of the API: each area's module lists its routes."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt
from rest_framework.routers import SimpleRouter

from api import views

router = SimpleRouter()
router.register("benchmarks", views.BenchmarkViewSet, basename="benchmark")
router.register("tasks", views.TaskViewSet, basename="task")
router.register("experiments", views.ExperimentViewSet, basename="experiment")
router.register("runs", views.RunViewSet, basename="run")
router.register("comparisons", views.RecipeComparisonViewSet, basename="comparison")
router.register("candidates", views.CandidateViewSet, basename="candidate")
router.register("results", views.CertifiedResultViewSet, basename="result")
router.register("trials", views.TrialViewSet, basename="trial")
router.register("ledger", views.LedgerViewSet, basename="ledger")
router.register("flags", views.LeakageFlagViewSet, basename="flag")
router.register("review-decisions", views.ReviewDecisionViewSet, basename="review-decision")
router.register("annotations", views.AnnotationViewSet, basename="annotation")

urlpatterns: list = [
    *router.urls,
    re_path(
        r"^candidates/(?P<pk>[^/.]+)/files/(?P<path>.+)$",  # any id, as the router's: a bad one is the API's 404
        views.CandidateViewSet.as_view({"get": "files"}),
        name="candidate-file",
    ),
]

from api import external, trajectories  # noqa: E402  (their own routes)

urlpatterns += [*trajectories.urlpatterns, *external.urlpatterns]

# GET /trials/<pk>/trajectory/ reads (views.TrialViewSet.trajectory), POST imports
# (trajectories.TrajectoryImportView): one URL, two views. This dispatcher comes
# first so both methods are reachable; the two routes above stay listed for the
# OpenAPI schema, which merges their operations under the one path.
_trajectory_read = views.TrialViewSet.as_view({"get": "trajectory"})
_trajectory_import = trajectories.TrajectoryImportView.as_view()


@csrf_exempt  # each DRF view enforces CSRF itself for session-authenticated requests
def trial_trajectory(request: HttpRequest, pk: str) -> HttpResponse:
    if request.method == "POST":
        return _trajectory_import(request, pk=pk)
    return _trajectory_read(request, pk=pk)


# Any id the router's trial routes take, so that a POST to /trials/abc/trajectory/ is a 404 here, not a 405 there.
urlpatterns.insert(0, re_path(r"^trials/(?P<pk>[^/.]+)/trajectory/$", trial_trajectory, name="trial-trajectory"))
