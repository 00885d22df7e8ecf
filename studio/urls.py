from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from studio.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("hub/", include("datahub.hf_urls")),
    path("", include("studio.web_urls")),
    path("", include("environments.web_urls")),
]

handler400 = "studio.views.bad_request"
