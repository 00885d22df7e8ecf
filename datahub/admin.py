from __future__ import annotations

from django.contrib import admin, messages

from datahub import services, uploads
from datahub.models import Blob, Branch, Commit, Repo, Tag, UploadSession
from studio.admin_services import ServiceDeletes, each_through


class ReadOnly(admin.ModelAdmin):
    """The Data Hub's history is written by its services alone (datahub.repos, datahub.commits,
    datahub.uploads): a commit, blob or tag changed here would leave trees naming bytes that are not
    there, or a ref naming another repo's commit."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class BranchInline(admin.TabularInline):
    model = Branch
    extra = 0
    fields = ("name", "head", "updated_at")
    readonly_fields = fields
    can_delete = False  # the repo page's Delete branch, or the API's DELETE (services.delete_branch)

    def has_add_permission(self, request, obj=None) -> bool:
        return False  # made from a ref, by the API or the repo page (services.create_branch)


@admin.register(Repo)
class RepoAdmin(ReadOnly, ServiceDeletes):
    """Read-only; Delete goes through services.delete_repo, as the API's DELETE: refused while a live
    run uses the repo, its unfinished uploads aborted, and in the audit trail. A repo is made by the
    API or the Data Hub's New repo (with its first commit on main), never here."""

    list_display = ("name", "project", "type", "created_at")
    list_filter = ("type",)
    search_fields = ("name", "project__slug")
    list_select_related = ("project",)
    inlines = [BranchInline]

    def delete_one(self, obj: Repo) -> None:
        services.delete_repo(obj)


@admin.register(Commit)
class CommitAdmin(ReadOnly):
    list_display = ("id", "repo", "author_name", "title", "created_at")
    search_fields = ("id", "repo__name", "message")
    list_select_related = ("repo__project",)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # later commits name it as their parent, and runs as the commit they trained on


@admin.register(Blob)
class BlobAdmin(ReadOnly):
    list_display = ("sha256", "size", "created_at")
    search_fields = ("sha256",)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # `manage.py hub_gc` removes the blobs no tree and no unfinished upload names, bytes and row


@admin.register(Tag)
class TagAdmin(ReadOnly, ServiceDeletes):
    """Read-only; Delete goes through services.delete_tag, as the API's DELETE (refused while a live
    run names the tag, and audited). Tags are made by the API or the repo page, and never move."""

    list_display = ("name", "repo", "commit", "created_at")
    list_select_related = ("repo__project",)

    def delete_one(self, obj: Tag) -> None:
        services.delete_tag(obj.repo, obj.name)


@admin.register(UploadSession)
class UploadSessionAdmin(ReadOnly):
    """Read-only but for the "Abort selected upload sessions" action (uploads.abort_upload, as the
    API's DELETE: the staged files go, and the client is told the session was aborted). Not deleted
    here: hub_gc aborts the idle ones, and a deleted repo's unfinished ones say why they stopped."""

    list_display = ("id", "repo", "branch", "state", "created_at")
    list_filter = ("state",)
    list_select_related = ("project", "repo__project")
    actions = ["abort"]

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Abort selected upload sessions")
    def abort(self, request, queryset) -> None:
        aborted = each_through(self, request, queryset, uploads.abort_upload, "aborted")
        if aborted:
            self.message_user(request, f"Aborted {aborted} upload session(s) (one already aborted stays so).", messages.SUCCESS)
