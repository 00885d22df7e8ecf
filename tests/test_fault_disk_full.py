"""Disk full on blob storage (issue 9): the run fails with a clear message, the engine is stopped,
and nothing half-written is visible — no commit on the run's branch, no short blob, no staged file.

The full disk is real: a 1 MiB tmpfs mounted as the Data Hub's storage (tests/conftest.py small_disk).
"""
from __future__ import annotations

import pytest

from datahub.models import Blob, Branch, TreeEntry
from tests.conftest import sft_body, wait_for
from training.backends.local import group_alive, parse_job_id
from training.models import Status, TrainingRun

pytestmark = pytest.mark.worker


@pytest.fixture
def full_disk(small_disk, settings, monkeypatch):
    mount = small_disk("1m", "hub")
    settings.DATAHUB_ROOT = mount
    monkeypatch.setenv("DATAHUB_ROOT", str(mount))  # the worker subprocess reads it from its environment
    return mount


def test_a_full_blob_storage_fails_the_run_and_leaves_nothing_half_written(transactional_db, request, full_disk, api, tiny_models):
    request.getfixturevalue("studio_worker")  # started after DATAHUB_ROOT points at the small disk
    body = sft_body(base_model=tiny_models["student"], dataset=tiny_models["data_sft"],
                    config={"max_steps": 100000, "save_steps": 2, "learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64,
                            "heartbeat_interval_seconds": 1})
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status__in=(Status.FAILED, Status.COMPLETED, Status.CANCELLED)).first(),
                   240, interval=0.5, message="the run to end")
    assert run.status == Status.FAILED and run.error["code"] == "training_error"
    assert "blob storage is full" in run.error["message"] and "free space" in run.error["message"]
    wait_for(lambda: not group_alive(parse_job_id(run.backend_job_id)[1]), 30, message="the engine to be stopped")

    branch = Branch.objects.get(repo__project=run.project, name=f"run-{run.pk}")
    assert not TreeEntry.objects.filter(commit_id=branch.head_id, path__startswith="checkpoints/").exists()
    for blob in Blob.objects.all():  # every blob on the small disk holds all of its bytes
        path = full_disk / blob.storage_name
        assert not path.exists() or path.stat().st_size == blob.size
    # Later checkpoints' commit tasks may still be failing on the full disk: each removes its own
    # staged file when its write fails, so wait for them to finish rather than look mid-write.
    wait_for(lambda: not [p for p in full_disk.rglob("*") if p.is_file() and p.name.startswith("blob-")], 60, message="no staged file left")
