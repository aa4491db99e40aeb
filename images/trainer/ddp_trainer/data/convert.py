"""Convert an image folder (local or s3://) into indexed tar shards (local or s3://).

    python -m ddp_trainer make-shards SOURCE DEST [--samples-per-shard N] [--no-shuffle] [--seed S]

Each sample becomes `<key>.<image ext>` (the original bytes), `<key>.cls` (class index) and
`<key>.json` ({"path", "class"}); DEST receives `shard-NNNNNN.tar` files and `index.json`
(wids format, with relative URLs and the class list).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

from ..errors import ConfigError, TrainerError
from ..storage import urls
from .imagefolder import IMG_EXTENSIONS, make_samples
from .shardindex import write_index

INDEX_NAME = "index.json"


@dataclass(frozen=True)
class SourceSample:
    path: str  # relative to the source root
    target: int
    read: Callable[[], bytes]


class ProgressBar:
    """A one-line text progress bar on stderr, redrawn at most 10 times a second."""

    def __init__(self, total: int, label: str, stream: IO[str] | None = None, width: int = 30) -> None:
        self.total, self.label, self.width = total, label, width
        self.stream = stream or sys.stderr
        self.done = 0
        self.bytes = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def update(self, samples: int, nbytes: int) -> None:
        self.done += samples
        self.bytes += nbytes
        now = time.monotonic()
        if now - self._drawn >= 0.1 or self.done >= self.total:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * self.width)
        elapsed = max(now - self.started, 1e-9)
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"{self.done / elapsed:.0f} samples/s {self.bytes / elapsed / 1e6:.1f} MB/s"
        )
        self.stream.flush()

    def close(self) -> None:
        self._draw(time.monotonic())
        self.stream.write("\n")
        self.stream.flush()


def list_source(source: str) -> tuple[list[str], list[SourceSample]]:
    """(classes, samples) of an image folder, in ImageFolder order."""
    names = urls.list_names(source)
    try:
        classes, _, samples = make_samples(names, "", IMG_EXTENSIONS)
    except ConfigError as exc:
        raise ConfigError(f"source {source}: {exc}") from None
    return classes, [SourceSample(rel, target, _reader(urls.join(source, rel))) for rel, target in samples]


def _reader(url: str) -> Callable[[], bytes]:
    return lambda: urls.read_bytes(url)


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o444
    info.mtime = 0  # reproducible shards
    tar.addfile(info, io.BytesIO(data))


def build_shard(samples: Sequence[tuple[int, SourceSample, bytes]], classes: Sequence[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for number, sample, data in samples:
            key = f"sample{number:09d}"
            ext = os.path.splitext(sample.path)[1].lstrip(".").lower()
            _add_member(tar, f"{key}.{ext}", data)
            _add_member(tar, f"{key}.cls", str(sample.target).encode())
            meta = {"path": sample.path, "class": classes[sample.target]}
            _add_member(tar, f"{key}.json", json.dumps(meta).encode())
    return buffer.getvalue()


def _batches(items: Sequence[SourceSample], size: int) -> Iterator[list[tuple[int, SourceSample]]]:
    for start in range(0, len(items), size):
        yield [(start + i, s) for i, s in enumerate(items[start : start + size])]


def make_shards(
    source: str,
    dest: str,
    samples_per_shard: int = 1000,
    shuffle: bool = True,
    seed: int = 0,
    readers: int = 16,
    progress: IO[str] | None = None,
) -> str:
    """Write shards and index for `source` into `dest`; returns the index URL."""
    if samples_per_shard < 1:
        raise ConfigError(f"samples per shard {samples_per_shard} must be >= 1")
    classes, samples = list_source(source)
    if shuffle:
        random.Random(seed).shuffle(samples)
    bar = ProgressBar(len(samples), "make-shards", progress)
    shard_list: list[tuple[str, int]] = []
    with ThreadPoolExecutor(max_workers=readers) as pool:
        for number, batch in enumerate(_batches(samples, samples_per_shard)):
            payloads = list(pool.map(lambda item: item[1].read(), batch))
            data = build_shard([(n, s, p) for (n, s), p in zip(batch, payloads, strict=True)], classes)
            name = f"shard-{number:06d}.tar"
            urls.write_bytes(urls.join(dest, name), data)
            shard_list.append((name, len(batch)))
            bar.update(len(batch), len(data))
    bar.close()
    index_url = urls.join(dest, INDEX_NAME)
    write_index(index_url, shard_list, name=os.path.basename(source.rstrip("/")), classes=list(classes))
    return index_url


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp_trainer make-shards", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="image folder: a local directory or s3://bucket/prefix")
    parser.add_argument("dest", help="where shards and index.json go: a local directory or s3://bucket/prefix")
    parser.add_argument("--samples-per-shard", type=int, default=1000)
    parser.add_argument("--no-shuffle", action="store_true", help="keep ImageFolder order instead of shuffling")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readers", type=int, default=16, help="parallel reads from the source")
    args = parser.parse_args(argv)
    try:
        index = make_shards(
            args.source, args.dest, args.samples_per_shard, not args.no_shuffle, args.seed, args.readers
        )
    except TrainerError as exc:
        print(f"make-shards: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    print(index)
    return 0
