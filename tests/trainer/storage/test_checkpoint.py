"""Checkpoints against a real S3 server: committed by a manifest, kept to the last K, resumed."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict, namedtuple

import pytest
import torch

import s3server  # localcluster/s3server.py: its identity without the right to list
from ddp_contract import envnames, layout
from ddp_trainer.data.sampler import DistributedChunkedSampler
from ddp_trainer.errors import ConfigError, CorruptDataError, StorageError, StorageUnavailableError
from ddp_trainer.storage import checkpoint, s3
from ddp_trainer.storage.checkpoint import MANIFEST, STATE, CheckpointManager, restore_training_state, training_state
from linkproxy import LinkProxy
from waiting import wait_until


def _state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sampler = DistributedChunkedSampler(100, num_replicas=2, rank=0, chunksize=10)
    sampler.set_epoch(3)
    return training_state(model, opt, sampler, step_seed=seed)


def test_save_keep_last_k_and_load_latest(bucket: str) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), keep=2, rank=0)
    assert manager.load_latest() is None
    for step in (10, 20, 30):
        manager.save(step, _state(step))
    assert manager.committed_steps() == [20, 30]
    keys = [k for k, _ in s3.list_objects(s3.S3Url(bucket, f"job/{layout.CHECKPOINTS}"))]
    assert not any("step-000000000010" in k for k in keys)
    latest = manager.load_latest()
    assert latest is not None and latest.step == 30
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sampler = DistributedChunkedSampler(100, num_replicas=2, rank=0, chunksize=10)
    restore_training_state(latest.state, model, opt, sampler)
    expected = _state(30)
    assert torch.equal(model.weight, expected["model"]["weight"])
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], expected["optimizer"]["state"][0]["momentum_buffer"])
    assert sampler.epoch == 3 and latest.state["step_seed"] == 30
    manifest = json.loads(s3.get_bytes(latest.url.join(MANIFEST)))
    assert manifest["step"] == 30 and manifest["files"][STATE]["size"] > 0


def test_uncommitted_and_corrupt_checkpoints_are_ignored(bucket: str) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), keep=3, rank=0)
    manager.save(1, _state(1))
    # A crash after the data upload but before the manifest: step 2 has data, no manifest.
    s3.put_bytes(manager.step_url(2).join(STATE), b"partial")
    assert manager.committed_steps() == [1]
    assert manager.load_latest().step == 1
    # Data that no longer matches its manifest is skipped too.
    manager.save(3, _state(3))
    s3.put_bytes(manager.step_url(3).join(STATE), b"truncated")
    assert manager.load_latest().step == 1
    # Committing a newer checkpoint removes the leftovers of the crashed save.
    manager.save(4, _state(4))
    keys = [k for k, _ in s3.list_objects(manager.prefix)]
    assert not any("step-000000000002" in k for k in keys)


def test_manifest_records_crc32c_and_a_changed_byte_is_caught(bucket: str) -> None:
    from awscrt.checksums import crc32c

    manager = CheckpointManager(s3.S3Url(bucket, "job"), keep=3, rank=0)
    manager.save(1, _state(1))
    manager.save(2, _state(2))
    entry = json.loads(s3.get_bytes(manager.step_url(2).join(MANIFEST)))["files"][STATE]
    data = s3.get_bytes(manager.step_url(2).join(STATE))
    assert entry == {"size": len(data), "crc32c": f"{crc32c(data):08x}"}
    # Same size, one bit flipped: only the checksum tells.
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    s3.put_bytes(manager.step_url(2).join(STATE), bytes(flipped))
    with pytest.raises(CorruptDataError, match="does not match its manifest"):
        manager.load(2)
    assert manager.load_latest().step == 1


def test_sha256_manifests_written_without_the_crt_still_load(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), keep=3, rank=0)
    with monkeypatch.context() as without_crt:
        without_crt.setattr(checkpoint, "crc32c_function", lambda: None)
        manager.save(1, _state(1))
    entry = json.loads(s3.get_bytes(manager.step_url(1).join(MANIFEST)))["files"][STATE]
    assert set(entry) == {"size", "sha256"}
    latest = manager.load_latest()
    assert latest.step == 1 and torch.equal(latest.state["model"]["weight"], _state(1)["model"]["weight"])
    s3.put_bytes(manager.step_url(1).join(STATE), b"x" * entry["size"])
    with pytest.raises(CorruptDataError, match="does not match its manifest"):
        manager.load(1)


def test_a_crc32c_manifest_without_the_crt_says_what_to_install(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), rank=0)
    manager.save(1, _state(1))
    monkeypatch.setattr(checkpoint, "crc32c_function", lambda: None)
    with pytest.raises(ConfigError, match=r"CRC32C.*boto3\[crt\]"):
        manager.load(1)


def test_a_manifest_without_a_checksum_is_malformed(bucket: str) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), rank=0)
    manager.save(1, _state(1))
    url = manager.step_url(1).join(MANIFEST)
    manifest = json.loads(s3.get_bytes(url))
    manifest["files"][STATE].pop("crc32c")
    s3.put_bytes(url, json.dumps(manifest).encode())
    with pytest.raises(CorruptDataError, match=r"malformed: .*crc32c or sha256"):
        manager.load(1)


def test_only_rank_0_writes(bucket: str) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), rank=1)
    assert manager.save(5, _state(5)) is None
    assert manager.committed_steps() == []


def test_async_save_does_not_stall_and_snapshots_state(bucket: str) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), keep=5, async_save=True, rank=0)
    weights = torch.zeros(512, 1024)  # 2 MiB
    started = time.monotonic()
    url = manager.save(7, {"w": weights})
    returned_after = time.monotonic() - started
    weights += 1  # training goes on mutating the tensors; the checkpoint keeps the old values
    manager.wait()
    assert url == manager.step_url(7)
    latest = manager.load_latest()
    assert latest.step == 7 and torch.equal(latest.state["w"], torch.zeros(512, 1024))
    manager.save(8, {"w": weights})
    manager.close()
    assert manager.committed_steps() == [7, 8]
    assert returned_after < 2.0


Pair = namedtuple("Pair", "first second")  # at module level, where pickle (and so torch.save) finds it


def test_async_and_sync_saves_load_back_identically(bucket: str) -> None:
    """What a synchronous save keeps, an asynchronous one keeps: a state dict's type and `_metadata`
    (module versions, read by load_state_dict hooks), namedtuples, defaultdicts, Parameters, and
    tensors shared under two names or viewing one storage."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    weight = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    base = torch.arange(10.0)
    state = {
        "model": model.state_dict(),
        "pair": Pair(weight, 3),
        "tied": [weight, weight],
        "frozen": torch.nn.Parameter(torch.ones(2), requires_grad=False),
        "leaf": torch.zeros(2, requires_grad=True),
        "counts": defaultdict(list, {"a": [1]}),
        "base": base,
        "window": base[2:5],
    }
    loaded = {}
    for mode in (False, True):
        manager = CheckpointManager(s3.S3Url(bucket, f"meta-{mode}"), async_save=mode, rank=0)
        manager.save(1, state)
        manager.close()
        loaded[mode] = manager.load_latest(weights_only=False).state  # Pair is not on weights_only's list
    for got in loaded.values():
        assert type(got["model"]) is type(model.state_dict()) and got["model"]._metadata == model.state_dict()._metadata
        assert got["model"]._metadata["1"]["version"] == 2  # BatchNorm's version, which its loading hook reads
        assert all(torch.equal(got["model"][k], v) for k, v in model.state_dict().items())
        assert type(got["pair"]) is Pair and got["pair"].first is got["tied"][0] is got["tied"][1]
        assert type(got["tied"][0]) is torch.nn.Parameter and got["tied"][0].requires_grad
        assert torch.equal(got["tied"][0], weight)
        assert type(got["frozen"]) is torch.nn.Parameter and not got["frozen"].requires_grad
        assert type(got["leaf"]) is torch.Tensor and got["leaf"].requires_grad
        assert type(got["counts"]) is defaultdict and got["counts"].default_factory is list
        assert got["counts"] == {"a": [1]} and got["counts"]["new"] == []
        got["base"][3] = 42  # the window still views the base's storage
        assert got["window"].tolist() == [2.0, 42.0, 4.0]


def test_async_save_error_surfaces(s3_env) -> None:
    manager = CheckpointManager(s3.S3Url("no-such-bucket-ckpt", "job"), async_save=True, rank=0)
    manager.save(1, {"w": torch.ones(2)})
    with pytest.raises(Exception, match="no-such-bucket-ckpt"):
        manager.wait()


def test_multipart_upload_of_large_checkpoint(bucket: str) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "big"), rank=0, part_size=5 * 1024 * 1024)
    big = {"w": torch.arange(3 * 1024 * 1024, dtype=torch.float32)}  # 12 MiB -> 3 parts
    url = manager.save(1, big)
    etag = s3.head(url.join(STATE))["ETag"]
    assert etag.strip('"').endswith("-3")  # multipart ETags end in -<number of parts>
    assert torch.equal(manager.load_latest().state["w"], big["w"])


class StatusRecorder:
    """Stands where the job's status is written (a JobStatusSink); the cluster test uses the real one."""

    def __init__(self) -> None:
        self.patches: list[dict] = []

    def patch(self, fields: dict) -> bool:
        self.patches.append(fields)
        return True


def test_each_commit_is_recorded_as_the_jobs_last_checkpoint(bucket: str) -> None:
    status = StatusRecorder()
    manager = CheckpointManager(s3.S3Url(bucket, "job"), rank=0, async_save=True, job_status=status)
    manager.save(10, _state(10))
    manager.save(20, _state(20))
    manager.close()
    recorded = [p["lastCheckpoint"] for p in status.patches]
    assert [r["step"] for r in recorded] == [10, 20]
    assert recorded[1]["uri"] == f"s3://{bucket}/job/{layout.CHECKPOINTS}/step-000000000020" and recorded[1]["time"].endswith("Z")


def test_resume_loads_the_newest_committed_checkpoint_or_the_one_the_operator_names(bucket: str, monkeypatch) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), keep=5, rank=0)
    for step in (10, 20, 30):
        manager.save(step, _state(step))
    model = torch.nn.Linear(4, 3)
    assert manager.resume(model) == 30
    # status.lastCheckpoint said 20 when this attempt's pods were made (rank 0 committed 30 and was lost
    # before the job's status said so): 30 all the same, no work lost.
    monkeypatch.setenv("DDP_RESUME_FROM", str(manager.step_url(20)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert manager.resume(model, opt) == 30
    assert torch.equal(model.weight, _state(30)["model"]["weight"])
    # The newest no longer verifies: the next newest that does.
    s3.put_bytes(manager.step_url(30).join(STATE), b"truncated")
    assert manager.resume(model) == 20
    monkeypatch.setenv("DDP_RESUME_FROM", f"s3://{bucket}/elsewhere/step-000000000010")
    assert manager.resume(model) == 20
    assert CheckpointManager(s3.S3Url(bucket, "fresh"), rank=0).resume(model) == 0


def test_without_the_right_to_list_resume_loads_the_checkpoint_the_operator_names(
        bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), keep=5, rank=0)
    for step in (10, 20):
        manager.save(step, _state(step))
    key = os.environ["AWS_ACCESS_KEY_ID"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key + s3server.NO_LIST)  # may read and write, not list
    s3.reset_clients()
    try:
        reader = CheckpointManager(s3.S3Url(bucket, "job"), keep=5, rank=0)
        with pytest.raises(StorageError, match="access denied"):
            reader.committed_steps()
        monkeypatch.setenv("DDP_RESUME_FROM", str(reader.step_url(10)))
        model = torch.nn.Linear(4, 3)
        assert reader.resume(model) == 10
        assert torch.equal(model.weight, _state(10)["model"]["weight"])
        monkeypatch.delenv("DDP_RESUME_FROM")
        with pytest.raises(StorageError, match="access denied"):  # nothing named: nothing to go by but a listing
            reader.resume(model)
    finally:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        s3.reset_clients()


def test_a_checkpoint_the_job_asks_for_is_requested_of_rank_0_until_one_is_saved(
        bucket: str, tmp_path, monkeypatch) -> None:
    request = tmp_path / "checkpoint-request"
    monkeypatch.setenv(envnames.CHECKPOINT_REQUEST_FILE, str(request))
    rank_0, rank_1 = (CheckpointManager(s3.S3Url(bucket, "job"), rank=r) for r in (0, 1))
    assert not rank_0.requested()  # no request file: none asked for
    request.write_text("2026-11-24T23:00:00Z")
    assert rank_0.requested() and not rank_1.requested()
    rank_0.save(7, _state(7))
    assert not rank_0.requested() and rank_0.committed_steps() == [7]  # answered
    request.write_text("2026-11-24T23:05:00Z")  # asked again, later
    assert rank_0.requested()
    request.unlink()
    assert not rank_0.requested()


def test_snapshots_are_taken_as_often_as_asked_and_said_once_on_the_job(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    status = StatusRecorder()
    manager = CheckpointManager(s3.S3Url("unused", "job"), rank=0, job_status=status, memory_every=3,
                                memory_dir=tmp_path)
    made = []

    def state() -> dict:
        made.append(1)
        return _state(1)

    taken = [step for step in range(1, 11) if manager.snapshot(step, state)]
    manager.close()
    assert taken == [1, 4, 7, 10] and len(made) == 4  # the state is made only when a snapshot is due
    assert [h.step for h in manager.pod_snapshots.held()] == [10, 7] and manager.pod_snapshots.reached() == 10
    (said,) = [p["memorySnapshots"] for p in status.patches]
    assert said["every"] == "every 3 steps" and said["copies"] == 2 and said["bytes"] > 0, said
    # Only the pod's first rank process keeps them: the state is the same in every rank.
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert not CheckpointManager(s3.S3Url("unused", "job"), rank=1, memory_every=1, memory_dir=tmp_path / "x").snapshot(1, state)
    assert not (tmp_path / "x").exists()


def test_snapshots_that_do_not_fit_are_turned_off_with_the_reason_on_the_job(tmp_path, monkeypatch) -> None:
    from ddp_trainer.storage import podsnapshots

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(podsnapshots, "room", lambda directory: podsnapshots.Room(free=100, memory_limit=None,
                                                                                  memory_used=None))
    status = StatusRecorder()
    manager = CheckpointManager(s3.S3Url("unused", "job"), rank=0, job_status=status, memory_every_s=0.5,
                                memory_dir=tmp_path)
    assert not manager.snapshot(1, _state(1)) and not manager.snapshot(2, _state(2))
    (said,) = [p["memorySnapshots"] for p in status.patches]
    assert said["off"].startswith("memory snapshots are off: 2 copies of the training state") and "spec.shmSize" in said["off"]
    assert manager.pod_snapshots.held() == []


@pytest.mark.parametrize("memory", [{"memory_every": 0}, {"memory_every": 1.5}, {"memory_every_s": 0}])
def test_a_snapshot_interval_that_is_no_interval_is_refused(memory: dict) -> None:
    with pytest.raises(ConfigError, match="memory_every"):
        CheckpointManager(s3.S3Url("unused", "job"), rank=0, **memory)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_checkpoints_wait_for_s3_through_an_outage_and_the_newest_is_committed(
        bucket: str, s3_outage: LinkProxy, async_save: bool) -> None:
    """S3 out at a save: it returns and training goes on, the job's status says a checkpoint is behind
    since when, a later save replaces the waiting one, and once S3 answers the newest is committed and
    the status cleared."""
    status = StatusRecorder()
    before = set(threading.enumerate())
    manager = CheckpointManager(s3.S3Url(bucket, "job"), rank=0, async_save=async_save, job_status=status)
    manager.save(10, _state(10))
    assert manager.wait() == manager.step_url(10)
    s3_outage.down()
    manager.save(20, _state(20))  # returns though S3 is out
    wait_until(lambda: any(p.get("checkpointsBehind") for p in status.patches), timeout=20,
               what="the status to say a checkpoint is behind")
    manager.save(30, _state(30))  # replaces step 20
    behind = [p["checkpointsBehind"] for p in status.patches if p.get("checkpointsBehind")]
    assert behind[0]["since"].endswith("Z") and behind[0]["error"] and behind[0]["step"] in (20, 30)
    s3_outage.refusing = False
    manager.close()
    assert manager.committed_steps() == [10, 30]
    assert torch.equal(manager.load_latest().state["model"]["weight"], _state(30)["model"]["weight"])
    assert status.patches[-1] == {"checkpointsBehind": None}  # once step 30 is the job's last checkpoint
    assert status.patches[-2]["lastCheckpoint"]["step"] == 30
    assert not [t for t in set(threading.enumerate()) - before if t.name == "ddp-checkpoint"]  # close ended it
    manager.save(40, _state(40))  # S3 answers: a synchronous save writes it itself
    assert manager.wait() == manager.step_url(40)
    manager.close()


def test_an_outage_longer_than_the_limit_fails_the_next_save(bucket: str, s3_outage: LinkProxy) -> None:
    manager = CheckpointManager(s3.S3Url(bucket, "job"), rank=0, s3_outage_s=1.0)
    s3_outage.down()
    manager.save(1, _state(1))
    with pytest.raises(StorageUnavailableError, match="unreachable for over 1 s"):
        wait_until(lambda: manager.save(2, _state(2)) and False, timeout=20, what="the outage limit")
    with pytest.raises(ConfigError, match="s3_outage_s=-1"):
        CheckpointManager(s3.S3Url(bucket, "job"), rank=0, s3_outage_s=-1)


def test_a_save_behind_a_write_the_s3_client_still_retries_returns_once_s3_is_out(
        bucket: str, s3_outage: LinkProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 client retries the write in flight for minutes (30 attempts): the next save asks S3 itself,
    finds it out, and returns with its state waiting, instead of stalling training until those retries
    end; the status says from then on that a checkpoint is behind."""
    monkeypatch.setenv("DDP_S3_MAX_ATTEMPTS", "30")
    s3.reset_clients()
    status = StatusRecorder()
    manager = CheckpointManager(s3.S3Url(bucket, "job"), rank=0, async_save=True, job_status=status)
    s3_outage.down()
    manager.save(20, _state(20))
    saved = threading.Event()
    threading.Thread(target=lambda: (manager.save(30, _state(30)), saved.set()), daemon=True).start()
    wait_until(saved.is_set, timeout=30, what="the save behind the retried write to return")
    assert status.patches[0]["checkpointsBehind"]["step"] == 20
    s3_outage.refusing = False
    manager.close()
    assert manager.committed_steps()[-1] == 30
    assert status.patches[-1]["lastCheckpoint"]["step"] == 30
    assert {"checkpointsBehind": None} in status.patches  # caught up once the retried write went through
