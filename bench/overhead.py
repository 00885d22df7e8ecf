"""Platform overhead: a tiny SFT run's wall time through Studio vs the bare engine command.

Bare: `python -m training.engine --spec spec.json` with no ingest URL (nothing reported), timed from
exec to exit. Through Studio: POST /api/training-runs + START against gunicorn, a real Celery worker
and the local backend, timed from START to the run's `completed` status in the database (the engine
reports every metric and its status through the ingest API on the way). Same tiny model, data and
config; alternated, `--repeats` times each. Overhead = Studio median (START → the engine process's
exit, like the bare figure) − bare median; START → `completed` is reported too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import requests

from bench.common import BENCH_VAR, REPO_ROOT, Gunicorn, bench_env, emit, fresh_project, setup_django

CONFIG = {"learning_rate": 5e-3, "per_device_train_batch_size": 8, "max_length": 64, "max_steps": 20, "heartbeat_interval_seconds": 2}


def tiny() -> dict[str, str]:
    from training.engine.tiny import build_demo_datasets, build_tiny_models

    out = BENCH_VAR / "tiny"
    marker = out / "paths.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    paths = {**build_tiny_models(out / "models"), **{f"data_{k}": v for k, v in build_demo_datasets(out / "data").items()}}
    marker.write_text(json.dumps(paths))
    return paths


def bare_once(studio_spec: dict, n: int) -> float:
    """The engine command on the very spec Studio wrote for its run, without the ingest block, in
    the environment the local backend builds (the same allow-list)."""
    from training.backends.local import engine_env

    directory = BENCH_VAR / "overhead" / f"bare-{n}"
    directory.mkdir(parents=True, exist_ok=True)
    spec = {**studio_spec, "run_id": f"bare-{n}", "ingest": None, "output_dir": str(directory / "output")}
    (directory / "spec.json").write_text(json.dumps(spec))
    env = engine_env({"HF_HUB_OFFLINE": "1"})
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "training.engine", "--spec", str(directory / "spec.json")], cwd=REPO_ROOT, env=env,
                          stdout=(directory / "engine.log").open("wb"), stderr=subprocess.STDOUT)
    elapsed = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"bare engine exited {done.returncode}: {(directory / 'engine.log').read_text()[-2000:]}")
    return elapsed


class Worker:
    def __init__(self, server_url: str):
        self.log = BENCH_VAR / "overhead-worker.log"
        env = {**bench_env(), "STUDIO_PUBLIC_URL": server_url, "STUDIO_RUNS_DIR": str(BENCH_VAR / "overhead" / "runs"), "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "studio", "worker", "-Q", env["CELERY_QUEUE"], "-c", "2", "--loglevel", "INFO",
                                      "--without-gossip", "--without-mingle", "-n", f"bench-overhead-{time.time_ns()}@%h"],
                                     cwd=REPO_ROOT, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        while "ready." not in self.log.read_text(errors="replace"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(self.log.read_text()[-3000:])
            time.sleep(0.2)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def studio_once(server: Gunicorn, token: str, models: dict[str, str]) -> float:
    from training.models import MetricPoint, Status, TrainingRun

    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    body = {"name": "overhead", "method": "sft", "base_model": models["student"], "dataset": models["data_sft"], "config": CONFIG}
    response = api.post(f"{server.url}/api/training-runs", json=body, timeout=30)
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    t0 = time.monotonic()
    assert api.post(f"{server.url}/api/training-runs/{run_id}/start", timeout=30).status_code == 202
    deadline = t0 + 600
    while True:
        status = TrainingRun.objects.values_list("status", flat=True).get(pk=run_id)
        if status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} still {status}")
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    run = TrainingRun.objects.get(pk=run_id)
    if status != Status.COMPLETED:
        raise RuntimeError(f"run {run_id} ended {status}: {run.error}")
    assert MetricPoint.objects.filter(run=run, key="loss").count() > 0
    # The engine reports `completed` before its interpreter exits; the bare figure includes the exit.
    exit_file = BENCH_VAR / "overhead" / "runs" / str(run_id) / f"attempt-{run.attempt}" / "exit.json"
    while not exit_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    spec = json.loads((exit_file.parent / "spec.json").read_text())
    return elapsed, time.monotonic() - t0, spec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()
    setup_django()
    from studio.celery import app

    app.control.purge()
    models = tiny()
    _, _, token = fresh_project("overhead")
    bare, studio, studio_exit = [], [], []
    with Gunicorn(workers=2, threads=4) as server:
        worker = Worker(server.url)
        try:
            _, _, spec = studio_once(server, token, models)  # warm-up; its spec is the bare run's
            for n in range(args.repeats):
                # Alternate which goes first: the machine's background load drifts.
                if n % 2:
                    bare.append(bare_once(spec, n))
                completed, exited, spec = studio_once(server, token, models)
                studio.append(completed)
                studio_exit.append(exited)
                if not n % 2:
                    bare.append(bare_once(spec, n))
        finally:
            worker.close()
    bare_median, studio_median = statistics.median(bare), statistics.median(studio_exit)
    emit(
        "overhead",
        {"bare_engine_s": [round(x, 2) for x in bare], "through_studio_to_completed_s": [round(x, 2) for x in studio],
         "through_studio_to_engine_exit_s": [round(x, 2) for x in studio_exit], "bare_median_s": round(bare_median, 2),
         "studio_median_s": round(studio_median, 2), "overhead_s": round(studio_median - bare_median, 2),
         "overhead_pct": round(100 * (studio_median - bare_median) / bare_median, 1)},
        {"method": "sft", "model": "tiny Qwen2-shaped (hidden 64, 2 layers), built offline", "config": CONFIG, "repeats": args.repeats,
         "studio": "gunicorn 2x4 + celery prefork -c 2 + local backend; START → status completed", "bare": "python -m training.engine --spec <the spec Studio wrote, ingest: null>, local backend's env allow-list",
         "note": "one warm-up Studio run first; the order alternates each repeat"},
    )


if __name__ == "__main__":
    main()
