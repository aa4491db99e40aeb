"""The entrypoint's GPU path: nccl, the rank pinned to its CUDA device, checkpoints of CUDA state.

These need a CUDA device, so they are skipped on CPU-only machines (CI); run them on a GPU machine
with `python -m pytest tests/trainer/test_gpu.py`. One GPU is enough: a single nccl rank
exercises the backend choice, device pinning, DDP on CUDA and resume from a checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import ddp_workloads
import pytest
import torch
from trainerhelp import describe as _describe
from trainerhelp import launch, rank_env, workload_env

from commandpods import command_job, run_pods
from ddp_trainer.runtime.zygote import Zygote
from ddp_trainer.storage import s3
from ddp_trainer.storage.checkpoint import CheckpointManager
from kube import REPO
from ports import free_port

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BATCH = 8
EPOCHS = 2
GPU = {"DDP_BACKEND": "auto", "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES") or "0"}


def _env(s3_env: dict[str, str], bucket: str, job: str, out: Path, **extra: str) -> dict[str, str]:
    return workload_env(s3_env, bucket, job, "gpu", out, BATCH, EPOCHS, **GPU, **extra)


@pytest.mark.timeout(300)
def test_nccl_rank_trains_on_its_gpu_and_resumes_from_a_checkpoint(s3_env, bucket, tmp_path) -> None:
    out = tmp_path / "straight.pt"
    (straight,) = launch("ddp_workloads:train", 1, _env(s3_env, bucket, "straight", out, WL_CKPT_EVERY="5"))
    assert straight.returncode == 0, _describe([straight])
    # auto picked nccl because the rank has a GPU, and pinned the rank to cuda:LOCAL_RANK.
    assert "rank 0/1 joined (nccl on cuda:0)" in straight.stderr, straight.stderr[-3000:]

    params = torch.load(out)
    reference = ddp_workloads.reference(1, BATCH, EPOCHS)
    for name in params:
        assert torch.allclose(params[name], reference[name], rtol=1e-4, atol=1e-5), name

    # Checkpoints taken of CUDA tensors load on a machine without a GPU (map_location cpu).
    latest = CheckpointManager(s3.S3Url(bucket, "runs/gpu/straight"), rank=0).load_latest()
    steps = EPOCHS * ddp_workloads.SAMPLES // BATCH
    assert latest is not None and latest.step == steps - steps % 5
    assert all(t.device.type == "cpu" for t in latest.state["model"].values() if isinstance(t, torch.Tensor))

    # Killed right after starting an async save of CUDA state, then resumed: same parameters.
    resumed_out = tmp_path / "resumed.pt"
    env = _env(s3_env, bucket, "crashy", resumed_out, WL_CKPT_EVERY="5", WL_CRASH_AT_STEP="10", WL_ASYNC="1")
    (first,) = launch("ddp_workloads:train", 1, env)
    assert first.returncode == -9, _describe([first])
    env.pop("WL_CRASH_AT_STEP")
    (second,) = launch("ddp_workloads:train", 1, env)
    assert second.returncode == 0, _describe([second])
    assert "resumed from step" in second.stdout
    resumed = torch.load(resumed_out)
    for name in params:
        assert torch.allclose(resumed[name], params[name], rtol=0, atol=1e-6), name


@pytest.mark.timeout(300)
def test_a_rank_forked_by_an_in_place_pods_zygote_trains_with_nccl_on_its_gpu(tmp_path, capfd) -> None:
    """The zygote imports torch but never initialises CUDA (a child forked after its parent did could
    not use it), so a rank process it forks picks nccl, pins its GPU and trains as one started anew."""
    out = tmp_path / "forked.pt"
    env = rank_env({**GPU, "WL_BATCH": str(BATCH), "WL_EPOCHS": str(EPOCHS), "WL_OUT": str(out),
                    "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}, 0, 1, free_port())
    zygote = Zygote(env)
    try:
        forked = zygote.fork("ddp_workloads:train", [], env)
        assert forked is not None, "the zygote did not fork the rank"
        assert forked.wait(240) == 0, capfd.readouterr().err[-3000:]
    finally:
        zygote.close()
    assert "rank 0/1 joined (nccl on cuda:0)" in capfd.readouterr().err
    params = torch.load(out)
    reference = ddp_workloads.reference(1, BATCH, EPOCHS)
    for name in params:
        assert torch.allclose(params[name], reference[name], rtol=1e-4, atol=1e-5), name


@pytest.mark.timeout(300)
def test_a_torchrun_command_under_the_runtime_trains_on_its_gpu_and_its_bar_is_read(tmp_path) -> None:
    """A job's command, a user's torchrun script that picks nccl itself, runs under `ddp-trainer exec` as its
    pod would: the runtime's hook in the rank's interpreter lets nccl form the gang on the GPU, and the
    progress comes from the script's tqdm bar."""
    speed = tmp_path / "speed.json"
    script = ["torchrun", str(REPO / "benchmarks" / "resnet_torchrun.py"), "--model", "resnet18", "--batch", "8",
              "--size", "64", "--steps", "20", "--warmup", "5", "--out", str(speed)]
    job = command_job("gpu-command", script, worldSize=1, gpusPerRank=1)
    (pod,) = run_pods(job, free_port(), tmp_path, {**GPU, "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")})
    assert pod.code == 0, pod.output[-3000:]
    assert json.loads(speed.read_text())["world_size"] == 1
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert (progress["step"], progress["percent"]) == (20, 100), progress
    assert progress["loss"] is not None, progress
