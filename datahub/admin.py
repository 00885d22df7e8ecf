from __future__ import annotations

from django.contrib import admin

from datahub.models import Blob, Branch, Commit, Repo, Tag, UploadSession


class BranchInline(admin.TabularInline):
    model = Branch
    extra = 0
    fields = ("name", "head", "updated_at")
    readonly_fields = fields
    can_delete = False


@admin.register(Repo)
class RepoAdmin(admin.ModelAdmin):
    list_display = ("name", "project", "type", "created_at")
    list_filter = ("type",)
    search_fields = ("name", "project__slug")
    inlines = [BranchInline]


@admin.register(Commit)
class CommitAdmin(admin.ModelAdmin):
    list_display = ("id", "repo", "author_name", "title", "created_at")
    search_fields = ("id", "repo__name", "message")
    readonly_fields = ("id", "repo", "parents", "author", "author_name", "message", "created_at")


@admin.register(Blob)
class BlobAdmin(admin.ModelAdmin):
    list_display = ("sha256", "size", "created_at")
    search_fields = ("sha256",)
    readonly_fields = ("sha256", "size", "created_at")


@admin.register(Tag)
class TagAdmin(admin.ModelAdmin):
    list_display = ("name", "repo", "commit", "created_at")


@admin.register(UploadSession)
class UploadSessionAdmin(admin.ModelAdmin):
    list_display = ("id", "repo", "branch", "state", "created_at")
    list_filter = ("state",)
