"""Each attempt of a run keeps what it trained with (RunAttempt): a stopped or failed run can be
edited before it is started again, and a resume from an earlier attempt's step continues with that
attempt's settings and adapter, not the run's current ones. A real worker and engine, on the tiny
models."""
from __future__ import annotations

import pytest

from tests.conftest import sft_body, wait_for
from training import services
from training.models import Checkpoint, MetricPoint, RunAttempt, Status, TrainingRun

pytestmark = pytest.mark.worker


def lora_config(rank: int, learning_rate: float) -> dict:
    return {"max_steps": 100000, "save_steps": 2, "lora_rank": rank, "learning_rate": learning_rate,
            "per_device_train_batch_size": 2, "max_length": 64, "heartbeat_interval_seconds": 1}


def stop_when(api, run_id: int, ready, what: str) -> None:
    wait_for(ready, 180, interval=0.5, message=what)
    r = api.post(f"/api/training-runs/{run_id}/stop")
    assert r.status_code == 200 and r.json()["status"] == "cancelled", r.content


def test_resume_from_an_earlier_attempt_trains_with_that_attempts_settings(api, studio_worker, tiny_models):
    run_id = api.post("/api/training-runs", sft_body(base_model=tiny_models["student"], dataset=tiny_models["data_sft"],
                                                     config=lora_config(4, 5e-3))).json()["id"]
    first = TrainingRun.objects.get(pk=run_id).config
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    stop_when(api, run_id, lambda: Checkpoint.objects.filter(run_id=run_id, attempt=1, step=2).exists(), "attempt 1 to save step 2")
    # Edited between attempts: another adapter size and learning rate.
    r = api.patch(f"/api/training-runs/{run_id}", {"config": {"lora_rank": 8, "learning_rate": 1e-3}})
    assert r.status_code == 200, r.content
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    stop_when(api, run_id, lambda: TrainingRun.objects.filter(pk=run_id, attempt=2, status=Status.RUNNING).exists(), "attempt 2 to train")
    run = TrainingRun.objects.get(pk=run_id)
    assert run.config["lora_rank"] == 8 and first["lora_rank"] == 4

    recorded = {a.attempt: a for a in RunAttempt.objects.filter(run=run)}
    assert sorted(recorded) == [1, 2] and recorded[1].config == first and recorded[2].config == run.config
    listed = api.get(f"/api/training-runs/{run_id}/attempts").json()
    assert [(a["attempt"], a["config"]["lora_rank"], a["config"]["learning_rate"]) for a in listed] == [(1, 4, 5e-3), (2, 8, 1e-3)]

    r = api.post(f"/api/training-runs/{run_id}/checkpoints/2/resume?attempt=1")
    assert r.status_code == 201, r.content
    child = TrainingRun.objects.get(pk=r.json()["id"])
    assert child.config == first and r.json()["config"] == first
    assert (child.base_model, child.dataset, child.compute) == (recorded[1].base_model, recorded[1].dataset, recorded[1].compute)
    assert services.resume_findings(child) == []  # the adapter it resumes is attempt 1's, rank 4 like its own
    # It trains on from attempt 1's step 2 with attempt 1's adapter (rank 8 failed to load it).
    assert api.patch(f"/api/training-runs/{child.pk}", {"config": {"max_steps": 4}}).status_code == 200
    assert api.post(f"/api/training-runs/{child.pk}/start").status_code == 202
    done = wait_for(lambda: TrainingRun.objects.filter(pk=child.pk, status__in=(Status.COMPLETED, Status.FAILED)).first(), 300, interval=0.5,
                    message="the child run to end")
    assert done.status == Status.COMPLETED, done.error
    assert sorted(MetricPoint.objects.filter(run=done, key="loss").values_list("step", flat=True)) == [3, 4]
