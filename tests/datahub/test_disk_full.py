"""A full disk while files come in: a 507 that says the Studio's disk is full, that nothing was
committed and what to do; nothing half-written is visible (no commit, no Blob row, no short blob
file, no leftover staged bytes), and an API upload session carries on once space is freed. A
checkpoint commit on a full disk is logged and stays 'commit pending' (tests/test_fault_disk_full.py
runs it end to end with a worker and an engine).

The full disk is real: a small tmpfs (tests/conftest.py small_disk), filled with fill_disk.
"""
from __future__ import annotations

import hashlib
import logging
import os

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from datahub import repos, storage
from datahub.models import Blob, TreeEntry, UploadSession
from datahub.tasks import commit_checkpoint
from tests.conftest import assert_error, fill_disk, sft_body
from tests.datahub.test_uploads import put
from training.models import Checkpoint, Status, TrainingRun

DATA = os.urandom(200_000)


def assert_disk_full(response, field: str, then: str) -> None:
    body = assert_error(response, 507, field)
    assert "disk is full" in body["detail"] and "nothing was committed" in body["detail"], body
    said = body["errors"][0]["message"]
    assert "free space" in said and "admin" in said and then in said, said


def files_under(path) -> dict[str, int]:
    return {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file() and p.name != "filler"}


@pytest.fixture
def full_hub(small_disk, settings):
    """The Data Hub's storage, staging included (the default), on a 1 MiB disk."""
    root = small_disk("1m", "hub-disk")
    settings.DATAHUB_ROOT = root
    return root


def test_a_chunk_on_a_full_disk_is_507_and_the_session_resumes_once_space_is_freed(api, dataset_repo, full_hub):
    half = len(DATA) // 2
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "train.bin", "size": len(DATA)}]}).json()["id"]
    assert put(api, upload_id, 0, 0, DATA[:half]).json()["received"] == half
    filler = fill_disk(full_hub)

    assert_disk_full(put(api, upload_id, 0, half, DATA[half:]), "body", f"send this chunk again at offset {half}")
    session = api.get(f"/api/hub/uploads/{upload_id}").json()
    assert session["state"] == "open" and session["files"][0]["received"] == half
    # the refused chunk's bytes are given back: the staged file holds what arrived before it
    assert files_under(full_hub) == {f"staging/uploads/{upload_id}/0.part": half}

    filler.unlink()
    assert put(api, upload_id, 0, half, DATA[half:]).json()["complete"] is True
    r = api.post(f"/api/hub/uploads/{upload_id}/commit")
    assert r.status_code == 200, r.content
    assert repos.tree(repos.resolve(dataset_repo, "main"))["train.bin"].sha256 == hashlib.sha256(DATA).hexdigest()


def test_a_commit_on_a_full_blob_storage_is_507_and_committing_again_works(api, dataset_repo, small_disk, settings, tmp_path):
    # staging on another disk than the blobs, so the commit step copies the bytes (a full rename cannot fail)
    settings.DATAHUB_STAGING_DIR = tmp_path / "staging"
    settings.DATAHUB_ROOT = blobs = small_disk("1m", "blob-disk")
    upload_id = api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "train.bin", "size": len(DATA)}]}).json()["id"]
    assert put(api, upload_id, 0, 0, DATA).json()["complete"] is True
    head = repos.resolve(dataset_repo, "main")
    filler = fill_disk(blobs)

    assert_disk_full(api.post(f"/api/hub/uploads/{upload_id}/commit"), "files", "commit this upload session again")
    assert repos.resolve(dataset_repo, "main") == head
    assert not Blob.objects.exists() and files_under(blobs) == {}  # no row, and the short copy is removed
    assert UploadSession.objects.get(pk=upload_id).state == UploadSession.State.OPEN
    assert (settings.DATAHUB_STAGING_DIR / "uploads" / upload_id / "0.part").stat().st_size == len(DATA)  # kept for the retry

    filler.unlink()
    r = api.post(f"/api/hub/uploads/{upload_id}/commit")
    assert r.status_code == 200, r.content
    blob = repos.tree(repos.resolve(dataset_repo, "main"))["train.bin"]
    assert (blobs / blob.storage_name).read_bytes() == DATA


def test_the_upload_form_on_a_full_disk_says_so_beside_files_and_leaves_nothing(browser, dataset_repo, full_hub):
    c = browser("member")
    filler = fill_disk(full_hub)
    r = c.post("/hub/acme/hub-data/upload", {"files": [SimpleUploadedFile("train.bin", DATA)], "branch": "main", "folder": "data"})

    assert r.status_code == 303  # a refused plain form goes back to its page (a reload sends nothing again)
    html = c.get(r["Location"]).content.decode()
    said = html[html.index('id="f-files-errors"'):]
    assert "disk is full, so nothing was committed" in said and "ask your Studio admin" in said and "upload the files again" in said
    assert repos.tree(repos.resolve(dataset_repo, "main")) == {}
    assert not Blob.objects.exists() and files_under(full_hub) == {}
    assert list(UploadSession.objects.values_list("state", flat=True)) == [UploadSession.State.ABORTED]

    filler.unlink()
    r = c.post("/hub/acme/hub-data/upload", {"files": [SimpleUploadedFile("train.bin", DATA)], "branch": "main", "folder": "data"})
    assert r.status_code == 302
    assert "data/train.bin" in repos.tree(repos.resolve(dataset_repo, "main"))


def test_a_checkpoint_commit_on_a_full_disk_is_logged_and_stays_pending(api, users, full_hub, tmp_path, settings, caplog):
    from django.test import Client

    from training.backends.local import run_dir

    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(status=Status.RUNNING)
    saved = run_dir(run_id, 1) / "output" / "checkpoint-2"
    saved.mkdir(parents=True)
    (saved / "model.safetensors").write_bytes(DATA)
    checkpoint = Checkpoint.objects.create(run_id=run_id, attempt=1, step=2, kind="checkpoint", path=str(saved))
    filler = fill_disk(full_hub)

    with caplog.at_level(logging.ERROR, logger="datahub.services"):
        result = commit_checkpoint.apply(args=[checkpoint.pk])  # the task as the worker runs it
    assert result.successful() and result.result is None  # handled: no exception, so no retry loop
    assert f"blob storage full while committing checkpoint {checkpoint.pk}" in caplog.text
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.FAILED and "free space" in run.error["message"]
    assert not TreeEntry.objects.filter(path__startswith="checkpoints/").exists() and not Blob.objects.exists()
    assert [p for p in files_under(full_hub) if not p.startswith("staging/uploads")] == []  # no staged or short blob left
    viewer = Client()
    viewer.force_login(users["viewer"])
    assert "Download: commit pending" in viewer.get(f"/training/runs/{run_id}/checkpoints/").content.decode()

    filler.unlink()  # safe to run again once there is room: the checkpoint is committed then
    assert commit_checkpoint.apply(args=[checkpoint.pk]).successful()
    assert TreeEntry.objects.filter(path="checkpoints/step-2/model.safetensors").exists()
    assert storage.blob_storage().exists(TreeEntry.objects.get(path="checkpoints/step-2/model.safetensors").blob.storage_name)


def test_a_new_upload_session_on_a_disk_out_of_room_is_507_and_leaves_no_session(api, dataset_repo, small_disk, settings):
    # A full ext4 disk refuses a new folder too; here the tmpfs runs out of inodes, which fails
    # mkdir with the same ENOSPC.
    settings.DATAHUB_STAGING_DIR = staging = small_disk("1m", "staging-disk", inodes=64)
    (staging / "uploads").mkdir()
    n = 0
    with pytest.raises(OSError):
        while True:
            (staging / f"f{n}").touch()
            n += 1
    before = UploadSession.objects.count()
    assert_disk_full(api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "train.bin", "size": 10}]}), "files", "create the upload session again")
    assert UploadSession.objects.count() == before
    for i in range(n):
        (staging / f"f{i}").unlink()
    assert api.post("/api/hub/repos/hub-data/uploads", {"files": [{"path": "train.bin", "size": 10}]}).status_code == 201


def test_a_form_whose_files_meet_a_full_temp_disk_is_507_not_500(browser, dataset_repo, small_disk, settings):
    """Django spools a form's file over FILE_UPLOAD_MAX_MEMORY_SIZE to FILE_UPLOAD_TEMP_DIR while it
    parses the body, before any view runs: a full disk there is a 507 page, and nothing is stored."""
    settings.FILE_UPLOAD_TEMP_DIR = temp = small_disk("1m", "temp-disk")
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 100_000  # so DATA (200 kB) is spooled to disk
    filler = fill_disk(temp)
    c = browser("member")
    r = c.post("/hub/acme/hub-data/upload", {"files": [SimpleUploadedFile("train.bin", DATA)], "branch": "main", "folder": "data"})

    assert r.status_code == 507
    html = r.content.decode()
    assert "disk is full" in html and "nothing was committed" in html and "send the form again" in html
    assert repos.tree(repos.resolve(dataset_repo, "main")) == {} and not Blob.objects.exists()
    assert not UploadSession.objects.exists()
    assert files_under(temp) == {}  # the half-written temp file is gone

    filler.unlink()
    r = c.post("/hub/acme/hub-data/upload", {"files": [SimpleUploadedFile("train.bin", DATA)], "branch": "main", "folder": "data"})
    assert r.status_code == 302
    assert "data/train.bin" in repos.tree(repos.resolve(dataset_repo, "main"))
