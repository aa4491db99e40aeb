"""Fewer points that draw the same curve."""

import math

import pytest

from ddp_client.downsample import largest_triangles


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
