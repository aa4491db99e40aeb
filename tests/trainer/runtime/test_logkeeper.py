"""Logs that outlive the pods: every rank's output kept under the job's results prefix, in real rank processes."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainerhelp import ROOT, describe, launch, rank_env

from ddp_contract import layout
from ddp_trainer.errors import ExitCode, ObjectNotFoundError
from ddp_trainer.runtime import logkeeper
from ddp_trainer.runtime.logkeeper import LogKeeper, Parts
from ddp_trainer.storage import s3
from ports import free_port
from waiting import wait_until


def kept_log(bucket: str, job: str, attempt: int, rank: int, namespace: str = "ns") -> str:
    url = s3.S3Url(bucket, f"runs/{namespace}/{job}/{layout.log_part(attempt, rank, 0)}")
    return s3.get_bytes(url).decode()


def job_env(s3_env: dict[str, str], bucket: str, job: str, **extra: str) -> dict[str, str]:
    return {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAME": job, "DDP_JOB_NAMESPACE": "ns",
            "DDP_ATTEMPT": "3", **extra}


def test_parts_are_cut_at_their_size_and_only_changed_ones_go_again() -> None:
    parts = Parts(part_bytes=4)
    parts.add(b"abcdef")
    assert parts.changed() == [(0, b"abcd"), (1, b"ef")]
    assert parts.changed() == []
    parts.add(b"g")
    assert parts.changed() == [(1, b"efg")]  # part 0 is full: never sent again
    parts.unsent([(1, b"efg")])
    assert parts.changed() == [(1, b"efg")]


def test_every_kind_of_output_of_a_failing_rank_is_kept_and_still_reaches_the_container_log(s3_env, bucket) -> None:
    results = launch("ddp_workloads:chatty", 2, job_env(s3_env, bucket, "chat", WL_FAIL="1"))
    assert [r.returncode for r in results] == [ExitCode.USER_ERROR] * 2, describe(results)
    for result in results:
        kept = kept_log(bucket, "chat", 3, result.rank)
        for line in (f"rank {result.rank} prints to stdout", f"rank {result.rank} writes to stderr",
                     f"rank {result.rank} logs a warning", "a DataLoader worker printed item 1",
                     "Traceback (most recent call last)", f"RuntimeError: rank {result.rank} fails on purpose",
                     f"ddp-trainer: error (rank {result.rank}, step -, exit 1 USER_ERROR"):
            assert line in kept, (line, kept)
        # The tee changes nothing for the container's own log: stdout and stderr stay apart.
        assert f"rank {result.rank} prints to stdout" in result.stdout
        assert "a DataLoader worker printed item 0" in result.stdout
        assert f"rank {result.rank} writes to stderr" in result.stderr and "Traceback" in result.stderr
        assert "writes to stderr" not in result.stdout


def test_a_rank_without_a_results_prefix_keeps_nothing_and_runs_as_before(s3_env, bucket) -> None:
    (result,) = launch("ddp_workloads:chatty", 1, {**s3_env, "DDP_JOB_NAME": "chat"})
    assert result.returncode == 0, describe([result])
    assert "rank 0 prints to stdout" in result.stdout
    assert list(s3.list_objects(s3.S3Url(bucket, "runs"))) == []


def start_waiting_rank(s3_env: dict[str, str], bucket: str, job: str, ready: Path, interval: str) -> subprocess.Popen:
    env = rank_env(job_env(s3_env, bucket, job, WL_READY_FILE=str(ready), DDP_LOG_UPLOAD_INTERVAL_SECONDS=interval),
                   0, 1, free_port())
    return subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", "ddp_workloads:chatty"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_uploads_the_log_with_the_ranks_last_words(s3_env, bucket, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    proc = start_waiting_rank(s3_env, bucket, "stopped", ready, interval="0")  # 0: only at exit
    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, "the rank to be in the user's code")
        assert ready.exists(), proc.communicate(timeout=10)
        proc.terminate()
        proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.TERMINATED
    kept = kept_log(bucket, "stopped", 3, 0)
    assert "rank 0 prints to stdout" in kept and "stopped by SIGTERM" in kept, kept


def test_the_log_is_uploaded_every_interval_so_a_sigkill_loses_at_most_the_last_one(s3_env, bucket, tmp_path) -> None:
    ready = tmp_path / "ready"
    proc = start_waiting_rank(s3_env, bucket, "killed", ready, interval="1")

    def uploaded() -> bool:
        try:
            return "a DataLoader worker printed item 1" in kept_log(bucket, "killed", 3, 0)
        except ObjectNotFoundError:
            return False

    try:
        wait_until(lambda: ready.exists() or proc.poll() is not None, 60, "the rank to be in the user's code")
        assert ready.exists(), proc.communicate(timeout=10)
        wait_until(uploaded, 30, "the periodic upload of the rank's output")
        proc.kill()
        proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert "rank 0 prints to stdout" in kept_log(bucket, "killed", 3, 0)


FINISH_TWICE = """
import os, sys, threading, time
from ddp_trainer.runtime.logkeeper import LogKeeper
main = threading.get_ident()
kept, seen, uploading, second_returned = [], [], threading.Event(), threading.Event()

def main_waits_in_finish():
    names, frame = [], sys._current_frames().get(main)
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names[:1] == ["wait"] and "finish" in names

def upload(part, data):
    uploading.set()
    deadline = time.monotonic() + 30
    while not (main_waits_in_finish() or second_returned.is_set()) and time.monotonic() < deadline:
        second_returned.wait(0.01)  # a slow last upload: it runs until the second caller waits in finish()
    second_returned.wait(0.5)  # and half a second more, in which a caller that stopped waiting would return
    kept.append(data)

keeper = LogKeeper(upload, 0).start()
print("the rank's last words", flush=True)
first = threading.Thread(target=keeper.finish)
first.start()
in_upload = uploading.wait(30)  # the first caller is in finish(), uploading
keeper.finish()  # a second caller, as the hang watchdog's thread can be: returns once the first is done
seen.extend(kept)
second_returned.set()
first.join(30)
os.write(sys.__stderr__.fileno(), ("@" + repr((in_upload, seen))).encode())
os._exit(0)
"""


def test_a_second_finish_waits_for_the_first_ones_upload(tmp_path: Path) -> None:
    env = rank_env({}, 0, 1, free_port())
    result = subprocess.run([sys.executable, "-c", FINISH_TWICE], env=env, capture_output=True, text=True, timeout=60)
    in_upload, seen = ast.literal_eval(result.stderr.rsplit("@", 1)[-1])
    assert in_upload, result.stderr
    assert seen == [b"the rank's last words\n"], result.stderr  # what was uploaded when the second finish() returned


class SlowS3:
    """An upload that takes until the test releases it (a slow or stuck S3 server); what it kept.
    only_first: the uploads after the first one land at once."""

    def __init__(self, fail_first: bool = False, only_first: bool = False) -> None:
        self.kept: list[bytes] = []
        self.started, self.release = threading.Event(), threading.Event()
        self.fail_first = fail_first
        self.only_first = only_first

    def upload(self, part: int, data: bytes) -> None:
        if self.fail_first:
            self.fail_first = False
            raise OSError("connection refused")
        if self.only_first and self.started.is_set():
            self.kept.append(data)
            return
        self.started.set()
        self.release.wait(60)
        self.kept.append(data)


def keeper_of(upload: SlowS3, text: bytes) -> LogKeeper:
    """A keeper teeing a child's stdout (a pipe written with `text`, then closed) on to /dev/null."""
    read_end, write_end = os.pipe()
    out = os.open(os.devnull, os.O_WRONLY)
    keeper = LogKeeper(upload.upload, 0).attach([(read_end, out)])
    os.write(write_end, text)
    os.close(write_end)
    return keeper


def test_the_last_upload_is_waited_for_within_its_budget_and_a_cut_off_one_is_said(caplog) -> None:
    slow = SlowS3()
    keeper = keeper_of(slow, b"the last words\n")
    finishing = threading.Thread(target=keeper.finish, kwargs={"upload_s": 60})
    finishing.start()
    assert slow.started.wait(30)
    assert finishing.is_alive()  # still waiting on the upload
    slow.release.set()
    finishing.join(30)
    assert not finishing.is_alive() and slow.kept == [b"the last words\n"]
    assert "may not be kept" not in caplog.text

    stuck = SlowS3()
    started = time.monotonic()
    keeper_of(stuck, b"never kept\n").finish(upload_s=0.2)
    assert time.monotonic() - started < 10 and stuck.kept == []
    assert "the end of this rank's log may not be kept in S3: its upload took over 0 s" in caplog.text
    stuck.release.set()


def test_a_server_that_already_failed_gets_no_longer_than_a_stopped_rank_s_wait(monkeypatch) -> None:
    monkeypatch.setattr(logkeeper, "FINAL_UPLOAD_SECONDS", 0.2)
    failing = SlowS3(fail_first=True)
    keeper = keeper_of(failing, b"output\n")
    def refused() -> bool:
        keeper.upload_changed()
        return not failing.fail_first

    wait_until(refused, 30, "a periodic upload, refused (once the tee has taken the output in)", interval=0.01)
    started = time.monotonic()
    keeper.finish(upload_s=60)
    assert time.monotonic() - started < 10 and failing.kept == []
    failing.release.set()


def test_the_last_upload_waits_for_the_interval_s_in_flight_so_the_newest_copy_lands_last() -> None:
    """Two uploads of one part at once would race, and the older copy landing second would be what S3
    keeps: the rank's last lines lost though uploaded."""
    slow = SlowS3(only_first=True)
    keeper = LogKeeper(slow.upload, 0)
    keeper.parts.add(b"one\n")
    interval = threading.Thread(target=keeper.upload_changed)
    interval.start()
    assert slow.started.wait(30)
    keeper.parts.add(b"two\n")
    last = threading.Thread(target=keeper.upload_changed)
    last.start()
    last.join(1)
    assert last.is_alive()  # waits for the upload in flight, not beside it
    slow.release.set()
    interval.join(30)
    last.join(30)
    assert slow.kept == [b"one\n", b"one\ntwo\n"]
