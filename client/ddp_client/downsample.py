"""Fewer points that draw the same curve: a metric of a long run has a point per step, and a page (the
dashboard) or a figure needs no more points than it has pixels across."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

Point = tuple[float, float]


def largest_triangles(points: Sequence[Point], limit: int) -> list[Point]:
    """At most `limit` of `points` (sorted by x), chosen by Largest-Triangle-Three-Buckets (Steinarsson,
    2013): the first and last points, and from each of limit-2 equal buckets between them the point that
    makes the largest triangle with the point kept before it and the mean of the next bucket, so spikes
    and turns stay where a stride would skip them. All of them when there are no more than `limit`."""
    _check(limit)
    if len(points) <= limit:
        return list(points)
    import numpy as np

    xy = np.array(points, dtype=float).reshape(len(points), 2)
    return [points[i] for i in largest_triangles_at(xy[:, 0], xy[:, 1], limit).tolist()]


def largest_triangles_at(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], limit: int) -> npt.NDArray[np.intp]:
    """The indices (ascending) of the points largest_triangles keeps of the points (x[i], y[i]); the same
    choice, bucket by bucket, with each bucket's points weighed at once."""
    import numpy as np

    _check(limit)
    count = len(x)
    if count <= limit:
        return np.arange(count)
    # Bucket j holds the points edges[j] <= i < edges[j + 1]; buckets 0..limit-3 are chosen from, and each
    # one's next bucket (the last one's: up to the last point) gives the mean. Edges as int(j * width) + 1,
    # the same float arithmetic as one bucket at a time.
    width = (count - 2) / (limit - 2)
    edges = np.minimum((np.arange(limit) * width).astype(np.intp) + 1, count - 1)
    bucket = np.searchsorted(edges, np.arange(1, count - 1), side="right") - 1
    # A bucket's mean: its points' running sum (bincount adds in index order) over their count.
    sizes = np.bincount(bucket, minlength=limit - 1)
    filled = sizes > 0
    means = [np.divide(np.bincount(bucket, weights=values[1:count - 1], minlength=limit - 1), sizes,
                       out=np.full(limit - 1, values[count - 1]), where=filled).tolist() for values in (x, y)]
    bounds = edges.tolist()
    kept = np.empty(limit, dtype=np.intp)
    kept[0], kept[-1] = 0, count - 1
    previous_x, previous_y = float(x[0]), float(y[0])
    for chosen in range(limit - 2):
        mean_x, mean_y = means[0][chosen + 1], means[1][chosen + 1]  # of the next bucket
        start, end = bounds[chosen], bounds[chosen + 1]
        area = np.abs((previous_x - mean_x) * (y[start:end] - previous_y)
                      - (previous_x - x[start:end]) * (mean_y - previous_y))
        best = start + int(np.argmax(area))
        kept[chosen + 1] = best
        previous_x, previous_y = float(x[best]), float(y[best])
    return kept


def _check(limit: int) -> None:
    if limit < 3:
        raise ValueError(f"limit must be at least 3 (the first, the last and one between), not {limit}")
