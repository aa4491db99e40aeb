"""The dashboard's curves, newest steps and attempts' marks drawn from columns of the records: the same
answers as worked out a record at a time (tests/recordwise.py), from a list of records or one Columns
shared by all of them."""

from __future__ import annotations

import json

import pytest

import recordwise
from ddp_client.metriccolumns import Columns
from ddp_client.web import views


@pytest.mark.parametrize("seed", range(3))
def test_curves_are_those_drawn_a_record_at_a_time(seed: int) -> None:
    records = recordwise.messy_records(seed, 3000)
    shared = Columns(records)
    for points in (3, 50, 2000):
        for rank in (0, 3, None, 7):
            for axis in ("step", "time"):
                expected = recordwise.curves(records, rank, axis, points)
                assert json.dumps(views.curves(shared, rank, axis, points)) == json.dumps(expected), (points, rank, axis)
                assert views.curves(records, rank, axis, points) == expected
        expected_side_by_side = recordwise.curves_by_rank(records, 3, points)
        assert json.dumps(views.curves_by_rank(shared, 3, points)) == json.dumps(expected_side_by_side), points


def test_newest_steps_and_attempt_marks_are_those_worked_out_a_record_at_a_time() -> None:
    for seed in range(3):
        records = recordwise.messy_records(seed, 2000, ranks=6)
        shared = Columns(records)
        assert views.last_steps(shared) == views.last_steps(iter(records)) == recordwise.last_steps(records)
        assert list(views.last_steps(shared)) == list(recordwise.last_steps(records))  # ranks as they first came
        marks = views.attempt_marks(shared, [])
        assert [(m["attempt"], m["time"], m["step"]) for m in marks] == recordwise.attempt_starts(records)
        assert [type(m["time"]) for m in marks] == [type(when) for _, when, _ in recordwise.attempt_starts(records)]


def test_a_rank_s_steps_logged_without_a_time_are_not_drawn_against_time() -> None:
    records = [{"step": s, "loss": float(s), "rank": 0, "time": 100.0 + s} for s in range(6)]
    del records[2]["time"], records[4]["time"]
    drawn = views.curves(records, 0, axis="time")["loss"]
    assert drawn == {"x": [100.0, 101.0, 103.0, 105.0], "y": [0.0, 1.0, 3.0, 5.0], "points": 6}
    assert views.curves(records, 0)["loss"]["x"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
