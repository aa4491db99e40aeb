"""Fewer points that draw the same curve: a metric of a long run has a point per step, and a page (the
dashboard) or a figure needs no more points than it has pixels across."""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]


def largest_triangles(points: Sequence[Point], limit: int) -> list[Point]:
    """At most `limit` of `points` (sorted by x), chosen by Largest-Triangle-Three-Buckets (Steinarsson,
    2013): the first and last points, and from each of limit-2 equal buckets between them the point that
    makes the largest triangle with the point kept before it and the mean of the next bucket, so spikes
    and turns stay where a stride would skip them. All of them when there are no more than `limit`."""
    if limit < 3:
        raise ValueError(f"limit must be at least 3 (the first, the last and one between), not {limit}")
    if len(points) <= limit:
        return list(points)
    kept = [points[0]]
    width = (len(points) - 2) / (limit - 2)
    previous = points[0]
    for bucket in range(limit - 2):
        start, end = int(bucket * width) + 1, int((bucket + 1) * width) + 1
        following = points[end:min(int((bucket + 2) * width) + 1, len(points) - 1)] or [points[-1]]
        mean_x = sum(x for x, _ in following) / len(following)
        mean_y = sum(y for _, y in following) / len(following)
        best = max(points[start:end], key=lambda p: abs((previous[0] - mean_x) * (p[1] - previous[1])
                                                        - (previous[0] - p[0]) * (mean_y - previous[1])))
        kept.append(best)
        previous = best
    kept.append(points[-1])
    return kept
