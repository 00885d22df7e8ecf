from __future__ import annotations

from django.contrib import admin
from django.db import transaction

from studio.models import ApiToken, AuditEvent, Membership, Plan, Project, ProjectSecret
from studio.services import remove_member, revoke_member_tokens


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ("name", "includes_training", "max_concurrent_runs", "max_gpus_per_run")


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "plan", "created_at")
    list_select_related = ("plan",)
    inlines = [MembershipInline]

    def save_formset(self, request, form, formset, change) -> None:
        """A member taken out here (a deleted row, or a row given to another user) loses their
        tokens for the project, as remove_member does: a later re-invite must not revive them."""
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        with transaction.atomic():
            memberships = formset.save(commit=False)
            for gone in formset.deleted_objects:
                remove_member(gone.project, gone.user)
            for row in formset.forms:
                if row.instance.pk and "user" in row.changed_data and row not in formset.deleted_forms:
                    revoke_member_tokens(row.instance.project, row.initial["user"])
            for membership in memberships:
                membership.save()
            formset.save_m2m()


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "token_hash", "created_at", "last_used_at")
    list_select_related = ("user", "project")

    def has_add_permission(self, request) -> bool:
        return False  # tokens are made with `createapitoken`, which shows the plaintext once

    def get_readonly_fields(self, request, obj=None) -> tuple[str, ...]:
        # An existing token's plaintext is already out there: given to another user or project, it
        # would act there for whoever holds it, and the audit log would credit the new user. To move
        # access, revoke the token (revoked at) and make a new one.
        return (*self.readonly_fields, "user", "project") if obj is not None else tuple(self.readonly_fields)


@admin.register(ProjectSecret)
class ProjectSecretAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "updated_at")
    fields = ("project", "name", "updated_at")
    readonly_fields = ("project", "name", "updated_at")

    def has_add_permission(self, request) -> bool:
        return False  # values are written through the API; the admin never shows them


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
