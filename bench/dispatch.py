"""Dispatch latency: START (the API call) → the backend's submit() called in a Celery worker.

A real Celery worker (prefork, -c 2, as `make studio` runs it) on a real Redis, against the bench
database. In the worker, the local backend's submit() is replaced by one that only notes the time it
was called (its job id is "bench:<unix time>"), so the figure is the platform's own path: the START
transaction, on_commit publish, the broker, the worker's claim (conditional UPDATE) and the hand-off —
not the engine's start-up. 200 runs, one after another; p50/p95. Target: p50 < 50 ms.

    python -m bench.dispatch            # the bench
    python -m bench.dispatch --worker   # (internal) the patched worker
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from bench.common import BENCH_VAR, REPO_ROOT, bench_env, emit, fresh_project, setup_django, summary_ms

RUNS = 200


def worker_main() -> None:
    setup_django()
    from studio.celery import app
    from training.backends import BACKENDS

    def submit(job) -> str:
        return f"bench:{time.time():.6f}"

    BACKENDS["local"].submit = submit  # type: ignore[method-assign]
    app.worker_main(["worker", "-Q", os.environ["CELERY_QUEUE"], "-c", "2", "--loglevel", "WARNING", "--without-gossip",
                     "--without-mingle", "--without-heartbeat", "-n", f"bench-{os.getpid()}@%h"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    if args.worker:
        worker_main()
        return
    setup_django()
    from django.test import Client

    from studio.celery import app
    from training.models import TrainingRun

    app.control.purge()
    project, user, token = fresh_project("dispatch")
    client = Client()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    body = '{"name": "dispatch bench", "method": "sft", "base_model": "org/base", "dataset": "org/data", "compute": {"backend": "local"}}'
    run_ids = []
    for _ in range(args.runs + 5):
        response = client.post("/api/training-runs", data=body, content_type="application/json", **auth)
        assert response.status_code == 201, response.content
        run_ids.append(response.json()["id"])

    log_path = BENCH_VAR / "dispatch-worker.log"
    worker = subprocess.Popen([sys.executable, "-m", "bench.dispatch", "--worker"], cwd=REPO_ROOT, env=bench_env(),
                              stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    latencies, start_request, answered_to_submit = [], [], []
    try:
        for i, run_id in enumerate(run_ids):
            started = time.time()
            response = client.post(f"/api/training-runs/{run_id}/start", **auth)
            answered = time.time()
            assert response.status_code == 202, response.content
            deadline = time.monotonic() + (120 if i == 0 else 30)  # the first waits for the worker to boot
            while True:
                job_id = TrainingRun.objects.filter(pk=run_id).values_list("backend_job_id", flat=True).first()
                if job_id:
                    break
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError(f"run {run_id} was not submitted; worker log:\n{log_path.read_text()[-3000:]}")
                time.sleep(0.002)
            if i >= 5:  # the first few warm the worker's connections
                submitted = float(job_id.split(":", 1)[1])
                latencies.append(submitted - started)
                start_request.append(answered - started)
                answered_to_submit.append(submitted - answered)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    emit(
        "dispatch",
        {"start_to_submit": summary_ms(latencies), "start_request": summary_ms(start_request), "response_to_submit": summary_ms(answered_to_submit)},
        {"runs": len(latencies), "warmup_runs": 5, "worker": "celery prefork -c 2, Redis broker", "start": "POST /api/training-runs/{id}/start in-process (Django test client)",
         "measured": "wall clock at START request → wall clock inside backend.submit() in the worker", "redis": os.environ.get("REDIS_URL")},
        {"p50_ms": "< 50"},
    )


if __name__ == "__main__":
    main()
