"""Pages: the environment catalogue (Fork), an environment repo's CONFIG, and Settings → Secrets."""
from __future__ import annotations

from django.urls import path

from environments import views
from studio import secrets_views

urlpatterns = [
    path("environments/", views.catalogue_page, name="environments"),
    path("environments/fork", views.fork, name="environment_fork"),
    path("environments/<str:name>/", views.repo_page, name="environment_repo"),
    path("environments/<str:name>/config", views.edit_config, name="environment_config"),
    path("settings/secrets/", secrets_views.secrets_page, name="secrets"),
    path("settings/secrets/set", secrets_views.set_secret, name="secret_set"),
    path("settings/secrets/delete", secrets_views.delete_secret, name="secret_delete"),
]
