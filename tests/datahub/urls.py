"""Only the API and the /hub endpoints: used when studio.urls cannot be imported because another
app's pages are half-written in this checkout (the Data Hub tests do not need them)."""
from __future__ import annotations

from django.urls import include, path

from studio.api import api

urlpatterns = [
    path("api/", api.urls),
    path("hub/", include("datahub.hf_urls")),
]
