"""Faults beyond those the engine and backend tests cover.

- PostgreSQL drops the web process's connections while an engine is reporting: the engine's
  reporter retries its batches (same batch_id), and every point lands exactly once.
- The web process is killed and restarted mid-run: the run still completes and every metric step
  the engine logged arrives, once.
- The whole Studio is down from mid-run until after the engine gave up on its last reports: the
  engine spools them, and the reconciler delivers them when it sees the job end (checkpoints,
  metrics and the end status land, and the run log says so).
- STOP while a DISTILL run is capturing the teacher's logits: cancelled, the engine's process group
  is gone, and nothing from it lands afterwards.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from django.db import connection

from studio import crypto
from tests.conftest import REPO_ROOT, Api, celery_worker, free_port, listening, wait_for
from training import reconciler
from training.backends.local import group_alive, output_dir, parse_job_id, run_dir
from training.engine.reporter import Reporter
from training.models import Checkpoint, LogLine, MetricPoint, Status, TrainingRun

pytestmark = pytest.mark.worker
FAST = {"learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, "heartbeat_interval_seconds": 1}


def db_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def requires_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (pg_terminate_backend)")


# ---- PostgreSQL drops connections during ingest --------------------------------------------------

def test_connection_drops_during_ingest_lose_and_duplicate_nothing(transactional_db, live_server, api):
    requires_postgresql()
    run_id = api.post("/api/training-runs", {"name": "drops", "method": "sft", "base_model": "org/base", "dataset": "org/data"}).json()["id"]
    token = crypto.new_token("ing")
    TrainingRun.objects.filter(pk=run_id).update(status=Status.RUNNING, attempt=1, ingest_token_hash=crypto.hash_token(token))
    reporter = Reporter(f"{live_server.url}/api/ingest/runs/{run_id}", token, flush_interval=0.05, heartbeat_interval=5, echo=False).start()

    stop = threading.Event()
    killed: list[int] = []

    mine = connection.cursor().connection.info.backend_pid  # the test's own connection is spared

    def kill_server_connections() -> None:
        # The live server's connections are cut every ~10 ms, mid-request or not.
        with psycopg.connect(db_url(), autocommit=True) as admin:
            while not stop.is_set():
                rows = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND pid <> %s AND backend_type = 'client backend'", (mine,)).fetchall()
                killed.extend(1 for _ in rows)
                time.sleep(0.01)

    killer = threading.Thread(target=kill_server_connections, daemon=True)
    killer.start()
    steps = 3000
    for step in range(steps):
        reporter.metric(step, "loss", 1.0 / (step + 1))
        reporter.metric(step, "grad_norm", float(step))
        if step % 50 == 0:
            time.sleep(0.05)  # spread the batches so the cuts land in the middle of some
    time.sleep(1.0)
    stop.set()
    killer.join(timeout=10)
    assert reporter.flush(timeout=90), "the reporter could not deliver everything after the database came back"
    reporter.close(timeout=10)

    assert killed, "no connection was cut: the fault was not injected"
    warnings = "\n".join(reporter.log_tail)
    assert "retrying batch" in warnings, f"no batch was retried, so no drop hit a request:\n{warnings}"
    rows = list(MetricPoint.objects.filter(run_id=run_id).values_list("key", "step"))
    assert len(rows) == 2 * steps, f"{len(rows)} points stored for {2 * steps} sent"
    assert set(rows) == {(k, s) for s in range(steps) for k in ("loss", "grad_norm")}


# ---- the web process restarted mid-run -----------------------------------------------------------

class WebProcess:
    """gunicorn on a fixed port, on the test database, that the test can kill and start again."""

    def __init__(self, tmp_path, port: int):
        self.port, self.tmp_path, self.proc = port, tmp_path, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> None:
        env = {**os.environ, "DATABASE_URL": db_url(), "DEBUG": "1", "GUNICORN_BIND": f"127.0.0.1:{self.port}",
               "GUNICORN_WORKERS": "1", "GUNICORN_THREADS": "4", "STUDIO_VAR_DIR": str(self.tmp_path / "var"),
               # The worker's: ingest takes a checkpoint only inside the attempt's output folder there.
               "STUDIO_RUNS_DIR": str(self.tmp_path / "runs")}
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "studio/gunicorn.conf.py", "studio.wsgi:application"],
                                     cwd=REPO_ROOT, env=env, stdout=(self.tmp_path / f"web-{time.time_ns()}.log").open("wb"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

        wait_for(lambda: listening(self.port, self.proc), 60, message="gunicorn to listen")

    def kill(self) -> None:
        # The whole group: a worker whose master was killed alone keeps answering until it notices.
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def web_and_worker(transactional_db, tmp_path, settings):
    from studio.celery import app

    app.control.purge()
    web = WebProcess(tmp_path, free_port())
    web.start()
    runs_dir = tmp_path / "runs"
    settings.STUDIO_RUNS_DIR = runs_dir
    env = {**os.environ, "DATABASE_URL": db_url(), "STUDIO_PUBLIC_URL": web.url, "STUDIO_RUNS_DIR": str(runs_dir),
           "CELERY_QUEUE": app.conf.task_default_queue, "STUDIO_STOP_GRACE_SECONDS": "5", "DEBUG": "1"}
    try:
        with celery_worker(env, tmp_path / "worker.log", "faults"):
            yield web
    finally:
        if web.proc and web.proc.poll() is None:
            web.proc.terminate()
            web.proc.wait(timeout=20)


def status_of(run_id: int) -> str:
    return TrainingRun.objects.values_list("status", flat=True).get(pk=run_id)


def test_web_process_restarted_mid_run_the_run_completes_with_every_metric(web_and_worker, api, tiny_models):
    max_steps = 300
    body = {"name": "restart web", "method": "sft", "base_model": tiny_models["student"], "dataset": tiny_models["data_sft"],
            "config": {**FAST, "max_steps": max_steps, "logging_steps": 1, "heartbeat_timeout_seconds": 300}}
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    wait_for(lambda: MetricPoint.objects.filter(run_id=run_id, key="loss").count() >= 3, 240, interval=0.2, message="the first metrics")
    web_and_worker.kill()
    down_at = MetricPoint.objects.filter(run_id=run_id, key="loss").count()
    time.sleep(4)  # the engine keeps training and buffering; its posts fail meanwhile
    web_and_worker.start()
    wait_for(lambda: status_of(run_id) in (Status.COMPLETED, Status.FAILED, Status.CANCELLED), 300, interval=0.5, message="the run to finish")
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.COMPLETED, (run.error, list(LogLine.objects.filter(run=run).values_list("line", flat=True))[-30:])
    assert down_at < max_steps, "the run finished before the web process went down: nothing was tested"
    steps = list(MetricPoint.objects.filter(run_id=run_id, key="loss").values_list("step", flat=True))
    assert sorted(steps) == list(range(1, max_steps + 1)), sorted(steps)


# ---- the Studio down while the engine finishes -----------------------------------------------------

def test_reports_spooled_during_an_outage_longer_than_the_drain_are_delivered_when_the_job_ends(web_and_worker, api, tiny_models):
    max_steps = 240
    body = {"name": "outage at the end", "method": "sft", "base_model": tiny_models["student"], "dataset": tiny_models["data_sft"],
            "config": {**FAST, "max_steps": max_steps, "save_steps": 80, "logging_steps": 1, "heartbeat_timeout_seconds": 60}}
    run_id = api.post("/api/training-runs", body).json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    wait_for(lambda: MetricPoint.objects.filter(run_id=run_id, key="loss").count() >= 3, 240, interval=0.2, message="the first metrics")
    web_and_worker.kill()  # no beat runs in this fixture: with the web process down, nothing of the Studio hears the engine
    down_at = MetricPoint.objects.filter(run_id=run_id, key="loss").count()
    exit_file = run_dir(run_id, 1) / "exit.json"
    # The engine trains to its end, retries its last reports for heartbeat_timeout_seconds (60 s), then exits.
    assert down_at < max_steps, "the run finished before the Studio went down: nothing was tested"
    wait_for(exit_file.is_file, 600, interval=0.5, message="the engine to exit")
    assert json.loads(exit_file.read_text())["returncode"] == 4
    assert TrainingRun.objects.get(pk=run_id).status == Status.RUNNING
    assert not Checkpoint.objects.filter(run_id=run_id, kind="final").exists()  # a step checkpoint may have landed before the outage

    web_and_worker.start()  # the Studio is back; its reconciler sees the job ended

    def delivered() -> bool:
        # Another pass may hold the run's reconcile lease (then this one returns at once) and be
        # mid-delivery: the run reads completed before the delivery's own log line is written.
        reconciler.reconcile_run(run_id)
        return LogLine.objects.filter(run_id=run_id, line__contains=" delivered from ").exists()

    wait_for(delivered, 150, interval=1, message="the spool's delivery")
    run = TrainingRun.objects.get(pk=run_id)
    lines = list(LogLine.objects.filter(run_id=run_id).order_by("id").values_list("line", flat=True))
    assert run.status == Status.COMPLETED, (run.status, run.error, lines[-20:])
    steps = sorted(MetricPoint.objects.filter(run_id=run_id, key="loss").values_list("step", flat=True))
    assert steps == list(range(1, max_steps + 1)), steps
    assert run.progress["step"] == max_steps
    stored = set(Checkpoint.objects.filter(run_id=run_id).values_list("step", "kind"))
    assert {(80, "checkpoint"), (160, "checkpoint"), (240, "checkpoint"), (240, "final")} <= stored, stored
    # "1 report batch … was delivered" when the batch in flight at the kill had landed (then "1 had
    # already arrived"): which of the two depends on where the kill fell.
    assert any(re.search(r"\d+ report batch(es)? .* (was|were) delivered from .*undelivered-reports\.jsonl", line) for line in lines), lines[-20:]
    assert not any("never reached the Studio" in line or "did not reach the Studio" in line for line in lines), lines[-20:]
    listed = api.get(f"/api/training-runs/{run_id}/checkpoints").json()
    assert {c["kind"] for c in (listed["items"] if isinstance(listed, dict) else listed)} >= {"checkpoint", "final"}
    assert (output_dir(run_id, 1) / "undelivered-reports.jsonl.delivered").is_file()


# ---- STOP during DISTILL capture -----------------------------------------------------------------

def test_stop_during_distill_capture_cancels_and_kills_the_engine(studio_worker, api: Api, tiny_models, tmp_path):
    # The demo set captures in well under a second, so STOP could land after it: give the teacher
    # 300× the rows, so the capture stage lasts long enough to be stopped in.
    rows = open(tiny_models["data_sft"]).read().strip().splitlines()
    big = tmp_path / "capture-rows.jsonl"
    big.write_text("\n".join(rows * 300) + "\n")
    body = {"name": "stop in capture", "method": "distill", "base_model": tiny_models["student"], "dataset": str(big),
            "config": {**FAST, "max_steps": 200, "distillation": {"teacher_model": tiny_models["teacher"], "top_k": 16}}}
    response = api.post("/api/training-runs", body)
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    assert api.post(f"/api/training-runs/{run_id}/start").status_code == 202
    wait_for(lambda: TrainingRun.objects.filter(pk=run_id, stage="capture").exists() or status_of(run_id) in (Status.FAILED, Status.COMPLETED),
             240, interval=0.1, message="the capture stage")
    run = TrainingRun.objects.get(pk=run_id)
    assert run.stage == "capture", (run.status, run.stage, run.error)
    job = parse_job_id(run.backend_job_id)
    assert job is not None
    stopped = api.post(f"/api/training-runs/{run_id}/stop")
    assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled", stopped.content
    wait_for(lambda: not group_alive(job[1]), 30, message="the engine's process group to exit")
    time.sleep(2)
    run = TrainingRun.objects.get(pk=run_id)
    assert run.status == Status.CANCELLED and run.finished_at is not None
    # The STOP wins: nothing the engine said on its way out (it flushes on SIGTERM) moved the run again.
    moves = [line.split("→ ")[1].split(":")[0] for line in LogLine.objects.filter(run_id=run_id, line__startswith="[studio] status →").order_by("id").values_list("line", flat=True)]
    assert moves[-1] == "cancelled" and "completed" not in moves and "failed" not in moves, moves
    assert not MetricPoint.objects.filter(run_id=run_id, key="loss").exists(), "training steps ran although STOP came during capture"
