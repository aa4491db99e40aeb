"""Data-path and checkpoint benchmark for the trainer runtime (not a test; `make bench-data`).

Measures samples/s and MB/s over the same synthetic image set stored four ways:
  per-object      S3ImageFolder, one GET per sample (DataLoader workers)
  shards-map      ShardedDataset + DistributedChunkedSampler, cold cache then warm cache
  shards-stream   ShardStream (DataLoader workers)
  webdataset      the webdataset library's tar expander over the same S3 streams
  raw-get         parallel GETs of the shard objects: the ceiling for this endpoint
and checkpoint save/load throughput of a --size-mb state dict (sync and async save).

S3 comes from DDP_S3_ENDPOINT/AWS_* if DDP_S3_ENDPOINT is set, otherwise a moto server is started
on loopback (then the numbers compare the readers with each other, not with real S3).

    python images/trainer/bench_data.py [--samples 2000] [--image-kb 16] [--workers 4] [--size-mb 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ddp_trainer import s3  # noqa: E402
from ddp_trainer.checkpoint import CheckpointManager  # noqa: E402
from ddp_trainer.convert import make_shards  # noqa: E402
from ddp_trainer.imagefolder import S3ImageFolder  # noqa: E402
from ddp_trainer.sampler import DistributedChunkedSampler  # noqa: E402
from ddp_trainer.shards import ShardedDataset, ShardStream, load_index  # noqa: E402


@contextmanager
def s3_endpoint() -> Iterator[str]:
    if os.environ.get("DDP_S3_ENDPOINT"):
        yield os.environ["DDP_S3_ENDPOINT"]
        return
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        DDP_S3_ENDPOINT=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench"
    )
    s3.reset_clients()
    try:
        yield os.environ["DDP_S3_ENDPOINT"]
    finally:
        server.stop()


def make_image_folder(bucket: str, prefix: str, samples: int, image_kb: int, classes: int = 10) -> int:
    """Upload `samples` random-noise PNGs of about `image_kb` KB; returns total bytes."""
    import numpy as np
    from PIL import Image

    side = max(8, int((image_kb * 1024 / 3) ** 0.5))
    total = 0

    def upload(i: int) -> int:
        pixels = np.random.default_rng(i).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
        data = buffer.getvalue()
        s3.put_bytes(s3.S3Url(bucket, f"{prefix}/class{i % classes:02d}/{i:07d}.png"), data)
        return len(data)

    with ThreadPoolExecutor(16) as pool:
        total = sum(pool.map(upload, range(samples)))
    return total


def timed(label: str, samples: int, nbytes: int, fn: Callable[[], int], results: list[dict[str, Any]]) -> None:
    started = time.perf_counter()
    seen = fn()
    elapsed = time.perf_counter() - started
    row = {
        "reader": label,
        "samples": seen,
        "seconds": round(elapsed, 3),
        "samples_per_s": round(seen / elapsed, 1),
        "MB_per_s": round(nbytes * seen / max(samples, 1) / elapsed / 1e6, 2),
    }
    results.append(row)
    print(f"{label:<22} {row['samples_per_s']:>10.1f} samples/s {row['MB_per_s']:>9.2f} MB/s  ({seen} in {elapsed:.2f}s)", flush=True)


def count_loader(dataset: Any, workers: int, batch_size: int = 32, sampler: Any = None) -> int:
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=len,
        multiprocessing_context="fork" if workers else None,
    )
    return sum(loader)


def raw_payload(sample: dict[str, Any]) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def bench_readers(bucket: str, args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    print(f"uploading {args.samples} images of ~{args.image_kb} KB ...", flush=True)
    nbytes = make_image_folder(bucket, "folder", args.samples, args.image_kb)
    make_shards(f"s3://{bucket}/folder", f"s3://{bucket}/shards", samples_per_shard=args.shard_samples, progress=io.StringIO())
    index = load_index(f"s3://{bucket}/shards/index.json")
    print(f"{args.samples} samples, {nbytes / 1e6:.1f} MB, {len(index.shards)} shards; workers={args.workers}", flush=True)

    folder = S3ImageFolder(bucket, "folder", loader=lambda data, key: len(data))
    timed("per-object", args.samples, nbytes, lambda: count_loader(folder, args.workers), results)

    cache_dir = tempfile.mkdtemp(prefix="bench-cache-")
    try:
        mapped = ShardedDataset(index, cache_dir=cache_dir, transform=raw_payload, decode=False)
        sampler = DistributedChunkedSampler(mapped, num_replicas=1, rank=0, chunksize=args.shard_samples)
        timed("shards-map (cold)", args.samples, nbytes, lambda: count_loader(mapped, args.workers, sampler=sampler), results)
        timed("shards-map (warm)", args.samples, nbytes, lambda: count_loader(mapped, args.workers, sampler=sampler), results)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)

    stream = ShardStream(index, rank=0, world_size=1, transform=raw_payload, decode=False)
    timed("shards-stream", args.samples, nbytes, lambda: count_loader(stream, args.workers), results)

    def webdataset_count() -> int:
        from webdataset.tariterators import group_by_keys, tar_file_expander

        def streams() -> Iterator[dict[str, Any]]:
            for shard in index.shards:
                yield {"url": shard.url, "stream": s3.open_stream(s3.parse_uri(shard.url))}

        return sum(1 for _ in group_by_keys(tar_file_expander(streams())))

    timed("webdataset (1 stream)", args.samples, nbytes, webdataset_count, results)

    def raw_get() -> int:
        with ThreadPoolExecutor(max(args.workers, 1) * 4) as pool:
            list(pool.map(lambda shard: s3.get_bytes(s3.parse_uri(shard.url)), index.shards))
        return args.samples

    timed("raw-get (parallel)", args.samples, nbytes, raw_get, results)


def bench_checkpoint(bucket: str, size_mb: int, results: list[dict[str, Any]]) -> None:
    import torch

    state = {f"layer{i}": torch.randn(size_mb * 1024 * 1024 // 4 // 8) for i in range(8)}
    size = sum(t.numel() * 4 for t in state.values())
    for mode in ("sync", "async"):
        manager = CheckpointManager(s3.S3Url(bucket, f"ckpt-{mode}"), keep=1, async_save=mode == "async", rank=0)
        started = time.perf_counter()
        manager.save(1, state)
        stall = time.perf_counter() - started
        manager.wait()
        total = time.perf_counter() - started
        results.append({"checkpoint": f"save-{mode}", "MB": size / 1e6, "seconds": round(total, 3), "stall_s": round(stall, 3)})
        print(f"checkpoint save {mode:<5} {size / 1e6 / total:>9.1f} MB/s  ({size / 1e6:.0f} MB in {total:.2f}s, training stalled {stall:.2f}s)", flush=True)
        manager.close()
    started = time.perf_counter()
    loaded = CheckpointManager(s3.S3Url(bucket, "ckpt-sync"), rank=0).load_latest()
    elapsed = time.perf_counter() - started
    assert loaded is not None and torch.equal(loaded.state["layer0"], state["layer0"])
    results.append({"checkpoint": "load", "MB": size / 1e6, "seconds": round(elapsed, 3)})
    print(f"checkpoint load       {size / 1e6 / elapsed:>9.1f} MB/s  ({size / 1e6:.0f} MB in {elapsed:.2f}s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--image-kb", type=int, default=16)
    parser.add_argument("--shard-samples", type=int, default=250)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--size-mb", type=int, default=1024, help="checkpoint state dict size; 0 skips")
    parser.add_argument("--skip-readers", action="store_true")
    parser.add_argument("--bucket", default=None, help="existing bucket to use (default: a new one)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with s3_endpoint() as endpoint:
        bucket = args.bucket or f"bench-{uuid.uuid4().hex[:10]}"
        if not args.bucket:
            s3.client().create_bucket(Bucket=bucket)
        print(f"endpoint {endpoint}, bucket {bucket}", flush=True)
        if not args.skip_readers:
            bench_readers(bucket, args, results)
        if args.size_mb:
            bench_checkpoint(bucket, args.size_mb, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
