"""A commit's files (or one folder's) as a folder on this machine, for what loads weights only from a
path: Try it's generator (training.playground) over a Data Hub base model, or over the weights a dstack
or Modal job committed to its run's branch.

Checkouts are cached under DATAHUB_CHECKOUT_DIR, one folder per commit and folder: a commit's files
never change, so a checkout is reused by every later ask. Each is written in a temporary folder and
renamed into place, so a reader never sees half of one; two writers at once both write, and the
second rename loses harmlessly to the first. Past DATAHUB_CHECKOUT_MAX_BYTES the least recently used
go. A checkout in use holds a shared lock on its lock file, which eviction takes exclusively (without
waiting) before it deletes one: an answer never loses its weights while its generator reads them.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from django.conf import settings

from datahub.archives import blob_chunks, members_of
from datahub.models import TreeEntry

# A temporary folder older than this was left by a writer that died (a worker killed mid-copy).
STALE_TMP_SECONDS = 6 * 3600
TMP_PREFIX = ".tmp-"


def checkout_root() -> Path:
    return Path(getattr(settings, "DATAHUB_CHECKOUT_DIR", None) or Path(settings.VAR_DIR) / "checkouts")


def checkout_name(commit: str, folder: str) -> str:
    """The cache key: the commit id, and for one folder of it a digest of the folder's path."""
    return commit + (f"-{hashlib.sha256(folder.encode()).hexdigest()[:16]}" if folder else "")


@contextmanager
def checked_out(commit: str, folder: str = "") -> Iterator[Path]:
    """The folder holding commit `commit`'s files under `folder` ("" for all of them), paths relative
    to `folder`, written first when the cache lacks it; kept (not evicted) until the block ends.
    FileNotFoundError when the commit has no file there (its repo was deleted since it was asked)."""
    root = checkout_root()
    root.mkdir(parents=True, exist_ok=True)
    name = checkout_name(commit, folder)
    with held(root / f"{name}.lock", fcntl.LOCK_SH):
        target = root / name
        if not target.is_dir():
            write(target, commit, folder)
        os.utime(target)  # the least recently used go first
        evict(root, keep=name)
        yield target


@contextmanager
def held(path: Path, how: int) -> Iterator[IO[str]]:
    """`path` opened and flocked `how`. Eviction unlinks a lock file while holding it exclusively: one
    opened just before that is no longer the file at `path`, so it is opened again."""
    while True:
        lock = open(path, "a")  # noqa: SIM115 - closed below, or after the block
        try:
            fcntl.flock(lock, how)
            if path.exists() and os.fstat(lock.fileno()).st_ino == path.stat().st_ino:
                break
        except BaseException:
            lock.close()
            raise
        lock.close()
    try:
        yield lock
    finally:
        lock.close()


def write(target: Path, commit: str, folder: str) -> None:
    entries = TreeEntry.objects.filter(commit_id=commit)
    members = members_of(entries.filter(path__startswith=f"{folder}/") if folder else entries)
    if not members:
        raise FileNotFoundError(errno.ENOENT, f"commit {commit[:12]} has no files" + (f" under {folder}/" if folder else ""))
    tmp = target.parent / f"{TMP_PREFIX}{target.name}-{uuid.uuid4().hex[:8]}"
    try:
        for member in members:
            relative = member.path.removeprefix(f"{folder}/") if folder else member.path
            path = tmp / relative
            if not path.resolve().is_relative_to(tmp.resolve()):  # the Data Hub's paths have no "..": a guard all the same
                raise ValueError(f"{member.path} is not a path inside its commit")
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as out:
                for chunk in blob_chunks(member):
                    out.write(chunk)
        try:
            os.rename(tmp, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            # Another writer's checkout of the same files was renamed first: it is as good as this one.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def evict(root: Path, keep: str) -> None:
    """Delete the least recently used checkouts (not `keep`, nor one in use) until the rest fit in
    DATAHUB_CHECKOUT_MAX_BYTES, and temporary folders that dead writers left."""
    now = time.time()
    checkouts = []
    for path in root.iterdir():
        if path.name.startswith(TMP_PREFIX):
            if path.is_dir() and now - path.stat().st_mtime > STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        elif path.is_dir():
            checkouts.append((path.stat().st_mtime, path, size_of(path)))
    total = sum(size for _, _, size in checkouts)
    for _, path, size in sorted(checkouts):
        if total <= settings.DATAHUB_CHECKOUT_MAX_BYTES:
            return
        if path.name == keep or not drop(path):
            continue
        total -= size


def drop(path: Path) -> bool:
    """Delete checkout `path` unless it is in use (its lock is held): whether it went."""
    lock_path = path.parent / f"{path.name}.lock"
    with open(lock_path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        gone = path.parent / f"{TMP_PREFIX}{path.name}-gone-{uuid.uuid4().hex[:8]}"
        os.rename(path, gone)  # at once: a reader that comes next writes it again rather than reading half of it
        lock_path.unlink(missing_ok=True)
    shutil.rmtree(gone, ignore_errors=True)
    return True
