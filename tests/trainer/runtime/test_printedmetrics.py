"""Progress and metrics from what training code already prints, in real rank processes: the dask example's
JSON lines and Hugging Face's dict lines recognised among lines that are none, the code's own reports
winning, and a setting that turns it off; and, fed captured output, how lines, bars and what the code's
trainer says merge into one progress."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from trainerhelp import FakeClock, describe, launch

from ddp_trainer.runtime import printedmetrics
from ddp_trainer.runtime.heartbeat import Heartbeat
from ddp_trainer.runtime.printedmetrics import PrintedMetrics, Probed
from ddp_trainer.runtime.progress import ProgressReporter
from ddp_trainer.storage import s3
from ddp_trainer.storage.results import PRINTED, read_metrics

STEPS = 12


def run(s3_env: dict[str, str], bucket: str, tmp_path: Path, job: str, **extra: str) -> tuple[dict[str, Any] | None,
                                                                                                list[dict[str, Any]]]:
    """Two ranks of ddp_workloads.prints_metrics; (rank 0's progress file, every metric record)."""
    progress = tmp_path / f"{job}-progress.json"
    env = {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAME": job, "DDP_JOB_NAMESPACE": "ns",
           "DDP_PROGRESS_FILE": str(progress), "DDP_PROGRESS_INTERVAL_SECONDS": "0.2", "WL_STEPS": str(STEPS), **extra}
    results = launch("ddp_workloads:prints_metrics", 2, env)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert all('{"accuracy": 0.5, "count": 12}' in r.stdout for r in results)  # the output is as it was printed
    said = json.loads(progress.read_text()) if progress.exists() else None
    return said, [dict(r) for r in read_metrics(s3.S3Url(bucket, f"runs/ns/{job}"))]


def test_dask_pytorch_ddp_s_json_lines_drive_progress_and_every_rank_s_metrics(s3_env, bucket, tmp_path) -> None:
    progress, records = run(s3_env, bucket, tmp_path, "dask")
    assert progress is not None and (progress["epoch"], progress["step"], progress["loss"]) == (2, STEPS, 0.08333)
    assert progress["samplesPerSecond"] is None  # the lines say nothing of samples
    for rank in (0, 1):
        mine = sorted((r for r in records if r["rank"] == rank), key=lambda r: r["step"])
        assert [r["step"] for r in mine] == list(range(1, STEPS + 1)) and {r["source"] for r in mine} == {PRINTED}
        assert all(math.isclose(r["loss"], 1 / r["step"]) and r["epoch"] == (r["step"] - 1) // 4 and r["worker"] == rank
                   for r in mine)


def test_hugging_face_s_dict_lines_report_the_epoch_and_number_the_records(s3_env, bucket, tmp_path) -> None:
    progress, records = run(s3_env, bucket, tmp_path, "hf", WL_STYLE="hf")
    assert progress is not None and (progress["epoch"], progress["step"], progress["loss"]) == (3, None, 0.0833)
    mine = sorted((r for r in records if r["rank"] == 0), key=lambda r: r["step"])
    assert [r["step"] for r in mine] == list(range(1, STEPS + 1))  # the line's number: the dict has no step
    assert [r["epoch"] for r in mine][:5] == [0.25, 0.5, 0.75, 1, 1.25]
    assert {"grad_norm", "learning_rate"} <= mine[0].keys() and mine[-1]["learning_rate"] == 5e-05


def test_the_code_s_own_reports_win_over_its_printed_lines(s3_env, bucket, tmp_path) -> None:
    progress, records = run(s3_env, bucket, tmp_path, "explicit", WL_EXPLICIT="1")
    assert progress is not None and (progress["step"], progress["loss"]) == (STEPS * 100, 0.8333)
    for rank in (0, 1):  # at most the line printed before the code's first call (the client drops it)
        assert [r["step"] for r in records if r["rank"] == rank and r.get("source") == PRINTED] in ([], [1])
    assert sorted(r["step"] for r in records if r["rank"] == 0 and r.get("source") != PRINTED) == \
        [100 * s for s in range(1, STEPS + 1)]


@pytest.mark.parametrize("off", ["false", "0", "off"])
def test_recognition_turned_off_reports_nothing_from_the_output(s3_env, bucket, tmp_path, off: str) -> None:
    progress, records = run(s3_env, bucket, tmp_path, f"off-{off}", DDP_METRICS_FROM_OUTPUT=off)
    assert progress is None and records == []


def test_without_a_results_prefix_the_printed_lines_still_drive_progress(s3_env, bucket, tmp_path) -> None:
    progress = tmp_path / "progress.json"
    results = launch("ddp_workloads:prints_metrics", 2, {"DDP_JOB_NAME": "nos3", "DDP_PROGRESS_FILE": str(progress),
                                                         "WL_STEPS": "3"})
    assert [r.returncode for r in results] == [0, 0], describe(results)
    assert json.loads(progress.read_text())["step"] == 3


PRINTED_RUNS = Path(__file__).resolve().parents[2] / "contract" / "printed"


@pytest.fixture
def no_code_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's earlier tests' reporters said the code reports itself (a flag for the process): not here."""
    monkeypatch.setattr(printedmetrics, "reported_by_code", lambda: False)


def printed_metrics(heartbeat: Heartbeat | None = None,
                    clock: FakeClock | None = None) -> tuple[PrintedMetrics, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    reporter = ProgressReporter(records.append, min_interval_s=0.0, by_code=False, **({"clock": clock} if clock else {}))
    return PrintedMetrics(reporter, None, heartbeat), records


def test_hugging_face_s_lines_and_its_bar_on_the_other_stream_merge_into_one_progress(no_code_reports: None) -> None:
    printed, records = printed_metrics()
    out = (PRINTED_RUNS / "transformers-5.23-trainer.stdout").read_bytes()
    err = (PRINTED_RUNS / "transformers-5.23-trainer.stderr").read_bytes()
    for start in range(0, max(len(out), len(err)), 64):  # interleaved as the tee reads two pipes
        printed.feed(err[start:start + 64], 2)
        printed.feed(out[start:start + 64], 1)
    printed.flush()
    last = records[-1]
    assert (last["step"], last["percent"], last["epoch"]) == (16, 100.0, 1)
    assert last["loss"] == 3.907  # the last log dict's, kept while the bar moves on
    assert all(r["loss"] is not None for r in records if r["step"] and r["step"] > 2)


def test_what_the_code_s_trainer_says_wins_over_its_bars_and_gives_the_time_left(no_code_reports: None) -> None:
    clock, reporter_clock = Heartbeat(), FakeClock(100.0)
    printed, records = printed_metrics(clock, reporter_clock)
    printed.record_probe(Probed(step=10, total=100, epoch=0.5, loss=1.25), now=100.0)
    assert records[-1]["remainingSeconds"] is None  # one message says no pace
    reporter_clock.now = 110.0
    printed.record_probe(Probed(step=30, total=100, epoch=1.5, loss=1.0), now=110.0)
    printed.feed(b"Epoch 1:  10%|#         | 1/10 [00:01<00:09,  1.00it/s, train_loss=9.9]\r")
    printed.flush()
    assert (records[-1]["step"], records[-1]["epoch"], records[-1]["loss"], records[-1]["percent"]) == (30, 1, 1.0, 30.0)
    assert records[-1]["remainingSeconds"] == 35  # 70 steps at 0.5 s each
    assert clock.step is not None  # every message ticked the command's hang-watch clock


def test_a_progress_line_of_the_code_s_own_reporter_in_the_output_stops_the_printed_progress(
        no_code_reports: None) -> None:
    printed, records = printed_metrics()
    printed.feed(b'{"loss": 0.5, "step": 1}\n')
    printed.flush()
    printed.feed(b'{"event": "ddp-progress", "step": 1, "loss": 0.5}\n{"loss": 0.25, "step": 2}\n')
    printed.flush()
    assert [r["step"] for r in records] == [1]


def test_a_run_that_succeeded_ends_complete_with_the_output_read_after_its_end(no_code_reports: None) -> None:
    """The bar's last drawings come through the pipe after the command ended: they are the last step."""
    outcomes = {}
    for succeeded in (True, False):
        printed, records = printed_metrics()
        printed.feed(b" 97%|#########6| 62/64 [00:09<00:00,  6.50it/s, loss=0.5]\r")
        if succeeded:
            printed.succeeded()
        printed.feed(b"100%|##########| 64/64 [00:10<00:00,  6.40it/s, loss=0.25]\n")
        printed.close()
        outcomes[succeeded] = records[-1]
    assert (outcomes[True]["step"], outcomes[True]["loss"], outcomes[True]["percent"], outcomes[True]["remaining"]) == \
        (64, 0.25, 100.0, "0s")
    assert outcomes[False]["remaining"] is None  # the bar's own word, not a pace of enough steps and seconds


def test_a_run_that_succeeded_short_of_its_total_is_complete_and_one_that_failed_is_not(no_code_reports: None) -> None:
    """An early-stopping rule ended the run at step 40 of 64: it is done; a run that failed there is not."""
    shown = {}
    for succeeded in (True, False):
        printed, records = printed_metrics()
        printed.probe({"step": 40, "total": 64, "epoch": 0.6, "loss": 0.5})
        if succeeded:
            printed.succeeded()
        printed.close()
        shown[succeeded] = (records[-1]["step"], records[-1]["percent"], records[-1]["remaining"])
    assert shown == {True: (40, 100.0, "0s"), False: (40, 62.5, None)}
