from __future__ import annotations

from django.contrib import admin

from experiments.models import Experiment


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    """Read-only: an experiment's slug names its Data Hub repo (experiment-<slug>, where its runs'
    branches are) and its runs are in its project, so neither moves here; experiments are made by the
    API or the New experiment form (create_experiment)."""

    list_display = ("name", "slug", "project", "created_at")
    list_select_related = ("project",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
