from __future__ import annotations

from django.apps import AppConfig


class DatahubConfig(AppConfig):
    name = "datahub"
    default_auto_field = "django.db.models.BigAutoField"
