"""Concurrent writers on the embedded default (SQLite): what a busy Studio's writes wait, and whether any fails.

`--writers` engines post realistic ingest batches back to back (600 metric points and 100 log lines,
~75 KB each, as a reporter drains), while a user uploads a Data Hub file in 256 KiB chunks over a
~5 Mbit/s link and creates runs. The server is gunicorn (studio/gunicorn.conf.py, 2 workers x 4
threads) on a fresh SQLite file under var/bench/. Every answer's status is counted; a 5xx is an
error (a 503 is counted apart: the reporter resends it). Every point of a batch answered 200 is
counted back from the database (no loss).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import threading
import time
import uuid
from collections import Counter

import requests

from bench.common import BENCH_VAR, Gunicorn, emit, live_run, summary_ms

KEYS = ("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens", "epoch", "reward", "kl", "kd_loss")
STEPS_PER_BATCH = 60  # x 10 keys = 600 points
LOG_LINES = 100
CHUNK = 256 * 1024
LINK_BYTES_PER_S = 5_000_000 // 8


def engine(url: str, token: str, number: int, deadline: float, out: dict) -> None:
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    step, sent, latencies, statuses = 0, 0, [], Counter()
    while time.monotonic() < deadline:
        metrics = []
        for _ in range(STEPS_PER_BATCH):
            step += 1
            metrics.extend({"step": step, "key": key, "value": 1.0 / step + i} for i, key in enumerate(KEYS))
        logs = [f"engine {number} step {step}: loss={1.0 / step:.6f} grad_norm=0.5 lr=5e-5 tokens/s=1234.5 " + "x" * 300 for _ in range(LOG_LINES)]
        body = json.dumps({"batch_id": uuid.uuid4().hex, "metrics": metrics, "logs": logs, "progress": {"step": step}})
        t0 = time.perf_counter()
        try:
            status = session.post(url, data=body, timeout=90).status_code
        except requests.RequestException:
            status = 0
        latencies.append(time.perf_counter() - t0)
        statuses[status] += 1
        if status == 200:
            sent += len(metrics)
    out[number] = (sent, latencies, statuses, len(body))


def slow_put(port: int, path: str, token: str, body: bytes) -> int:
    """PUT `body` with a Content-Length, trickled at LINK_BYTES_PER_S as a remote browser's would arrive."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
    try:
        conn.putrequest("PUT", path)
        conn.putheader("Authorization", f"Bearer {token}")
        conn.putheader("Content-Type", "application/octet-stream")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        piece = LINK_BYTES_PER_S // 20
        for start in range(0, len(body), piece):
            conn.send(body[start:start + piece])
            time.sleep(0.05)
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def uploader(server: Gunicorn, token: str, deadline: float, out: dict) -> None:
    """Upload one 16 MiB file chunk by chunk until the deadline (a new session when it is done)."""
    headers = {"Authorization": f"Bearer {token}"}
    latencies, statuses = [], Counter()
    data = os.urandom(CHUNK)
    size = 64 * CHUNK
    while time.monotonic() < deadline:
        session = requests.post(f"{server.url}/api/hub/repos/bench-data/uploads", json={"branch": "main", "files": [{"path": f"{uuid.uuid4().hex}.bin", "size": size}]},
                                headers=headers, timeout=90)
        if session.status_code != 201:
            statuses[session.status_code] += 1
            continue
        upload_id, offset = session.json()["id"], 0
        while offset < size and time.monotonic() < deadline:
            t0 = time.perf_counter()
            status = slow_put(server.port, f"/api/hub/uploads/{upload_id}/files/0?offset={offset}", token, data)
            latencies.append(time.perf_counter() - t0)
            statuses[status] += 1
            if status == 200:
                offset += CHUNK
            else:
                time.sleep(1)
    out["upload"] = (latencies, statuses)


def creator(url: str, token: str, deadline: float, out: dict) -> None:
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {token}"})
    latencies, statuses = [], Counter()
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        try:
            status = session.post(url, json={"name": "bench create", "method": "sft", "base_model": "org/base", "dataset": "org/data"}, timeout=90).status_code
        except requests.RequestException:
            status = 0
        latencies.append(time.perf_counter() - t0)
        statuses[status] += 1
        time.sleep(0.5)
    out["create"] = (latencies, statuses)


def figures(latencies: list[float], statuses: Counter) -> dict:
    return {**summary_ms(latencies), "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "errors_5xx": sum(v for k, v in statuses.items() if k >= 500 or k == 0), "busy_503": statuses.get(503, 0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    folder = BENCH_VAR / "sqlite-writers"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{folder / 'studio.sqlite3'}"
    os.environ["DATAHUB_ROOT"] = str(folder / "hub")
    from bench.common import fresh_project, setup_django

    setup_django()
    from datahub import repos

    project, user, token = fresh_project("sqlite")
    repos.create_repo(project, "bench-data", "dataset", user)
    runs = [live_run(project, user, "sqlite writers bench") for _ in range(args.writers)]
    results: dict = {}
    with Gunicorn(workers=args.workers, threads=args.threads) as server:
        for run, run_token in runs:  # warm the workers outside the timed window
            requests.post(f"{server.url}/api/ingest/runs/{run.pk}", json={"batch_id": uuid.uuid4().hex}, headers={"Authorization": f"Bearer {run_token}"}, timeout=90)
        deadline = time.monotonic() + args.seconds
        threads = [threading.Thread(target=engine, args=(f"{server.url}/api/ingest/runs/{run.pk}", run_token, i, deadline, results)) for i, (run, run_token) in enumerate(runs)]
        threads.append(threading.Thread(target=uploader, args=(server, token, deadline, results)))
        threads.append(threading.Thread(target=creator, args=(f"{server.url}/api/training-runs", token, deadline, results)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    from training.models import MetricPoint

    ingest_latencies = [x for i in range(args.writers) for x in results[i][1]]
    ingest_statuses = sum((results[i][2] for i in range(args.writers)), Counter())
    sent = sum(results[i][0] for i in range(args.writers))
    stored = MetricPoint.objects.filter(run__in=[run for run, _ in runs]).count()
    emit(
        "sqlite_writers",
        {"label": args.label, "ingest": {**figures(ingest_latencies, ingest_statuses), "points_answered_200": sent, "points_stored": stored},
         "upload_chunk": figures(*results["upload"]), "create_run": figures(*results["create"])},
        {"writers": args.writers, "seconds": args.seconds, "batch": f"{STEPS_PER_BATCH * len(KEYS)} points + {LOG_LINES} log lines, {results[0][3]} bytes",
         "upload": f"{CHUNK // 1024} KiB chunks at {LINK_BYTES_PER_S * 8 // 1_000_000} Mbit/s", "create": "one POST /api/training-runs every 0.5 s",
         "server": f"gunicorn gthread {args.workers} workers x {args.threads} threads", "database": "SQLite (the embedded default's settings)"},
        {"errors_5xx": 0},
    )


if __name__ == "__main__":
    main()
