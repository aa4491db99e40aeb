"""Metrics records from JSON lines, and series against the step."""

from __future__ import annotations

import json

import pytest

from ddp_client.metrics import parse_lines, series


def line(**record: object) -> str:
    return json.dumps(record)


def test_records_are_parsed_and_a_bad_line_is_named() -> None:
    text = line(step=1, loss=2.0, rank=0) + "\n\n" + line(step=2, loss=1.0, rank=0) + "\n"
    assert [r["step"] for r in parse_lines(text)] == [1, 2]
    with pytest.raises(ValueError, match="m.jsonl line 2 is not JSON"):
        parse_lines(line(step=1) + "\n{oops\n", "m.jsonl")
    with pytest.raises(ValueError, match="line 1 is not a metrics record"):
        parse_lines('{"loss": 1}', "m.jsonl")


def test_series_per_rank_keep_the_latest_record_of_a_step_and_only_numbers() -> None:
    records = [
        {"step": 1, "epoch": 0, "loss": 3.0, "acc": 0.1, "note": "x", "rank": 0, "time": 1.0},
        {"step": 2, "epoch": 0, "loss": 2.0, "acc": None, "rank": 0, "time": 2.0},
        {"step": 2, "epoch": 0, "loss": 1.5, "rank": 0, "time": 5.0},  # the resumed gang logged step 2 again
        {"step": 1, "epoch": 0, "loss": 5.0, "rank": 1, "time": 1.0},
        {"step": 3, "epoch": 0, "loss": float("nan"), "rank": 0, "time": 6.0},
    ]
    assert series(records) == {"acc": [(1, 0.1)], "loss": [(1, 3.0), (2, 1.5)]}
    assert series(records, rank=1) == {"loss": [(1, 5.0)]}
    assert series(records, rank=None)["loss"] == [(1, 4.0), (2, 1.5)]  # the ranks' mean
