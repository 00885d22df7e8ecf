from __future__ import annotations

from django.contrib import admin, messages
from django.db import transaction

from studio import webhooks
from studio.admin_services import AuditedEdits
from studio.models import ApiToken, AuditEvent, Membership, Plan, Project, ProjectSecret, Webhook, WebhookDelivery
from studio.services import add_member, delete_secret, remove_member, revoke_api_token


@admin.register(Plan)
class PlanAdmin(AuditedEdits):
    """Each add, change and delete of a plan (its limits gate every START) is in the audit trail."""

    list_display = ("name", "includes_training", "max_concurrent_runs", "max_gpus_per_run")


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    fields = ("user", "role", "joined_at", "last_used_at")
    readonly_fields = ("joined_at", "last_used_at")  # the services keep them


@admin.register(Project)
class ProjectAdmin(AuditedEdits):
    """A change of the project's own fields (its plan, its slug) is in the audit trail (AuditedEdits),
    and each change of its members (the inline) is, through the services."""

    list_display = ("slug", "name", "plan", "created_at")
    list_select_related = ("plan",)
    inlines = [MembershipInline]

    def audit_project(self, obj: Project) -> Project:
        return obj

    def save_formset(self, request, form, formset, change) -> None:
        """The Membership inline's rows go through the services, as any other change of members:
        a member taken out here (a deleted row, or a row given to another user) loses their tokens
        for the project (remove_member: a later re-invite must not revive them), and each addition,
        removal and role change is in the audit trail once."""
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        with transaction.atomic():
            memberships = formset.save(commit=False)
            for gone in formset.deleted_objects:
                remove_member(gone.project, gone.user)
            for membership in memberships:
                row = next(row for row in formset.forms if row.instance is membership)
                if membership.pk and "user" in row.changed_data:  # the row given to another user
                    previous = Membership.objects.get(pk=membership.pk)
                    remove_member(previous.project, previous.user)
                    membership.pk = None
                add_member(membership.project, membership.user, membership.role)
            formset.save_m2m()


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Read-only but for the "Revoke selected tokens" action (revoke_api_token, which the audit
    trail records): a token is not moved, renamed, revived or deleted here."""

    list_display = ("prefix", "name", "user", "project", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("project", "user", "name", "prefix", "token_hash", "created_at", "last_used_at", "revoked_at")
    list_select_related = ("user", "project")
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # tokens are made with `createapitoken`, which shows the plaintext once

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead: the row says who held the token, for the audit trail

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset) -> None:
        revoked = sum(revoke_api_token(token) for token in queryset.select_related("user", "project"))
        self.message_user(request, f"Revoked {revoked} token(s); {queryset.count() - revoked} already were.", messages.SUCCESS)


@admin.register(ProjectSecret)
class ProjectSecretAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "updated_at")
    fields = ("project", "name", "updated_at")
    readonly_fields = ("project", "name", "updated_at")

    def has_add_permission(self, request) -> bool:
        return False  # values are written through the API; the admin never shows them

    def delete_model(self, request, obj) -> None:
        delete_secret(obj.project, obj.name)  # audited, as the API's DELETE

    def delete_queryset(self, request, queryset) -> None:
        with transaction.atomic():
            for secret in queryset.select_related("project"):
                delete_secret(secret.project, secret.name)


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Read-only: the trail is written by the services and never edited."""

    list_display = ("created_at", "actor_name", "via", "project_slug", "action", "target_type", "target_id", "target_name")
    list_filter = ("action", "target_type")
    search_fields = ("actor_name", "project_slug", "target_name", "target_id")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    """Enable, disable or delete one, through the services (audited); its signing secret is never
    shown here, its ciphertext neither: the Studio shows the secret once, to whoever adds the webhook."""

    list_display = ("url", "project", "active", "event_names", "created_by", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "project__slug")
    list_select_related = ("project", "created_by")
    fields = ("project", "url", "event_names", "active", "created_by", "created_at")  # not secret_ciphertext
    readonly_fields = ("project", "url", "event_names", "created_by", "created_at")

    @admin.display(description="events")
    def event_names(self, obj: Webhook) -> str:
        return ", ".join(obj.events)

    def has_add_permission(self, request) -> bool:
        return False  # added in Settings → Webhooks or through the API, which make the secret and show it once

    def save_model(self, request, obj, form, change) -> None:
        webhooks.set_webhook_active(Webhook.objects.get(pk=obj.pk), obj.active)  # as its Enable / Disable buttons

    def delete_model(self, request, obj) -> None:
        webhooks.delete_webhook(obj)

    def delete_queryset(self, request, queryset) -> None:
        with transaction.atomic():
            for webhook in queryset:
                webhooks.delete_webhook(webhook)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """Read-only: the worker records each try (studio.webhooks.attempt_delivery)."""

    list_display = ("id", "webhook", "event", "last_status_code", "attempts", "delivered_at", "last_error", "created_at")
    list_filter = ("event",)
    search_fields = ("webhook__url", "webhook__project__slug")
    list_select_related = ("webhook__project",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # deleted with its webhook, or as one of the oldest (DELIVERIES_KEPT)
