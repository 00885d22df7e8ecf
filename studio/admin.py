from __future__ import annotations

from django.contrib import admin

from studio.models import ApiToken, AuditEvent, Membership, Plan, Project, ProjectSecret


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


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "project", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "token_hash", "created_at", "last_used_at")
    list_select_related = ("user", "project")

    def has_add_permission(self, request) -> bool:
        return False  # tokens are made with `createapitoken`, which shows the plaintext once


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
