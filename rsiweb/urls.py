from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path
from django.views.decorators.http import require_GET

from review.throttle import throttled


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico on pages that name no icon (the admin's):
    the review screens' icon, rather than a 404 in the log."""
    return HttpResponsePermanentRedirect(static("review/favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    # Both login forms go through the failed-login throttle (review/throttle.py).
    path("admin/login/", throttled(admin.site.login), name="admin-login"),
    path("admin/", admin.site.urls),
    path("api/", include("api.urls")),
    path("login/", throttled(auth_views.LoginView.as_view()), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("review.urls")),
]

# The app's error pages, from handlers that never read the request's body (review/views/errors.py).
handler400 = "review.views.errors.bad_request"
handler403 = "review.views.errors.permission_denied"
handler404 = "review.views.errors.page_not_found"
handler500 = "review.views.errors.server_error"
