from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import include, path

from datahub import views as datahub_views
from studio import token_views, views, webhook_views

urlpatterns = [
    path("", views.home, name="home"),
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("projects/switch", views.switch_project, name="switch_project"),
    path("models/", datahub_views.models_page, name="models"),
    path("settings/billing/", views.billing, name="billing"),
    path("settings/api-tokens/", token_views.api_tokens_page, name="api_tokens"),
    path("settings/api-tokens/new", token_views.create_token, name="api_token_create"),
    path("settings/api-tokens/<int:token_id>/revoke", token_views.revoke_token, name="api_token_revoke"),
    path("settings/webhooks/", webhook_views.webhooks_page, name="webhooks"),
    path("settings/webhooks/new", webhook_views.create_webhook, name="webhook_create"),
    path("settings/webhooks/<int:webhook_id>/active", webhook_views.toggle_webhook, name="webhook_toggle"),
    path("settings/webhooks/<int:webhook_id>/test", webhook_views.test_webhook, name="webhook_test"),
    path("settings/webhooks/<int:webhook_id>/delete", webhook_views.delete_webhook, name="webhook_delete"),
    path("", include("training.web_urls")),
    path("experiments/", include("experiments.web_urls")),
]
