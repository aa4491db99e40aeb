"""Series and spans of metric records computed over columns: the same results as a record at a time
(tests/recordwise.py), on records with gaps, several ranks and attempts, and values that are no numbers."""

from __future__ import annotations

import json
from typing import Any

import pytest

import recordwise
from ddp_client import metriccolumns
from ddp_client.metriccolumns import Columns
from ddp_client.metricrecords import _parse_at_once, parse_lines, series


@pytest.mark.parametrize("seed", range(6))
def test_series_are_those_worked_out_a_record_at_a_time(seed: int) -> None:
    records = recordwise.messy_records(seed, 400)
    for rank in (0, 1, 3, None, 9):
        expected = recordwise.series(records, rank)
        got = series(records, rank)
        assert got == expected, rank
        assert [type(step) for values in got.values() for step, _ in values] == [int] * sum(map(len, got.values()))


def test_a_step_of_several_ranks_is_their_mean_added_in_the_order_they_came() -> None:
    # Three values whose sum depends on the order it is added in: 0.1 + 0.2 + 0.3 != 0.3 + 0.2 + 0.1.
    records = [{"step": 5, "rank": rank, "time": float(when), "loss": value}
               for rank, when, value in ((2, 1, 0.1), (0, 2, 0.2), (1, 3, 0.3))]
    assert series(records, None) == {"loss": [(5, ((0.1 + 0.2) + 0.3) / 3)]}
    assert series(list(reversed(records)), None) == series(records, None)  # by time, not by place in the list


def test_a_resumed_attempt_s_records_of_a_step_win_over_the_first_one_s() -> None:
    records = [{"step": s, "loss": 1.0, "rank": 0, "attempt": 0, "time": float(s)} for s in range(10)]
    records += [{"step": s, "loss": 2.0, "rank": 0, "attempt": 1, "time": 100.0 + s} for s in range(5, 8)]
    assert series(records) == {"loss": [(s, 2.0 if 5 <= s < 8 else 1.0) for s in range(10)]}


def test_fields_that_are_no_numbers_are_left_out_and_a_bad_step_is_the_error_int_gives() -> None:
    records: list[dict[str, Any]] = [{"step": 1, "loss": True, "acc": "0.5", "rank": 0, "time": None},
                                     {"step": "2", "loss": 2, "rank": False, "time": True},
                                     {"step": 3.0, "loss": float("inf"), "rank": 1, "time": 1.0}]
    assert series(records) == recordwise.series(records) == {"loss": [(2, 2.0)]}
    assert series([*records, {"step": "x", "loss": 1.0, "rank": 2}], rank=0) == {"loss": [(2, 2.0)]}  # another rank's
    with pytest.raises(ValueError, match="invalid literal for int"):
        series([*records, {"step": "x", "loss": 1.0, "rank": 0}], rank=0)


def test_step_times_newest_records_and_attempt_spans_are_those_worked_out_a_record_at_a_time() -> None:
    for seed in range(4):
        records = recordwise.messy_records(seed, 300)
        columns = Columns(records)
        for rank in (0, 2, None):
            steps, when = metriccolumns.step_times(columns, rank)
            assert dict(zip(steps.tolist(), when.tolist(), strict=True)) == recordwise.step_times(records, rank)
        assert {rank: {"step": int(records[i]["step"]), "time": float(records[i]["time"])}
                for rank, i in metriccolumns.newest(columns).items()} == recordwise.last_steps(records)
        spans = metriccolumns.attempt_spans(columns)
        assert [(attempt, records[first]["time"], records[first]["step"]) for attempt, (first, _) in spans.items()][1:] \
            == recordwise.attempt_starts(records)


def test_no_records_make_no_series_and_no_spans() -> None:
    empty = Columns([])
    assert metriccolumns.series(empty, None) == {} and metriccolumns.newest(empty) == {}
    assert metriccolumns.attempt_spans(empty) == {} and len(metriccolumns.step_times(empty, 0)[0]) == 0


def test_lines_read_at_once_are_the_records_of_each_line_and_a_bad_line_is_still_named() -> None:
    records = recordwise.messy_records(1, 200)
    text = "\n".join(json.dumps(r) for r in records) + "\n\n"
    assert json.dumps(parse_lines(text)) == json.dumps(records)  # NaN too
    good = json.dumps({"step": 1, "loss": 1.0})
    for bad, why in ((good + good, "is not JSON"), ('{"step": 1,', "is not JSON"), ("[1, 2]", "is not a metrics record"),
                     ('{"step": 1}, {"step": 2}', "is not JSON")):
        with pytest.raises(ValueError, match=f"m.jsonl line 3 {why}"):
            parse_lines(f"{good}\n{good}\n{bad}\n{good}\n", "m.jsonl")
    with pytest.raises(ValueError, match="m.jsonl line 1 is not JSON"):  # an object over two lines
        parse_lines('{"step": 1\n"loss": 2.0}\n', "m.jsonl")


def test_plain_lines_are_read_at_once_and_other_line_ends_a_line_at_a_time() -> None:
    lines = [json.dumps(r) for r in recordwise.messy_records(2, 50)]
    plain = "\n".join(lines) + "\n"
    assert _parse_at_once(plain) is not None
    accented = "\n".join([*lines, json.dumps({"step": 9, "précision": 0.5}, ensure_ascii=False)])
    for text in (plain.replace("\n", "\r\n"), plain.replace("\n", "\n\n"), accented):
        assert _parse_at_once(text) is None
        assert json.dumps(parse_lines(text)) == json.dumps([json.loads(line) for line in text.splitlines() if line.strip()])
    with pytest.raises(ValueError, match="m.jsonl line 51 is not JSON"):  # U+2028 ends a line, mid-record
        parse_lines("\n".join([*lines, '{"step": 9, "note": "a\u2028b"}']), "m.jsonl")
    with pytest.raises(ValueError, match="m.jsonl line 2 is not JSON"):  # so does a lone carriage return
        parse_lines('{"step": 1}\n{"step": 2,\r"loss": 1.0}\n', "m.jsonl")
