"""Server-side render time of a run page with 100k metric points (issue 4: p95 < 150 ms).

    .venv/bin/python bench/run_page.py [--points 100000] [--n 30]

Uses its own database (default postgres://postgres@127.0.0.1:5432/studio_bench_ui, created when missing;
override with BENCH_UI_DATABASE_URL), never a developer's or another bench's data.
Measures the full Django request (middleware, view, template) with the test client, not the network.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
BENCH_DB = os.environ.get("BENCH_UI_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/studio_bench_ui")
os.environ["DATABASE_URL"] = BENCH_DB
os.environ.setdefault("DEBUG", "0")  # production-like: DEBUG keeps every query in memory
os.environ.setdefault("SECRET_KEY", "bench-" + "x" * 60)
os.environ.setdefault("STUDIO_ENCRYPTION_KEY", "bench-encryption-key")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("SECURE_SSL_REDIRECT", "0")  # the test client speaks plain HTTP


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=100_000, help="metric points of the run, split over its chart keys")
    parser.add_argument("--n", type=int, default=30, help="timed requests per page")
    args = parser.parse_args()

    import django

    if BENCH_DB.startswith("postgres"):
        ensure_database(BENCH_DB)
    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    from studio.models import Project
    from studio.services import create_plan, create_project
    from training import services
    from training.models import MetricPoint

    User = get_user_model()
    user = User.objects.filter(username="bench").first() or User.objects.create_user("bench", "bench@example.com", "pw")
    project = Project.objects.filter(slug="bench").first() or create_project("bench", owner=user, plan=create_plan("bench-plan"))
    name = f"bench-{args.points}"
    run = project.runs.filter(name=name).first()
    if run is None:
        run = services.create_run(project, user, name=name, method="sft", base_model="org/base", dataset="org/data")
        keys = ["loss", "tokens_per_s"]
        per_key = args.points // len(keys)
        MetricPoint.objects.bulk_create(
            (MetricPoint(run=run, key=k, step=s, value=1.0 / (s + 1)) for k in keys for s in range(per_key)), batch_size=20_000
        )
        from django.db import connection

        with connection.cursor() as cursor:  # what autovacuum would have done by the time someone looks
            cursor.execute(f"VACUUM ANALYZE {MetricPoint._meta.db_table}")
    from django.conf import settings
    from django.test.utils import override_settings

    # Static URLs without a collectstatic run: the bench measures the view, not the manifest.
    override_settings(STORAGES={**settings.STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}).enable()
    client = Client(SERVER_NAME="localhost")
    client.force_login(user)
    for label, url, headers in [
        ("run page (full)", f"/training/runs/{run.pk}/", {}),
        ("live partial (poll)", f"/training/runs/{run.pk}/live", {"HTTP_HX_REQUEST": "true"}),
        ("metrics API", f"/api/training-runs/{run.pk}/metrics?keys=loss,tokens_per_s&max_points=500", {}),
    ]:
        client.get(url, **headers)  # warm up
        times = []
        for _ in range(args.n):
            start = time.perf_counter()
            response = client.get(url, **headers)
            times.append((time.perf_counter() - start) * 1000)
            assert response.status_code == 200, (url, response.status_code)
        times.sort()
        p95 = times[max(0, int(round(0.95 * len(times))) - 1)]
        print(f"{label:22s} points={args.points} median={statistics.median(times):6.1f} ms  p95={p95:6.1f} ms  ({'OK' if p95 < 150 else 'OVER 150 ms'})")


if __name__ == "__main__":
    main()
