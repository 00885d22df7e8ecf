from __future__ import annotations

from django.apps import AppConfig


class StudioConfig(AppConfig):
    name = "studio"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from studio.sqlite import register_functions

        connection_created.connect(register_functions, dispatch_uid="studio.sqlite.register_functions")
