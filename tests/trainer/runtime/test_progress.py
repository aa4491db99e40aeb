from __future__ import annotations

import io
import json
from datetime import datetime

import pytest
import torch
from trainerhelp import FakeClock

from ddp_trainer.runtime.progress import (
    MIN_PACE_SECONDS,
    MIN_PACE_STEPS,
    FileSink,
    LogSink,
    ProgressReporter,
    default_reporter,
    duration,
)


def test_rate_limit_and_samples_per_second() -> None:
    clock, records = FakeClock(100.0), []
    reporter = ProgressReporter(records.append, min_interval_s=5.0, clock=clock, wallclock=lambda: 0.0)
    clock.now += 1.0
    assert reporter.report(0, 1, 2.0, samples=32)  # the first report goes out at once
    for step in range(2, 10):
        clock.now += 1.0
        emitted = reporter.report(0, step, 1.0, samples=32)
        assert emitted == (step == 6)  # 5 s after the first
    assert [r["step"] for r in records] == [1, 6]
    assert records[0]["samplesPerSecond"] == 32.0
    assert records[1]["samplesPerSecond"] == pytest.approx(5 * 32 / 5.0)
    assert records[1] == {"epoch": 0, "step": 6, "loss": 1.0, "samplesPerSecond": 32.0, "stepSeconds": 1.0,
                          "percent": None, "remainingSeconds": None, "remaining": None,
                          "updatedAt": "1970-01-01T00:00:00.000Z"}
    assert reporter.flush() and records[-1]["step"] == 9
    assert records[-1]["stepSeconds"] == 1.0  # steps 7-9, one second each
    assert not reporter.flush()  # nothing new


def test_a_reporter_with_the_runs_total_says_the_percent_and_the_time_left_at_the_recent_pace() -> None:
    clock, records = FakeClock(0.0), []
    reporter = ProgressReporter(records.append, min_interval_s=10.0, clock=clock, total_steps=1000)
    for step in range(1, 251):
        clock.now += 0.5
        reporter.report(0, step, 1.0, samples=8)
    reporter.flush()
    assert (records[-1]["step"], records[-1]["percent"]) == (250, 25.0)
    assert records[-1]["remainingSeconds"] == 375 and records[-1]["remaining"] == "6m15s"  # 750 steps of 0.5 s


def test_percent_and_time_left_given_with_a_report_win_and_are_bounded() -> None:
    clock, records = FakeClock(0.0), []
    reporter = ProgressReporter(records.append, min_interval_s=0.0, clock=clock, total_steps=10)
    reporter.report(1, 3, 0.5, percent=70.0, remaining_s=9000.0)
    clock.now += MIN_PACE_SECONDS
    reporter.report(1, 3 + MIN_PACE_STEPS, 0.5, percent=71.25, remaining_s=7322.4)
    assert (records[-1]["percent"], records[-1]["remainingSeconds"], records[-1]["remaining"]) == (71.2, 7322, "2h02m")
    reporter.report(1, 4 + MIN_PACE_STEPS, 0.5, percent=140.0, remaining_s=float("inf"))
    assert (records[-1]["percent"], records[-1]["remainingSeconds"]) == (100.0, None)


@pytest.mark.parametrize(("step_s", "first_said_at"), [
    (1 / 64, 641),  # fast steps: 10 steps in 0.16 s; the 10 s come at step 641
    (5.0, 11),  # slow steps: 10 s after 2 steps; the 10 steps come at step 11
    (1.0, 11),  # both at once
])
def test_the_time_left_is_said_once_it_rests_on_enough_steps_and_seconds(step_s: float, first_said_at: int) -> None:
    clock, records = FakeClock(0.0), []
    reporter = ProgressReporter(records.append, min_interval_s=0.0, clock=clock, total_steps=100_000)
    clock.now += 30.0  # what came before the first step (imports, the gang forming, warm-up) is no step's
    for step in range(1, first_said_at + 1):
        reporter.report(0, step, 1.0, samples=8)
        clock.now += step_s
    said = [r["step"] for r in records if r["remainingSeconds"] is not None]
    assert said == [first_said_at]
    assert records[-1]["remainingSeconds"] == pytest.approx((100_000 - first_said_at) * step_s, rel=0.01)


def test_a_time_left_without_steps_is_said_once_the_run_moved_by_a_percent_in_enough_seconds() -> None:
    """An epoch bar says how far the run is but no step."""
    clock, records = FakeClock(0.0), []
    reporter = ProgressReporter(records.append, min_interval_s=0.0, clock=clock)
    for percent in (10.0, 10.5, 10.99, 11.0):
        reporter.report(1, None, 1.0, percent=percent, remaining_s=500.0)
        clock.now += MIN_PACE_SECONDS / 2
    assert [r["remainingSeconds"] for r in records] == [None, None, None, 500]


def test_a_run_that_ended_as_it_should_shows_its_last_step_complete() -> None:
    clock, records = FakeClock(0.0), []
    reporter = ProgressReporter(records.append, min_interval_s=10.0, clock=clock, total_steps=70)
    for step in range(1, 65):  # stopped early (an early-stopping callback, say) at 64 of 70
        clock.now += 0.1
        reporter.report(1, step, 0.5, samples=4)
    assert records[-1]["step"] == 1  # the rest was within the rate limit
    assert reporter.finish()
    assert (records[-1]["step"], records[-1]["percent"], records[-1]["remainingSeconds"], records[-1]["remaining"]) == \
        (64, 100.0, 0, "0s")
    assert records[-1]["samplesPerSecond"] == 40.0 and records[-1]["stepSeconds"] == 0.1
    assert not reporter.finish() and not reporter.flush()  # said already
    reporter.report(1, 65, 0.25, samples=4)  # output read after the end
    assert reporter.flush() and (records[-1]["step"], records[-1]["percent"]) == (65, 100.0)


def test_a_run_finished_right_after_its_last_record_says_it_again_complete() -> None:
    records: list[dict] = []
    reporter = ProgressReporter(records.append, min_interval_s=0.0, total_steps=100)
    reporter.report(0, 98, 0.5, samples=4)
    assert reporter.finish() and len(records) == 2
    assert {**records[1], "percent": 98.0, "remainingSeconds": None, "remaining": None, "updatedAt": None} == \
        {**records[0], "updatedAt": None}  # the same record but for how far
    assert (records[1]["percent"], records[1]["remaining"]) == (100.0, "0s")


def test_a_finished_run_that_never_said_how_far_it_was_says_no_percent() -> None:
    records: list[dict] = []
    reporter = ProgressReporter(records.append, min_interval_s=0.0)
    assert not reporter.finish()  # nothing reported: nothing to say
    reporter.report(0, 12, 0.5)
    assert reporter.finish() and (records[-1]["step"], records[-1]["percent"], records[-1]["remaining"]) == (12, None, None)


@pytest.mark.parametrize(("seconds", "shown"), [(0, "0s"), (59, "59s"), (60, "1m00s"), (3599, "59m59s"),
                                                (3600, "1h00m"), (90061, "1d01h")])
def test_time_left_reads_as_kubectl_shows_ages(seconds: int, shown: str) -> None:
    assert duration(seconds) == shown


@pytest.mark.parametrize(
    ("loss", "shown"),
    [(1.0835673809051514, 1.084), (0.4375, 0.4375), (123456.7, 123500.0), (torch.tensor(2.5e-05), 2.5e-05),
     (float("nan"), None), (float("inf"), None), (None, None)],
)
def test_loss_is_shown_with_four_significant_digits(loss, shown) -> None:
    records: list[dict] = []
    ProgressReporter(records.append, min_interval_s=0.0).report(0, 1, loss)
    assert records[0]["loss"] == shown


def test_sinks_write_file_and_one_log_line(tmp_path) -> None:
    path = tmp_path / "sub" / "progress.json"
    stream = io.StringIO()
    reporter = ProgressReporter(lambda r: (FileSink(str(path))(r), LogSink(stream)(r)), min_interval_s=0)
    reporter.report(2, 40, 0.5, samples=10)
    reporter.report(2, 41, 0.25, samples=10)
    record = json.loads(path.read_text())
    assert record["step"] == 41 and record["epoch"] == 2 and record["loss"] == 0.25
    datetime.fromisoformat(record["updatedAt"].replace("Z", "+00:00"))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and json.loads(lines[1]) == {"event": "ddp-progress", **record}
    assert list(tmp_path.joinpath("sub").iterdir()) == [path]  # no temp files left


def test_default_reporter_only_rank_0_writes(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    path = tmp_path / "p.json"
    monkeypatch.setenv("DDP_PROGRESS_FILE", str(path))
    monkeypatch.setenv("DDP_PROGRESS_INTERVAL_SECONDS", "60")
    default_reporter(rank=1).report(0, 1, 1.0, samples=1)
    assert not path.exists() and capsys.readouterr().out == ""
    reporter = default_reporter(rank=0)
    assert reporter.min_interval_s == 60
    reporter.report(0, 1, 1.0, samples=1)
    reporter.report(0, 2, 1.0, samples=1)  # rate-limited
    assert json.loads(path.read_text())["step"] == 1
    assert capsys.readouterr().out.count("ddp-progress") == 1


def test_a_failing_sink_never_stops_training_or_the_other_sinks(tmp_path) -> None:
    from ddp_trainer.runtime.progress import fanout

    records = []

    def broken(record: dict) -> None:
        raise OSError("read-only file system")

    reporter = ProgressReporter(fanout([broken, records.append]), min_interval_s=0)
    assert reporter.report(0, 1, 1.0, samples=4) and reporter.report(0, 2, 0.5, samples=4)
    assert [r["step"] for r in records] == [1, 2]


def test_default_reporter_without_kubernetes_credentials(tmp_path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    # Under the operator (job name + in-cluster env) but no service-account token: file and log only.
    monkeypatch.setenv("DDP_PROGRESS_FILE", str(tmp_path / "p.json"))
    monkeypatch.setenv("DDP_JOB_NAME", "job")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    reporter = default_reporter(rank=0)
    reporter.report(1, 5, 0.1, samples=2)
    assert json.loads((tmp_path / "p.json").read_text())["step"] == 5
    assert "cannot write progress to the DDPJob status" in caplog.text
