"""The metrics endpoint's downsampling in-process, on the embedded default's SQLite or on PostgreSQL: a
live run (never cached) with one dense `loss` series and one with a repeated step every 10 (the walk
along the index), each of --points points, read at max_points 1000 through training.metrics.series_in_sql,
against the old path (every point through the ORM, then downsampled in Python), which took 3.4-7 s for
120k-768k points on SQLite.

    .venv/bin/python -m bench.metrics_sqlite [--points 120000] [--n 5] [--database postgres]

SQLite: its own file (var/bench/metrics.sqlite3, made afresh), never a developer's data. PostgreSQL:
the bench database (DATABASE_URL, else studio_bench), vacuumed after the points go in, as autovacuum
would; the run and its points are deleted at the end.
"""
from __future__ import annotations

import argparse
import os
import time

from bench.common import BENCH_VAR, emit, fresh_project, setup_django, summary_ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=120_000, help="points in each series")
    parser.add_argument("--n", type=int, default=5, help="timed reads per path")
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    if args.database == "sqlite":
        db = BENCH_VAR / "metrics.sqlite3"
        BENCH_VAR.mkdir(parents=True, exist_ok=True)
        db.unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    setup_django()
    from django.db import connection

    from experiments.services import default_experiment
    from training import metrics
    from training.models import MetricPoint, Status, TrainingRun

    project, user, _ = fresh_project("metrics-sqlite")
    run = TrainingRun.objects.create(project=project, experiment=default_experiment(project), created_by=user, name="long", method="sft",
                                     base_model="org/base", dataset="org/data", config={}, compute={"backend": "local"}, status=Status.RUNNING)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="loss", step=s, value=5.0 / (1 + s / 1000)) for s in range(args.points)], batch_size=5000)
    MetricPoint.objects.bulk_create([MetricPoint(run=run, key="reward", step=s - s // 10, value=s % 7) for s in range(args.points)], batch_size=5000)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {MetricPoint._meta.db_table}")

    def timed(fn) -> dict:
        seconds = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - t0)
        return summary_ms(seconds)

    def python_path(key: str) -> None:
        points = list(MetricPoint.objects.filter(run=run, key=key).order_by("step", "id").values_list("step", "value").iterator(chunk_size=10_000))
        metrics.downsample(points, 1000)

    try:
        figures = {key: {"sql": timed(lambda key=key: metrics.series_in_sql(run.pk, [key], 1000)), "python": timed(lambda key=key: python_path(key))}
                   for key in ("loss", "reward")}
    finally:
        if connection.vendor == "postgresql":
            run.delete()
    emit("metrics_sqlite", figures, {"points_per_series": args.points, "max_points": 1000,
                                     "database": "SQLite file (WAL)" if connection.vendor == "sqlite" else "PostgreSQL, vacuumed",
                                     "series": {"loss": "dense (one point a step)", "reward": "a repeated step every 10 (the walk)"}})


if __name__ == "__main__":
    main()
