"""Fewer points that draw the same curve."""

import math
import random

import numpy as np
import pytest

import recordwise
from ddp_client.downsample import largest_triangles, largest_triangles_at


def test_few_points_are_kept_as_they_are() -> None:
    points = [(float(x), float(x * x)) for x in range(10)]
    assert largest_triangles(points, 10) == points
    assert largest_triangles([], 5) == []


def test_many_points_become_at_most_the_limit_first_and_last_kept_in_order() -> None:
    points = [(float(x), math.sin(x / 50)) for x in range(100_000)]
    kept = largest_triangles(points, 2000)
    assert len(kept) == 2000
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert [x for x, _ in kept] == sorted(x for x, _ in kept)
    assert set(kept) <= set(points)


def test_a_spike_a_stride_would_skip_is_kept() -> None:
    points = [(float(x), 1.0) for x in range(10_000)]
    points[4321] = (4321.0, 50.0)  # one step's loss spiked
    assert (4321.0, 50.0) in largest_triangles(points, 100)
    assert (4321.0, 50.0) not in points[::100]


def test_a_limit_below_three_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be at least 3"):
        largest_triangles([(0.0, 0.0)] * 10, 2)


@pytest.mark.parametrize("seed", range(2))
def test_the_points_kept_are_those_chosen_one_bucket_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    for count, limit in ((5, 3), (1000, 7), (12_345, 500), (20_000, 2000)):
        shapes = ([(float(x), rng.random()) for x in range(count)],
                  [(x, rng.gauss(0, 1) * 1e6) for x in range(count)],  # int steps, as a series has them
                  [(1.8e9 + 0.37 * x, math.sin(x / 30)) for x in range(count)],  # times
                  [(float(x), float(rng.randint(0, 2))) for x in range(count)])  # equal areas: the first of them
        for points in shapes:
            assert largest_triangles(points, limit) == recordwise.largest_triangles(points, limit), (count, limit)
    x, y = np.arange(50_000, dtype=np.float64), np.cos(np.arange(50_000) / 700.0)
    kept = largest_triangles_at(x, y, 1000)
    assert [(x[i], y[i]) for i in kept] == recordwise.largest_triangles(list(zip(x.tolist(), y.tolist(), strict=True)), 1000)
    assert largest_triangles_at(x[:10], y[:10], 20).tolist() == list(range(10))
