from __future__ import annotations

from django.contrib import admin

from experiments.models import Experiment


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "project", "created_at")
    list_select_related = ("project",)
