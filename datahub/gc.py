"""Garbage collection of blob bytes that no repo uses any more (`manage.py hub_gc`).

Blobs are content addressed and shared by every repo, so deleting a repo leaves them. collect(), in
this order (each step can free what the next one removes),
- aborts an upload session that is open or committing and has had no activity (no chunk, no state
  change, no file stored by its commit: updated_at) for `upload_idle`, as uploads.expire_upload
  says: a client that went away, or a committer that died; its staged chunks go, and its client is
  told why;
- removes, from the local staging dir, `blob-*` temp files (storage.stage_stream's, left by a crash
  mid-write) and the folders of upload sessions that are committed, aborted or gone, once nothing in
  them was written for the grace period (mtime); an unfinished session's folder is never touched;
- removes a Blob row and its bytes when no tree entry names it, no upload file of an unfinished (open or
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
import shutil
import uuid
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.core.files.storage import Storage
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from datahub import storage, uploads
from datahub.models import Blob, TreeEntry, UploadFile, UploadSession, blob_path

DEFAULT_GRACE = timedelta(hours=24)
DEFAULT_UPLOAD_IDLE = timedelta(days=7)
BLOBS = "blobs"
SHA256_RE = re.compile(r"[0-9a-f]{64}")
BATCH = 1000


@dataclass
class Report:
    """What collect() did, or would do on a dry run: (name, bytes) each. `sessions` are the upload
    sessions it aborted (with the bytes they had staged), `staging` the leftovers it removed from
    the staging dir (paths), `blobs` and `strays` the blobs and stray files (storage names)."""

    sessions: list[tuple[str, int]] = field(default_factory=list)
    staging: list[tuple[str, int]] = field(default_factory=list)
    blobs: list[tuple[str, int]] = field(default_factory=list)
    strays: list[tuple[str, int]] = field(default_factory=list)


def unused_blobs(cutoff: datetime, expiring: Collection = ()) -> QuerySet[Blob]:
    """Blobs last used before `cutoff` that no tree entry and no unfinished upload names (counting
    the sessions `expiring` as aborted already: a dry run's)."""
    in_tree = TreeEntry.objects.filter(blob=OuterRef("pk"))
    uploading = UploadFile.objects.filter(blob=OuterRef("pk"), session__state__in=uploads.UNFINISHED)
    if expiring:
        uploading = uploading.exclude(session__in=expiring)
    return Blob.objects.filter(~Exists(in_tree), ~Exists(uploading), used_at__lt=cutoff)


def idle_uploads(idle_since: datetime) -> QuerySet[UploadSession]:
    """Open or committing upload sessions with no activity since `idle_since`."""
    return UploadSession.objects.filter(state__in=uploads.UNFINISHED, updated_at__lt=idle_since)


def spell(period: timedelta) -> str:
    """7 days, 1.5 days, 36 hours, 1 minute: the largest unit the period fills at least once."""
    seconds = period.total_seconds()
    unit, size = next(((u, s) for u, s in (("day", 86400), ("hour", 3600), ("minute", 60)) if seconds >= s), ("second", 1))
    value = round(seconds / size, 2)
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


def collect(grace: timedelta = DEFAULT_GRACE, dry_run: bool = False, upload_idle: timedelta = DEFAULT_UPLOAD_IDLE) -> Report:
    """Abort the upload sessions idle for `upload_idle`, then remove the staging leftovers, the
    unused blobs and the stray files older than `grace` (change nothing on a dry run)."""
    now = timezone.now()
    cutoff = now - grace
    report = Report()
    reason = f"it had no activity for {spell(upload_idle)}"
    expiring = list(idle_uploads(now - upload_idle).values_list("pk", flat=True))
    for session_id in expiring:
        size = _size(uploads.staged_path(session_id))
        if dry_run or uploads.expire_upload(session_id, now - upload_idle, reason):
            report.sessions.append((f"upload session {session_id}", size))
    for path, size in staging_leftovers(cutoff):
        if not dry_run:
            _remove_path(path)
        report.staging.append((str(path), size))
    for sha, size in _batches(unused_blobs(cutoff, expiring if dry_run else ()).values_list("pk", "size")):
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


def staging_leftovers(cutoff: datetime) -> Iterator[tuple[Path, int]]:
    """Temp files of storage.stage_stream and folders of finished or deleted upload sessions in the
    staging dir, unchanged since `cutoff`. A folder with no session row may be one that
    create_upload is making (its row not yet committed): the grace period keeps it, and so would
    session_dir, which makes the folder again when a chunk finds it gone. A temp file is written
    to until its writer moves it into the blob storage (put_staged touches it first), so only a
    grace period of 0 can take one from a live writer (whose commit then fails)."""
    root = storage.staging_dir()
    for path in sorted(root.glob("blob-*")):
        if path.is_file() and _mtime(path) < cutoff:
            yield path, _size(path)
    folders: dict[uuid.UUID, Path] = {}
    for path in sorted(uploads.uploads_dir().glob("*")):
        try:
            session_id = uuid.UUID(path.name)
        except ValueError:
            continue
        if str(session_id) == path.name:  # else not a session's folder, and not ours to remove
            folders[session_id] = path
    ids = list(folders)
    for start in range(0, len(ids), BATCH):
        chunk = ids[start:start + BATCH]
        unfinished = set(UploadSession.objects.filter(pk__in=chunk, state__in=uploads.UNFINISHED).values_list("pk", flat=True))
        for session_id in chunk:
            path = folders[session_id]
            if session_id not in unfinished and path.is_dir() and _mtime(path) < cutoff:
                yield path, _size(path)


def _remove_path(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _mtime(path: Path) -> datetime:
    """When anything in `path` (a file, or a folder and the files in it) was last written."""
    try:
        stamps = [path.stat().st_mtime] + ([p.stat().st_mtime for p in path.iterdir()] if path.is_dir() else [])
    except FileNotFoundError:  # removed meanwhile (a commit or an abort discarding it): nothing to do
        return timezone.now()
    return datetime.fromtimestamp(max(stamps), tz=UTC)


def _size(path: Path) -> int:
    """The bytes in a file, or in the files of a folder (0 when it is not there)."""
    try:
        return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size
    except FileNotFoundError:
        return 0


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
