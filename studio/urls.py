from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from studio import views
from studio.api import api

urlpatterns = [
    # Pages without a <link rel="icon"> (the admin's, Django's) make the browser ask for /favicon.ico:
    # a 404 there is a console error on every admin page.
    path("favicon.ico", views.favicon),
    path("healthz", views.healthz),
    path("admin/", admin.site.urls),
    path("api", views.api_root),
    path("api/", api.urls),
    path("hub/", include("datahub.hf_urls")),
    path("", include("studio.web_urls")),
    path("", include("environments.web_urls")),
]

handler400 = "studio.views.bad_request"
