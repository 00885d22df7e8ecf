"""The PostgreSQL downsampling (training/metrics.py: dense series by step, others with window
functions) returns exactly what the Python reference `downsample` returns, for every shape."""
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
    if connection.vendor != "postgresql":
        pytest.skip("the SQL path is PostgreSQL's")
    reference = defaultdict(list)
    for key, step, value in MetricPoint.objects.filter(run=shaped_run).order_by("key", "step", "id").values_list("key", "step", "value"):
        reference[key].append((step, value))
    expected = {key: metrics.downsample(points, max_points) for key, points in reference.items()}
    got = metrics.series_in_sql(shaped_run, None, max_points)
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


@pytest.mark.parametrize("path", ["sql", "python"])
def test_bucket_means_of_values_near_the_float_limit_stay_finite(api, path):
    # Each value is finite, but their sum is not: an avg() of them was Infinity, which broke the
    # API's JSON and the run page's charts.
    if path == "sql" and connection.vendor != "postgresql":
        pytest.skip("the SQL path is PostgreSQL's")
    run_id = api.post("/api/training-runs", sft_body()).json()["id"]
    MetricPoint.objects.bulk_create([MetricPoint(run_id=run_id, key=key, step=s, value=sign * 1.7e308) for s in range(10, 30)
                                     for key, sign in (("big", 1), ("neg", -1))])
    run = TrainingRun.objects.get(pk=run_id)
    got = metrics.series_in_sql(run, None, 3) if path == "sql" else metrics.series_in_python(run, None, 3)
    assert got == {"big": [(10, 1.7e308), (28, pytest.approx(1.7e308)), (29, 1.7e308)], "neg": [(10, -1.7e308), (28, pytest.approx(-1.7e308)), (29, -1.7e308)]}
