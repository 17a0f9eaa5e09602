"""/api/v1/ routes, the OpenAPI schema and its documentation page."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

app_name = "api"

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # Our template: drf-spectacular's without its inline <style>, which the CSP forbids.
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="api:schema", template_name="api/swagger_ui.html"),
        name="docs",
    ),
    path("v1/", include("api.v1")),
]
