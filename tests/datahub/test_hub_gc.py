"""`manage.py hub_gc`: blobs no tree and no unfinished upload names go once past the grace period,
with their bytes, and so do files in the blob storage that no blob row names; whatever a live repo,
an open upload or a commit in flight uses stays, also when the collector runs during that commit.
Upload sessions idle for --upload-days are aborted (their client is told why), and leftovers in the
staging dir go once past the grace period."""
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
from tests.conftest import assert_error, wait_for

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


# ---- idle upload sessions and staging leftovers --------------------------------------------------

def idle(session_id, days: float) -> None:
    """As if the session had had no chunk and no state change for `days`."""
    UploadSession.objects.filter(pk=session_id).update(updated_at=timezone.now() - timedelta(days=days))


def put(api, upload_id, index: int, offset: int, data: bytes):
    return api.client.put(f"/api/hub/uploads/{upload_id}/files/{index}?offset={offset}", data=data,
                          content_type="application/octet-stream", HTTP_AUTHORIZATION=f"Bearer {api.token}")


def new_upload(api, data: bytes = b"first half") -> str:
    """An upload session of my-model with one file, of which `data` arrived."""
    r = api.post("/api/hub/repos/my-model/uploads", {"files": [{"path": "w.bin", "size": len(data) * 2}]})
    assert r.status_code == 201, r.content
    assert put(api, r.json()["id"], 0, 0, data).status_code == 200
    return r.json()["id"]


def backdate(path, hours: float) -> None:
    """Set the mtime of `path` (and of the files in it) to `hours` ago."""
    when = time.time() - hours * 3600
    for p in [*(path.iterdir() if path.is_dir() else []), path]:
        os.utime(p, (when, when))


def test_an_open_upload_idle_past_upload_days_is_aborted_and_its_client_is_told_why(api, repo):
    upload_id = new_upload(api)
    idle(upload_id, 8)

    out = hub_gc()

    assert "hub_gc aborted 1 idle upload session(s), 10 bytes staged" in out, out
    assert UploadSession.objects.get(pk=upload_id).state == UploadSession.State.ABORTED
    assert not uploads.staged_path(upload_id).exists()
    reason = api.get(f"/api/hub/uploads/{upload_id}").json()["reason"]
    assert "aborted because it had no activity for 7 days" in reason and "start a new upload session (POST /api/hub/repos/my-model/uploads)" in reason, reason
    for r in (put(api, upload_id, 0, 10, b"second one"), api.post(f"/api/hub/uploads/{upload_id}/commit")):
        body = assert_error(r, 409, "upload_id")
        assert "aborted because it had no activity for 7 days" in body["detail"] and "start a new upload session" in body["errors"][0]["message"], body
    assert not uploads.staged_path(upload_id).exists() and repos.tree(repos.resolve(repo, "main")) == {}


def test_a_chunk_is_activity_so_an_upload_that_got_one_recently_is_kept(api, repo):
    upload_id = new_upload(api)
    idle(upload_id, 8)
    assert put(api, upload_id, 0, 10, b"second one").status_code == 200  # the client came back

    assert "aborted 0 idle upload session(s)" in hub_gc()

    assert UploadSession.objects.get(pk=upload_id).state == UploadSession.State.OPEN
    assert api.get(f"/api/hub/uploads/{upload_id}").json()["reason"] is None
    assert api.post(f"/api/hub/uploads/{upload_id}/commit").status_code == 200
    assert download(api, "my-model", "w.bin") == b"first halfsecond one"


def test_an_upload_idle_less_than_upload_days_is_kept(api, repo):
    upload_id = new_upload(api)
    idle(upload_id, 6)
    assert "aborted 0 idle upload session(s)" in hub_gc()
    assert "aborted 1 idle upload session(s)" in hub_gc("--upload-days", "5.5")
    assert "no activity for 5.5 days" in api.get(f"/api/hub/uploads/{upload_id}").json()["reason"]


def test_a_committing_upload_idle_that_long_is_aborted_and_its_stored_blob_goes_in_the_same_pass(upload_with_a_stored_blob):
    """Its committer died mid-commit (the session stayed "committing"); the blob it stored is then
    named by no unfinished upload, and is past the grace period."""
    session = upload_with_a_stored_blob
    UploadSession.objects.filter(pk=session.pk).update(state=UploadSession.State.COMMITTING)
    idle(session.pk, 8)

    out = hub_gc()

    assert "aborted 1 idle upload session(s), 0 bytes staged" in out and "removed 1 unused blob(s), 11 bytes" in out, out
    assert UploadSession.objects.get(pk=session.pk).state == UploadSession.State.ABORTED
    assert not uploads.staged_path(session.pk).exists() and not stored(b"upload data")


@pytest.fixture
def leftovers(api, repo) -> dict[str, Any]:
    """Two days old unless named fresh: temp files of stage_stream, the folders of a deleted, a
    committed and an aborted session, a folder that is no session's, and an open session's folder."""
    root = storage.staging_dir()
    made: dict[str, Any] = {"open": new_upload(api, b"open")}
    for name, data in [("temp", b"half a blob"), ("fresh temp", b"being written")]:
        made[name] = root / f"blob-{name.replace(' ', '')}"
        made[name].write_bytes(data)
    made["deleted"] = uploads.staged_path("0b9c6c3e-3f37-4c7e-9d4e-2d6a1f0c7a11")
    made["deleted"].mkdir(parents=True)
    (made["deleted"] / "0.part").write_bytes(b"deleted")
    for state in ("committed", "aborted"):
        made[state] = uploads.staged_path(new_upload(api, state.encode()))  # 9 and 7 bytes
        UploadSession.objects.filter(pk=made[state].name).update(state=state)
    made["other"] = uploads.uploads_dir() / "notes"
    made["other"].mkdir()
    for name, path in made.items():
        if name != "fresh temp":
            backdate(uploads.staged_path(path) if name == "open" else path, 48)
    backdate(made["fresh temp"], 1)
    return made


def test_staging_leftovers_go_after_the_grace_period_and_open_uploads_keep_theirs(leftovers):
    out = hub_gc("--verbosity", "2")

    assert f"removed 4 staging leftover(s), {11 + 7 + 9 + 7} bytes" in out, out
    assert f"removed {leftovers['temp']} (11 bytes)" in out, out
    for gone in ("temp", "deleted", "committed", "aborted"):
        assert not leftovers[gone].exists(), gone
    assert leftovers["fresh temp"].exists() and leftovers["other"].exists()
    assert (uploads.staged_path(leftovers["open"]) / "0.part").read_bytes() == b"open"
    assert "removed 0 staging leftover(s)" in hub_gc()


def test_staging_leftovers_inside_the_grace_period_are_kept(leftovers):
    assert "removed 0 staging leftover(s)" in hub_gc("--grace-hours", "49")
    assert leftovers["temp"].exists() and leftovers["deleted"].exists()


def test_dry_run_lists_idle_uploads_and_leftovers_and_changes_nothing(upload_with_a_stored_blob, leftovers):
    session = upload_with_a_stored_blob
    idle(session.pk, 8)
    idle(leftovers["open"], 8)  # with 4 bytes staged
    before = UploadSession.objects.get(pk=session.pk).updated_at

    out = hub_gc("--dry-run", "--verbosity", "2")

    assert f"would abort upload session {session.pk} (0 bytes staged)" in out, out  # its one file went into the blob
    assert f"would abort upload session {leftovers['open']} (4 bytes staged)" in out, out
    assert f"would remove {leftovers['deleted']} (7 bytes)" in out, out
    # the session's blob would go too, as the real run aborts the session first
    assert "hub_gc would abort 2 idle upload session(s), 4 bytes staged; would remove 4 staging leftover(s), 34 bytes; " \
           "would remove 1 unused blob(s), 11 bytes" in out and "nothing was removed or aborted" in out, out
    after = UploadSession.objects.get(pk=session.pk)
    assert after.state == UploadSession.State.OPEN and after.updated_at == before and after.abort_reason == ""
    assert UploadSession.objects.get(pk=leftovers["open"]).state == UploadSession.State.OPEN
    assert (uploads.staged_path(leftovers["open"]) / "0.part").exists() and stored(b"upload data")
    assert all(leftovers[name].exists() for name in ("temp", "deleted", "committed", "aborted"))

    real = hub_gc()
    assert "aborted 2 idle upload session(s), 4 bytes staged; removed 4 staging leftover(s), 34 bytes; removed 1 unused blob(s), 11 bytes" in real, real


@pytest.mark.parametrize("days", ["0", "-1", "nan", "inf", "1e9"])
def test_a_bad_upload_idle_period_is_refused_naming_the_option(api, repo, days):
    upload_id = new_upload(api)
    idle(upload_id, 8)
    with pytest.raises(CommandError, match="--upload-days: .* give more than 0 and at most 36500 days"):
        hub_gc("--upload-days", days)
    assert UploadSession.objects.get(pk=upload_id).state == UploadSession.State.OPEN


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


@postgres_only
def test_a_chunk_whose_session_the_collector_aborts_while_it_arrives_is_a_409_and_not_counted(transactional_db, project, users):
    repo = repos.create_repo(project, "my-model", "model", users["owner"])
    session = uploads.create_upload(repo, users["owner"], "main", [{"path": "w.bin", "size": 8}])
    idle(session.pk, 8)

    class SlowClient(io.BytesIO):
        """Its bytes arrive while hub_gc runs in another connection."""

        def read(self, size: int | None = -1) -> bytes:
            if not hasattr(self, "collected"):
                thread, self.collected = in_thread(gc.collect)
                thread.join(30)
            return super().read(size)

    client = SlowClient(b"12345678")
    with pytest.raises(Conflict, match="aborted because it had no activity for 7 days"):
        uploads.write_chunk(session, 0, 0, client, 8)

    assert "error" not in client.collected and len(client.collected["value"].sessions) == 1, client.collected
    assert UploadFile.objects.get(session=session).received == 0
    assert UploadSession.objects.get(pk=session.pk).state == UploadSession.State.ABORTED


@pytest.mark.parametrize("period, said", [
    (timedelta(days=7), "7 days"), (timedelta(days=1), "1 day"), (timedelta(days=5.5), "5.5 days"), (timedelta(hours=36), "1.5 days"),
    (timedelta(hours=1), "1 hour"), (timedelta(minutes=90), "1.5 hours"), (timedelta(seconds=0.864), "0.86 seconds"), (timedelta(0), "0 seconds"),
])
def test_periods_read_in_the_largest_unit_they_fill(period, said):
    assert gc.spell(period) == said  # --upload-days 0.00001 read "1e-05 days"
