"""What the Django admin's pages share so that a staff user's edit there is no back door around the
services: a delete that goes through the service the API's DELETE calls (its refusals shown as the
admin's error message), and an audit event for each edit of a row that no service writes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected as confirm_delete_selected
from django.contrib.admin.utils import unquote
from django.db import models, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from studio import audit
from studio.errors import ApiError
from studio.models import AuditEvent


def refusal(obj: Any, done: str, exc: ApiError) -> str:
    """The admin's error message for a service's refusal to have `obj` `done` ("deleted"): the
    service's sentence and each finding, which say what to do."""
    reasons = "; ".join(f"{finding.field}: {finding.message}" for finding in exc.errors)
    return f"{obj} was not {done}: {exc.detail}{' (' + reasons + ')' if reasons else ''}"


def each_through(modeladmin: admin.ModelAdmin, request: HttpRequest, rows: Iterable[Any], service: Callable[[Any], Any], done: str) -> int:
    """An admin action's work: `service` (stop_run, delete_run, ...) on each row. Each service holds
    its own transaction (and does its slow I/O after it), so a row it refuses stays as it was, the
    admin says why (`done`: what the row was not, "stopped"), and the others are done. How many were."""
    count = 0
    for obj in rows:
        try:
            service(obj)
            count += 1
        except ApiError as exc:
            modeladmin.message_user(request, refusal(obj, done, exc), messages.ERROR)
    return count


class ServiceDeletes(admin.ModelAdmin):
    """Delete through `delete_one` (the service the API's DELETE calls: its checks, its side effects,
    its audit event), on the change page's Delete and in the "Delete selected" action alike. A row the
    service refuses (a 409: a live run uses it, say) stays, and the admin says why."""

    def delete_one(self, obj: Any) -> None:
        raise NotImplementedError

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.delete_one(obj)

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> tuple[list, dict, set, list]:
        """What the confirmation page lists, without Django's own refusals: the service deletes in its
        order (a repo's refs before the commits they protect) the rows that the admin lets nobody
        delete one by one (a commit), and refuses, with its reasons, what must not go."""
        to_delete, model_count, _perms_needed, _protected = super().get_deleted_objects(objs, request)
        return to_delete, model_count, set(), []

    def delete_queryset(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        raise NotImplementedError("delete_selected goes through delete_one, row by row")

    def delete_view(self, request: HttpRequest, object_id: str, extra_context: dict | None = None) -> HttpResponse:
        try:
            return super().delete_view(request, object_id, extra_context)
        except ApiError as exc:  # the admin's own transaction rolled back with it: its log entry too
            self.message_user(request, refusal(self.get_object(request, unquote(object_id)) or object_id, "deleted", exc), messages.ERROR)
            opts = self.model._meta
            return HttpResponseRedirect(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[object_id], current_app=self.admin_site.name))

    @admin.action(permissions=["delete"], description="Delete selected %(verbose_name_plural)s")
    def delete_selected(self, request: HttpRequest, queryset: models.QuerySet) -> HttpResponse | None:
        if not request.POST.get("post"):
            return confirm_delete_selected(self, request, queryset)  # Django's confirmation page, which posts back here
        deleted = each_through(self, request, queryset, self.delete_one, "deleted")
        if deleted:
            opts = self.model._meta
            self.message_user(request, f"Deleted {deleted} {opts.verbose_name if deleted == 1 else opts.verbose_name_plural}.", messages.SUCCESS)
        return None

    def get_actions(self, request: HttpRequest) -> dict:
        actions = super().get_actions(request)
        if "delete_selected" in actions and self.has_delete_permission(request):
            actions["delete_selected"] = self.get_action("delete_selected")  # this class's, not the site's
        return actions


def _plain(value: Any) -> Any:
    """A field's value as the audit event's details show it (JSON): a related row by its name."""
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    return str(value)  # a Decimal price, a plan, a project


class AuditedEdits(admin.ModelAdmin):
    """For rows that no service writes, so the admin is where they change (a plan's limits, a project's
    plan, a backend connection, a GPU price): each add, change and delete here is one audit event, the
    changed fields in its details with their values before and after. A save that changes no field
    (a project's form saved for its members alone) records nothing of its own."""

    def audit_name(self, obj: Any) -> str:
        return str(obj)

    def audit_project(self, obj: Any) -> Any:
        return getattr(obj, "project", None)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        # The admin saves inside its own transaction: the event commits or rolls back with the change.
        before = type(obj).objects.filter(pk=obj.pk).first() if change else None
        super().save_model(request, obj, form, change)
        fields = [name for name in form.changed_data if name in {f.name for f in obj._meta.concrete_fields}]
        if change and not fields:
            return
        changes = {name: {"from": _plain(getattr(before, name, None)), "to": _plain(getattr(obj, name))} for name in fields}
        audit.record(AuditEvent.Action.UPDATED if change else AuditEvent.Action.CREATED, obj,
                     project=self.audit_project(obj), name=self.audit_name(obj), details={"changes": changes})

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self._record_delete(obj)
        super().delete_model(request, obj)

    def delete_queryset(self, request: HttpRequest, queryset: models.QuerySet) -> None:
        with transaction.atomic():
            for obj in queryset:
                self._record_delete(obj)
            super().delete_queryset(request, queryset)

    def _record_delete(self, obj: Any) -> None:
        project = self.audit_project(obj)
        # While the row has its pk; a project's own event keeps its slug, the row's project goes with it.
        audit.record(AuditEvent.Action.DELETED, obj, project=project, name=self.audit_name(obj))
