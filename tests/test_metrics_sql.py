"""The downsampling in SQL (training/metrics.py: dense series by step, others with window functions)
returns exactly what the Python reference `downsample` returns, for every shape, on PostgreSQL and on
the embedded default's SQLite alike (run this file with DATABASE_URL=sqlite:///... for the latter)."""
from __future__ import annotations

import math
import random
from collections import defaultdict

import pytest
from django.db import connection

from tests.conftest import sft_body
from training import metrics
from training.models import MetricPoint, Status, TrainingRun

SHAPES = {
    "one": [0], "two": [0, 1], "three": [4, 5, 6], "dense": list(range(5, 1005)), "dense_odd": list(range(999)),
    "repeated_steps": [s // 2 for s in range(5003)], "gaps": [s * 3 for s in range(4000)], "from_one": list(range(1, 2501)),
}


@pytest.fixture
def shaped_run(api):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    rng = random.Random(3)
    rows = [MetricPoint(run_id=run_id, key=key, step=step, value=rng.random()) for key, steps in SHAPES.items() for step in steps]
    rng.shuffle(rows)
    MetricPoint.objects.bulk_create(rows)
    return TrainingRun.objects.get(pk=run_id)


@pytest.mark.parametrize("max_points", [2, 3, 4, 7, 50, 999, 1000, 1001])
def test_sql_downsampling_equals_the_python_reference(shaped_run, max_points):
    reference = defaultdict(list)
    for key, step, value in MetricPoint.objects.filter(run=shaped_run).order_by("key", "step", "id").values_list("key", "step", "value"):
        reference[key].append((step, value))
    expected = {key: metrics.downsample(points, max_points) for key, points in reference.items()}
    got = metrics.series_in_sql(shaped_run.pk, None, max_points)
    assert list(got) == sorted(expected)
    for key, points in expected.items():
        assert [s for s, _ in got[key]] == [s for s, _ in points], key
        assert all(math.isclose(a, b, rel_tol=1e-12) for (_, a), (_, b) in zip(got[key], points, strict=True)), key


def test_a_finished_runs_series_are_cached_and_a_late_batch_refreshes_them(shaped_run):
    TrainingRun.objects.filter(pk=shaped_run.pk).update(status=Status.COMPLETED)
    run = TrainingRun.objects.get(pk=shaped_run.pk)
    first = metrics.series(run, ["two"], 10)
    MetricPoint.objects.create(run=run, key="two", step=2, value=0.5)
    assert metrics.series(run, ["two"], 10) == first  # same version: served from the cache
    from django.utils import timezone

    TrainingRun.objects.filter(pk=run.pk).update(last_heartbeat_at=timezone.now())  # what ingest does
    run.refresh_from_db()
    assert [s for s, _ in metrics.series(run, ["two"], 10)["two"]] == [0, 1, 2]


def test_bucket_means_of_values_near_the_float_limit_stay_finite(api):
    # Each value is finite, but their sum is not: an avg() of them was Infinity, which broke the
    # API's JSON and the run page's charts.
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key=key, step=s, value=sign * 1.7e308) for s in range(10, 30)
                                     for key, sign in (("big", 1), ("neg", -1))])
    got = metrics.series_in_sql(run_id, None, 3)
    assert got == {"big": [(10, 1.7e308), (19, pytest.approx(1.7e308)), (29, 1.7e308)], "neg": [(10, -1.7e308), (19, pytest.approx(-1.7e308)), (29, -1.7e308)]}


def test_the_api_and_the_run_page_downsample_in_the_database_on_every_vendor(api, shaped_run):
    # On SQLite the API read every point into Python (3.4 s for 120k points): now every query it runs
    # on the points aggregates them, and the run page charts the same points.
    from django.test.utils import CaptureQueriesContext

    from training.views import chart_series

    with CaptureQueriesContext(connection) as queries:
        body = api.get(f"/api/training-runs/{shaped_run.pk}/metrics", keys="dense,gaps,repeated_steps", max_points=7).json()
    point_queries = [q["sql"].lower() for q in queries.captured_queries if MetricPoint._meta.db_table in q["sql"]]
    # The answer's known_keys: metrics.metric_keys' index walk, one row per key, not a read of the points.
    walks = [sql for sql in point_queries if sql.lstrip().startswith("with recursive walk(run_id, key)")]
    point_queries = [sql for sql in point_queries if sql not in walks]
    assert len(walks) == 1 and {"dense", "gaps", "repeated_steps"} <= set(body["known_keys"]), (walks, body["known_keys"])
    assert point_queries and all("count(" in sql or "sum(" in sql for sql in point_queries), point_queries
    assert {key: len(points) for key, points in body["series"].items()} == {"dense": 7, "gaps": 7, "repeated_steps": 7}
    charts = chart_series(shaped_run.pk, ["dense", "gaps", "repeated_steps"], 7)
    assert {key: [[s, v] for s, v in points] for key, points in charts.items()} == body["series"]


def test_a_long_dense_series_at_the_largest_max_points_matches_the_reference(api):
    # bucket bounds multiply a bucket number by the series length: past 2**31 in 32-bit arithmetic
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    rng = random.Random(5)
    MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key="loss", step=s, value=rng.random()) for s in range(7, 100_010)], batch_size=10_000)
    points = list(MetricPoint.objects.filter(run_id=run_id).order_by("step", "id").values_list("step", "value"))
    got = metrics.series_in_sql(run_id, ["loss"], 100_000)["loss"]
    expected = metrics.downsample(points, 100_000)
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert all(math.isclose(a, b, rel_tol=1e-12) for (_, a), (_, b) in zip(got, expected, strict=True))


RESUMED = {
    # attempt 1 logged steps 0-2999, attempt 2 resumed from its step 2000 and logged 2000-4999 again
    "resumed": list(range(3000)) + list(range(2000, 5000)),
    # several points at each step (a metric logged per micro-batch): bucket ends fall inside a step
    "per_micro_batch": [s // 7 for s in range(3500)],
    "sparse": [s * s for s in range(1500)],
}


@pytest.mark.parametrize("max_points", [2, 3, 100, 1000, 4999, 6000])
def test_a_resumed_runs_repeated_steps_downsample_as_the_python_reference(api, max_points):
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    rng = random.Random(7)
    MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key=key, step=step, value=rng.uniform(-3, 3)) for key, steps in RESUMED.items() for step in steps])
    got = metrics.series_in_sql(run_id, None, max_points)
    for key in RESUMED:
        points = list(MetricPoint.objects.filter(run_id=run_id, key=key).order_by("step", "id").values_list("step", "value"))
        expected = metrics.downsample(points, max_points)
        assert [s for s, _ in got[key]] == [s for s, _ in expected], key
        assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) for (_, a), (_, b) in zip(got[key], expected, strict=True)), key


def test_a_series_with_repeated_steps_is_read_from_the_index_alone_with_no_sort(api):
    # A resumed run's series took a window function over every point and a GROUP BY that sorted them,
    # reading each point's value from its table row: 2× slower than reading every point into Python on
    # SQLite (768k points: 5.2 → 9.9 s). Now a walk along the (run, key, step, id, value) index.
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key="reward", step=s - s // 10, value=s % 7) for s in range(5000)])
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        metrics.series_in_sql(run_id, ["reward"], 100)
    walk = [q["sql"] for q in queries.captured_queries if "RECURSIVE" in q["sql"]]
    assert len(walk) == 1, [q["sql"] for q in queries.captured_queries]
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            plan = [row[-1] for row in cursor.execute("EXPLAIN QUERY PLAN " + walk[0]).fetchall()]
            searches = [step for step in plan if MetricPoint._meta.db_table in step and "PRIMARY KEY" not in step]
            assert searches and all("COVERING INDEX metric_series_idx" in step for step in searches), plan
            assert not any("GROUP BY" in step for step in plan), plan
        else:
            cursor.execute("SET enable_seqscan = off")  # a test table this small would be read whole
            cursor.execute("EXPLAIN " + walk[0])
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("RESET enable_seqscan")
            assert "WindowAgg" not in plan and "HashAggregate" not in plan and "GroupAggregate" not in plan, plan
            assert "Index Only Scan using metric_series_idx" in plan, plan


@pytest.mark.parametrize(("steps", "labels"), [
    (list(range(1, 31)), [1, 8, 22, 30]),  # dense: inner buckets of steps 2-15 and 16-29
    ([2 * s for s in range(1, 31)], [2, 17, 45, 60]),  # gaps (the walk): steps 4-30 and 32-58
])
def test_a_bucket_mean_is_drawn_at_its_middle_step_and_the_series_still_ends_at_the_last(api, steps, labels):
    # QA: with max_points=4 on 30 loss points the API answered (15, 3.49), the mean of steps 2-15, where
    # the loss at step 15 was 1.956: labelled with its bucket's last step, the curve lagged the real one.
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    loss = {step: 4.0 / (1 + i) for i, step in enumerate(steps)}
    MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key="loss", step=step, value=value) for step, value in loss.items()])
    body = api.get(f"/api/training-runs/{run_id}/metrics", keys="loss", max_points=4).json()
    assert [step for step, _ in body["series"]["loss"]] == labels
    inner = steps[1:-1]
    for (label, mean), bucket in zip(body["series"]["loss"][1:-1], (inner[:14], inner[14:]), strict=True):
        assert label == (bucket[0] + bucket[-1]) // 2 and mean == pytest.approx(sum(loss[s] for s in bucket) / len(bucket))
    assert body["series"]["loss"][-1] == [steps[-1], loss[steps[-1]]] and body["last_step"] == steps[-1]  # the run's last point as it is


def test_an_answer_cached_before_buckets_were_drawn_at_their_middle_step_is_not_served(api):
    # A finished run's series are cached for an hour: one cached under the old labels (each bucket's last step) must not outlive the change.
    import hashlib

    from django.core.cache import cache

    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key="loss", step=s, value=float(s)) for s in range(1, 31)])
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED)
    run = TrainingRun.objects.get(pk=run_id)
    version = f"{run.pk}:{run.created_at.timestamp()}:{run.attempt}:{run.status}:{run.last_heartbeat_at and run.last_heartbeat_at.timestamp()}"
    cache.set("metrics:" + hashlib.sha256(f"{version}:4:None:loss".encode()).hexdigest(), {"loss": [(1, 1.0), (15, 8.5), (29, 22.5), (30, 30.0)]}, 60)
    assert metrics.series(run, ["loss"], 4) == {"loss": [(1, 1.0), (8, 8.5), (22, 22.5), (30, 30.0)]}
