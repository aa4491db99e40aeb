"""Fixtures for the trainer runtime tests: a real S3 server (moto) on loopback, rank launchers."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TRAINER_SRC = ROOT / "images" / "trainer"
CONTRACT_SRC = ROOT / "contract"
EXAMPLES = ROOT / "examples" / "trainer"
sys.path.insert(0, str(HERE))  # ddp_workloads, the code the ranks run

ACCESS_KEY = "testing-key"
SECRET_KEY = "testing-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """S3 settings in this process's environment (and to hand to subprocesses)."""
    from ddp_trainer import s3

    values = {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "DDP_S3_ENDPOINT": s3_endpoint,
        "DDP_S3_REGION": "us-east-1",
        "DDP_S3_MAX_ATTEMPTS": "3",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    s3.reset_clients()
    yield values
    s3.reset_clients()


@pytest.fixture
def bucket(s3_env: dict[str, str]) -> str:
    from ddp_trainer import s3

    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.client().create_bucket(Bucket=name)
    return name


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def rank_env(extra: Mapping[str, str], rank: int, world_size: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WL_", "DDP_", "MASTER_"))}
    env.update(
        # Ahead of, not instead of, an inherited PYTHONPATH (packages installed with --target).
        PYTHONPATH=os.pathsep.join([str(CONTRACT_SRC), str(TRAINER_SRC), str(HERE), str(EXAMPLES),
                                     *filter(None, [os.environ.get("PYTHONPATH")])]),
        OMP_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK="0",
        DDP_BACKEND="gloo",
        DDP_INIT_TIMEOUT_SECONDS="60",
        CUDA_VISIBLE_DEVICES="",
    )
    env.update(extra)
    return env


def launch(
    target: str | None,
    world_size: int,
    extra_env: Mapping[str, str] | None = None,
    ranks: Sequence[int] | None = None,
    timeout: float = 120,
    args: Sequence[str] = (),
) -> list[RankResult]:
    """Start `python -m ddp_trainer run target -- args` for each rank and wait for all of them."""
    port = free_port()
    procs = []
    for rank in ranks if ranks is not None else range(world_size):
        env = rank_env(extra_env or {}, rank, world_size, port)
        # No target: the operator's form, `run -- ARGS` with the target in $DDP_ENTRYPOINT.
        cmd = [sys.executable, "-m", "ddp_trainer", "run", *([target] if target else []), "--", *args]
        procs.append((rank, subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    results = []
    try:
        for rank, proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(RankResult(rank, proc.returncode, out, err))
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def describe(results: Sequence[RankResult]) -> str:
    """Each rank's exit code and the tail of its output, for assertion messages."""
    return "\n".join(f"--- rank {r.rank} rc={r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}" for r in results)


def workload_env(s3_env: Mapping[str, str], bucket: str, job: str, namespace: str, out: Path, batch: int,
                 epochs: int, **extra: str) -> dict[str, str]:
    """Settings of ddp_workloads.train for one job writing its results under s3://bucket/runs."""
    return {
        **s3_env,
        "DDP_RESULTS_URI": f"s3://{bucket}/runs",
        "DDP_JOB_NAME": job,
        "DDP_JOB_NAMESPACE": namespace,
        "WL_BATCH": str(batch),
        "WL_EPOCHS": str(epochs),
        "WL_OUT": str(out),
        **extra,
    }


@pytest.fixture
def launch_ranks():
    return launch
