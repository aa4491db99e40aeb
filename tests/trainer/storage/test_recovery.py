"""How a restarted gang picks its state: the plans (pure), then real ranks in processes of their own, each
"pod" a snapshot directory of its own, handing snapshots over loopback with the job's token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainerhelp import rank_env

from ddp_trainer.storage import s3
from ddp_trainer.storage.checkpoint import CheckpointManager, training_state
from ddp_trainer.storage.podsnapshots import PodSnapshots, SnapshotTaker
from ddp_trainer.storage.recovery import Offer, Source, newest_reached, plans
from ports import free_port


def offer(rank: int, pod: str, steps: tuple[int, ...], port: int | None = 1000, reached: int | None = None) -> Offer:
    return Offer(rank=rank, pod=pod, host=f"ip-{pod}", port=port, steps=steps, reached=reached)


def test_the_newest_step_a_pod_holds_comes_first_and_ranks_without_it_fetch_it_spread_over_its_holders() -> None:
    offers = [offer(0, "a", (8, 7)), offer(1, "b", (8,)), offer(2, "c", (), reached=9), offer(3, "d", (7,)),
              offer(4, "e", ())]
    first, second = plans(offers, s3_step=5)
    assert first.step == 8 and first.holders == ("a", "b")
    assert first.sources[0] == Source("a", "ip-a", None) and first.sources[1] == Source("b", "ip-b", None)
    assert first.sources[2] == Source("a", "ip-a", 1000) and first.sources[3] == Source("b", "ip-b", 1000)
    assert first.sources[4] == Source("a", "ip-a", 1000)
    assert second.step == 7 and second.holders == ("a", "d")
    assert newest_reached(offers) == 9


def test_memory_older_than_the_s3_checkpoint_is_passed_over_and_as_new_as_it_is_taken() -> None:
    offers = [offer(0, "a", (4, 3)), offer(1, "b", (4,))]
    assert [p.step for p in plans(offers, s3_step=5)] == []
    assert [p.step for p in plans(offers, s3_step=4)] == [4]
    assert [p.step for p in plans(offers, s3_step=None)] == [4, 3]


def test_a_step_some_rank_cannot_get_is_no_plan() -> None:
    # Pod b holds step 9 but does not serve it (no token): rank 0's pod lacks it, so only 8 will do.
    offers = [offer(0, "a", (8,)), offer(1, "b", (9, 8), port=None)]
    assert [p.step for p in plans(offers, None)] == [8]
    # Two ranks of one pod: one serving is enough for the pod, and neither fetches what the pod holds.
    shared = [offer(0, "a", (3,), port=None), offer(1, "a", (3,), port=77), offer(2, "b", ())]
    (plan,) = plans(shared, None)
    assert plan.sources[2] == Source("a", "ip-a", 77) and plan.sources[0].port is None


RECOVER = """
import json, sys, torch, torch.distributed as dist
from ddp_trainer.storage.checkpoint import CheckpointManager
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
manager = CheckpointManager(sys.argv[1], memory_every=1, job_status=False)
step = manager.resume(model, optimizer)
momentum = optimizer.state_dict()["state"][0]["momentum_buffer"] if optimizer.state else None
json.dump({"step": step, "weight": model.weight.flatten().tolist(),
           "momentum": None if momentum is None else momentum.flatten().tolist(),
           "held": [h.step for h in manager.pod_snapshots.held()]}, open(sys.argv[2], "w"))
dist.destroy_process_group()
"""


def state_at(step: int) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = torch.Generator().manual_seed(2)
    for _ in range(step):
        optimizer.zero_grad()
        model(torch.randn(3, 8, generator=data)).pow(2).sum().backward()
        optimizer.step()
    return training_state(model, optimizer)


def hold(directory: Path, *steps: int) -> None:
    taker = SnapshotTaker(PodSnapshots(directory), attempt=0)
    for step in steps:
        taker.take(step, state_at(step))
        taker.wait()


def recover(tmp_path: Path, s3_env: dict, prefix: str, pods: dict[str, str]) -> list[dict]:
    """Ranks 0 and 1 in pods a and b resume; what each restored. pods: pod -> its token."""
    (tmp_path / "recover.py").write_text(RECOVER)
    port = free_port()
    ranks = [subprocess.Popen(
        [sys.executable, str(tmp_path / "recover.py"), prefix, str(tmp_path / f"out-{rank}.json")],
        env=rank_env({**s3_env, "HOSTNAME": pod, "POD_IP": "127.0.0.1", "DDP_JOB_TOKEN": token,
                      "DDP_SNAPSHOT_DIR": str(tmp_path / pod)}, rank, 2, port))
        for rank, (pod, token) in enumerate(pods.items())]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    return [json.loads((tmp_path / f"out-{rank}.json").read_text()) for rank in range(2)]


def restored(found: dict, step: int) -> bool:
    # The snapshots and checkpoints hold the bytes state_at made in this process, and state_at makes the same
    # ones again here: equality is of copies, on any CPU and thread count.
    expected = state_at(step)
    return (found["step"] == step and found["weight"] == expected["model"]["weight"].flatten().tolist()
            and found["momentum"] == expected["optimizer"]["state"][0]["momentum_buffer"].flatten().tolist())


@pytest.mark.parametrize(("b_token", "step", "held"), [
    ("secret", 5, ([5, 4], [4])),  # rank 1's pod lacks step 5: it gets it from pod a (nothing newer to forget)
    ("guessed", 4, ([4], [4])),  # without the job's token it cannot: the gang takes step 4, which both hold,
])                               # and pod a forgets step 5, past where the gang resumed
def test_a_rank_whose_pod_lacks_the_newest_snapshot_gets_it_from_a_peer_that_holds_the_job_s_token(
        tmp_path: Path, s3_env: dict, bucket: str, b_token: str, step: int, held: tuple[list[int], list[int]]) -> None:
    hold(tmp_path / "a", 4, 5)
    hold(tmp_path / "b", 4)
    found = recover(tmp_path, s3_env, f"s3://{bucket}/job", {"a": "secret", "b": b_token})
    assert all(restored(rank, step) for rank in found), found
    assert (found[0]["held"], found[1]["held"]) == held


def test_a_damaged_snapshot_is_passed_over_and_an_older_s3_checkpoint_is_the_last_resort(
        tmp_path: Path, s3_env: dict, bucket: str) -> None:
    hold(tmp_path / "a", 6)
    hold(tmp_path / "b", 6)
    for pod in ("a", "b"):
        data = bytearray((tmp_path / pod / "slot-0.data").read_bytes())
        data[0] ^= 1
        (tmp_path / pod / "slot-0.data").write_bytes(data)
    CheckpointManager(s3.S3Url(bucket, "job"), rank=0, job_status=False).save(3, state_at(3))
    found = recover(tmp_path, s3_env, f"s3://{bucket}/job", {"a": "secret", "b": "secret"})
    assert all(restored(rank, 3) for rank in found), found
    assert found[0]["held"] == [] and found[1]["held"] == []


def test_an_s3_checkpoint_newer_than_the_gang_s_memory_wins(tmp_path: Path, s3_env: dict, bucket: str) -> None:
    hold(tmp_path / "a", 2)
    CheckpointManager(s3.S3Url(bucket, "job"), rank=0, job_status=False).save(3, state_at(3))
    found = recover(tmp_path, s3_env, f"s3://{bucket}/job", {"a": "secret", "b": "secret"})
    assert all(restored(rank, 3) for rank in found), found
