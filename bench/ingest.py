"""Ingest throughput: metric points/s through POST /api/ingest/runs/{id} into PostgreSQL.

Batches of 500 points, as the engine's reporter sends them (JSON encoded per request, keep-alive
connection, a fresh batch_id each), from 1 and from 4 concurrent clients, for a fixed wall time
each. The server is gunicorn (studio/gunicorn.conf.py) on the same 2-core machine as the clients.
Every point sent is counted back from the database afterwards (no loss, no duplicates).

Target: >= 20,000 points/s. Anchor: MLflow 3.17's tracking server on PostgreSQL on this machine kind
ingests ~2,050 points/s from one client, ~4,000 from four (batches of 500).
"""
from __future__ import annotations

import argparse
import json
import threading
import time
import uuid

import requests

from bench.common import Gunicorn, emit, fresh_project, live_run, setup_django, summary_ms

BATCH = 500
KEYS = ("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens", "epoch", "reward", "kl", "kd_loss")


def client(url: str, token: str, client_no: int, deadline: float, out: dict) -> None:
    session = requests.Session()
    session.headers.update({"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    step, sent, latencies = client_no * 10_000_000, 0, []
    while time.monotonic() < deadline:
        metrics = []
        for _ in range(BATCH // len(KEYS)):
            step += 1
            metrics.extend({"step": step, "key": key, "value": 1.0 / step + i} for i, key in enumerate(KEYS))
        body = json.dumps({"batch_id": uuid.uuid4().hex, "metrics": metrics, "logs": [], "progress": {"step": step}})
        t0 = time.perf_counter()
        response = session.post(url, data=body, timeout=30)
        latencies.append(time.perf_counter() - t0)
        if response.status_code != 200:
            raise RuntimeError(f"ingest answered {response.status_code}: {response.text[:300]}")
        sent += len(metrics)
    out[client_no] = (sent, latencies)


def measure(server: Gunicorn, clients: int, seconds: float) -> dict:
    from training.models import MetricPoint

    # One run per client, as each engine reports its own run.
    runs = [live_run(*fresh_project("ingest")[:2], "ingest bench") for _ in range(clients)]
    urls = [f"{server.url}/api/ingest/runs/{run.pk}" for run, _ in runs]
    for url, (_, token) in zip(urls, runs, strict=True):
        # Warm the workers (imports, connections) outside the timed window.
        for _ in range(4):
            warm = requests.post(url, json={"batch_id": uuid.uuid4().hex, "metrics": [{"step": 0, "key": "warm", "value": 0.0}]}, headers={"Authorization": f"Bearer {token}"}, timeout=30)
            warm.raise_for_status()
    results: dict[int, tuple[int, list[float]]] = {}
    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(urls[i], runs[i][1], i, start + seconds, results)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    sent = sum(s for s, _ in results.values())
    stored = MetricPoint.objects.filter(run__in=[run for run, _ in runs]).exclude(key="warm").count()
    latencies = [x for _, lat in results.values() for x in lat]
    return {"clients": clients, "seconds": round(elapsed, 2), "points_sent": sent, "points_stored": stored,
            "points_per_s": round(stored / elapsed), "batch_latency": summary_ms(latencies)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    setup_django()
    with Gunicorn(workers=args.workers, threads=args.threads) as server:
        one = measure(server, 1, args.seconds)
        four = measure(server, 4, args.seconds)
    assert one["points_sent"] == one["points_stored"] and four["points_sent"] == four["points_stored"], (one, four)
    emit(
        "ingest",
        {"points_per_s_1_client": one["points_per_s"], "points_per_s_4_clients": four["points_per_s"], "one_client": one, "four_clients": four},
        {"batch_points": BATCH, "keys_per_step": len(KEYS), "server": f"gunicorn gthread {args.workers} workers x {args.threads} threads",
         "client": "requests.Session keep-alive, JSON encoded per batch, same machine", "database": "PostgreSQL"},
        {"points_per_s": ">= 20000", "mlflow_anchor_points_per_s": {"1_client": 2050, "4_clients": 4000}},
    )


if __name__ == "__main__":
    main()
