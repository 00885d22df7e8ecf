"""Metric series for charts and the API: step-ordered, downsampled to at most max_points."""
from __future__ import annotations

import hashlib
from collections import defaultdict

from django.core.cache import cache
from django.db import connection

from training.models import TERMINAL_STATUSES, MetricPoint, TrainingRun

CACHE_SECONDS = 3600


def downsample(points: list[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """Bucket means over equal runs of points; the first and last points are kept as they are."""
    n = len(points)
    if n <= max_points:
        return points
    inner = points[1:-1]
    buckets = max_points - 2
    out = [points[0]]
    for b in range(buckets):
        lo, hi = b * len(inner) // buckets, (b + 1) * len(inner) // buckets
        chunk = inner[lo:hi]
        if chunk:
            values = [v for _, v in chunk]
            out.append((chunk[-1][0], bucket_mean(values)))
    out.append(points[-1])
    return out


def bucket_mean(values: list[float]) -> float:
    """The mean, summed at 2**-32 scale: values near the float limit (1.7e308) are finite one by one,
    but their plain sum overflows (PostgreSQL's avg() raised, Python's gave infinity, which JSON
    cannot carry). Scaling by a power of two is exact, so every other mean is unchanged."""
    return sum(v / MEAN_SCALE for v in values) / len(values) * MEAN_SCALE


MEAN_SCALE = 2.0**32
# bucket_mean in SQL. Not avg(): PostgreSQL's float8 avg also sums the squares, which overflow first.
MEAN_SQL = f"sum(value / {MEAN_SCALE:.0f}) / count(*) * {MEAN_SCALE:.0f}"

# The same buckets as downsample(), computed by PostgreSQL: a 100k-point series leaves the database
# as max_points rows instead of 100k. With rn the 1-based position in (step, id) order and n the
# series length, inner point i = rn - 2 of m = n - 2 falls in bucket floor(((i + 1) * B - 1) / m),
# the b with b*m//B <= i < (b+1)*m//B; the first and last points are buckets of their own, and a
# series of at most max_points rows keeps every point (bucket = rn).
DOWNSAMPLE_SQL = """
WITH ranked AS (
    SELECT key, step, value,
           row_number() OVER (PARTITION BY key ORDER BY step, id) AS rn,
           count(*) OVER (PARTITION BY key) AS n
    FROM {table}
    WHERE run_id = %(run_id)s {key_filter}
), bucketed AS (
    SELECT key, step, value, rn,
           CASE WHEN n <= %(max_points)s THEN rn
                WHEN rn = 1 THEN 0
                WHEN rn = n THEN %(max_points)s + 1
                WHEN %(max_points)s <= 2 THEN NULL
                ELSE 1 + ((rn - 1) * (%(max_points)s - 2) - 1) / (n - 2)
           END AS bucket
    FROM ranked
)
SELECT key, max(step), {mean}
FROM bucketed
WHERE bucket IS NOT NULL
GROUP BY key, bucket
ORDER BY key, bucket
"""


# The window functions cost ~200 ms on a 100k-point series (a sort and two window passes). Nearly
# every series is dense — one point per step from the first to the last, so count = max - min + 1 —
# and then rn - 1 = step - min: the same buckets come from the step alone, with one index scan and a
# hash aggregate (~40 ms). Series that are not dense (gaps, repeated steps) take the window query.
STATS_SQL = """
SELECT key, count(*), min(step), max(step)
FROM {table}
WHERE run_id = %(run_id)s {key_filter}
GROUP BY key
"""
DENSE_SQL = """
SELECT max(step), {mean}
FROM (
    SELECT step, value,
           CASE WHEN %(n)s <= %(max_points)s THEN step - %(lo)s
                WHEN step = %(lo)s THEN -1
                WHEN step = %(hi)s THEN %(max_points)s + 1
                WHEN %(max_points)s <= 2 THEN NULL
                ELSE 1 + ((step - %(lo)s) * (%(max_points)s - 2) - 1) / (%(n)s - 2)
           END AS bucket
    FROM {table}
    WHERE run_id = %(run_id)s AND key = %(key)s
) AS bucketed
WHERE bucket IS NOT NULL
GROUP BY bucket
ORDER BY bucket
"""


def series(run: TrainingRun, keys: list[str] | None, max_points: int) -> dict[str, list[tuple[int, float]]]:
    """A finished run's series do not change until it is restarted (which changes its status) or a
    late batch lands (which moves last_heartbeat_at), so they are cached under a key made of both."""
    cache_key = None
    if run.status in TERMINAL_STATUSES:
        version = f"{run.pk}:{run.created_at.timestamp()}:{run.attempt}:{run.status}:{run.last_heartbeat_at and run.last_heartbeat_at.timestamp()}"
        cache_key = "metrics:" + hashlib.sha256(f"{version}:{max_points}:{','.join(sorted(keys or []))}".encode()).hexdigest()
        try:
            cached = cache.get(cache_key)
        except Exception:  # noqa: BLE001 - the cache is an optimisation: Redis down must not fail a read
            cached, cache_key = None, None
        if cached is not None:
            return cached
    if connection.vendor == "postgresql":
        result = series_in_sql(run, keys, max_points)
    else:
        result = series_in_python(run, keys, max_points)
    if keys:  # every key asked for is in the answer: one not reported (yet) is an empty series, not a missing one
        result = {key: result.get(key, []) for key in sorted(set(keys))}
    if cache_key is not None:
        try:
            cache.set(cache_key, result, CACHE_SECONDS)
        except Exception:  # noqa: BLE001 - see above
            pass
    return result


def series_in_python(run: TrainingRun, keys: list[str] | None, max_points: int) -> dict[str, list[tuple[int, float]]]:
    qs = MetricPoint.objects.filter(run=run)
    if keys:
        qs = qs.filter(key__in=keys)
    grouped: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for key, step, value in qs.order_by("key", "step", "id").values_list("key", "step", "value").iterator(chunk_size=10_000):
        grouped[key].append((step, value))
    return {key: downsample(points, max_points) for key, points in grouped.items()}


def series_in_sql(run: TrainingRun, keys: list[str] | None, max_points: int) -> dict[str, list[tuple[int, float]]]:
    table = MetricPoint._meta.db_table
    params: dict = {"run_id": run.pk, "max_points": max_points}
    key_filter = ""
    if keys:
        key_filter, params["keys"] = "AND key = ANY(%(keys)s)", list(keys)
    grouped: dict[str, list[tuple[int, float]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(STATS_SQL.format(table=table, key_filter=key_filter), params)
        stats = sorted(cursor.fetchall())
        sparse = []
        for key, n, lo, hi in stats:
            if n == hi - lo + 1:
                cursor.execute(DENSE_SQL.format(table=table, mean=MEAN_SQL), {**params, "key": key, "n": n, "lo": lo, "hi": hi})
                grouped[key] = [(step, value) for step, value in cursor.fetchall()]
            else:
                sparse.append(key)
        if sparse:
            cursor.execute(DOWNSAMPLE_SQL.format(table=table, key_filter="AND key = ANY(%(sparse)s)", mean=MEAN_SQL), {**params, "sparse": sparse})
            for key, step, value in cursor.fetchall():
                grouped.setdefault(key, []).append((step, value))
    return {key: grouped[key] for key in sorted(grouped)}
