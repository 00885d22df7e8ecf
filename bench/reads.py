"""Read paths, p95 over HTTP through gunicorn: the run list of a project with 10,000 runs, and the run
page and metrics endpoint of a run with 100,000 metric points.

The 100k points are one `loss` series of 100,000 steps (MLflow's get-history case) for the
metrics endpoint, plus the run page, which charts the SFT keys downsampled. Target: p95 < 150 ms
(MLflow returns a 100k-point history in 10-13 s on this machine kind). A finished run's series are
cached (training/metrics.py), so `metrics_100k_uncached` asks for a different max_points each time to
measure the SQL path itself. The in-process cost of the old Python downsampling path (every point
through the ORM) is measured alongside for comparison.
"""
from __future__ import annotations

import argparse
import time

import requests

from bench.common import Gunicorn, emit, fresh_project, session_cookie, setup_django, summary_ms

RUNS = 10_000
POINTS = 100_000


def populate():
    from django.db import connection

    from experiments.services import default_experiment
    from training.models import MetricPoint, Status, TrainingRun

    project, user, token = fresh_project("reads")
    experiment = default_experiment(project)
    statuses = [Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.QUEUED]
    TrainingRun.objects.bulk_create(
        [TrainingRun(project=project, experiment=experiment, created_by=user, name=f"run {i}", method="sft", base_model="org/base",
                     dataset="org/data", config={"learning_rate": 1e-5, "max_steps": 100}, compute={"backend": "local"},
                     status=statuses[i % len(statuses)]) for i in range(RUNS)],
        batch_size=2000,
    )
    run = TrainingRun.objects.filter(project=project).order_by("-id").first()
    TrainingRun.objects.filter(pk=run.pk).update(status=Status.COMPLETED)
    with connection.cursor() as cursor, cursor.copy("COPY training_metricpoint (run_id, step, key, value) FROM STDIN") as copy:
        for step in range(POINTS):
            copy.write_row((run.pk, step, "loss", 5.0 / (1 + step / 1000)))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE training_metricpoint")
        cursor.execute("ANALYZE training_trainingrun")
    assert MetricPoint.objects.filter(run=run).count() == POINTS
    return project, user, token, run


def timed(session: requests.Session, url: str, n: int, **kw) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(3):  # warm
        session.get(url, timeout=60, **kw).raise_for_status()
    for _ in range(n):
        t0 = time.perf_counter()
        response = session.get(url, timeout=60, **kw)
        times.append(time.perf_counter() - t0)
        response.raise_for_status()
        size = len(response.content)
    return times, size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=50, help="requests per path")
    args = parser.parse_args()
    setup_django()
    project, user, token, run = populate()
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {token}"
    browser = requests.Session()
    browser.cookies.set("sessionid", session_cookie(user))
    figures = {}
    with Gunicorn(workers=2, threads=4) as server:
        paths = {
            "run_list_api": (api, f"{server.url}/api/training-runs?limit=50"),
            "run_list_api_filtered": (api, f"{server.url}/api/training-runs?limit=50&status=completed"),
            "run_list_page": (browser, f"{server.url}/training/"),
            "run_api": (api, f"{server.url}/api/training-runs/{run.pk}"),
            "run_page": (browser, f"{server.url}/training/runs/{run.pk}/"),
            "metrics_100k_default": (api, f"{server.url}/api/training-runs/{run.pk}/metrics?keys=loss"),
            "metrics_100k_500_points": (api, f"{server.url}/api/training-runs/{run.pk}/metrics?keys=loss&max_points=500"),
            "metrics_100k_all_keys": (api, f"{server.url}/api/training-runs/{run.pk}/metrics"),
        }
        for name, (session, url) in paths.items():
            times, size = timed(session, url, args.n)
            figures[name] = {**summary_ms(times), "bytes": size}
        # Cold: a different max_points each time, so no request is answered from the cache.
        cold = []
        for i in range(args.n):
            t0 = time.perf_counter()
            api.get(f"{server.url}/api/training-runs/{run.pk}/metrics?keys=loss&max_points={1000 + i}", timeout=60).raise_for_status()
            cold.append(time.perf_counter() - t0)
        figures["metrics_100k_uncached"] = summary_ms(cold)
    # The old path (every point through the ORM, downsampled in Python), in-process, for comparison.
    from training import metrics
    from training.models import MetricPoint

    python_path = []
    for _ in range(5):
        t0 = time.perf_counter()
        points = list(MetricPoint.objects.filter(run=run, key="loss").order_by("step", "id").values_list("step", "value"))
        metrics.downsample(points, 1000)
        python_path.append(time.perf_counter() - t0)
    sql_path = []
    for _ in range(5):
        t0 = time.perf_counter()
        metrics.series_in_sql(run.pk, ["loss"], 1000)
        sql_path.append(time.perf_counter() - t0)
    figures["metrics_100k_in_process"] = {"python_downsampling": summary_ms(python_path), "sql_downsampling": summary_ms(sql_path)}
    emit(
        "reads",
        figures,
        {"runs_in_project": RUNS, "points_in_run": POINTS, "requests_per_path": args.n, "server": "gunicorn gthread 2x4, DEBUG=0",
         "client": "requests.Session keep-alive, sequential, same machine"},
        {"p95_ms": "< 150", "mlflow_anchor_100k_history_s": "10-13"},
    )


if __name__ == "__main__":
    main()
