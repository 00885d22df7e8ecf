"""Metric series for charts and the API: step-ordered, downsampled to at most max_points."""
from __future__ import annotations

from collections import defaultdict

from training.models import MetricPoint, TrainingRun


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
            out.append((chunk[-1][0], sum(v for _, v in chunk) / len(chunk)))
    out.append(points[-1])
    return out


def series(run: TrainingRun, keys: list[str] | None, max_points: int) -> dict[str, list[tuple[int, float]]]:
    qs = MetricPoint.objects.filter(run=run)
    if keys:
        qs = qs.filter(key__in=keys)
    grouped: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for key, step, value in qs.order_by("key", "step", "id").values_list("key", "step", "value").iterator(chunk_size=10_000):
        grouped[key].append((step, value))
    return {key: downsample(points, max_points) for key, points in grouped.items()}
