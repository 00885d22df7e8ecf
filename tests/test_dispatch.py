"""Dispatch through a real Celery worker and the local backend: START claims once and submits
once, STOP frees the process and cancels, a restart wipes the attempt's series (its log stays, by attempt)."""
from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.utils import timezone

from studio import crypto
from tests.conftest import sft_body, wait_for
from training import services
from training.backends.local import group_alive, parse_job_id
from training.models import Checkpoint, LogLine, MetricPoint, Rollout, RunAttempt, Status, TrainingRun

pytestmark = pytest.mark.worker


@pytest.fixture
def unloadable(tmp_path) -> dict[str, str]:
    """A base model and dataset that pass START's local checks (a folder with a config.json, a file of
    valid rows) but a model the engine cannot load, so the job fails fast: these tests are about
    dispatch, not training."""
    model = tmp_path / "unloadable-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "one row, so the dataset passes its row check"}\n')
    return {"base_model": str(model), "dataset": str(data)}


def submissions(run_id: int) -> int:
    return LogLine.objects.filter(run_id=run_id, line__contains="submitting to the local backend").count()


def test_start_is_claimed_by_the_worker_and_submitted_once(api, studio_worker, unloadable):
    run_id = api.post("/api/training-runs", sft_body(**unloadable)).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id).exclude(status=Status.QUEUED).first(), 30, message="the worker to claim the run")
    assert run.attempt == 1 and run.start_requested_at is None
    # The same task delivered twice more (a redelivery, a double click) claims nothing.
    from training.tasks import dispatch_run

    dispatch_run.delay(run_id)
    dispatch_run.delay(run_id)
    wait_for(lambda: studio_worker.log().count("training.tasks.dispatch_run") >= 6, 30, message="the repeated tasks to run")
    run.refresh_from_db()
    assert run.attempt == 1
    assert submissions(run_id) == 1
    assert sorted(p.name for p in (studio_worker.runs_dir / str(run_id)).iterdir()) == ["attempt-1"]


def test_concurrent_dispatches_claim_the_run_once(transactional_db, live_server, api, settings, tmp_path, unloadable):
    settings.STUDIO_RUNS_DIR = tmp_path / "runs"
    settings.STUDIO_PUBLIC_URL = live_server.url
    run_id = api.post("/api/training-runs", sft_body(**unloadable)).json()["id"]
    TrainingRun.objects.filter(pk=run_id).update(start_requested_at=timezone.now())
    results: list[bool] = []
    barrier = threading.Barrier(4)

    def race() -> None:
        barrier.wait()
        try:
            results.append(services.dispatch(run_id))
        finally:
            connection.close()

    threads = [threading.Thread(target=race) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    assert TrainingRun.objects.get(pk=run_id).attempt == 1
    assert submissions(run_id) == 1


def long_sft_body(tiny_models: dict) -> dict:
    return sft_body(base_model=tiny_models["student"], dataset=tiny_models["data_sft"],
                    config={"max_steps": 100000, "learning_rate": 1e-3, "per_device_train_batch_size": 2, "heartbeat_interval_seconds": 1})


def test_stop_frees_the_process_group_and_cancels(api, studio_worker, tiny_models):
    run_id = api.post("/api/training-runs", long_sft_body(tiny_models)).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status=Status.RUNNING).first(), 120, interval=0.5, message="the engine to report its first step")
    pgid = parse_job_id(run.backend_job_id)[1]
    assert group_alive(pgid)

    r = api.post(f"/api/training-runs/{run_id}/stop")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    wait_for(lambda: not group_alive(pgid), 30, message="the engine's process group to exit")
    run.refresh_from_db()
    assert run.status == Status.CANCELLED and run.finished_at is not None
    # A second STOP is a conflict, not a crash.
    assert api.post(f"/api/training-runs/{run_id}/stop").status_code == 409
    # The worker's stop task ran and cleared the run's stop mark: the run can be deleted.
    wait_for(lambda: not RunAttempt.objects.filter(run_id=run_id, stop_requested_at__isnull=False).exists(), 30, message="the stop task to finish")
    assert api.delete(f"/api/training-runs/{run_id}").status_code == 204


def test_restart_wipes_the_series_keeps_checkpoints_and_retires_the_old_token(api, studio_worker, unloadable):
    run_id = api.post("/api/training-runs", sft_body(**unloadable)).json()["id"]
    old_token = "ing_old-attempt-token"
    TrainingRun.objects.filter(pk=run_id).update(status=Status.FAILED, attempt=1, ingest_token_hash=crypto.hash_token(old_token), error={"code": "training_error", "message": "boom", "log_tail": []})
    run = TrainingRun.objects.get(pk=run_id)
    MetricPoint.objects.create(run=run, key="loss", step=1, value=2.0)
    Rollout.objects.create(run=run, step=1, prompt="p", completion="c", reward=1.0)
    LogLine.objects.create(run=run, attempt=1, line="old line")
    Checkpoint.objects.create(run=run, attempt=1, step=10, path="/ckpt/10")

    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, attempt=2).first(), 30, message="the restart to be claimed")
    assert run.error is None or run.error.get("message") != "boom"
    assert not MetricPoint.objects.filter(run=run).exists() and not Rollout.objects.filter(run=run).exists()
    # The failed attempt's log stays, read by its attempt; the run's log is the new attempt's.
    assert LogLine.objects.filter(run=run, attempt=1, line="old line").exists()
    assert "old line" not in api.get(f"/api/training-runs/{run_id}/logs", full="true").json()["lines"]
    assert "old line" in api.get(f"/api/training-runs/{run_id}/logs", full="true", attempt=1).json()["lines"]
    assert Checkpoint.objects.filter(run=run, step=10).exists()
    r = api.client.post(f"/api/ingest/runs/{run_id}", data={"batch_id": "x", "metrics": [{"step": 1, "key": "loss", "value": 1}]},
                        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {old_token}")
    assert r.status_code == 403
    assert not MetricPoint.objects.filter(run=run).exists()


def test_a_running_run_whose_job_id_was_lost_is_adopted_and_stop_signals_its_group_at_once(api, studio_worker, tiny_models):
    from datetime import timedelta

    from training import reconciler

    run_id = api.post("/api/training-runs", long_sft_body(tiny_models)).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    run = wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status=Status.RUNNING).first(), 120, interval=0.5, message="the first step")
    job_id, pgid = run.backend_job_id, parse_job_id(run.backend_job_id)[1]
    # The worker died after it started the runner and before it saved the id: STOP and polls could not name the job.
    TrainingRun.objects.filter(pk=run_id).update(backend_job_id="", submit_started_at=timezone.now() - timedelta(hours=1))
    assert run_id in reconciler.runs_to_resubmit()
    assert reconciler.resubmit(run_id)
    run.refresh_from_db()
    assert run.backend_job_id == job_id and run.status == Status.RUNNING and run.attempt == 1  # adopted, not started twice
    assert LogLine.objects.filter(run=run, line__contains=f"adopted job {job_id}").exists()
    # STOP's request itself signals the group, so the engine stops even while every worker is busy:
    # also for a run whose job id was lost again (the request looks it up, not only the stop task).
    services.signal_stop(run, run.attempt, "")
    wait_for(lambda: not group_alive(pgid), 30, message="the engine's process group to exit on the request's SIGTERM")
