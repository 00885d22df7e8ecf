"""Blob bytes, through Django's storage API.

The Data Hub uses the `datahub` entry of settings.STORAGES when there is one (e.g.
`storages.backends.s3.S3Storage` for an S3-compatible bucket), else a FileSystemStorage under
DATAHUB_ROOT (default var/hub). Upload sessions stage their chunks on local disk under
DATAHUB_STAGING_DIR: the storage API has no append, and a half-finished upload must never be a blob.

Nothing here holds a whole file in memory: bytes move in CHUNK_SIZE pieces.
"""
from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from django.conf import settings
from django.core.files import File
from django.core.files.storage import FileSystemStorage, Storage, storages

from studio.errors import Finding, InsufficientStorage

CHUNK_SIZE = 1024 * 1024
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left; over a quota: the same to whoever writes


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def disk_full_error(exc: BaseException | None, field: str, then: str) -> InsufficientStorage:
    """The 507 for a write that met a full disk (`exc`, the OSError): nothing was committed, free
    space, then `then`."""
    return InsufficientStorage(
        f"The Studio's disk is full ({getattr(exc, 'strerror', None) or 'no space left on device'}): nothing was committed.",
        [Finding(field, f"the Studio's disk is full, so nothing was committed: free space on it (or ask your Studio admin to), then {then}")],
    )


def hub_root() -> Path:
    return Path(getattr(settings, "DATAHUB_ROOT", None) or Path(settings.VAR_DIR) / "hub")


def blob_storage() -> Storage:
    if "datahub" in settings.STORAGES:
        return storages["datahub"]
    return FileSystemStorage(location=hub_root(), file_permissions_mode=0o644)


def staging_dir() -> Path:
    path = Path(getattr(settings, "DATAHUB_STAGING_DIR", None) or hub_root() / "staging")
    path.mkdir(parents=True, exist_ok=True)
    return path


class _StagedFile(File):
    """A File with temporary_file_path(): FileSystemStorage then moves it into place instead of
    copying (other storages stream it in chunks)."""

    def temporary_file_path(self) -> str:
        return self.file.name


@dataclass(frozen=True)
class Staged:
    path: Path
    sha256: str
    size: int


def stage_stream(source: IO[bytes] | BinaryIO) -> Staged:
    """Copy `source` to a temp file under the staging dir, hashing as it goes."""
    digest, size = hashlib.sha256(), 0
    fd, name = tempfile.mkstemp(dir=staging_dir(), prefix="blob-")
    try:
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = source.read(CHUNK_SIZE)
                if not chunk:
                    break
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
    except BaseException:
        os.unlink(name)
        raise
    return Staged(Path(name), digest.hexdigest(), size)


def hash_file(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK_SIZE):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def put_staged(staged_path: Path, name: str, keep_on_error: bool = False) -> bool:
    """Move a staged file to `name` in the blob storage and return True, unless those bytes are
    already there: then False, and the staged file is left to the caller (commits.store_staged
    keeps it until the blob's row holds, as hub_gc may remove bytes that no row names yet).
    Content addressing makes a concurrent writer of the same name harmless: same bytes.
    After a move the staged file is gone, unless the move failed and `keep_on_error` (an upload
    session's file, which its client commits again once the storage has room)."""
    storage = blob_storage()
    if storage.exists(name):
        return False
    failed = False
    try:
        # The stored file keeps the staged file's mtime (a rename, or a copy with copystat), and
        # hub_gc's grace period for a file with no Blob row counts from it: from now, then, not
        # from when an upload's last chunk arrived, perhaps days ago.
        os.utime(staged_path)
        try:
            with open(staged_path, "rb") as fh:
                saved = storage.save(name, _StagedFile(fh, name=str(staged_path)))
        except BaseException:
            failed = True
            # A save that failed part-way (a full disk) can leave a short file under the
            # content-addressed name, which would then pass exists() for bytes it does not hold.
            if storage.exists(name) and storage.size(name) != staged_path.stat().st_size:
                storage.delete(name)
            raise
        if saved != name:  # lost a race to another writer of the same bytes
            storage.delete(saved)
    finally:
        if staged_path.exists() and not (failed and keep_on_error):
            staged_path.unlink()
    return True


def open_blob(name: str) -> IO[bytes]:
    return blob_storage().open(name, "rb")


def iter_range(fh: IO[bytes], start: int, length: int) -> Iterator[bytes]:
    fh.seek(start)
    left = length
    try:
        while left > 0:
            chunk = fh.read(min(CHUNK_SIZE, left))
            if not chunk:
                break
            left -= len(chunk)
            yield chunk
    finally:
        fh.close()
