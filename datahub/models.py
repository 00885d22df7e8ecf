"""The Data Hub: versioned repos (model, dataset, experiment, environment) owned by a project.

A commit is a full snapshot: its tree entries map every path to a blob. Blobs are content
addressed by sha256 and shared by every repo of every project, so the same bytes are stored once.
Branch heads move only inside datahub.commits.commit_blobs, under a row lock on the branch.
"""
from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models.functions import Lower
from django.utils import timezone

from studio.models import Project

# \Z, not $: $ also matches before a trailing newline ("v1\n" was stored as a tag no ref could name).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z"


class RepoType(models.TextChoices):
    MODEL = "model"
    DATASET = "dataset"
    EXPERIMENT = "experiment"
    ENVIRONMENT = "environment"


class Repo(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="hub_repos")
    name = models.CharField(max_length=128)
    type = models.CharField(max_length=16, choices=RepoType.choices, default=RepoType.MODEL)
    description = models.TextField(blank=True)
    default_branch = models.CharField(max_length=96, default="main")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="hub_repo_name_per_project"),
            # UPPER and upper share a huggingface_hub cache folder on a case-insensitive disk
            # (macOS, Windows), so a project's repo names differ in more than case. Lookups stay exact.
            models.UniqueConstraint(Lower("name"), "project", name="hub_repo_name_per_project_any_case"),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.full_name

    @property
    def full_name(self) -> str:
        """The HF-style repo id: `<project-slug>/<name>`."""
        return f"{self.project.slug}/{self.name}"


class Blob(models.Model):
    """Bytes stored once, at blob_path(sha256) in the Data Hub storage. They stay when the repos
    that named them are deleted, until `manage.py hub_gc` (datahub.gc) removes the blobs no tree
    and no unfinished upload names."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    size = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    # When a writer last stored or reused these bytes (commits.store_staged): hub_gc's grace
    # period counts from here, which covers the time until the writer's commit names the blob.
    used_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.sha256[:12]} ({self.size} B)"

    @property
    def storage_name(self) -> str:
        return blob_path(self.sha256)


def blob_path(sha256: str) -> str:
    return f"blobs/{sha256[:2]}/{sha256[2:4]}/{sha256}"


class Commit(models.Model):
    id = models.CharField(max_length=40, primary_key=True)  # 40 hex digits, like a git sha1
    repo = models.ForeignKey(Repo, on_delete=models.CASCADE, related_name="commits")
    parents = models.JSONField(default=list, blank=True)  # ids of parent commits, first parent first
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    author_name = models.CharField(max_length=200, blank=True)
    message = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.repo}@{self.id[:10]}"

    @property
    def title(self) -> str:
        return (self.message or "").splitlines()[0] if self.message else ""


class TreeEntry(models.Model):
    commit = models.ForeignKey(Commit, on_delete=models.CASCADE, related_name="entries")
    path = models.CharField(max_length=1024)
    blob = models.ForeignKey(Blob, on_delete=models.PROTECT, related_name="entries")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["commit", "path"], name="hub_tree_path_once")]
        ordering = ["path"]


class Branch(models.Model):
    repo = models.ForeignKey(Repo, on_delete=models.CASCADE, related_name="branches")
    name = models.CharField(max_length=128)
    head = models.ForeignKey(Commit, on_delete=models.PROTECT, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["repo", "name"], name="hub_branch_name_per_repo")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.repo}:{self.name}"


class Tag(models.Model):
    repo = models.ForeignKey(Repo, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=128)
    commit = models.ForeignKey(Commit, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["repo", "name"], name="hub_tag_name_per_repo")]
        ordering = ["name"]


class UploadSession(models.Model):
    """A resumable upload: files are staged on local disk chunk by chunk and become visible only
    when the session is committed (then the staged files are hashed into blobs)."""

    class State(models.TextChoices):
        OPEN = "open"
        COMMITTING = "committing"
        COMMITTED = "committed"
        ABORTED = "aborted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Deleting the repo aborts its unfinished sessions and keeps them (repo becomes null), so their
    # client is told why (abort_reason) rather than "no such upload session"; project and repo_name
    # still say whose session it is and which repo it was for.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="+")
    repo = models.ForeignKey(Repo, null=True, blank=True, on_delete=models.SET_NULL, related_name="uploads")
    repo_name = models.CharField(max_length=128)
    branch = models.CharField(max_length=96)
    message = models.TextField(blank=True)
    parent = models.CharField(max_length=40, blank=True, help_text="When set, the commit step requires the branch to still be here.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    commit = models.ForeignKey(Commit, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    abort_reason = models.CharField(max_length=200, blank=True, help_text="Why the Studio aborted it (hub_gc, a deleted repo), e.g. \"it had no activity for 7 days\"; blank when its client did.")
    created_at = models.DateTimeField(auto_now_add=True)
    # The last activity: every chunk and every state change sets it (they write with update(), which
    # auto_now does not see, so they set it themselves); hub_gc aborts an unfinished session idle too long.
    updated_at = models.DateTimeField(auto_now=True)

    @property
    def repo_full_name(self) -> str:
        """The repo's `<project>/<name>`, also once the repo is deleted."""
        return f"{self.project.slug}/{self.repo_name}"


class UploadFile(models.Model):
    session = models.ForeignKey(UploadSession, on_delete=models.CASCADE, related_name="files")
    index = models.PositiveIntegerField()
    path = models.CharField(max_length=1024)
    size = models.BigIntegerField()
    received = models.BigIntegerField(default=0)
    sha256 = models.CharField(max_length=64, blank=True)  # optional, checked at commit when given
    blob = models.ForeignKey(Blob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")  # once stored

    class Meta:
        constraints = [models.UniqueConstraint(fields=["session", "index"], name="hub_upload_file_index")]
        ordering = ["index"]

    @property
    def complete(self) -> bool:
        return self.received == self.size
