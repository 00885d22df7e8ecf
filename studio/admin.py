from __future__ import annotations

from django.contrib import admin

from studio.models import ApiToken, Membership, Plan, Project, ProjectSecret


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
