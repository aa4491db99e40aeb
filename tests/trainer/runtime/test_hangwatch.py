"""The hang watch: its timeout and trigger on a fake clock, then real hung ranks that dump their stacks."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from trainerhelp import ROOT, FakeClock, launch, rank_env
from trainerhelp import describe as _describe

from ddp_contract import layout
from ddp_contract.failureline import parse_line
from ddp_trainer import wire
from ddp_trainer.errors import ExitCode, ObjectNotFoundError
from ddp_trainer.runtime.hangwatch import STEP_FACTOR, Hang, HangWatch, hang_timeout
from ddp_trainer.runtime.heartbeat import Heartbeat
from ddp_trainer.storage import s3
from ports import free_port

WORLD = 2
TOKEN = "the-jobs-data-token"


def test_timeout_is_configured_or_derived_from_the_slowest_step_with_a_floor() -> None:
    assert hang_timeout(30.0, 100.0, 300.0) == 30.0
    assert hang_timeout(0.0, 100.0, 300.0) is None  # 0: never
    assert hang_timeout(None, 1.0, 300.0) == 300.0
    assert hang_timeout(None, 60.0, 300.0) == STEP_FACTOR * 60.0


def test_the_clock_starts_at_the_first_step_and_restarts_with_each_new_one() -> None:
    clock = FakeClock()
    beat = Heartbeat(clock)
    fired: list[Hang] = []
    watch = HangWatch(beat, None, 5.0, fired.append)
    clock.now = 100.0
    assert watch.check() is None  # no step yet: startup is the rendezvous timeout's business
    beat.beat(1)
    clock.now = 102.0
    beat.beat(2)  # a 2 s step: the derived timeout is max(5, 10 x 2) = 20 s
    beat.beat(2)  # the same step again does not restart the clock
    clock.now = 121.0
    assert watch.check() is None
    clock.now = 122.5
    hang = watch.check()
    assert hang is not None and hang.step == 2 and hang.timeout_s == 20.0
    assert hang.describe() == "no progress for 20s since step 2 (hang timeout 20s)"


def test_a_watch_with_timeout_zero_never_starts() -> None:
    watch = HangWatch(Heartbeat(), 0.0, 5.0, lambda hang: None).start()
    assert not watch._thread.is_alive()


def test_a_stalled_rank_saves_its_stacks_ahead_at_half_its_timeout_once_per_stalled_step() -> None:
    """With a derived timeout a peer may fire first and the restart take this rank's pod before its
    own timeout: its stacks are saved at half of it, once per step it stalls on."""
    clock = FakeClock()
    beat = Heartbeat(clock)
    stalls: list[Hang] = []
    hangs: list[Hang] = []
    watch = HangWatch(beat, 20.0, 5.0, hangs.append, on_stall=stalls.append)
    beat.beat(1)
    clock.now = 9.0
    assert not watch.poll() and stalls == []
    clock.now = 10.5
    assert not watch.poll() and [(s.step, s.stalled_s) for s in stalls] == [(1, 10.5)]
    clock.now = 15.0
    assert not watch.poll() and len(stalls) == 1  # once for this step
    beat.beat(2)
    clock.now = 26.0
    assert not watch.poll() and [s.step for s in stalls] == [1, 2]  # a new stall, a new dump
    clock.now = 35.5
    assert watch.poll() and hangs[0].step == 2 and watch.fired.is_set()


def test_a_rank_that_stops_calling_the_collective_is_caught_and_every_rank_dumps_its_stacks(
        s3_env, bucket, tmp_path: Path) -> None:
    env = {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAME": "stuck", "DDP_JOB_NAMESPACE": "team-a",
           "DDP_ATTEMPT": "2", "DDP_HANG_TIMEOUT_SECONDS": "3", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    started = time.monotonic()
    results = launch("ddp_workloads:hang", WORLD, env, timeout=90)
    assert [r.returncode for r in results] == [ExitCode.HUNG] * WORLD, _describe(results)
    assert time.monotonic() - started < 60
    hung = parse_line(results[1].stderr)
    assert hung is not None and hung.step == 3 and hung.exit_code == ExitCode.HUNG
    # Seen at the first look after 3 s without progress: a second later here, more on a busy machine.
    said = re.match(r"no progress for (\d+)s since step 3 \(hang timeout 3s\)", hung.error)
    assert said and 3 <= int(said[1]) < 30, hung.error
    dumps = s3.S3Url(bucket, f"runs/team-a/stuck/{layout.HANGS}/attempt-2")
    assert f"stacks in s3://{bucket}/{dumps.key}/rank-1.txt" in hung.error
    stuck_in_sleep = s3.get_bytes(dumps.join("rank-1.txt")).decode()
    waiting_in_collective = s3.get_bytes(dumps.join("rank-0.txt")).decode()
    assert "time.sleep(3600)" in stuck_in_sleep and "in hang" in stuck_in_sleep
    assert "dist.all_reduce(torch.ones(1))" in waiting_in_collective


def test_a_stalled_rank_saves_its_stacks_before_its_timeout_in_case_a_peer_s_ends_the_gang_first(
        s3_env, bucket, tmp_path: Path) -> None:
    """Halfway to its hang timeout a stalled rank saves its stacks without exiting; the pod deleted by
    a restart another rank's hang caused (here: SIGKILL) leaves them behind."""
    env = {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAME": "stalled", "DDP_JOB_NAMESPACE": "team-a",
           "DDP_HANG_TIMEOUT_SECONDS": "30", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", "ddp_workloads:hang"], cwd=ROOT,
                              env=rank_env(env, rank, WORLD, port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for rank in range(WORLD)]
    dump = s3.S3Url(bucket, f"runs/team-a/stalled/{layout.HANGS}/attempt-0/rank-1.txt")
    try:
        started = time.monotonic()
        while time.monotonic() - started < 60 and all(p.poll() is None for p in procs):
            try:
                saved = s3.get_bytes(dump).decode()
                break
            except ObjectNotFoundError:
                time.sleep(0.5)
        else:
            pytest.fail(f"no early dump of rank 1: {[p.poll() for p in procs]}")
        assert all(p.poll() is None for p in procs)  # saved ahead, not at the timeout: both still run
        assert "time.sleep(3600)" in saved and "in hang" in saved
    finally:
        for proc in procs:
            proc.kill()
        errors = [proc.communicate()[1] for proc in procs]
    assert "stacks saved ahead to s3://" in errors[1], errors[1][-2000:]


@pytest.fixture
def silent_data_worker() -> Iterator[str]:
    """A data worker that starts a rank's logical worker and then never answers a batch (a process
    stuck in the dataset, a machine too loaded to serve): its address."""
    listener = wire.listen("127.0.0.1", 0, TOKEN.encode())
    held: list[Any] = []

    def serve() -> None:
        with contextlib.suppress(OSError, EOFError):
            conn = wire.accept(listener)
            held.append(conn)
            wire.receive(conn)  # start
            wire.receive(conn)  # the dataset
            wire.send(conn, ("ready",))
            while True:
                wire.receive(conn)  # fetch: never answered

    threading.Thread(target=serve, daemon=True).start()
    yield f"127.0.0.1:{listener.address[1]}"
    listener.close()
    for conn in held:
        conn.close()


def test_a_rank_hung_on_a_data_worker_names_it_in_its_failure_line(silent_data_worker: str, tmp_path: Path) -> None:
    env = {"DDP_HANG_TIMEOUT_SECONDS": "3", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json"),
           "DDP_DATA_WORKERS": silent_data_worker, "DDP_DATA_WORKER_TOKEN": TOKEN}
    (result,) = launch("ddp_workloads:waits_on_a_data_worker", 1, env, timeout=90)
    assert result.returncode == ExitCode.HUNG, _describe([result])
    hung = parse_line(result.stderr)
    assert hung is not None and hung.step == 2, result.stderr[-2000:]
    assert re.search(rf"waiting on data worker {silent_data_worker} \(logical worker 0\) for batch 0 for [3-9]s",
                     hung.error), hung.error
