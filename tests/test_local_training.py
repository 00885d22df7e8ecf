"""Issue 3's acceptance through the REST API: a tiny run of each method trains for real on the local
backend (CPU) via a real Celery worker, goes queued → provisioning → running → completed, and learns.
Lost heartbeats and killed engines end failed with seed 000's codes."""
from __future__ import annotations

import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from statistics import mean

import pytest
from django.http import QueryDict
from django.utils import timezone

from tests.conftest import wait_for
from training import forms, reconciler
from training.backends.local import group_alive, parse_job_id
from training.models import LogLine, MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.worker
FAST = {"learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, "heartbeat_interval_seconds": 2}


def run_to_the_end(api, body: dict, timeout: float = 300) -> TrainingRun:
    r = api.post("/api/training-runs", body)
    assert r.status_code == 201, r.content
    run_id = r.json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    seen: list[str] = []

    def finished():
        status = TrainingRun.objects.values_list("status", flat=True).get(pk=run_id)
        if not seen or seen[-1] != status:
            seen.append(status)
        return status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)

    wait_for(finished, timeout, interval=0.25, message=f"run {run_id} to finish")
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.COMPLETED, (run.error, list(LogLine.objects.filter(run=run).values_list("line", flat=True))[-40:])
    # Every status the run went through, in order (the poll can miss a short one, never reorder).
    moves = [line.split("→ ")[1].split(":")[0] for line in LogLine.objects.filter(run=run, line__startswith="[studio] status →").order_by("id").values_list("line", flat=True)]
    assert moves == ["provisioning", "running", "completed"], moves
    assert run.started_at and run.finished_at and run.attempt == 1
    return run


def series(run: TrainingRun, key: str) -> list[float]:
    return list(MetricPoint.objects.filter(run=run, key=key).order_by("step").values_list("value", flat=True))


def test_sft_trains_and_loss_falls_by_30_percent(api, studio_worker, tiny_models):
    run = run_to_the_end(api, {"name": "sft", "method": "sft", "base_model": tiny_models["student"], "dataset": tiny_models["data_sft"],
                               "config": {**FAST, "max_steps": 20, "save_steps": 10}})
    loss = series(run, "loss")
    assert len(loss) == 20 and loss[-1] <= 0.7 * loss[0], loss
    assert series(run, "tokens_per_s") and run.progress["step"] == 20
    assert sorted(run.checkpoints.values_list("step", flat=True)) == [10, 20, 20]


def test_dpo_trains_and_margins_rise(api, studio_worker, tiny_models):
    run = run_to_the_end(api, {"name": "dpo", "method": "dpo", "base_model": tiny_models["student"], "dataset": tiny_models["data_dpo"],
                               "config": {**FAST, "learning_rate": 1e-2, "max_steps": 12, "lora_rank": 8, "loss": {"type": "dpo", "dpo_beta": 0.1}}})
    margins = series(run, "rewards/margins")
    assert len(margins) == 12 and mean(margins[-3:]) > mean(margins[:3]) + 0.1, margins
    assert set(run.checkpoints.values_list("kind", flat=True)) == {"adapter", "merged"}


def test_grpo_trains_and_reward_rises_on_builtin_arith(api, studio_worker, tiny_models):
    # NEW RUN's "Quick try" preset, turned into a config exactly as the form turns it: its promise is this test.
    form = QueryDict(mutable=True)
    form.update({"name": "grpo", "method": "grpo", **forms.GRPO_QUICK_TRY, "config.environment_id": forms.DEMO_ENVIRONMENT})
    preset = forms.parse_run_form(form).kwargs["config"]
    assert preset == {"max_steps": 40, "learning_rate": 2e-2, "rollouts_per_prompt": 8, "max_response_length": 8, "environment_id": "builtin/arith@main"}
    run = run_to_the_end(api, {"name": "grpo", "method": "grpo", "base_model": tiny_models["student"],
                               "config": {**preset, "rollout_log_steps": 10, "heartbeat_interval_seconds": 2}})
    reward = series(run, "reward")
    assert len(reward) == 40 and mean(reward[-10:]) > mean(reward[:10]) + 0.1, reward
    rollouts = run.rollouts.all()
    assert rollouts.count() == 4 * 8 and set(rollouts[0].components) == {"format", "digits", "exact"}


def test_distill_captures_then_kd_loss_falls(api, studio_worker, tiny_models):
    run = run_to_the_end(api, {"name": "distill", "method": "distill", "base_model": tiny_models["student"], "dataset": tiny_models["data_distill"],
                               "config": {**FAST, "max_steps": 16, "distillation": {"teacher_model": tiny_models["teacher"], "top_k": 16}}})
    kd, ce = series(run, "kd_loss"), series(run, "loss")
    assert len(kd) == len(ce) == 16 and mean(kd[-3:]) < 0.8 * mean(kd[:3]), kd
    assert LogLine.objects.filter(run=run, line__contains="capture").exists()
    sidecars = list(Path(studio_worker.runs_dir).rglob("*.kd"))
    assert sidecars and all((s.stat().st_size - 1024) % (6 * 16) == 0 for s in sidecars)
    # In the run's cache folder, beside its attempts: a restart reuses them (tests/engine/test_distill.py).
    assert {s.parent for s in sidecars} == {Path(studio_worker.runs_dir) / str(run.pk) / "cache" / "kd"}


def start_long_run(api, tiny_models, **config) -> TrainingRun:
    body = {"name": "long", "method": "sft", "base_model": tiny_models["student"], "dataset": tiny_models["data_sft"],
            "config": {**FAST, "max_steps": 100000, "heartbeat_interval_seconds": 1, **config}}
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    return wait_for(lambda: TrainingRun.objects.filter(pk=run_id, status=Status.RUNNING).first(), 120, interval=0.5, message="the first step")


def engine_pid(worker, run: TrainingRun) -> int:
    return int((Path(worker.runs_dir) / str(run.pk) / f"attempt-{run.attempt}" / "engine.pid").read_text())


def reconcile_until(run: TrainingRun, status: str, timeout: float = 60) -> TrainingRun:
    def check():
        reconciler.reconcile_run(run.pk)  # what the beat-driven reconcile_runs task does for each active run
        return TrainingRun.objects.filter(pk=run.pk, status=status).first()

    return wait_for(check, timeout, interval=1, message=f"run {run.pk} to become {status}")


def test_a_frozen_engine_ends_failed_with_heartbeat_timeout(api, studio_worker, tiny_models):
    run = start_long_run(api, tiny_models, heartbeat_timeout_seconds=60)
    os.kill(engine_pid(studio_worker, run), signal.SIGSTOP)
    time.sleep(2)  # a report already on its way lands; then the deadline (60 s at least) is made to have passed
    TrainingRun.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now() - timedelta(seconds=61))
    run = reconcile_until(run, Status.FAILED)
    assert run.error["code"] == "heartbeat_timeout" and "heartbeat_timeout_seconds" in run.error["message"]
    pgid = parse_job_id(run.backend_job_id)[1]
    wait_for(lambda: not group_alive(pgid), 30, message="the frozen engine to be killed")


def test_a_killed_engine_ends_failed_with_the_exit_mapped(api, studio_worker, tiny_models):
    run = start_long_run(api, tiny_models)
    os.kill(engine_pid(studio_worker, run), signal.SIGKILL)
    run = reconcile_until(run, Status.FAILED)
    # A `kill -9` is not an OOM: with the kernel's OOM-kill counter readable, the runner saw it not grow.
    oom_kills = json.loads((Path(studio_worker.runs_dir) / str(run.pk) / "attempt-1" / "exit.json").read_text())["oom_kills"]
    if oom_kills == 0:
        assert run.error["code"] == "training_error" and "SIGKILL) from outside the Studio" in run.error["message"], run.error
    else:
        assert oom_kills is None and run.error["code"] == "oom" and "possibly" in run.error["message"], run.error
    assert run.error["log_tail"] and len(run.error["log_tail"]) <= 200
