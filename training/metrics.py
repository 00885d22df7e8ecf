"""Metric series for charts and the API: step-ordered, downsampled to at most max_points inside the
database (PostgreSQL and the embedded default's SQLite run the same SQL), so a 768k-point run leaves it
as max_points rows a key instead of 768k."""
from __future__ import annotations

import hashlib

from django.core.cache import cache
from django.db import connection

from training.models import TERMINAL_STATUSES, Checkpoint, MetricPoint, TrainingRun

CACHE_SECONDS = 3600
# In every cache key: raised when the answer for the same points changes, so none cached before is served
# (2: a bucket's mean is drawn at its middle step, bucket_step, no longer its last).
CACHE_VERSION = 2


def downsample(points: list[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """Bucket means over equal runs of points; the first and last points are kept as they are. The
    reference the SQL below is tested against (tests/test_metrics_sql.py). A mean is drawn at its
    bucket's middle step (bucket_step), where the points it averages are: at the bucket's last step,
    the curve lagged the real one by half a bucket."""
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
            out.append((bucket_step(chunk[0][0], chunk[-1][0]), bucket_mean(values)))
    out.append(points[-1])
    return out


def bucket_step(first: int, last: int) -> int:
    """The step a bucket's mean is drawn at: the middle of its first and last steps, rounded down
    (steps are never negative). BUCKET_STEP_SQL is the same in SQL."""
    return (first + last) // 2


# bucket_step in SQL: BIGINT, as two steps near the int4 column's limit add up past it.
BUCKET_STEP_SQL = "(CAST({first} AS BIGINT) + CAST({last} AS BIGINT)) / 2"


def bucket_mean(values: list[float]) -> float:
    """The mean, summed at 2**-32 scale: values near the float limit (1.7e308) are finite one by one,
    but their plain sum overflows (PostgreSQL's avg() raised, Python's gave infinity, which JSON
    cannot carry). Scaling by a power of two is exact, so every other mean is unchanged."""
    return sum(v / MEAN_SCALE for v in values) / len(values) * MEAN_SCALE


MEAN_SCALE = 2.0**32
# bucket_mean in SQL. Not avg(): PostgreSQL's float8 avg also sums the squares, which overflow first.
MEAN_SQL = f"sum(value / {MEAN_SCALE:.0f}) / count(*) * {MEAN_SCALE:.0f}"

# The same buckets as downsample(), computed by the database: a 100k-point series leaves the database
# as max_points rows instead of 100k. In (step, id) order, with n the series length (from STATS_SQL),
# m = n - 2 inner points and B = max_points - 2 inner buckets, the first and last points are buckets of
# their own and inner bucket j holds inner points j*m//B .. (j+1)*m//B - 1, so it ends at position
# end(k) = 1 + k*m//B for k = j + 1; a series of at most max_points points keeps each one (B = m).
#
# A series that is not dense (gaps, or steps repeated by a resumed run) walks its buckets along the
# (run, key, step, id, value) index: from the last point of the previous bucket, the last point of the
# next one is OFFSET len - 1 further, a bucket's mean is one index range scan between the two, and the
# first step of its label (bucket_step) one index probe past the previous bucket's last point. Every
# inner bucket holds q = m//B or q + 1 points, so the offsets are three constants (SQLite's LIMIT cannot
# read the outer row). The step bounds of a bucket's mean follow from its (step, id) bounds; they are
# there for PostgreSQL's planner, which guesses a third of the series for a row comparison, so a guessed
# cost past jit_above_cost JIT-compiled the query (~20 ms of a 120k-point series' 75 ms). The walk
# replaced row_number() OVER the series and a GROUP BY bucket, whose window pass and sort took 3-4× as
# long on SQLite (bench/RESULTS.md).
# A bucket's first step: the point right after the previous bucket's last (the first point is its own bucket).
FIRST_STEP_SQL = """(SELECT step FROM {table}
                    WHERE run_id = %(run_id)s AND key = %(key)s AND (step, id) > (walk.before_step, walk.before_id)
                    ORDER BY step, id LIMIT 1)"""
NEXT_SQL = """(SELECT id FROM {table}
              WHERE run_id = %(run_id)s AND key = %(key)s AND (step, id) > (walk.step, walk.id)
              ORDER BY step, id LIMIT 1 OFFSET {offset})"""
WALK_SQL = """
WITH RECURSIVE walk(i, before_step, before_id, step, id) AS (
    SELECT 0, step, id - 1, step, id FROM (
        SELECT step, id FROM {table} WHERE run_id = %(run_id)s AND key = %(key)s {step_filter} ORDER BY step, id LIMIT 1
    ) AS first
    UNION ALL
    -- the last point alone (with max_points <= 2 the inner points between are left out)
    SELECT i + 1, CASE WHEN i + 1 = %(buckets)s - 1 THEN point.step ELSE walk.step END,
           CASE WHEN i + 1 = %(buckets)s - 1 THEN point.id - 1 ELSE walk.id END, point.step, point.id
    FROM walk JOIN {table} AS point ON point.id = CASE
        WHEN i + 1 = %(buckets)s - 1 THEN {last}
        WHEN CAST(i + 1 AS BIGINT) * %(m)s / %(inner)s - CAST(i AS BIGINT) * %(m)s / %(inner)s = %(q)s THEN {short}
        ELSE {long} END
    WHERE i + 1 < %(buckets)s
)
SELECT {label}, (SELECT {mean} FROM {table}
              WHERE run_id = %(run_id)s AND key = %(key)s AND step BETWEEN walk.before_step AND walk.step
                AND (step, id) > (walk.before_step, walk.before_id) AND (step, id) <= (walk.step, walk.id))
FROM walk
ORDER BY i
"""


# Nearly every series is dense — one point a step from the first to the last, so count = max - min + 1 —
# and then a point's position - 1 = step - min: each bucket is a range of steps, its first and last steps
# (and so its label, bucket_step) are known without walking to them, and its mean is one index range scan. Bucket i of `buckets`: the first and last points
# alone, inner bucket j = i - 1 the steps lo + 1 + j*m//B .. lo + (j+1)*m//B; with every point kept,
# step lo + i. No sort and no GROUP BY: on a busy 2-core machine, 100k points took half the time of the
# GROUP BY by bucket it replaced on PostgreSQL and a quarter on SQLite (bench/metrics_sqlite.py has the
# SQLite figures). Series that are not dense (gaps, repeated steps) take the walk above.
STATS_SQL = """
SELECT key, count(*), min(step), max(step)
FROM {table}
WHERE run_id = %(run_id)s {key_filter} {step_filter}
GROUP BY key
"""
DENSE_SQL = """
WITH RECURSIVE bucket(i) AS (
    SELECT 0 UNION ALL SELECT i + 1 FROM bucket WHERE i + 1 < %(buckets)s
), bounds AS (
    SELECT i,
           CASE WHEN %(every)s = 1 THEN %(lo)s + i WHEN i = 0 THEN %(lo)s WHEN i = %(buckets)s - 1 THEN %(hi)s
                ELSE %(lo)s + 1 + CAST(i - 1 AS BIGINT) * %(m)s / %(inner)s END AS first,
           CASE WHEN %(every)s = 1 THEN %(lo)s + i WHEN i = 0 THEN %(lo)s WHEN i = %(buckets)s - 1 THEN %(hi)s
                ELSE %(lo)s + CAST(i AS BIGINT) * %(m)s / %(inner)s END AS last
    FROM bucket
)
SELECT {label}, (SELECT {mean} FROM {table} WHERE run_id = %(run_id)s AND key = %(key)s AND step BETWEEN first AND last)
FROM bounds
ORDER BY i
"""


def series(run: TrainingRun, keys: list[str] | None, max_points: int, after_step: int | None = None) -> dict[str, list[tuple[int, float]]]:
    """With after_step, the points of later steps alone, downsampled among themselves (the buckets
    of a full read span other points). A finished run's series do not change until it is restarted
    (which changes its status) or a late batch lands (which moves last_heartbeat_at), so they are
    cached under a key made of both."""
    cache_key = None
    if run.status in TERMINAL_STATUSES:
        version = f"{run.pk}:{run.created_at.timestamp()}:{run.attempt}:{run.status}:{run.last_heartbeat_at and run.last_heartbeat_at.timestamp()}"
        cache_key = f"metrics:v{CACHE_VERSION}:" + hashlib.sha256(f"{version}:{max_points}:{after_step}:{','.join(sorted(keys or []))}".encode()).hexdigest()
        try:
            cached = cache.get(cache_key)
        except Exception:  # noqa: BLE001 - the cache is an optimisation: Redis down must not fail a read
            cached, cache_key = None, None
        if cached is not None:
            return cached
    result = series_in_sql(run.pk, keys, max_points, after_step)
    if keys:  # every key asked for is in the answer: one not reported (yet) is an empty series, not a missing one
        result = {key: result.get(key, []) for key in sorted(set(keys))}
    if cache_key is not None:
        try:
            cache.set(cache_key, result, CACHE_SECONDS)
        except Exception:  # noqa: BLE001 - see above
            pass
    return result


STEP_FILTER = "AND step > %(after_step)s"


def key_in(keys: list[str], params: dict) -> str:
    """`AND key IN (...)` with one named parameter a key: SQLite has no `= ANY(array)`."""
    names = [f"key{i}" for i in range(len(keys))]
    params.update(zip(names, keys, strict=True))
    return "AND key IN (" + ", ".join(f"%({n})s" for n in names) + ")"


def series_in_sql(run_id: int, keys: list[str] | None, max_points: int, after_step: int | None = None) -> dict[str, list[tuple[int, float]]]:
    """The run's series by key (all keys when none are named; a key with no points is left out), of
    the steps after after_step when it is given. Both SQL paths read that range alone: its bounds are
    in STATS_SQL, and the walk starts from its first point."""
    table = MetricPoint._meta.db_table
    params: dict = {"run_id": run_id, "after_step": after_step}
    key_filter = key_in(sorted(set(keys)), params) if keys else ""
    step_filter = STEP_FILTER if after_step is not None else ""
    grouped: dict[str, list[tuple[int, float]]] = {}
    with connection.cursor() as cursor:
        cursor.execute(STATS_SQL.format(table=table, key_filter=key_filter, step_filter=step_filter), params)
        stats = sorted(cursor.fetchall())
        for key, n, lo, hi in stats:
            if n == hi - lo + 1:
                every, inner = n <= max_points, max(max_points - 2, 1)
                buckets = n if every else max_points if max_points > 2 else 2
                cursor.execute(DENSE_SQL.format(table=table, mean=MEAN_SQL, label=BUCKET_STEP_SQL.format(first="first", last="last")), {"run_id": run_id, "key": key, "lo": lo, "hi": hi, "m": n - 2,
                                                                             "inner": inner, "buckets": buckets, "every": int(every)})
            else:
                cursor.execute(walk_sql(table, step_filter), {**walk_params(run_id, key, n, max_points), "after_step": after_step})
            grouped[key] = [(int(step), value) for step, value in cursor.fetchall()]
    return {key: grouped[key] for key in sorted(grouped)}


def walk_sql(table: str, step_filter: str = "") -> str:
    def after(offset: str) -> str:
        return NEXT_SQL.format(table=table, offset=offset)

    label = BUCKET_STEP_SQL.format(first=FIRST_STEP_SQL.format(table=table), last="walk.step")
    return WALK_SQL.format(table=table, mean=MEAN_SQL, label=label, step_filter=step_filter, last=after("%(last)s"), short=after("%(short)s"),
                           long=after("%(long)s"))


def walk_params(run_id: int, key: str, n: int, max_points: int) -> dict[str, int | str]:
    """WALK_SQL's numbers for a series of n points: n buckets of one point when it has at most
    max_points, else max_points buckets; with max_points <= 2, the first and last points (the last is
    then m points past the first, not next to an inner bucket's end)."""
    m = n - 2
    inner = max(m if n <= max_points else max_points - 2, 1)
    buckets = n if n <= max_points else max(max_points, 2)
    last = m if n > max_points and max_points <= 2 else 0
    return {"run_id": run_id, "key": key, "buckets": buckets, "m": m, "inner": inner, "q": m // inner,
            "short": max(m // inner - 1, 0), "long": m // inner, "last": last}


# The keys a set of runs reports, one index probe a key of each run (a loose index scan down the
# (run, key, ...) index): a DISTINCT over their points read every point, 12 runs of 100k points
# each for the experiment page's metric choice.
KEYS_SQL = """
WITH RECURSIVE walk(run_id, key) AS (
    SELECT id, (SELECT key FROM {table} WHERE run_id = runs.id ORDER BY key LIMIT 1)
    FROM {runs} AS runs WHERE id IN ({ids})
    UNION ALL
    SELECT run_id, (SELECT key FROM {table} WHERE run_id = walk.run_id AND key > walk.key ORDER BY key LIMIT 1)
    FROM walk WHERE key IS NOT NULL
)
SELECT DISTINCT key FROM walk WHERE key IS NOT NULL ORDER BY key
"""


def metric_keys(run_ids: list[int]) -> list[str]:
    """The metric keys any of the runs has points of, sorted."""
    if not run_ids:
        return []
    params = {f"run{i}": run_id for i, run_id in enumerate(run_ids)}
    sql = KEYS_SQL.format(table=MetricPoint._meta.db_table, runs=TrainingRun._meta.db_table, ids=", ".join(f"%({name})s" for name in params))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [key for (key,) in cursor.fetchall()]


# Each key's value at each of a few steps, in one query: the keys walk down the index as KEYS_SQL's do,
# then one index probe a (key, step); of repeated steps (a spot retry that resumed before them), the
# newest point, which the later attempt reported.
AT_STEPS_SQL = """
WITH RECURSIVE walk(key) AS (
    SELECT (SELECT key FROM {table} WHERE run_id = %(run_id)s ORDER BY key LIMIT 1)
    UNION ALL
    SELECT (SELECT key FROM {table} WHERE run_id = %(run_id)s AND key > walk.key ORDER BY key LIMIT 1) FROM walk WHERE key IS NOT NULL
)
SELECT point.step, point.key, point.value
FROM walk JOIN {table} AS point ON point.run_id = %(run_id)s AND point.key = walk.key AND point.step IN ({steps})
ORDER BY point.step, point.key, point.id
"""


def values_at(run_id: int, steps: set[int]) -> dict[int, dict[str, float]]:
    """step → {key: value} of the metrics the run reported at each of `steps` (a step without any is left out)."""
    if not steps:
        return {}
    params: dict = {"run_id": run_id} | {f"step{i}": step for i, step in enumerate(sorted(steps))}
    sql = AT_STEPS_SQL.format(table=MetricPoint._meta.db_table, steps=", ".join(f"%({name})s" for name in params if name != "run_id"))
    found: dict[int, dict[str, float]] = {}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for step, key, value in cursor.fetchall():
            found.setdefault(step, {})[key] = value
    return found


def at_checkpoints(run: TrainingRun, saved: list[Checkpoint]) -> dict[int, dict[str, float]]:
    """checkpoint pk → {key: value}: the metrics the run reported at each checkpoint's step, in one
    query for them all. A run's points are not kept by attempt, and a restart (START again) wipes them:
    a checkpoint of an attempt before the last START's first (start_attempt) gets {}, not the points a
    later attempt reported at the same step."""
    current = [c for c in saved if c.attempt >= run.start_attempt]
    found = values_at(run.pk, {c.step for c in current})
    return {c.pk: found.get(c.step, {}) if c.attempt >= run.start_attempt else {} for c in saved}
