from __future__ import annotations

from django.contrib import admin

from studio.queue import send_after_commit
from training.models import BackendConnection, GpuPrice, TrainingRun


@admin.register(TrainingRun)
class TrainingRunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "project", "method", "status", "created_at")
    list_filter = ("status", "method")
    list_select_related = ("project",)
    readonly_fields = ("status", "attempt", "ingest_token_hash", "backend_job_id", "error", "started_at", "finished_at",
                       "provisioning_since", "worker_up_at", "interruptions", "gpu_leased_at", "gpu_seconds", "hourly_price", "cost")


@admin.register(BackendConnection)
class BackendConnectionAdmin(admin.ModelAdmin):
    """Tokens are not here: they are project secrets (encrypted at rest), named by token_secret."""

    list_display = ("project", "backend", "enabled", "server_url", "dstack_project", "modal_environment", "last_checked_at", "last_check_error")
    list_filter = ("backend", "enabled")
    list_select_related = ("project",)
    readonly_fields = ("last_checked_at", "last_check_error")

    def save_model(self, request, obj, form, change):
        from training.tasks import verify_backend_connection

        super().save_model(request, obj, form, change)
        # One real call to the backend, from a worker (never in this request).
        # A broker that is down leaves it unchecked (logged): the save itself is done.
        send_after_commit(verify_backend_connection, obj.pk)


@admin.register(GpuPrice)
class GpuPriceAdmin(admin.ModelAdmin):
    list_display = ("gpu_type", "spot", "backend", "price_per_hour")
    list_filter = ("backend", "spot")
    list_editable = ("price_per_hour",)
