"""Metrics records from JSON lines, and series against the step."""

from __future__ import annotations

import json

import pytest

from ddp_client import metricrecords as metricdata
from ddp_client.metricrecords import parse_lines, series


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


def test_dask_pytorch_ddp_s_per_step_result_files_are_read_as_records() -> None:
    body = json.dumps({"loss": 0.5, "epoch": 1, "count": 40, "worker": 2}).encode()
    record = metricdata.dask_result_record("worker/2/data-2026-01-02T03:04:05.json", body, order=7)
    assert record == {"step": 40, "epoch": 1.0, "loss": 0.5, "rank": 2, "time": 7.0, "source": metricdata.DASK_RESULTS,
                      "count": 40.0, "worker": 2.0}
    assert metricdata.dask_result_record("worker/2/model.json", b'{"layers": 3}', 0) is None  # no metric dict
    assert metricdata.dask_result_record("worker/2/broken.json", b'{"loss": ', 0) is None
    assert metricdata.dask_result_record("eval/accuracy.json", body, 0) is None  # not a worker's file


def test_each_rank_s_records_come_from_its_best_source_only() -> None:
    code = {"step": 1, "loss": 0.9, "rank": 0, "time": 1.0}
    printed = [{"step": s, "loss": 1.0, "rank": r, "time": 0.5, "source": metricdata.PRINTED} for r in (0, 1) for s in (1, 2)]
    dask = {"step": 1, "loss": 0.8, "rank": 2, "time": 0.0, "source": metricdata.DASK_RESULTS}
    dask_and_printed = {**printed[0], "rank": 2}
    kept = metricdata.best_sources([code, *printed, dask, dask_and_printed])
    by_rank = {r: sorted((x.get("source") or "code") for x in kept if x["rank"] == r) for r in (0, 1, 2)}
    assert by_rank == {0: ["code"], 1: ["printed", "printed"], 2: [metricdata.DASK_RESULTS]}
    assert metricdata.series(kept, rank=1) == {"loss": [(1, 1.0), (2, 1.0)]}  # "source" is not a metric


@pytest.mark.parametrize("ranks", [[0, 0, 1, 1, 2], [1, 1, 0, 0], [0, 1, 0], [None, 0, 1], [0, "1", 1], [3]])
def test_best_sources_of_one_source_keeps_every_record_grouped_by_rank_in_the_order_each_came(
        ranks: list[object]) -> None:
    records = [{"step": i, "rank": rank, "loss": 1.0} for i, rank in enumerate(ranks)]
    order = list(dict.fromkeys(int(rank or 0) for rank in ranks))  # type: ignore[call-overload]
    expected = [r for rank in order for r in records if int(r["rank"] or 0) == rank]  # type: ignore[call-overload]
    assert metricdata.best_sources(records) == expected
