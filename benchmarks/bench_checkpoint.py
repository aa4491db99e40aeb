"""Checkpoint save and load against a real S3 server, next to what users would pick instead (not a test;
`make bench-checkpoint`).

One state dict of --size-mb (eight float32 tensors) is saved and loaded, in this process, by:
- ours: the runtime's CheckpointManager, synchronous and asynchronous save (the training thread's
  stall shown apart), load_latest();
- s3torchconnector's S3Checkpoint: torch.save into its writer, torch.load from its reader;
- torch.distributed.checkpoint (DCP) with s3torchconnector's S3StorageWriter/S3StorageReader (its S3
  storage layer; fsspec's would need s3fs, whose aiobotocore pins a botocore older than ours);
- the ceiling: the same bytes as one object through boto3's multipart upload, through the AWS CRT
  (the runtime's put_large, which checkpoints use where awscrt is installed) and as parallel ranged
  GETs (the runtime's ReadAhead), no serialisation at all.

S3 is SeaweedFS on loopback (localcluster/s3server.py), or DDP_S3_ENDPOINT with AWS_* credentials.
Each round runs every row once (--repeat rounds); a row's best wall time and least CPU are kept. MB/s is
the state dict's bytes over the wall time; client CPU is this process's (all its threads) per GB.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / p) for p in ("localcluster", "contract", "images/trainer")]
import demo  # noqa: E402
from ddp_contract import envnames  # noqa: E402

REGION = "us-east-1"


@contextmanager
def s3_endpoint() -> Iterator[str]:
    given = os.environ.get(envnames.S3_ENDPOINT)
    if given:
        yield given
        return
    with demo.s3_server(0) as endpoint:
        os.environ.update({envnames.S3_ENDPOINT: endpoint, envnames.S3_REGION: REGION,
                           "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY})
        yield endpoint


def new_bucket(prefix: str) -> str:
    """A bucket of its own on the benchmark's endpoint, with this process's S3 clients made anew for it."""
    from ddp_trainer.storage import s3

    bucket = f"{prefix}-{uuid.uuid4().hex[:8]}"
    s3.reset_clients()
    s3.client().create_bucket(Bucket=bucket)
    return bucket


@dataclass
class Row:
    """One way to save or load: `run` does it once and returns its wall seconds; each round runs every
    row once, so what drifts on the machine (the server's disk, page cache) falls on all of them."""

    name: str
    run: Callable[[], float]
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)

    def measure(self) -> None:
        cpu = time.process_time()  # this process's threads, native ones (CRT, s3torchconnector) included
        self.walls.append(self.run())
        self.cpus.append(time.process_time() - cpu)


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    def run() -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    return run


def ceiling_rows(state: dict[str, object], bucket: str) -> list[Row]:
    """The state dict's bytes as one object: boto3's multipart PUT, the CRT's, parallel ranged GETs."""
    from ddp_trainer.storage import crtupload, s3
    from ddp_trainer.storage.readahead import open_readahead

    raw = b"".join(t.numpy().tobytes() for t in state.values())  # type: ignore[attr-defined]
    url = s3.S3Url(bucket, "raw/blob")

    def read_all() -> None:
        with open_readahead(url) as reader:
            while reader.read(64 * 1024 * 1024):
                pass

    rows = [Row("ceiling: boto3 multipart PUT", timed(lambda: s3.upload_fileobj(io.BytesIO(raw), url)))]
    if crtupload.available():
        rows.append(Row("ceiling: AWS CRT PUT (put_large)", timed(lambda: s3.put_large(url, raw))))
    return [*rows, Row("ceiling: ranged GETs (ReadAhead)", timed(read_all))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each row's best is shown")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # DCP in one process, as meant
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")  # DCP: each round overwrites

    import torch
    import torch.distributed.checkpoint as dcp
    from s3torchconnector import S3Checkpoint, S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3FileSystem, S3StorageReader, S3StorageWriter

    from ddp_trainer.storage import s3
    from ddp_trainer.storage.checkpoint import CheckpointManager

    state = {f"layer{i}": torch.randn(args.size_mb * 1024 * 1024 // 4 // 8) for i in range(8)}
    size = sum(t.numel() * t.element_size() for t in state.values())

    with s3_endpoint() as endpoint:
        bucket = new_bucket("bench-ckpt")
        print(f"== {size / 1e6:.0f} MB state dict; endpoint {endpoint}, bucket {bucket}; torch {torch.__version__}; "
              f"best of {args.repeat} rounds", flush=True)
        config = S3ClientConfig(force_path_style=True)
        stalls: dict[str, list[float]] = {"sync": [], "async": []}

        def save_ours(mode: str) -> float:
            manager = CheckpointManager(s3.S3Url(bucket, f"ours-{mode}"), keep=1, async_save=mode == "async", rank=0)
            started = time.perf_counter()
            manager.save(len(stalls[mode]) + 1, state)
            stalls[mode].append(time.perf_counter() - started)
            manager.wait()
            total = time.perf_counter() - started
            manager.close()
            return total

        prefix = s3.S3Url(bucket, "ours-load")
        CheckpointManager(prefix, rank=0).save(1, state)

        def load_ours() -> None:
            loaded = CheckpointManager(prefix, rank=0).load_latest()
            assert loaded is not None and torch.equal(loaded.state["layer0"], state["layer0"])

        checkpoint = S3Checkpoint(region=REGION, endpoint=endpoint, s3client_config=config)
        uri = f"s3://{bucket}/s3torch/model.pt"

        def save_s3torch() -> None:
            with checkpoint.writer(uri) as writer:
                torch.save(state, writer)

        def load_s3torch() -> None:
            with checkpoint.reader(uri) as reader:
                loaded = torch.load(reader, weights_only=True)
            assert torch.equal(loaded["layer0"], state["layer0"])

        def dcp_fs() -> S3FileSystem:
            return S3FileSystem(REGION, s3_client=S3Client(REGION, endpoint=endpoint, s3client_config=config))

        def save_dcp() -> None:
            writer = S3StorageWriter(REGION, f"s3://{bucket}/dcp", s3client_config=config, thread_count=8, overwrite=True)
            writer.fs = dcp_fs()
            dcp.save(state, storage_writer=writer)

        def load_dcp() -> None:
            target = {k: torch.empty_like(v) for k, v in state.items()}
            reader = S3StorageReader(REGION, f"s3://{bucket}/dcp", s3client_config=config)
            reader.fs = dcp_fs()
            dcp.load(target, storage_reader=reader)
            assert torch.equal(target["layer0"], state["layer0"])

        save_s3torch()  # the load rows read what the first round's saves would write
        save_dcp()
        rows = [*ceiling_rows(state, bucket),
                Row("ours: save sync", lambda: save_ours("sync")),
                Row("ours: save async", lambda: save_ours("async")),
                Row("s3torchconnector S3Checkpoint: save", timed(save_s3torch)),
                Row("DCP + S3StorageWriter (8 threads)", timed(save_dcp)),
                Row("ours: load", timed(load_ours)),
                Row("s3torchconnector S3Checkpoint: load", timed(load_s3torch)),
                Row("DCP + S3StorageReader", timed(load_dcp))]
        for round_ in range(args.repeat):
            for row in rows:
                row.measure()
            print(f"round {round_ + 1}: " + ", ".join(f"{row.name} {size / 1e6 / row.walls[-1]:.0f}" for row in rows),
                  flush=True)

    print(f"{'path':<38} {'MB/s':>7} {'s':>6} {'client CPU-s/GB':>16}")
    for row in rows:
        wall = min(row.walls)
        note = f"  training stalled {min(stalls['async']):.2f} s" if row.name == "ours: save async" else ""
        print(f"{row.name:<38} {size / 1e6 / wall:>7.1f} {wall:>6.2f} {min(row.cpus) / (size / 1e9):>16.2f}{note}")
    by = {row.name: size / 1e6 / min(row.walls) for row in rows}
    for kind, ours, theirs in (("save", "ours: save sync", ("s3torchconnector S3Checkpoint: save",
                                                            "DCP + S3StorageWriter (8 threads)")),
                               ("load", "ours: load", ("s3torchconnector S3Checkpoint: load", "DCP + S3StorageReader"))):
        fastest = max(theirs, key=lambda name: by[name])
        print(f"{kind}: ours {by[ours]:.0f} MB/s = {by[ours] / by[fastest]:.2f}x the fastest alternative ({fastest}, "
              f"{by[fastest]:.0f} MB/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
