from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from studio.admin_services import AuditedEdits, ServiceDeletes, each_through
from studio.queue import send_after_commit
from training import services
from training.backends import connections
from training.models import BackendConnection, GpuPrice, TrainingRun


@admin.register(TrainingRun)
class TrainingRunAdmin(ServiceDeletes):
    """Read-only but for the "Stop selected runs" action and Delete, which go through the run services
    as the API's STOP and DELETE do: stop_run stops the backend job, delete_run refuses a live run (STOP
    it first) and removes the run's folder, and each is in the audit trail. A run's settings change
    through its Edit form or the API's PATCH (update_run, which validates them and refuses a run that is
    starting or running); a run is made with New run or the API (create_run: the plan, the checks, its
    Data Hub branch)."""

    list_display = ("id", "name", "project", "method", "status", "created_at")
    list_filter = ("status", "method")
    list_select_related = ("project",)
    actions = ["stop"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def delete_one(self, obj: TrainingRun) -> None:
        services.delete_run(obj)

    @admin.action(description="Stop selected runs")
    def stop(self, request, queryset) -> None:
        stopped = each_through(self, request, queryset.select_related("project"), services.stop_run, "stopped")
        if stopped:
            self.message_user(request, f"Stopped {stopped} run(s) (a START no worker had claimed is withdrawn: that run stays queued).", messages.SUCCESS)


class BackendConnectionForm(forms.ModelForm):
    def clean(self) -> dict:
        """A connection that runs go through is not disabled, given another backend or moved to
        another project (connections.runs_through): the Studio could no longer poll or stop their jobs."""
        cleaned = super().clean()
        stored = BackendConnection.objects.filter(pk=self.instance.pk).first()
        moved = stored is not None and stored.enabled and (
            not cleaned.get("enabled") or cleaned.get("backend") != stored.backend or cleaned.get("project") != stored.project)
        if moved and (findings := connections.runs_through(stored)):
            raise forms.ValidationError([f"{finding.message}, then disable or change the connection" for finding in findings])
        return cleaned


@admin.register(BackendConnection)
class BackendConnectionAdmin(ServiceDeletes, AuditedEdits):
    """Tokens are not here: they are project secrets (encrypted at rest), named by token_secret.
    Each add, change and delete is in the audit trail; one that runs go through is not deleted,
    disabled or moved while they run (connections.runs_through)."""

    form = BackendConnectionForm

    list_display = ("project", "backend", "enabled", "server_url", "dstack_project", "modal_environment", "last_checked_at", "last_check_error")
    list_filter = ("backend", "enabled")
    list_select_related = ("project",)
    readonly_fields = ("last_checked_at", "last_check_error")

    def delete_one(self, obj: BackendConnection) -> None:
        connections.delete_connection(obj)

    def save_model(self, request, obj, form, change):
        from training.tasks import verify_backend_connection

        super().save_model(request, obj, form, change)
        # One real call to the backend, from a worker (never in this request).
        # A broker that is down leaves it unchecked (logged): the save itself is done.
        send_after_commit(verify_backend_connection, obj.pk)


@admin.register(GpuPrice)
class GpuPriceAdmin(AuditedEdits):
    """Each add, change (the list's price column too) and delete is in the audit trail: the price
    sets what runs cost from their next GPU lease on."""

    list_display = ("gpu_type", "spot", "backend", "price_per_hour")
    list_filter = ("backend", "spot")
    list_editable = ("price_per_hour",)

    def audit_name(self, obj: GpuPrice) -> str:
        return f"{obj.gpu_type}{' spot' if obj.spot else ''} on {obj.backend or 'any backend'}"
