from __future__ import annotations

from django.contrib import admin

from training.models import TrainingRun


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "project", "method", "status", "created_at")
    list_filter = ("status", "method")
    list_select_related = ("project",)
    readonly_fields = ("status", "attempt", "ingest_token_hash", "backend_job_id", "error", "started_at", "finished_at")
