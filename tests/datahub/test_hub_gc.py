"""`manage.py hub_gc`: blobs no tree and no unfinished upload names go once past the grace period,
with their bytes, and so do files in the blob storage that no blob row names; whatever a live repo,
an open upload or a commit in flight uses stays, also when the collector runs during that commit."""
from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from datahub import commits, gc, repos, storage, uploads
from datahub.models import Blob, Branch, UploadFile, UploadSession, blob_path
from studio.errors import Conflict
from tests.conftest import wait_for

SHARED, OWN = b"shared weights " * 100, b"only the deleted repo had these"
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="waits on PostgreSQL row locks (pg_locks)")


def hub_gc(*args: str) -> str:
    out = StringIO()
    call_command("hub_gc", *args, stdout=out)
    return out.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def age(data: bytes, hours: float) -> None:
    """As if no writer had used the blob of `data` for `hours`."""
    Blob.objects.filter(pk=sha(data)).update(used_at=timezone.now() - timedelta(hours=hours))


def stored(data: bytes) -> bool:
    return storage.blob_storage().exists(blob_path(sha(data)))


def stray(data: bytes, hours: float, name: str | None = None) -> str:
    """A file in the blob storage with no Blob row (a crash left it), last written `hours` ago."""
    store = storage.blob_storage()
    name = store.save(name or blob_path(sha(data)), ContentFile(data))
    when = time.time() - hours * 3600
    os.utime(store.path(name), (when, when))
    return name


def download(api, repo: str, path: str) -> bytes:
    r = api.client.get(f"/api/hub/repos/{repo}/download", {"path": path}, **api._headers())
    assert r.status_code == 200, r.content
    return b"".join(r.streaming_content)


@pytest.fixture
def live_and_deleted(api, project):
    """Repo `live` and repo `gone` share SHARED; OWN was only in `gone`, now deleted by the API."""
    live = repos.create_repo(project, "live", "model")
    commits.commit_files(live, "main", {"weights.bin": SHARED}, "weights")
    gone = repos.create_repo(project, "gone", "model")
    commits.commit_files(gone, "main", {"copy.bin": SHARED, "own.bin": OWN}, "weights")
    assert api.delete("/api/hub/repos/gone").status_code == 204
    return live


def test_a_blob_only_a_deleted_repo_used_goes_after_the_grace_period_with_its_bytes(api, live_and_deleted):
    age(SHARED, 48)
    age(OWN, 48)

    out = hub_gc()

    assert f"removed 1 unused blob(s), {len(OWN)} bytes, and 0 stray file(s)" in out, out
    assert not Blob.objects.filter(pk=sha(OWN)).exists() and not stored(OWN)
    assert Blob.objects.filter(pk=sha(SHARED)).exists() and stored(SHARED)  # the live repo still names it
    assert download(api, "live", "weights.bin") == SHARED
    assert "removed 0 unused blob(s), 0 bytes" in hub_gc()  # nothing left to do


def test_a_blob_inside_the_grace_period_is_kept(live_and_deleted):
    assert "removed 0 unused blob(s)" in hub_gc()  # just deleted: used minutes ago
    age(OWN, 3)
    assert "removed 0 unused blob(s)" in hub_gc()  # the default grace is 24 h
    assert "removed 0 unused blob(s)" in hub_gc("--grace-hours", "4")
    assert Blob.objects.filter(pk=sha(OWN)).exists() and stored(OWN)
    assert "removed 1 unused blob(s)" in hub_gc("--grace-hours", "2.5")
    assert not stored(OWN)


def test_dry_run_lists_what_would_go_and_removes_nothing(live_and_deleted):
    age(OWN, 48)
    name = stray(b"left by a crash", 48)

    out = hub_gc("--dry-run", "--verbosity", "2")

    assert f"would remove {blob_path(sha(OWN))} ({len(OWN)} bytes)" in out and f"would remove {name} (15 bytes)" in out, out
    assert f"would remove 1 unused blob(s), {len(OWN)} bytes, and 1 stray file(s), 15 bytes" in out and "nothing was removed" in out, out
    assert Blob.objects.filter(pk=sha(OWN)).exists() and stored(OWN) and storage.blob_storage().exists(name)


def test_stray_files_go_after_the_grace_period(live_and_deleted):
    old = stray(b"old crash", 48)
    fresh = stray(b"a writer is about to record these", 1)
    junk = stray(b"a copy that lost a race", 48, name=f"blobs/ab/cd/{'ab' * 32}_x1Yz2")

    out = hub_gc()

    assert "and 2 stray file(s), 32 bytes" in out, out
    store = storage.blob_storage()
    assert not store.exists(old) and not store.exists(junk) and store.exists(fresh)
    assert not Blob.objects.filter(pk=sha(b"old crash")).exists()  # the claim row is not left behind
    assert stored(SHARED) and stored(OWN)  # files with a blob row are no strays, however old


@pytest.fixture
def upload_with_a_stored_blob(repo, users):
    """An upload session whose commit stored its file as a blob and then failed (the branch moved
    since its parent): the session is open again, and only its upload file names the blob."""
    parent = repos.resolve(repo, "main").pk
    session = uploads.create_upload(repo, users["owner"], "main", [{"path": "big.bin", "size": 11}], parent=parent)
    uploads.write_chunk(session, 0, 0, io.BytesIO(b"upload data"), 11)
    commits.commit_files(repo, "main", {"other.txt": b"moved"}, "someone else's commit")
    with pytest.raises(Conflict):
        uploads.commit_upload(session, users["owner"])
    assert UploadFile.objects.get(session=session).blob_id == sha(b"upload data")
    age(b"upload data", 48)
    return session


@pytest.mark.parametrize("state", [UploadSession.State.OPEN, UploadSession.State.COMMITTING])
def test_a_blob_of_an_unfinished_upload_is_kept(upload_with_a_stored_blob, state):
    UploadSession.objects.filter(pk=upload_with_a_stored_blob.pk).update(state=state)
    assert "removed 0 unused blob(s)" in hub_gc()
    assert stored(b"upload data") and UploadFile.objects.get(session=upload_with_a_stored_blob).blob_id == sha(b"upload data")


def test_a_blob_of_an_aborted_upload_goes(upload_with_a_stored_blob):
    uploads.abort_upload(upload_with_a_stored_blob)
    assert "removed 1 unused blob(s), 11 bytes" in hub_gc()
    assert not stored(b"upload data") and UploadFile.objects.get(session=upload_with_a_stored_blob).blob_id is None


def test_a_commit_in_flight_that_reuses_an_old_unused_blob_keeps_it(api, live_and_deleted):
    """commit_files stores every file before it commits: reusing OWN, left two days ago by the
    deleted repo, counts as a use, so the collector keeps it until the commit names it."""
    age(OWN, 48)
    blob = commits.store_blob(OWN)  # commit_files' first step (the commit itself comes below)

    assert "removed 0 unused blob(s)" in hub_gc()

    commits.commit_blobs(live_and_deleted, "main", {"own.bin": blob}, "reuse")
    assert download(api, "live", "own.bin") == OWN


def test_a_commit_whose_blob_the_collector_took_is_a_409_and_commits_nothing(api, live_and_deleted):
    """A commit slower than the grace period (here: a grace of 0): the collector removed the blob
    between store_blob and commit_blobs. The commit says so rather than name bytes that are gone."""
    blob = commits.store_blob(b"slow commit")
    head = repos.resolve(live_and_deleted, "main").pk
    assert "removed 2 unused blob(s)" in hub_gc("--grace-hours", "0")  # this one, and OWN
    assert not stored(b"slow commit")

    with pytest.raises(Conflict) as exc:
        commits.commit_blobs(live_and_deleted, "main", {"late.bin": blob}, "late")

    assert exc.value.errors[0].field == "path" and "late.bin: commit it again" in exc.value.errors[0].message
    assert repos.resolve(live_and_deleted, "main").pk == head
    commits.commit_files(live_and_deleted, "main", {"late.bin": b"slow commit"}, "again")  # stores the bytes anew
    assert download(api, "live", "late.bin") == b"slow commit"


def test_storing_bytes_the_collector_removed_under_a_row_writes_them_again(live_and_deleted):
    """A collector stopped between deleting the bytes and committing the row's delete: the next
    writer of those bytes finds the row without them and stores them again."""
    storage.blob_storage().delete(blob_path(sha(OWN)))
    assert commits.store_blob(OWN).pk == sha(OWN) and stored(OWN)


@pytest.mark.parametrize("hours", ["-1", "nan", "inf", "1e9"])
def test_a_bad_grace_period_is_refused_naming_the_option(live_and_deleted, hours):
    age(OWN, 48)
    with pytest.raises(CommandError, match="--grace-hours: .* give 0 to 876000 hours"):
        hub_gc("--grace-hours", hours)
    assert stored(OWN)


# ---- the collector against writers in other transactions (PostgreSQL row locks) -----------------

def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - asserted by the test
            result["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def someone_waits_for_me() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND pg_backend_pid() = ANY(pg_blocking_pids(pid))")
        return cur.fetchone()[0] > 0


@postgres_only
def test_the_collector_waits_for_a_commit_adding_the_blob_and_keeps_it(transactional_db, project):
    live = repos.create_repo(project, "live", "model")
    blob = commits.store_blob(b"hashed for two days")
    age(b"hashed for two days", 48)  # a commit slower than the grace period

    with transaction.atomic():  # commit_blobs' transaction is a savepoint of this one: it commits at the end of the block
        commits.commit_blobs(live, "main", {"weights.bin": blob}, "slow")
        thread, result = in_thread(lambda: gc.collect(timedelta(hours=24)))
        wait_for(someone_waits_for_me, 20, message="the collector to wait for the commit's lock on the blob")
    thread.join(30)

    assert "error" not in result, result
    assert result["value"].blobs == [] and stored(b"hashed for two days")
    head = Branch.objects.get(repo=live, name="main").head
    assert repos.tree(head)["weights.bin"].pk == blob.pk


@postgres_only
def test_the_collector_leaves_a_stray_file_that_a_writer_is_recording(transactional_db):
    name = stray(b"found there by a writer", 48)

    with transaction.atomic():  # the writer's row is made but not committed until the end of the block
        blob = commits.store_blob(b"found there by a writer")  # finds the bytes in place: writes nothing
        thread, result = in_thread(lambda: gc.collect(timedelta(hours=24)))
        wait_for(someone_waits_for_me, 20, message="the collector's claim to wait for the writer's row")
    thread.join(30)

    assert "error" not in result, result
    assert result["value"].strays == [] and storage.blob_storage().exists(name)
    assert Blob.objects.get(pk=blob.pk).size == len(b"found there by a writer")
