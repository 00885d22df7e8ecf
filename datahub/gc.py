"""Garbage collection of blob bytes that no repo uses any more (`manage.py hub_gc`).

Blobs are content addressed and shared by every repo, so deleting a repo leaves them. collect()
removes
- a Blob row and its bytes when no tree entry names it, no upload file of an unfinished (open or
  committing) upload session names it, and no writer has used it for the grace period (used_at);
- a file under blobs/ in the blob storage that no Blob row names (a crash between storing the bytes
  and recording their row), once it is older than the grace period (its mtime).

Why a grace period: a writer stores bytes first and names them later. put_staged moves a file into
place before store_staged makes its row; commit_files stores every file of a commit (hashing can
take minutes) before commit_blobs writes the tree entries; an upload's commit stores each staged
file before recording it on its upload file. In each gap bytes exist that nothing names yet. So
store_staged sets used_at, also when it reuses a blob that was already there (one a deleted repo
left long ago, whose created_at says nothing about the commit in flight), and put_staged gives the
file it stores the current mtime: a writer's blob is never a candidate until `grace` after it.

Why locks as well: a commit slower than the grace period, or a run with --grace-hours 0, must still
never leave a tree naming bytes that are gone. Each blob goes in its own transaction, which locks its
row, then checks again, in new statements that see every commit made meanwhile, that nothing names
it and that it is still old, and deletes its bytes before its row's delete commits. commit_blobs
locks the rows of the blobs it adds, so the collector either waits for that commit and then sees
its tree entries, or took the blob first and the commit is a 409 naming the file (nothing lost: the
client still has the bytes). store_staged checks the bytes under the same lock and writes them again
when they went. A stray file has no row to lock: the collector inserts one of its sha256 while it
deletes the file (a claim); a writer's insert of that row waits for the claim, then finds the bytes
gone and writes them again. On PostgreSQL these are row locks (a unique-key wait for the claim). On
SQLite (the embedded default) select_for_update does nothing, but every transaction is IMMEDIATE
(studio.settings) and takes the database's write lock when it begins, so they run one at a time.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.files.storage import Storage
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from datahub import storage
from datahub.models import Blob, TreeEntry, UploadFile, UploadSession, blob_path

DEFAULT_GRACE = timedelta(hours=24)
BLOBS = "blobs"
SHA256_RE = re.compile(r"[0-9a-f]{64}")
UNFINISHED = (UploadSession.State.OPEN, UploadSession.State.COMMITTING)
BATCH = 1000


@dataclass
class Report:
    """What collect() removed, or would remove on a dry run: (storage name, bytes) each."""

    blobs: list[tuple[str, int]] = field(default_factory=list)
    strays: list[tuple[str, int]] = field(default_factory=list)


def unused_blobs(cutoff: datetime) -> QuerySet[Blob]:
    """Blobs last used before `cutoff` that no tree entry and no unfinished upload names."""
    in_tree = TreeEntry.objects.filter(blob=OuterRef("pk"))
    uploading = UploadFile.objects.filter(blob=OuterRef("pk"), session__state__in=UNFINISHED)
    return Blob.objects.filter(~Exists(in_tree), ~Exists(uploading), used_at__lt=cutoff)


def collect(grace: timedelta = DEFAULT_GRACE, dry_run: bool = False) -> Report:
    """Remove the unused blobs and the stray files older than `grace` (nothing on a dry run)."""
    cutoff = timezone.now() - grace
    report = Report()
    for sha, size in _batches(unused_blobs(cutoff).values_list("pk", "size")):
        if dry_run or _remove_blob(sha, cutoff):
            report.blobs.append((blob_path(sha), size))
    store = storage.blob_storage()
    names = list(_files(store, BLOBS))
    for start in range(0, len(names), BATCH):
        chunk = names[start:start + BATCH]
        recorded = set(Blob.objects.filter(pk__in=[_sha_of(n) for n in chunk]).values_list("pk", flat=True))
        for name in chunk:
            sha = _sha_of(name)
            if (sha in recorded and name == blob_path(sha)) or store.get_modified_time(name) >= cutoff:
                continue
            size = store.size(name)
            if dry_run or _remove_stray(store, name, sha):
                report.strays.append((name, size))
    return report


def _remove_blob(sha: str, cutoff: datetime) -> bool:
    """Delete an unused blob's row and bytes; False when a writer uses it again meanwhile."""
    with transaction.atomic():
        # Waits for a commit adding this blob (commit_blobs) or a writer reusing it (store_staged)
        # to finish; the check below is a new statement, which sees what they committed.
        Blob.objects.select_for_update().filter(pk=sha).values_list("pk", flat=True).first()
        blob = unused_blobs(cutoff).filter(pk=sha).first()
        if blob is None:
            return False
        name = blob.storage_name
        blob.delete()  # upload files of finished sessions that named it let go of it (SET_NULL)
        # The bytes go before the row's delete commits: a writer that finds the row finds them too.
        storage.blob_storage().delete(name)
    return True


def _remove_stray(store: Storage, name: str, sha: str) -> bool:
    """Delete a file that no Blob row names; False when a writer records it as a blob meanwhile."""
    if name != blob_path(sha) or not SHA256_RE.fullmatch(sha):
        store.delete(name)  # not at a blob's name (e.g. the copy of a writer that lost a race): no one reads it
        return True
    with transaction.atomic():
        try:
            with transaction.atomic():
                Blob.objects.create(sha256=sha, size=0)  # the claim: a writer's row for these bytes waits for it
        except IntegrityError:
            return False  # a writer recorded these bytes since they were listed: a blob now
        store.delete(name)
        Blob.objects.filter(pk=sha).delete()
    return True


def _batches(rows: QuerySet) -> Iterator[tuple[str, int]]:
    """The rows in pk order, BATCH at a time, without holding a cursor open across the deletes."""
    after = ""
    while batch := list(rows.filter(pk__gt=after).order_by("pk")[:BATCH]):
        yield from batch
        after = batch[-1][0]


def _files(store: Storage, folder: str) -> Iterator[str]:
    try:
        folders, files = store.listdir(folder)
    except FileNotFoundError:  # nothing stored yet
        return
    for name in files:
        yield f"{folder}/{name}"
    for sub in folders:
        yield from _files(store, f"{folder}/{sub}")


def _sha_of(name: str) -> str:
    return name.rsplit("/", 1)[-1]
