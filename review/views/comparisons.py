"""The comparison screen (a stored ``compare_recipes`` comparison) and its JSON download."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import path
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_GET

from evolution import access
from evolution.loop.compare import comparisons_reap
from evolution.models import RecipeComparison
from review.pages import comparison as pages


@require_GET
@access.permission_required()
def comparison(request: HttpRequest, pk: int) -> HttpResponse:
    """Recipes × proposer seeds × split draws: scores, means, paired differences, leaky edits, rules fired."""
    comparisons_reap()  # a comparison whose command stopped shows as interrupted, not running for ever
    page = pages.comparison_page(pk=pk)
    return render(request, "review/comparisons/comparison.html", page.context())


@require_GET
@access.permission_required()
def comparison_json(request: HttpRequest, pk: int) -> HttpResponse:
    """The comparison's JSON (what ``compare_recipes --json`` printed), as a download."""
    comparisons_reap()
    stored = get_object_or_404(RecipeComparison, pk=pk)
    response = JsonResponse(
        {
            "id": stored.pk,
            "status": stored.status,
            "command": stored.command,
            "error": stored.error,
            "result": stored.result,
        },
        json_dumps_params={"indent": 2, "sort_keys": True},
    )
    response["Content-Disposition"] = content_disposition_header(True, f"comparison-{stored.pk}.json")
    return response


urlpatterns = [
    path("comparisons/<int:pk>/", comparison, name="comparison"),
    path("comparisons/<int:pk>/json/", comparison_json, name="comparison_json"),
]
