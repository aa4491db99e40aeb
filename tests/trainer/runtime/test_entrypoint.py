"""run(), the whole sequence, in real processes: gloo process groups on loopback, startup errors, resume, the
last progress flushed. Its steps have their own test modules (test_rendezvous, test_target, test_failures, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import ddp_workloads
import pytest
import torch
from trainerhelp import describe as _describe
from trainerhelp import launch, workload_env

from ddp_trainer.errors import ExitCode
from ddp_trainer.storage import s3
from ddp_trainer.storage.checkpoint import CheckpointManager
from ddp_trainer.storage.results import read_metrics

WORLD = 2
BATCH = 4
EPOCHS = 2
STEPS = EPOCHS * ddp_workloads.SAMPLES // (WORLD * BATCH)


def _job_env(s3_env: dict[str, str], bucket: str, job: str, out: Path, **extra: str) -> dict[str, str]:
    return workload_env(s3_env, bucket, job, "team-a", out, BATCH, EPOCHS,
                        DDP_PROGRESS_FILE=str(out.parent / f"{job}-progress.json"),
                        DDP_PROGRESS_INTERVAL_SECONDS="0.5", **extra)


@pytest.fixture
def uninterrupted(s3_env, bucket, tmp_path):
    out = tmp_path / "uninterrupted.pt"
    results = launch("ddp_workloads:train", WORLD, _job_env(s3_env, bucket, "straight", out, WL_CKPT_EVERY="5"))
    assert [r.returncode for r in results] == [0] * WORLD, _describe(results)
    return torch.load(out), bucket, out


@pytest.mark.timeout(240)
def test_ddp_matches_single_process_and_resumes_after_kill(uninterrupted, s3_env, tmp_path) -> None:
    params, bucket, out = uninterrupted

    # DDP equivalence: N ranks with batch b == one process replaying their steps, but for rounding.
    ddp_workloads.assert_matches_reference(params, WORLD, BATCH, EPOCHS)
    assert not torch.allclose(params["0.weight"], ddp_workloads.model().state_dict()["0.weight"])  # it trained

    # The run left metrics, a result and progress behind.
    prefix = s3.S3Url(bucket, "runs/team-a/straight")
    metrics = read_metrics(prefix)
    assert sorted({m["rank"] for m in metrics}) == list(range(WORLD))
    assert sorted(m["step"] for m in metrics if m["rank"] == 0) == list(range(1, STEPS + 1))
    assert {"epoch", "loss", "time", "lr"} <= metrics[0].keys()
    assert s3.get_bytes(prefix.join("results", "final.txt")) == f"steps={STEPS}".encode()
    assert CheckpointManager(prefix, keep=2, rank=0).committed_steps() == [15, 20]
    progress = (out.parent / "straight-progress.json").read_text()
    assert f'"step": {STEPS}' in progress and '"samplesPerSecond"' in progress

    # Kill rank 0 (SIGKILL) right after an async save at step 10 was started; rank 1 then fails
    # in a collective and must exit with a retryable code.
    crashed_out = tmp_path / "resumed.pt"
    env = _job_env(s3_env, bucket, "crashy", crashed_out, WL_CKPT_EVERY="5", WL_CRASH_AT_STEP="10", WL_ASYNC="1")
    first = launch("ddp_workloads:train", WORLD, env)
    assert first[0].returncode == -9, _describe(first)
    assert first[1].returncode == ExitCode.COMMUNICATION_ERROR, _describe(first)
    assert "retryable" in first[1].stderr
    assert not crashed_out.exists()
    committed = CheckpointManager(s3.S3Url(bucket, "runs/team-a/crashy"), rank=0).committed_steps()
    assert committed and max(committed) in (5, 10)

    # Gang restart without the crash: resumes from the latest checkpoint, ends identical.
    env.pop("WL_CRASH_AT_STEP")
    second = launch("ddp_workloads:train", WORLD, env)
    assert [r.returncode for r in second] == [0] * WORLD, _describe(second)
    assert f"resumed from step {max(committed)}" in second[0].stdout
    resumed = torch.load(crashed_out)
    for name in params:
        assert torch.equal(resumed[name], params[name]), name


@pytest.mark.parametrize(
    ("target", "env", "message"),
    [
        ("ddp_workloads:train", {"WORLD_SIZE": ""}, "environment variable WORLD_SIZE is not set"),
        ("ddp_workloads:nope", {}, "module 'ddp_workloads' has no function 'nope'"),
        ("no_such_module:main", {}, "entrypoint module 'no_such_module' cannot be found"),
        ("ddp_workloads:train", {"DDP_BACKEND": "nccl"}, "DDP_BACKEND=nccl but this rank has no CUDA device"),
    ],
)
def test_bad_configuration_exits_2(target: str, env: dict[str, str], message: str) -> None:
    (result,) = launch(target, 1, env)
    assert result.returncode == ExitCode.CONFIG_ERROR, result.stderr
    assert message in result.stderr


def test_the_last_step_reported_reaches_the_progress_sinks_when_the_function_returns(tmp_path: Path) -> None:
    """Reports come at most every DDP_PROGRESS_INTERVAL_SECONDS; the one held back at the end is not lost."""
    script = tmp_path / "quick.py"
    script.write_text(
        "from ddp_trainer import default_reporter\n\n"
        "def train():\n"
        "    progress = default_reporter()\n"
        "    for step in range(1, 6):\n"
        "        progress.report(epoch=0, step=step, loss=1.0 / step, samples=4)\n")
    progress_file = tmp_path / "progress.json"
    (result,) = launch(f"{script}:train", 1, {"DDP_PROGRESS_FILE": str(progress_file),
                                               "DDP_PROGRESS_INTERVAL_SECONDS": "3600"})
    assert result.returncode == 0, result.stderr
    assert json.loads(progress_file.read_text())["step"] == 5
