"""Kept folders against the real S3 server: pods that mirror a folder as ranks write it, and pods of a
later attempt that restore it (each pod a FolderKeeper of its own, on a folder of its own)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from trainerhelp import FakeClock, rank_env

from ddp_contract import envnames
from ddp_trainer.errors import ConfigError, ObjectNotFoundError
from ddp_trainer.runtime.folderkeeper import FolderKeeper, KeptFolder, folders_from_env, make_folder_keeper
from ddp_trainer.storage import s3
from ddp_trainer.storage.keptfolders import scan_one
from ddp_trainer.storage.keptstore import Kept, KeptPasses, KeptStore
from kube import wait_until
from ports import free_port


@pytest.fixture
def prefix(bucket: str) -> s3.S3Url:
    return s3.S3Url(bucket, "runs/ns/job/kept/out")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


class Pods(dict[str, tuple[Path, FolderKeeper]]):
    """pods[name]: a pod's local folder and its keeper (settling in 10 s of `clock`, in a world of two ranks
    as start() would say), made on first use."""

    def __init__(self, root: Path, prefix: s3.S3Url, clock: FakeClock) -> None:
        super().__init__()
        self.root, self.prefix, self.clock = root, prefix, clock

    def __missing__(self, name: str) -> tuple[Path, FolderKeeper]:
        local = self.root / name / "out"
        folder = KeptFolder("out", str(local), KeptStore(self.prefix, name))
        passes = KeptPasses(s3.S3Url(self.prefix.bucket, "runs/ns/job/kept-passes"), name)
        self[name] = (local, FolderKeeper([folder], interval_s=3600, settle_s=10, clock=self.clock, passes=passes,
                                          passes_wait_s=3, parts_wait_s=3))
        self[name][1].world = 2
        return self[name]


@pytest.fixture
def pods(tmp_path: Path, prefix: s3.S3Url, clock: FakeClock) -> Pods:
    return Pods(tmp_path, prefix, clock)


def write(path: Path, data: bytes, mtime_s: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime_s is not None:
        os.utime(path, (mtime_s, mtime_s))


def settle(keeper: FolderKeeper, clock: FakeClock) -> None:
    """Two passes 10 s apart: what did not change between them is kept."""
    keeper.keep(ended_cleanly=False, final=False)
    clock.now += 10
    keeper.keep(ended_cleanly=False, final=False)


def listing(prefix: s3.S3Url) -> dict[str, int]:
    return KeptStore(prefix, "reader").listing()


def hugging_face_checkpoint(rank0: Path, rank1: Path, step: int, at: int) -> None:
    """What Trainer writes for a checkpoint of a 2-rank job: rank 0 the model, optimizer and state
    (trainer_state.json last), each rank its RNG state, into its own pod's output_dir."""
    folder = f"checkpoint-{step}"
    write(rank0 / folder / "model.safetensors", f"weights {step}".encode(), at)
    write(rank0 / folder / "optimizer.pt", f"optimizer {step}".encode(), at + 1)
    write(rank0 / folder / "rng_state_0.pth", b"rng 0", at + 1)
    write(rank1 / folder / "rng_state_1.pth", b"rng 1", at + 1)
    write(rank0 / folder / "trainer_state.json", json.dumps({"global_step": step}).encode(), at + 2)


def test_what_two_pods_write_is_kept_as_one_folder_and_restored_whole_with_its_times(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock) -> None:
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    hugging_face_checkpoint(rank0, rank1, 2, at=1_700_000_000)
    write(rank0 / "runs" / "events.out.tfevents.1.job-0", b"event 1", 1_700_000_005)
    for keeper in (keeper1, keeper0):
        settle(keeper, clock)
    assert sorted(listing(prefix)) == ["checkpoint-2/model.safetensors", "checkpoint-2/optimizer.pt",
                                       "checkpoint-2/rng_state_0.pth", "checkpoint-2/rng_state_1.pth",
                                       "checkpoint-2/trainer_state.json", "runs/events.out.tfevents.1.job-0"]
    # The next attempt's pod 1 is a new pod: it gets everything, as on a shared filesystem.
    fresh, keeper = pods["job-1-next"]
    line = keeper.restore()
    assert line.startswith("restored 6 kept file(s)")
    assert (fresh / "checkpoint-2" / "trainer_state.json").read_text() == '{"global_step": 2}'
    assert (fresh / "checkpoint-2" / "rng_state_1.pth").read_bytes() == b"rng 1"
    assert os.stat(fresh / "checkpoint-2" / "model.safetensors").st_mtime == 1_700_000_000
    # Hugging Face rotates checkpoints by their folder's time: the newest file's.
    assert os.stat(fresh / "checkpoint-2").st_mtime == 1_700_000_002
    assert os.stat(fresh / "runs").st_mtime == 1_700_000_005
    # Restored files are what is kept: nothing goes up again.
    settle(keeper, clock)
    assert keeper.restore().startswith("restored 0 kept file(s)")


def test_a_checkpoint_a_failed_rank_left_half_written_is_not_restored_and_is_removed_where_it_was_left(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock) -> None:
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    hugging_face_checkpoint(rank0, rank1, 2, at=1_700_000_000)
    settle(keeper1, clock)
    settle(keeper0, clock)
    write(rank0 / "checkpoint-3" / "model.safetensors", b"weights 3", 1_700_000_100)
    settle(keeper0, clock)  # the weights settle and go up
    write(rank0 / "checkpoint-3" / "optimizer.pt", b"optim")  # ...the rank fails while writing this one
    keeper0.finish(ended_cleanly=False, upload_s=30)
    assert "checkpoint-3/model.safetensors" in listing(prefix)
    assert "checkpoint-3/optimizer.pt" not in listing(prefix)  # never settled: not kept
    fresh, keeper = pods["job-1-next"]
    assert "left out incomplete checkpoint folder(s) out/checkpoint-3" in keeper.restore()
    assert sorted(p.name for p in fresh.iterdir()) == ["checkpoint-2"]
    # A pod that stayed (InPlace) removes the half-written folder it holds before the ranks start again.
    keeper0.restore()
    assert sorted(p.name for p in rank0.iterdir()) == ["checkpoint-2"]


def test_a_file_being_rewritten_when_its_rank_fails_keeps_its_last_settled_version(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock) -> None:
    local, keeper = pods["job-0"]
    write(local / "snapshot.pt", b"epoch 1 " * 1000)
    settle(keeper, clock)
    write(local / "snapshot.pt", b"epoch 2 half")  # torch.save cut short by the kill
    keeper.finish(ended_cleanly=False, upload_s=30)
    fresh, other = pods["job-0-next"]
    other.restore()
    assert (fresh / "snapshot.pt").read_bytes() == b"epoch 1 " * 1000


def test_when_the_ranks_exit_0_every_file_is_kept_settled_or_not(
        pods: Pods, prefix: s3.S3Url) -> None:
    local, keeper = pods["job-0"]
    write(local / "final" / "model.safetensors", b"final weights")
    keeper.finish(ended_cleanly=True, upload_s=30)
    assert listing(prefix) == {"final/model.safetensors": len(b"final weights")}


def test_a_rotated_checkpoint_folder_goes_whole_with_what_other_pods_kept_in_it(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock) -> None:
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    hugging_face_checkpoint(rank0, rank1, 1, at=1_700_000_000)
    hugging_face_checkpoint(rank0, rank1, 2, at=1_700_000_100)
    settle(keeper0, clock)
    settle(keeper1, clock)
    for path in sorted((rank0 / "checkpoint-1").iterdir()):  # save_total_limit=1: rank 0 removes the oldest
        path.unlink()
    (rank0 / "checkpoint-1").rmdir()
    keeper0.keep(ended_cleanly=False, final=False)
    assert not [name for name in listing(prefix) if name.startswith("checkpoint-1/")]
    assert "checkpoint-2/rng_state_1.pth" in listing(prefix)


def test_two_pods_writing_one_path_end_as_on_a_shared_filesystem_the_last_writer_winning(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock,
        caplog: pytest.LogCaptureFixture) -> None:
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    write(rank0 / "config.json", b'{"by": 0}')
    write(rank1 / "config.json", b'{"by": 1}')
    settle(keeper0, clock)
    with caplog.at_level(logging.WARNING):
        settle(keeper1, clock)
    assert "out/config.json: pod job-1 replaces the copy pod job-0 kept" in caplog.text
    fresh, keeper = pods["job-2"]
    keeper.restore()
    assert (fresh / "config.json").read_bytes() == b'{"by": 1}'


def test_a_large_file_goes_up_in_parts_and_comes_back_the_same(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock) -> None:
    local, keeper = pods["job-0"]
    data = os.urandom(1 << 20) * 40  # 40 MiB: five 8 MiB parts
    write(local / "checkpoint-9" / "model.safetensors", data)
    write(local / "checkpoint-9" / "trainer_state.json", b"{}")
    settle(keeper, clock)
    fresh, other = pods["job-0-next"]
    other.restore()
    restored = (fresh / "checkpoint-9" / "model.safetensors").read_bytes()
    assert hashlib.sha256(restored).hexdigest() == hashlib.sha256(data).hexdigest()


def test_the_folders_come_from_the_environment_and_need_a_results_prefix() -> None:
    assert folders_from_env({}) == []
    assert folders_from_env({envnames.KEEP_FOLDERS: '["out", "/workspace/runs"]'}) == ["out", "/workspace/runs"]
    with pytest.raises(ConfigError, match="DDP_KEEP_FOLDERS is not a JSON list of paths"):
        folders_from_env({envnames.KEEP_FOLDERS: "out"})
    with pytest.raises(ConfigError, match="must name a folder below / without '..' parts"):
        folders_from_env({envnames.KEEP_FOLDERS: '["../x"]'})
    with pytest.raises(ConfigError, match=r"has no results prefix \(spec.s3.results\)"):
        make_folder_keeper({envnames.KEEP_FOLDERS: '["out"]', envnames.JOB_NAME: "j"})
    assert make_folder_keeper({}) is None


RESUMING = """
    import os, pathlib, signal, sys, time
    out = pathlib.Path("out")
    done = int((out / "epochs.txt").read_text()) if (out / "epochs.txt").exists() else 0
    print(f"resumed after {done} epoch(s); DDP_KEEP_FOLDERS here: {os.environ.get('DDP_KEEP_FOLDERS')}", flush=True)
    out.mkdir(exist_ok=True)
    (out / "epochs.txt").write_text(str(done + 1))
    if len(sys.argv) > 2 and sys.argv[1] == "die-mid-save":  # argv[2]: where epochs.txt is kept
        from ddp_trainer.errors import ObjectNotFoundError
        from ddp_trainer.storage import s3

        def kept(url=s3.parse_uri(sys.argv[2])):
            try:
                return s3.get_bytes(url)
            except ObjectNotFoundError:
                return None

        deadline = time.monotonic() + 60
        while kept() != str(done + 1).encode():  # until epochs.txt is kept...
            assert time.monotonic() < deadline, "epochs.txt was not kept within 60 s"
            time.sleep(0.1)
        half = open(out / "epochs.txt", "w")  # ...then the next save is cut short, the file open
        half.write("half")
        half.flush()
        os.kill(os.getpid(), signal.SIGKILL)
"""


def pod(tmp_path: Path, name: str, s3_env: dict[str, str], bucket: str) -> tuple[Path, dict[str, str]]:
    """A fresh pod's working directory and the env the operator gives it for a job keeping `out`."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent(RESUMING))
    return folder, {**s3_env, "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAME": "keeps",
                    envnames.KEEP_FOLDERS: '["out"]', envnames.KEEP_SETTLE_SECONDS: "3",
                    envnames.KEEP_INTERVAL_SECONDS: "0.5"}


def run_pod(folder: Path, extra: dict[str, str], argv: list[str]) -> tuple[int, str, str]:
    env = rank_env(extra, 0, 1, free_port())
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    done = subprocess.run([sys.executable, "-m", "ddp_trainer", *argv], env=env, cwd=folder, capture_output=True,
                          text=True, timeout=180)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("argv", [["exec", "--", "python", "train.py"], ["run", "train.py"]],
                         ids=["command", "entrypoint"])
def test_a_rank_s_next_pod_starts_with_the_folder_its_last_pod_left(tmp_path: Path, s3_env: dict[str, str],
                                                                      bucket: str, argv: list[str]) -> None:
    first, extra = pod(tmp_path, "attempt-0", s3_env, bucket)
    code, out, err = run_pod(first, extra, argv)
    assert code == 0, err
    assert "resumed after 0 epoch(s)" in out and "restored 0 kept file(s)" in err
    if argv[0] == "run":  # the pod's process keeps the folder, not the rank process it starts
        assert "DDP_KEEP_FOLDERS here: None" in out
    second, _ = pod(tmp_path, "attempt-1", s3_env, bucket)  # a new pod: nothing local
    code, out, err = run_pod(second, extra, argv)
    assert code == 0, err
    assert "resumed after 1 epoch(s)" in out and "restored 1 kept file(s)" in err
    assert s3.get_bytes(s3.S3Url(bucket, "runs/default/keeps/kept/out/epochs.txt")) == b"2"


def test_a_rank_killed_mid_save_leaves_its_last_settled_file_for_the_next_pod(
        tmp_path: Path, s3_env: dict[str, str], bucket: str) -> None:
    first, extra = pod(tmp_path, "attempt-0", s3_env, bucket)
    kept = s3.S3Url(bucket, "runs/default/keeps/kept/out/epochs.txt")
    code, out, err = run_pod(first, extra, ["exec", "--", "python", "train.py", "die-mid-save", str(kept)])
    assert code == 128 + signal.SIGKILL, err
    assert (first / "out" / "epochs.txt").read_text() == "half"
    assert s3.get_bytes(kept) == b"1"
    second, _ = pod(tmp_path, "attempt-1", s3_env, bucket)
    code, out, err = run_pod(second, extra, ["exec", "--", "python", "train.py"])
    assert code == 0, err
    assert "resumed after 1 epoch(s)" in out


def test_what_is_kept_is_said_in_the_status_when_it_changes_at_most_every_30_s_and_at_the_end(
        tmp_path: Path, prefix: s3.S3Url, clock: FakeClock) -> None:
    reports: list[dict[str, Any]] = []
    local = tmp_path / "out"
    keeper = FolderKeeper([KeptFolder("out", str(local), KeptStore(prefix, "job-0"))], interval_s=3600, settle_s=10,
                          clock=clock, report=reports.append)
    write(local / "a.bin", b"12345")
    keeper.keep(ended_cleanly=False, final=False)  # seen, not kept yet (no ranks: once settled): behind
    [said] = [r["folders"] for r in reports]
    assert said == [{"path": "out", "uri": str(prefix), "files": 0, "bytes": 0, "pending": 1,
                     "behindSince": said[0]["behindSince"]}]
    assert said[0]["behindSince"].endswith("Z")
    clock.now += 10
    keeper.keep(ended_cleanly=False, final=False)  # kept, 10 s after the last report: not said yet
    assert len(reports) == 1
    clock.now += 20
    keeper.keep(ended_cleanly=False, final=False)
    assert reports[-1]["folders"] == [{"path": "out", "uri": str(prefix), "files": 1, "bytes": 5}]
    settle(keeper, clock)  # nothing new: nothing said
    write(local / "b.bin", b"123")
    settle(keeper, clock)  # 20 s after the last report: not yet
    assert len(reports) == 2
    keeper.finish(ended_cleanly=True, upload_s=30)
    assert reports[-1]["folders"][0]["files"] == 2 and reports[-1]["folders"][0]["bytes"] == 8
    assert "pending" not in reports[-1]["folders"][0]
    assert reports[-1]["time"].endswith("Z")


def test_the_pod_that_holds_rank_0_in_the_attempt_says_what_is_kept_and_no_other(
        tmp_path: Path, prefix: s3.S3Url, clock: FakeClock) -> None:
    """A spare that takes rank 0's place (or an elastic gang that places its pods anew) reports from then
    on, at its first pass, though nothing changed there; the pod it replaced says nothing more."""
    reports: dict[str, list[dict[str, Any]]] = {"job-0": [], "job-2": []}
    keepers = {name: FolderKeeper([KeptFolder("out", str(tmp_path / name / "out"), KeptStore(prefix, name))],
                                  interval_s=3600, settle_s=10, clock=clock, report=reports[name].append)
               for name in reports}
    write(tmp_path / "job-0" / "out" / "a.bin", b"12345")
    keepers["job-0"].start(0, world=2, reporting=True)
    keepers["job-2"].start(0, world=2, reporting=False)  # a spare's keeper, were it running
    for keeper in keepers.values():
        settle(keeper, clock)
    keepers["job-0"].finish(ended_cleanly=False, upload_s=30)
    keepers["job-2"].finish(ended_cleanly=False, upload_s=30)
    assert reports["job-0"] and reports["job-0"][-1]["folders"][0]["files"] == 1
    assert reports["job-2"] == []
    said = len(reports["job-0"])
    keepers["job-0"].start(1, world=2, reporting=False)  # back as a spare
    keepers["job-2"].start(1, world=2, reporting=True)  # in rank 0's place
    clock.now += 60
    for keeper in keepers.values():
        keeper.keep(ended_cleanly=False, final=False)
    assert len(reports["job-0"]) == said
    assert [r["folders"][0]["files"] for r in reports["job-2"]] == [1]
    for keeper in keepers.values():
        keeper.finish(ended_cleanly=False, upload_s=30)


def test_the_pods_of_a_later_attempt_all_resume_from_the_same_checkpoint(pods: Pods, clock: FakeClock) -> None:
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    keeper0.start(0, world=2)
    keeper1.start(0, world=2)
    hugging_face_checkpoint(rank0, rank1, 16, at=1_700_000_000)
    settle(keeper1, clock)
    settle(keeper0, clock)
    hugging_face_checkpoint(rank0, rank1, 32, at=1_700_000_100)  # whole in rank 0's pod, not yet kept...
    keeper0.finish(ended_cleanly=False, upload_s=30)  # ...when the attempt ends (InPlace: the pods stay)
    keeper1.finish(ended_cleanly=False, upload_s=30)
    for local, keeper in ((rank0, keeper0), (rank1, keeper1)):
        assert "without the last pass" not in keeper.restore(1)
        assert sorted(p.name for p in local.iterdir()) == ["checkpoint-16"]  # rank 0 drops its own checkpoint-32
    assert sorted(p.name for p in (rank1 / "checkpoint-16").iterdir()) == [
        "model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"]


def test_a_checkpoint_s_marker_waits_until_every_rank_s_rng_state_is_kept(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock) -> None:
    """Restored without rank 1's RNG state, rank 1 would resume with other random numbers (dropout): the
    checkpoint counts as whole only once its pod has kept it."""
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    hugging_face_checkpoint(rank0, rank1, 16, at=1_700_000_000)
    settle(keeper0, clock)
    assert sorted(listing(prefix)) == ["checkpoint-16/model.safetensors", "checkpoint-16/optimizer.pt",
                                       "checkpoint-16/rng_state_0.pth"]
    settle(keeper1, clock)
    keeper0.keep(ended_cleanly=False, final=False)
    assert "checkpoint-16/trainer_state.json" in listing(prefix)


def test_at_the_end_the_pod_of_rank_0_waits_for_the_other_pods_last_passes_to_keep_its_last_checkpoint_whole(
        pods: Pods, prefix: s3.S3Url) -> None:
    """The ranks exit 0 right after their last checkpoint: every pod's last pass keeps every file, at the
    same time; rank 0's waits for rank 1's RNG state to be there before it keeps the marker."""
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    hugging_face_checkpoint(rank0, rank1, 128, at=1_700_000_000)
    last = threading.Thread(target=keeper0.finish, kwargs={"ended_cleanly": True, "upload_s": 30})
    last.start()
    wait_until(lambda: "checkpoint-128/rng_state_0.pth" in listing(prefix), 30, "rank 0's last pass")
    keeper1.finish(ended_cleanly=True, upload_s=30)
    last.join()
    assert "checkpoint-128/trainer_state.json" in listing(prefix)


def test_a_pod_stopped_before_its_rank_s_rng_state_is_kept_leaves_that_checkpoint_out_of_the_next_attempt(
        pods: Pods, prefix: s3.S3Url, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    """Rank 1's pod is deleted (or lost) before its keeper kept checkpoint-32's RNG state: rank 0's pod does
    not keep checkpoint-32's marker, even at its last pass, and the next attempt resumes from checkpoint-16."""
    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    hugging_face_checkpoint(rank0, rank1, 16, at=1_700_000_000)
    settle(keeper1, clock)
    settle(keeper0, clock)
    hugging_face_checkpoint(rank0, rank1, 32, at=1_700_000_100)
    settle(keeper0, clock)
    with caplog.at_level(logging.WARNING):
        keeper0.finish(ended_cleanly=False, upload_s=30)
    assert "out/checkpoint-32 is not kept whole: checkpoint-32/rng_state_1.pth, written by other ranks, never came " \
           "to S3" in caplog.text
    fresh, keeper = pods["job-1-next"]
    assert "left out incomplete checkpoint folder(s) out/checkpoint-32" in keeper.restore()
    assert sorted(p.name for p in fresh.iterdir()) == ["checkpoint-16"]
    assert (fresh / "checkpoint-16" / "rng_state_1.pth").read_bytes() == b"rng 1"


SAVE_DCP = """
import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
dist.init_process_group("gloo")
torch.manual_seed(0)
dcp.save({"model": torch.nn.Linear(64, 8).state_dict()}, checkpoint_id=sys.argv[1])
dist.destroy_process_group()
"""


def test_a_distributed_checkpoint_is_restored_once_every_rank_s_files_are_kept_and_loads(
        tmp_path: Path, pods: Pods, prefix: s3.S3Url, clock: FakeClock) -> None:
    """torch.distributed.checkpoint over two ranks, each in its own pod: rank 0 writes __0_0.distcp and
    .metadata, rank 1 __1_0.distcp, which .metadata names. Until rank 1's pod kept its file, the folder is
    not whole in S3; then a new pod restores it, and it loads."""
    import torch
    import torch.distributed.checkpoint as dcp

    (rank0, keeper0), (rank1, keeper1) = pods["job-0"], pods["job-1"]
    (tmp_path / "save.py").write_text(SAVE_DCP)
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, str(tmp_path / "save.py"), str(local / "dcp" / "step-1")],
                              env=rank_env({}, rank, 2, port)) for rank, local in enumerate((rank0, rank1))]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    settle(keeper0, clock)
    assert sorted(listing(prefix)) == ["dcp/step-1/__0_0.distcp"]  # .metadata waits for rank 1's file
    settle(keeper1, clock)
    keeper0.keep(ended_cleanly=False, final=False)
    assert sorted(listing(prefix)) == ["dcp/step-1/.metadata", "dcp/step-1/__0_0.distcp", "dcp/step-1/__1_0.distcp"]
    fresh, keeper = pods["job-0-next"]
    keeper.restore()
    loaded = {"model": torch.nn.Linear(64, 8).state_dict()}
    dcp.load(loaded, checkpoint_id=fresh / "dcp" / "step-1")
    torch.manual_seed(0)
    saved = torch.nn.Linear(64, 8).state_dict()
    assert all(torch.equal(loaded["model"][name], saved[name]) for name in saved)


def test_a_later_attempt_waits_for_the_last_pass_of_a_pod_still_making_it(pods: Pods) -> None:
    keeper0, (rank1, keeper1) = pods["job-0"][1], pods["job-1"]
    keeper0.start(0, world=2)
    keeper1.start(0, world=2)
    keeper0.finish(ended_cleanly=True, upload_s=30)
    write(rank1 / "final.txt", b"written as the ranks ended")
    # job-1 has not made its last pass (a pod still stopping, or one lost without it): waited for, then named.
    fresh, keeper = pods["job-1-next"]
    assert keeper.restore(1).endswith("(without the last pass of job-1 (attempt 0))")
    keeper1.finish(ended_cleanly=True, upload_s=30)
    again, other = pods["job-0-next"]
    assert "without" not in other.restore(1)
    assert (again / "final.txt").read_bytes() == b"written as the ranks ended"


@pytest.mark.parametrize("crt", ["1", "0"], ids=["crt", "boto3"])
@pytest.mark.parametrize("size", [100, 20 << 20], ids=["small", "multipart"])
def test_a_file_that_changes_while_it_goes_up_replaces_nothing(tmp_path: Path, prefix: s3.S3Url, size: int, crt: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(envnames.S3_CRT, crt)
    store = KeptStore(prefix, "job-0")
    path = tmp_path / "snapshot.pt"
    write(path, b"1" * size)
    first = scan_one(str(path))
    assert first is not None and store.upload("snapshot.pt", str(path), first)
    write(path, b"2" * (size // 2))  # rewritten: what is read no longer is the settled version
    assert not store.upload("snapshot.pt", str(path), first)
    assert s3.get_bytes(prefix.join("snapshot.pt")) == b"1" * size
    second = scan_one(str(path))
    assert second is not None  # unchanged while it is read, but the ranks ended meanwhile: not whole
    assert not store.upload("snapshot.pt", str(path), second, still=lambda: False)
    assert s3.get_bytes(prefix.join("snapshot.pt")) == b"1" * size
    assert store.kept("snapshot.pt") == Kept(first.mtime_ns, "job-0")  # the file's time, as metadata either way


REWRITING = """
import sys, time, torch
path, count = sys.argv[1], 0
base = torch.arange(1 << 20, dtype=torch.float32)  # 4 MB: each save takes a while
while True:
    count += 1
    torch.save({"counter": count, "weights": base + count}, path)  # in place: truncated, then written
    time.sleep(1)
"""

HOLDING = """
import sys
folder = sys.argv[1]
events = open(folder + "/events.log", "ab")
events.write(b"step 1\\n")
events.flush()
snapshot = open(folder + "/snapshot.pt", "wb")  # as torch.save starts: opened, truncated, nothing written yet
print("holding", flush=True)
for line in sys.stdin:
    events.write(b"step 2\\n")
    events.flush()
    print("appended", flush=True)
"""


@pytest.fixture
def rank() -> Iterator[subprocess.Popen[str]]:
    """A process standing for the pod's rank process: running until the test ends."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, text=True)
    yield process
    process.kill()
    process.wait()


def kept_keeper(local: Path, prefix: s3.S3Url, clock: Callable[[], float], ranks: Callable[[], list[int]],
                interval_s: float = 3600) -> FolderKeeper:
    return FolderKeeper([KeptFolder("out", str(local), KeptStore(prefix, "job-0"))], interval_s=interval_s,
                        settle_s=10, clock=clock, ranks=ranks)


def loaded(prefix: s3.S3Url, name: str) -> dict[str, Any] | None:
    """The kept torch.save file `name`, loaded; None while there is none."""
    import torch

    try:
        data = s3.get_bytes(prefix.join(name))
    except ObjectNotFoundError:
        return None
    return torch.load(io.BytesIO(data))


def test_a_file_rewritten_every_second_is_kept_whole_version_after_version(
        tmp_path: Path, prefix: s3.S3Url) -> None:
    """pytorch/examples' snapshot.pt, saved each (short) epoch in place, never stays unchanged for the 10 s
    settle time; it is kept between two saves, each version whole (it loads, its tensor is its own)."""
    import torch

    local = tmp_path / "out"
    local.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", REWRITING, str(local / "snapshot.pt")])
    keeper = kept_keeper(local, prefix, time.monotonic, lambda: [writer.pid], interval_s=0.5).start()
    try:
        versions = []
        for _ in range(3):  # three kept versions, each newer than the one before
            newest = versions[-1]["counter"] if versions else 0
            version = wait_until(lambda n=newest: (v := loaded(prefix, "snapshot.pt")) and v["counter"] > n and v,
                                 90, f"a version of snapshot.pt newer than save {newest}")
            assert isinstance(version, dict)
            assert torch.equal(version["weights"], torch.arange(1 << 20, dtype=torch.float32) + version["counter"])
            versions.append(version)
    finally:
        writer.kill()
        writer.wait()
        keeper.finish(ended_cleanly=False, upload_s=30)
    assert [v["counter"] for v in versions] == sorted({v["counter"] for v in versions})


def test_a_file_held_open_for_writing_is_kept_once_settled_and_a_closed_one_at_once(
        tmp_path: Path, prefix: s3.S3Url, clock: FakeClock, rank: subprocess.Popen[str]) -> None:
    local = tmp_path / "out"
    local.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDING, str(local)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdin is not None and holder.stdout is not None
    keeper = kept_keeper(local, prefix, clock, lambda: [rank.pid])
    try:
        assert holder.stdout.readline() == "holding\n"
        write(local / "config.json", b"{}")
        keeper.keep(ended_cleanly=False, final=False)
        assert listing(prefix) == {"config.json": 2}  # closed: at once; the held ones wait to settle
        said = keeper.status()["folders"][0]
        assert said["pending"] == 2 and said["behindSince"].endswith("Z")
        holder.stdin.write("append\n")
        holder.stdin.flush()
        assert holder.stdout.readline() == "appended\n"
        clock.now += 5
        keeper.keep(ended_cleanly=False, final=False)
        assert sorted(listing(prefix)) == ["config.json"]
        clock.now += 5  # the empty snapshot.pt unchanged for 10 s, events.log for 5 s
        keeper.keep(ended_cleanly=False, final=False)
        assert listing(prefix) == {"config.json": 2, "snapshot.pt": 0}
        assert keeper.status()["folders"][0]["behindSince"] == said["behindSince"]  # events.log since then
        clock.now += 5
        keeper.keep(ended_cleanly=False, final=False)
        assert s3.get_bytes(prefix.join("events.log")) == b"step 1\nstep 2\n"
        assert "pending" not in keeper.status()["folders"][0]
    finally:
        holder.kill()
        holder.wait()


def test_a_version_whose_writer_died_holding_it_is_not_taken_as_whole(
        tmp_path: Path, prefix: s3.S3Url, clock: FakeClock, rank: subprocess.Popen[str]) -> None:
    """A launcher's worker killed mid-save (the rank process, its launcher, goes on for a while): the file it
    left is closed, but maybe cut short; only settling keeps it. A rank process that ended: the whole rule is
    off until the next attempt's start."""
    local = tmp_path / "out"
    write(local / "snapshot.pt", b"epoch 1")
    keeper = kept_keeper(local, prefix, clock, lambda: [rank.pid])
    keeper.keep(ended_cleanly=False, final=False)
    worker = subprocess.Popen([sys.executable, "-c", "import sys\nf = open(sys.argv[1], 'wb')\nf.write(b'epo')\n"
                               "f.flush()\nprint('saving', flush=True)\nsys.stdin.read()", str(local / "snapshot.pt")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None and worker.stdout.readline() == "saving\n"
    keeper.keep(ended_cleanly=False, final=False)  # held open: not whole
    worker.kill()
    worker.wait()
    keeper.keep(ended_cleanly=False, final=False)  # closed by its writer's death
    assert s3.get_bytes(prefix.join("snapshot.pt")) == b"epoch 1"
    write(local / "snapshot.pt", b"epoch 2")  # a whole save by a process that goes on
    keeper.keep(ended_cleanly=False, final=False)
    assert s3.get_bytes(prefix.join("snapshot.pt")) == b"epoch 2"
    rank.kill()
    rank.wait()
    write(local / "snapshot.pt", b"epoch 3")
    keeper.keep(ended_cleanly=False, final=False)
    assert s3.get_bytes(prefix.join("snapshot.pt")) == b"epoch 2"
    clock.now += 10
    keeper.keep(ended_cleanly=False, final=False)
    assert s3.get_bytes(prefix.join("snapshot.pt")) == b"epoch 3"


def test_a_file_that_changed_while_it_went_up_goes_up_next_from_a_copy_made_aside(
        tmp_path: Path, prefix: s3.S3Url, clock: FakeClock, rank: subprocess.Popen[str],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    aside = tmp_path / "tmp"
    aside.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(aside))
    copied: list[str] = []
    real_copyfile = shutil.copyfile
    monkeypatch.setattr(shutil, "copyfile", lambda source, target: copied.append(source) or real_copyfile(source, target))
    local = tmp_path / "out"
    write(local / "model.pt", b"v" * (20 << 20), mtime_s=1_700_000_000)
    write(local / "other.pt", b"w", mtime_s=1_700_000_000)
    keeper = kept_keeper(local, prefix, clock, lambda: [rank.pid])
    keeper.folders[0].rewritten.add("model.pt")  # as a direct upload that found it changed leaves it
    keeper.keep(ended_cleanly=False, final=False)
    assert copied == [str(local / "model.pt")]  # other.pt went up straight
    assert s3.get_bytes(prefix.join("model.pt")) == b"v" * (20 << 20)
    assert KeptStore(prefix, "reader").kept("model.pt") == Kept(1_700_000_000 * 10**9, "job-0")  # the file's time
    assert list(aside.iterdir()) == []
    # No room for a copy (here: no temporary folder): it goes up straight, and so do the next.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    write(local / "model.pt", b"x" * 100)
    with caplog.at_level(logging.WARNING):
        keeper.keep(ended_cleanly=False, final=False)
    assert f"no copy of out/model.pt could be made in {tmp_path / 'missing'}" in caplog.text
    assert s3.get_bytes(prefix.join("model.pt")) == b"x" * 100
