"""Data-path and checkpoint benchmark for the trainer runtime (not a test; `make bench-data`).

Measures samples/s and MB/s over one synthetic image set, read with the same DataLoader settings
(batch_size 32, every --workers count, fork) and without decoding (raw bytes: I/O and tar parsing):
  raw-get         whole shard objects fetched by as many threads as DataLoader workers (at least 1):
                  the ceiling for this endpoint; the other rows show their share of it
  whole-shard GETs in workers  the same GETs from inside the DataLoader workers, nothing parsed:
                  the part of the ceiling that the DataLoader's own machinery leaves to any reader
  per-object      S3ImageFolder, one GET per sample (over the first --per-object-samples objects)
  shards-map      ShardedDataset + DistributedChunkedSampler (with prefetching), cold cache then warm cache
  shards-stream   ShardStream (shipped settings: each shard read as 8 MB ranged GETs, 3 ahead of the reader)
  shards-stream (one GET per shard)  the same with DDP_S3_READ_AHEAD=0
  webdataset      the webdataset library (split_by_worker, tar_file_expander, group_by_keys) over
                  the same S3 streams
  s3torchconnector  S3IterableDataset (AWS CRT client) feeding webdataset's tar expander, if installed
  shards-stream (local files)  ShardStream over a local copy of the shards: our reader without S3
With --decoded, shards-stream and webdataset are measured again decoding the images with PIL.
"steady/s" leaves out the DataLoader start (worker fork, first shard) and shut-down: samples after
the first batch over the time from the first batch to the last; "1st-b" is the time to the first batch.
Each row also shows the CPU seconds spent by the readers (this process and its DataLoader workers)
and by the S3 server when it is the local moto server, to tell which side limits the rate.
Plus checkpoint save/load throughput of a --size-mb state dict (sync and async save).

S3 comes from DDP_S3_ENDPOINT/AWS_* if DDP_S3_ENDPOINT is set, otherwise a moto server is started
in a child process on loopback, once per --link-mbps value (a "regime"):
  0    unpaced: the server and the readers share this machine's cores, so the ceiling is CPU, and the
       rows compare how much CPU each reader needs per sample
  N    each response paced to N MB/s after --link-latency-ms, like one connection to a remote S3: the
       network bounds the ceiling, as on a cluster; measured with the --workers counts above 0 only
The benchmark's moto keeps each object as one bytes object, so that a ranged GET costs the server what
it serves (stock moto reads the whole object for every range).
With --server seaweedfs (unpaced only) the server is the real one the tests use (SeaweedFS,
localcluster/s3server.py) instead.

    python benchmarks/bench_data.py [--samples 20000] [--image-kb 16] [--shard-samples 1000]
        [--workers 0,4] [--link-mbps 0,50] [--link-latency-ms 20] [--repeat 2] [--decoded]
        [--size-mb 1024] [--only shards-stream,webdataset] [--server moto|seaweedfs] [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

# The benchmark runs from the source tree, like the tests: the imports below (E402) need these paths.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "contract"), os.path.join(REPO, "images", "trainer")]

from torch.utils.data import IterableDataset  # noqa: E402

from ddp_contract import envnames  # noqa: E402
from ddp_trainer.data.convert import SourceSample, build_shard  # noqa: E402
from ddp_trainer.data.imagefolder import S3ImageFolder  # noqa: E402
from ddp_trainer.data.mapdataset import ShardedDataset  # noqa: E402
from ddp_trainer.data.partition import dataloader_worker  # noqa: E402
from ddp_trainer.data.sampler import DistributedChunkedSampler  # noqa: E402
from ddp_trainer.data.shardindex import ShardIndex, load_index, write_index  # noqa: E402
from ddp_trainer.data.shardstream import ShardStream  # noqa: E402
from ddp_trainer.storage import s3  # noqa: E402
from ddp_trainer.storage.checkpoint import CheckpointManager  # noqa: E402

BATCH_SIZE = 32
_MOTO = """
import logging, sys, time
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app

port, link, latency = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])  # link: bytes/s per response, 0 for no limit
CHUNK = 256 * 1024


def paced(app):
    # Each response body starts after `latency` s and leaves at most `link` bytes/s, as through one
    # connection to a remote S3.
    def wrapped(environ, start_response):
        time.sleep(latency)
        started = time.monotonic()
        sent = 0
        for piece in app(environ, start_response):
            for at in range(0, len(piece), CHUNK):
                chunk = piece[at:at + CHUNK]
                sent += len(chunk)
                time.sleep(max(0.0, started + sent / link - time.monotonic()))
                yield chunk
    return wrapped


def serve_ranges_like_s3():
    # moto reads an object's whole body on every GET, then slices out the requested range: a ranged
    # GET of 8 MB from a 19 MB shard costs the server 19 MB. Keeping each body as one immutable bytes
    # object makes a GET cost what it serves, as on S3.
    from moto.s3.models import FakeKey

    read_body, write_body = FakeKey.value.fget, FakeKey.value.fset

    def cached(key):
        body = key.__dict__.get("_whole_body")
        if body is None:
            body = key.__dict__["_whole_body"] = read_body(key)
        return body

    def replace(key, value):
        key.__dict__.pop("_whole_body", None)
        write_body(key, value)

    FakeKey.value = property(cached, replace)


serve_ranges_like_s3()
app = DomainDispatcherApplication(create_backend_app)
server = make_server("127.0.0.1", port, paced(app) if link or latency else app, True, request_handler=MotoRequestHandler)
server.serve_forever()
"""
server_pid: int | None = None  # the moto server's process, for its CPU time


@contextmanager
def environment(**values: str) -> Iterator[None]:
    """Environment variables for the readers run inside (DataLoader workers inherit them)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def s3_endpoint(link_mbps: float = 0, latency_ms: float = 0, server_kind: str = "moto") -> Iterator[str]:
    global server_pid
    if os.environ.get(envnames.S3_ENDPOINT):
        yield os.environ[envnames.S3_ENDPOINT]
        return
    if server_kind == "seaweedfs":
        with seaweedfs_endpoint() as endpoint:
            yield endpoint
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # A child process, not a thread here: in-process readers would share this interpreter's GIL with it.
    server = subprocess.Popen([sys.executable, "-c", _MOTO, str(port), str(link_mbps * 1e6), str(latency_ms / 1e3)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        server_pid = server.pid
        endpoint = f"http://127.0.0.1:{port}"
        credentials = {envnames.AWS_ACCESS_KEY_ID: "bench", envnames.AWS_SECRET_ACCESS_KEY: "bench"}
        with environment(**{envnames.S3_ENDPOINT: endpoint, **credentials}):
            s3.reset_clients()
            yield endpoint
    finally:
        server.terminate()
        server.wait(10)
        server_pid = None
        s3.reset_clients()


@contextmanager
def seaweedfs_endpoint() -> Iterator[str]:
    """The real S3 server (localcluster/s3server.py), unpaced; its CPU is not counted."""
    sys.path.insert(0, os.path.join(REPO, "localcluster"))
    import demo

    with demo.s3_server(0) as endpoint:
        credentials = {envnames.AWS_ACCESS_KEY_ID: demo.ACCESS_KEY, envnames.AWS_SECRET_ACCESS_KEY: demo.SECRET_KEY}
        with environment(**{envnames.S3_ENDPOINT: endpoint, **credentials}):
            s3.reset_clients()
            yield endpoint
    s3.reset_clients()


def server_cpu() -> float:
    if server_pid is None:
        return float("nan")
    with open(f"/proc/{server_pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reader_cpu() -> float:
    """CPU seconds of this process and its finished children (DataLoader workers, once joined)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def make_images(distinct: int, image_kb: int) -> list[bytes]:
    """`distinct` random-noise PNGs of about `image_kb` KB (incompressible, so about that size)."""
    import numpy as np
    from PIL import Image

    side = max(8, int((image_kb * 1024 / 3) ** 0.5))
    images = []
    for i in range(distinct):
        pixels = np.random.default_rng(i).integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
        images.append(buffer.getvalue())
    return images


class Dataset:
    """The benchmark's data: shards in S3 (and a local copy), and a per-object image folder."""

    def __init__(self, bucket: str, args: argparse.Namespace) -> None:
        classes = [f"class{c:02d}" for c in range(10)]
        images = make_images(min(args.samples, 256), args.image_kb)  # reused cyclically: distinct bytes do not matter here
        self.samples = args.samples
        self.local_dir = tempfile.mkdtemp(prefix="bench-shards-")
        shard_list, self.shard_bytes, self.payload_bytes = [], 0, 0

        def put_shard(number: int) -> tuple[str, int, int, int]:
            first = number * args.shard_samples
            items = []
            for n in range(first, min(first + args.shard_samples, args.samples)):
                items.append((n, SourceSample(f"{classes[n % 10]}/{n:07d}.png", n % 10, lambda: b""), images[n % len(images)]))
            data = build_shard(items, classes)
            name = f"shard-{number:06d}.tar"
            s3.put_bytes(s3.S3Url(bucket, f"shards/{name}"), data)
            with open(os.path.join(self.local_dir, name), "wb") as f:
                f.write(data)
            payload = sum(len(d) for _, _, d in items) + sum(len(str(s.target)) for _, s, _ in items)
            payload += sum(len(json.dumps({"path": s.path, "class": classes[s.target]})) for _, s, _ in items)
            return name, len(items), len(data), payload

        with ThreadPoolExecutor(4) as pool:
            for name, count, size, payload in pool.map(put_shard, range(-(-args.samples // args.shard_samples))):
                shard_list.append((name, count))
                self.shard_bytes += size
                self.payload_bytes += payload
        write_index(f"s3://{bucket}/shards/index.json", shard_list)
        write_index(os.path.join(self.local_dir, "index.json"), shard_list)
        self.index = load_index(f"s3://{bucket}/shards/index.json")
        self.local_index = load_index(os.path.join(self.local_dir, "index.json"))

        self.per_object = min(args.per_object_samples, args.samples)
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    lambda n: s3.put_bytes(s3.S3Url(bucket, f"folder/{classes[n % 10]}/{n:07d}.png"), images[n % len(images)]),
                    range(self.per_object),
                )
            )
        self.bucket = bucket

    def close(self) -> None:
        shutil.rmtree(self.local_dir, ignore_errors=True)


class Bench:
    def __init__(self, data: Dataset, repeat: int, results: list[dict[str, Any]], only: list[str], link_mbps: float) -> None:
        self.data, self.repeat, self.results, self.only, self.link_mbps = data, repeat, results, only, link_mbps
        self.ceiling: float | None = None

    def run(self, label: str, workers: int, fn: Callable[[], int], repeat: int | None = None) -> None:
        """Best of `repeat` runs; MB/s counts sample payload bytes (image + cls + json)."""
        if self.only and not label.startswith("raw-get") and not any(label.startswith(prefix) for prefix in self.only):
            return
        best: dict[str, Any] | None = None
        for _ in range(repeat or self.repeat):
            _batch_times.clear()
            cpu0, server0, started = reader_cpu(), server_cpu(), time.perf_counter()
            try:
                seen = fn()
            except Exception as exc:  # noqa: BLE001 - a reader that fails is reported, not fatal
                print(f"{label:<30} {workers:>2}  failed: {type(exc).__name__}: {exc}", flush=True)
                self.results.append({"link_mbps": self.link_mbps, "reader": label, "workers": workers,
                                     "error": f"{type(exc).__name__}: {exc}"})
                return
            elapsed = time.perf_counter() - started
            if _batch_times and _batch_times[1] > _batch_times[0]:
                first_at, last_at, after_first = _batch_times
                steady, first_batch = after_first / (last_at - first_at), first_at - started
            else:  # not a DataLoader: no start-up to leave out
                steady, first_batch = seen / elapsed, 0.0
            row = {
                "link_mbps": self.link_mbps,
                "reader": label,
                "workers": workers,
                "samples": seen,
                "seconds": round(elapsed, 3),
                "samples_per_s": round(seen / elapsed, 1),
                "steady_samples_per_s": round(steady, 1),
                "first_batch_s": round(first_batch, 3),
                "MB_per_s": round(self.data.payload_bytes / self.data.samples * seen / elapsed / 1e6, 1),
                "reader_cpu_s": round(reader_cpu() - cpu0, 2),
                "server_cpu_s": round(server_cpu() - server0, 2),
            }
            if best is None or row["samples_per_s"] > best["samples_per_s"]:
                best = row
        assert best is not None
        if label.startswith("raw-get"):
            self.ceiling = best["samples_per_s"]
        if self.ceiling and not label.startswith("raw-get"):
            best["of_ceiling"] = round(best["samples_per_s"] / self.ceiling, 3)
        self.results.append(best)
        share = f"{best['of_ceiling']:>6.0%}" if "of_ceiling" in best else "      "
        print(
            f"{label:<30} {workers:>2} {best['samples_per_s']:>10.0f} {best['MB_per_s']:>8.1f} {share} "
            f"{best['steady_samples_per_s']:>9.0f} {best['first_batch_s']:>6.2f} "
            f"{best['samples']:>7} {best['seconds']:>7.2f} {best['reader_cpu_s']:>7.2f} {best['server_cpu_s']:>7.2f}",
            flush=True,
        )


_batch_times: list[float] = []  # (time of the first batch, of the last batch, samples after the first batch)


def count_loader(dataset: Any, workers: int, sampler: Any = None) -> int:
    """Samples delivered by a DataLoader; notes when the first and last batches arrived."""
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        sampler=sampler,
        num_workers=workers,
        collate_fn=len,
        multiprocessing_context="fork" if workers else None,
    )
    total = first = 0
    first_at = last_at = 0.0
    for batch in loader:
        last_at = time.perf_counter()
        if not total:
            first, first_at = batch, last_at
        total += batch
    _batch_times[:] = [first_at, last_at, total - first]
    return total


class WholeShards(IterableDataset):
    """Each DataLoader worker GETs whole shards (every num_workers-th) and parses nothing: what the
    DataLoader's own machinery (fork, per-worker clients and connections) leaves of the raw ceiling."""

    def __init__(self, index: ShardIndex) -> None:
        self.shards = index.shards

    def __iter__(self) -> Iterator[int]:
        worker, workers = dataloader_worker()
        for shard in self.shards[worker::workers]:
            s3.get_bytes(s3.parse_uri(shard.url))
            yield from itertools.repeat(1, shard.nsamples)


def raw_payload(sample: dict[str, Any]) -> int:
    return sum(len(v) for k, v in sample.items() if not k.startswith("__"))


def decoded_image(sample: dict[str, Any]) -> int:
    return sample["png"].size[0] if hasattr(sample["png"], "size") else 0


def webdataset_pipeline(urls: list[str], open_stream: Callable[[str], Any], decoded: bool) -> Any:
    import webdataset as wds
    from webdataset.tariterators import group_by_keys, tar_file_expander

    def opened(shards: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for shard in shards:
            yield {**shard, "stream": open_stream(shard["url"])}

    stages: list[Any] = [wds.SimpleShardList(urls), wds.split_by_worker, opened, tar_file_expander, group_by_keys]
    stages += [wds.decode("pil"), wds.map(decoded_image)] if decoded else [wds.map(raw_payload)]
    return wds.DataPipeline(*stages)


def s3torchconnector_pipeline(urls: list[str]) -> Any:
    import webdataset as wds
    from s3torchconnector import S3ClientConfig, S3IterableDataset
    from webdataset.tariterators import group_by_keys, tar_file_expander

    objects = S3IterableDataset.from_objects(
        urls,
        region=os.environ.get("DDP_S3_REGION", "us-east-1"),
        endpoint=os.environ["DDP_S3_ENDPOINT"],
        s3client_config=S3ClientConfig(force_path_style=True),
        enable_sharding=True,  # splits the objects over DataLoader workers (and ranks)
    )
    return wds.DataPipeline(
        objects, wds.map(lambda reader: {"url": reader.key, "stream": reader}), tar_file_expander, group_by_keys,
        wds.map(raw_payload)
    )


def bench_readers(bucket: str, args: argparse.Namespace, link_mbps: float, results: list[dict[str, Any]]) -> None:
    started = time.perf_counter()
    data = Dataset(bucket, args)
    index: ShardIndex = data.index
    urls = [shard.url for shard in index.shards]
    print(
        f"{data.samples} samples of ~{args.image_kb} KB in {len(index.shards)} shards of {args.shard_samples} "
        f"({data.shard_bytes / 1e6:.0f} MB; payload {data.payload_bytes / 1e6:.0f} MB), {data.per_object} as objects; "
        f"prepared in {time.perf_counter() - started:.0f}s; {os.cpu_count()} CPUs; best of {args.repeat}",
        flush=True,
    )
    try:
        import s3torchconnector  # noqa: F401 - only whether it is installed

        have_s3tc = True
    except ImportError as exc:
        have_s3tc = False
        print(f"s3torchconnector not installed ({exc}); `pip install s3torchconnector` to include it", flush=True)
    bench = Bench(data, args.repeat, results, args.only, link_mbps)
    print(
        f"{'reader':<30} {'wk':>2} {'samples/s':>10} {'MB/s':>8} {'%ceil':>6} {'steady/s':>9} {'1st-b':>6} {'samples':>7} "
        f"{'seconds':>7} "
        f"{'cpu-rd':>7} {'cpu-srv':>7}",
        flush=True,
    )
    for workers in [w for w in args.workers if w or not link_mbps]:  # one paced connection is just the link's rate
        threads = max(workers, 1)

        def raw_get() -> int:
            with ThreadPoolExecutor(threads) as pool:
                for _ in pool.map(lambda url: len(s3.get_bytes(s3.parse_uri(url))), urls):
                    pass  # each body is dropped when read, as a reader would: holding them all costs page faults
            return data.samples

        bench.run(f"raw-get ({threads} thread{'s' if threads > 1 else ''})", workers, raw_get)
        if workers:
            bench.run("whole-shard GETs in workers", workers, lambda: count_loader(WholeShards(index), workers))

        stream = ShardStream(index, rank=0, world_size=1, transform=raw_payload, decode=False)
        bench.run("shards-stream", workers, lambda: count_loader(stream, workers))
        with environment(**{envnames.S3_READ_AHEAD: "0"}):
            bench.run("shards-stream (one GET per shard)", workers, lambda: count_loader(stream, workers))
        bench.run("webdataset", workers,
                  lambda: count_loader(webdataset_pipeline(urls, lambda u: s3.open_stream(s3.parse_uri(u)), False), workers))
        if have_s3tc:
            bench.run("s3torchconnector+webdataset", workers, lambda: count_loader(s3torchconnector_pipeline(urls), workers))
        if args.decoded:
            decoding = ShardStream(index, rank=0, world_size=1, transform=decoded_image, decode=True)
            bench.run("shards-stream (decoded)", workers, lambda: count_loader(decoding, workers))
            bench.run(
                "webdataset (decoded)",
                workers,
                lambda: count_loader(webdataset_pipeline(urls, lambda u: s3.open_stream(s3.parse_uri(u)), True), workers),
            )

        cache_dir = tempfile.mkdtemp(prefix="bench-cache-")
        try:
            mapped = ShardedDataset(index, cache_dir=cache_dir, transform=raw_payload, decode=False)
            sampler = mapped.prefetching(DistributedChunkedSampler(mapped, num_replicas=1, rank=0, chunksize=args.shard_samples))
            bench.run("shards-map (cold cache)", workers, lambda: count_loader(mapped, workers, sampler=sampler), repeat=1)
            bench.run("shards-map (warm cache)", workers, lambda: count_loader(mapped, workers, sampler=sampler))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)

        folder = S3ImageFolder(bucket, "folder", loader=lambda data, key: len(data))
        bench.run(f"per-object ({data.per_object} samples)", workers, lambda: count_loader(folder, workers), repeat=1)

        local = ShardStream(data.local_index, rank=0, world_size=1, transform=raw_payload, decode=False)
        bench.run("shards-stream (local files)", workers, lambda: count_loader(local, workers))
    data.close()


def regime(link_mbps: float, latency_ms: float) -> str:
    if not link_mbps:
        return "unpaced loopback (CPU-bound: server and readers share this machine's cores)"
    return f"link {link_mbps:g} MB/s per connection, {latency_ms:g} ms to first byte"


def verdict(results: list[dict[str, Any]], link_mbps: float, latency_ms: float) -> None:
    """The issue's targets, for each worker count measured in one regime."""
    rows = {
        (r["reader"].split(" (")[0], r["workers"]): r
        for r in results
        if "samples_per_s" in r and r["link_mbps"] == link_mbps and ("(" not in r["reader"] or r["reader"].startswith("raw-get"))
    }
    print(f"targets, {regime(link_mbps, latency_ms)}:", flush=True)
    for workers in sorted({w for _, w in rows}):
        ours, theirs = rows.get(("shards-stream", workers)), rows.get(("webdataset", workers))
        ceiling = rows.get(("raw-get", workers))
        if not (ours and theirs and ceiling):
            continue
        for kind, field in (("end-to-end", "samples_per_s"), ("steady", "steady_samples_per_s")):
            vs_wds = ours[field] / theirs[field]
            share = ours[field] / ceiling["samples_per_s"]
            print(
                f"  {workers} workers, {kind}: shards-stream {ours[field]:.0f}/s = {vs_wds:.2f}x webdataset "
                f"({'met' if vs_wds >= 1 else 'NOT met'}), {share:.0%} of the raw-get ceiling "
                f"({'met' if share >= 0.8 else 'NOT met'})",
                flush=True,
            )
        in_workers = rows.get(("whole-shard GETs in workers", workers))
        if in_workers:
            print(f"    (shards-stream is {ours['samples_per_s'] / in_workers['samples_per_s']:.0%} of whole-shard GETs in "
                  f"the same {workers} DataLoader workers, {in_workers['samples_per_s']:.0f}/s)", flush=True)


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
        print(f"checkpoint save {mode:<5} {size / 1e6 / total:>9.1f} MB/s  ({size / 1e6:.0f} MB in {total:.2f}s, "
              f"training stalled {stall:.2f}s)", flush=True)
        manager.close()
    started = time.perf_counter()
    loaded = CheckpointManager(s3.S3Url(bucket, "ckpt-sync"), rank=0).load_latest()
    elapsed = time.perf_counter() - started
    assert loaded is not None and torch.equal(loaded.state["layer0"], state["layer0"])
    results.append({"checkpoint": "load", "MB": size / 1e6, "seconds": round(elapsed, 3)})
    print(f"checkpoint load       {size / 1e6 / elapsed:>9.1f} MB/s  ({size / 1e6:.0f} MB in {elapsed:.2f}s)", flush=True)


def make_bucket(existing: str | None) -> str:
    if existing:
        return existing
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    s3.client().create_bucket(Bucket=bucket)
    return bucket


def worker_counts(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--image-kb", type=int, default=16)
    parser.add_argument("--shard-samples", type=int, default=1000)
    parser.add_argument("--per-object-samples", type=int, default=2000, help="objects for the per-object reader")
    parser.add_argument("--workers", type=worker_counts, default=[0, 4], help="DataLoader worker counts, e.g. 0,4")
    parser.add_argument("--repeat", type=int, default=2, help="runs per row; the best is shown")
    parser.add_argument("--decoded", action="store_true", help="also stream with PIL decoding")
    parser.add_argument("--size-mb", type=int, default=1024, help="checkpoint state dict size; 0 skips")
    parser.add_argument("--skip-readers", action="store_true")
    parser.add_argument("--only", type=lambda text: [p.strip() for p in text.split(",") if p.strip()], default=[],
                        help="measure only the readers whose names start with these, e.g. shards-stream,webdataset")
    parser.add_argument("--bucket", default=None, help="existing bucket to use (default: a new one)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--link-mbps", type=lambda text: [float(v) for v in text.split(",") if v.strip()], default=[0.0, 50.0],
                        help="regimes: 0 for the unpaced local server, N to pace each of its responses to N MB/s like one "
                             "connection to a remote S3, so that the network and not this machine's shared CPU bounds "
                             "the ceiling")
    parser.add_argument("--server", choices=("moto", "seaweedfs"), default="moto",
                        help="the local S3 server: this benchmark's moto (which can pace its responses) or the real "
                             "one the tests use (unpaced only: --link-mbps 0)")
    parser.add_argument("--link-latency-ms", type=float, default=20,
                        help="in the paced regimes: time to first byte of each response")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    if any(args.link_mbps) and (os.environ.get(envnames.S3_ENDPOINT) or args.server == "seaweedfs"):
        parser.error(f"--link-mbps paces this benchmark's moto; with {envnames.S3_ENDPOINT} set or --server seaweedfs, "
                     "pass --link-mbps 0")
    for link_mbps in [] if args.skip_readers else args.link_mbps:
        with s3_endpoint(link_mbps, args.link_latency_ms if link_mbps else 0, args.server) as endpoint:
            bucket = make_bucket(args.bucket)
            print(f"\n== {regime(link_mbps, args.link_latency_ms)}: endpoint {endpoint}, bucket {bucket}", flush=True)
            bench_readers(bucket, args, link_mbps, results)
        verdict(results, link_mbps, args.link_latency_ms)
    if args.size_mb:
        with s3_endpoint(server_kind=args.server) as endpoint:
            bucket = make_bucket(args.bucket)
            print(f"\n== checkpoints: endpoint {endpoint}, bucket {bucket}", flush=True)
            bench_checkpoint(bucket, args.size_mb, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
