"""Helpers the trainer tests share: paths, rank processes (launch, rank_env), image trees on disk and in S3.

Plain functions imported by name; conftest.py keeps the fixtures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

import demo  # localcluster/demo.py
from ddp_trainer.storage import s3
from ports import free_port

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TRAINER_SRC = ROOT / "images" / "trainer"
CONTRACT_SRC = ROOT / "contract"
EXAMPLES = ROOT / "examples" / "trainer"

ACCESS_KEY, SECRET_KEY = demo.ACCESS_KEY, demo.SECRET_KEY  # the key pair the test S3 server checks


class FakeClock:
    """A clock the test moves by hand (`clock.now += 5`), for what takes `clock=`."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class RankResult:
    rank: int
    returncode: int
    stdout: str
    stderr: str


def rank_env(extra: Mapping[str, str], rank: int, world_size: int, port: int) -> dict[str, str]:
    # The test's own progress file (conftest's autouse fixture) is the one DDP_ setting passed on.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("WL_", "DDP_", "MASTER_")) or k == "DDP_PROGRESS_FILE"}
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
        procs.append((rank, subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         errors="replace")))
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

FILES = [
    "cat/1.png",
    "cat/b/2.JPG",
    "cat/a.png",
    "cat/a/0.png",
    "cat/notes.txt",  # not an image: skipped by both
    "dog/x.jpeg",
    "dog/y.png",
    "emu/deep/er/z.bmp",
    "emu/deep-2.png",
]


def write_tree(root: Path) -> None:
    for i, rel in enumerate(FILES):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".txt"):
            path.write_text("hello")
            continue
        fmt = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".bmp": "BMP"}[path.suffix.lower()]
        Image.new("RGB", (6 + i, 5), color=(20 * i, 255 - 20 * i, 7 * i)).save(path, format=fmt)


def upload_tree(root: Path, bucket: str, prefix: str) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            s3.put_bytes(s3.S3Url(bucket, f"{prefix}/{path.relative_to(root).as_posix()}"), path.read_bytes())
