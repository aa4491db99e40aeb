"""Indexed tar shards, compatible with webdataset and wids.

Index (wids format): ``{"wids_version": 1, "shardlist": [{"url": ..., "nsamples": N}, ...]}``;
relative URLs resolve against the index's own location (s3:// or a local path).

Samples follow webdataset's rules: tar members are grouped by consecutive basename (everything up
to the first dot of the file name) and each sample is a dict ``{"__key__", "__url__", "<ext>": ...}``
with lower-cased extensions and no leading dot, e.g. ``sample["jpg"]``, ``sample["cls"]``.

Two ways to read:

* `ShardedDataset` (map-style): shards are downloaded whole into a bounded local cache (least
  recently used shard evicted first) and members are read by offset. Pair it with
  `DistributedChunkedSampler(chunksize≈samples per shard)` for locality, wrapped in
  `dataset.prefetching(sampler)` to download the next shards ahead.
* `ShardStream` (iterable): streams shards sequentially, split by rank and DataLoader worker so
  that every rank yields exactly the same number of samples (and batches) per epoch.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import logging
import os
import posixpath
import random
import re
import threading
from bisect import bisect_right
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterable, Iterator

from torch.utils.data import Dataset, IterableDataset, Sampler

from . import readahead, s3
from .errors import ConfigError, CorruptDataError, ObjectNotFoundError
from .shardcache import ShardCache
from .tarreader import TarFormatError, tar_entries

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "webp", "tif", "tiff", "gif"}
INT_EXTENSIONS = {"cls", "cls2", "class", "count", "index", "inx", "id"}
TEXT_EXTENSIONS = {"txt", "text", "transcript"}
JSON_EXTENSIONS = {"json", "jsn"}

_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


@dataclass(frozen=True)
class ShardInfo:
    url: str  # absolute: s3://bucket/key or a local path
    nsamples: int


@dataclass(frozen=True)
class ShardIndex:
    url: str
    shards: list[ShardInfo]
    extra: dict[str, Any]

    @property
    def total(self) -> int:
        return sum(s.nsamples for s in self.shards)


# Index -----------------------------------------------------------------------------------------


def resolve(index_url: str, url: str) -> str:
    """Resolve a shard URL relative to the index location, as wids does."""
    if url.startswith("s3://") or os.path.isabs(url) or "://" in url:
        return url[len("file://") :] if url.startswith("file://") else url
    if index_url.startswith("s3://"):
        return "s3://" + posixpath.normpath(posixpath.join(posixpath.dirname(index_url[5:]), url))
    base = index_url[len("file://") :] if index_url.startswith("file://") else index_url
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(base)), url))


def parse_index(data: bytes, index_url: str) -> ShardIndex:
    try:
        doc = json.loads(data)
        if doc.get("wids_version") != 1:
            raise ValueError(f"wids_version is {doc.get('wids_version')!r}, expected 1")
        shards = [ShardInfo(resolve(index_url, str(s["url"])), int(s["nsamples"])) for s in doc["shardlist"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptDataError(f"shard index {index_url} is not a valid wids index: {exc}") from exc
    if not shards or any(s.nsamples < 0 for s in shards):
        raise CorruptDataError(f"shard index {index_url} lists no shards or a negative nsamples")
    extra = {k: v for k, v in doc.items() if k not in ("wids_version", "shardlist")}
    return ShardIndex(url=index_url, shards=shards, extra=extra)


def load_index(index_url: str) -> ShardIndex:
    return parse_index(s3.read_uri(index_url), index_url)


def write_index(index_url: str, shards: list[tuple[str, int]], **extra: Any) -> None:
    """`shards` holds (url relative to the index or absolute, nsamples)."""
    doc = {"wids_version": 1, **extra, "shardlist": [{"url": u, "nsamples": n} for u, n in shards]}
    s3.write_uri(index_url, json.dumps(doc, indent=1).encode())


# Tar members -> samples --------------------------------------------------------------------------


def split_name(name: str) -> tuple[str, str] | None:
    """webdataset's base_plus_ext: 'a/b.seg.png' -> ('a/b', 'seg.png')."""
    match = _KEY_EXT.match(name)
    return (match.group(1), match.group(2)) if match else None


def group_members(members: Iterable[tuple[str, Any]], url: str) -> Iterator[dict[str, Any]]:
    """Group (member name, payload) pairs into samples by consecutive key."""
    current: dict[str, Any] | None = None
    for name, payload in members:
        parts = split_name(name)
        if parts is None:
            continue
        key, ext = parts[0], parts[1].lower()
        if current is not None and current["__key__"] != key:
            yield current
            current = None
        if current is None:
            current = {"__key__": key, "__url__": url}
        if ext in current:
            raise CorruptDataError(f"shard {url}: sample {key!r} has two {ext!r} members")
        current[ext] = payload
    if current is not None:
        yield current


def decode(sample: dict[str, Any]) -> dict[str, Any]:
    """Decode by extension like webdataset's `.decode("pil")`: ints, text, JSON, npy, PIL images."""
    out: dict[str, Any] = {}
    for field, value in sample.items():
        if field.startswith("__") or not isinstance(value, (bytes, bytearray)):
            out[field] = value
            continue
        ext = field.rsplit(".", 1)[-1]
        try:
            out[field] = _decode_value(ext, bytes(value))
        except Exception as exc:  # noqa: BLE001 - any decoder failure means corrupt data
            raise CorruptDataError(f"decoding {sample['__key__']}.{field} in shard {sample['__url__']}: {exc}") from exc
    return out


def _decode_value(ext: str, data: bytes) -> Any:
    if ext in INT_EXTENSIONS:
        return int(data)
    if ext in TEXT_EXTENSIONS:
        return data.decode("utf-8")
    if ext in JSON_EXTENSIONS:
        return json.loads(data)
    if ext == "npy":
        import numpy

        return numpy.load(io.BytesIO(data), allow_pickle=False)
    if ext in IMAGE_EXTENSIONS:
        from PIL import Image

        image = Image.open(io.BytesIO(data))
        image.load()
        return image
    return data


# Map-style ---------------------------------------------------------------------------------------

_OPEN_SHARDS = 2  # per process: a chunked sampler keeps each worker on one shard at a time


@dataclass(frozen=True)
class MemberTable:
    """Where each sample's members lie in a shard, in columns (cheap to save and load as JSON).

    Sample i is `keys[i]`; its members are numbers first[i] .. first[i+1]-1, with the extensions
    `layouts[layout[i]]` and their data at `offsets` / `sizes` (in shard order, so one sample's
    members lie within offsets[first[i]] .. the end of its last member).
    """

    keys: list[str]
    layouts: list[list[str]]
    layout: list[int]
    first: list[int]
    offsets: list[int]
    sizes: list[int]

    def __len__(self) -> int:
        return len(self.keys)

    def sample(self, i: int) -> tuple[str, int, int, list[tuple[str, int, int]]]:
        """(key, start, end of the members' span, [(extension, offset, size), ...])."""
        a, b = self.first[i], self.first[i + 1]
        members = list(zip(self.layouts[self.layout[i]], self.offsets[a:b], self.sizes[a:b]))
        return self.keys[i], self.offsets[a], self.offsets[b - 1] + self.sizes[b - 1], members

    @classmethod
    def of_samples(cls, samples: Iterable[dict[str, Any]]) -> "MemberTable":
        """From group_members output whose member values are (offset, size)."""
        table = cls([], [], [], [0], [], [])
        layout_ids: dict[tuple[str, ...], int] = {}
        for sample in samples:
            exts = tuple(ext for ext in sample if not ext.startswith("__"))
            if exts not in layout_ids:
                layout_ids[exts] = len(table.layouts)
                table.layouts.append(list(exts))
            table.keys.append(sample["__key__"])
            table.layout.append(layout_ids[exts])
            for ext in exts:
                table.offsets.append(sample[ext][0])
                table.sizes.append(sample[ext][1])
            table.first.append(len(table.offsets))
        return table


def member_table(path: str, url: str, expected: int) -> MemberTable:
    """Parse an uncompressed tar shard's headers into its member table."""
    try:
        with open(path, "rb") as f:
            members = [(name, (offset, size)) for name, _, _, size, offset in tar_entries(f)]
    except TarFormatError as exc:
        raise CorruptDataError(f"shard {url} is not a readable uncompressed tar: {exc}") from exc
    table = MemberTable.of_samples(group_members(members, url))
    if len(table) != expected:
        raise CorruptDataError(f"shard {url} holds {len(table)} samples but the index says {expected}")
    return table


def _load_table(path: str, size: int) -> MemberTable | None:
    """The member table saved next to a cached shard, if it is there and of this shard."""
    try:
        with open(path + ShardCache.TABLE_SUFFIX) as f:
            doc = json.load(f)
        if doc.pop("size") != size:
            return None
        table = MemberTable(**doc)
        lengths_agree = len(table.layout) == len(table) == len(table.first) - 1
        if not (lengths_agree and len(table.offsets) == len(table.sizes) == table.first[-1]):
            return None
        return table
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        return None


def _save_table(path: str, size: int, table: MemberTable) -> None:
    tmp = f"{path}{ShardCache.TABLE_SUFFIX}.part.{os.getpid()}.{threading.get_ident()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"size": size, **dataclasses.asdict(table)}, f, separators=(",", ":"))
        os.replace(tmp, path + ShardCache.TABLE_SUFFIX)
    except OSError as exc:  # a cache that cannot hold the table still works: each process parses the shard
        log.debug("could not save the member table of %s: %s", path, exc)
        if os.path.exists(tmp):
            os.remove(tmp)


@dataclass
class _OpenShard:
    file: IO[bytes]
    table: MemberTable


class ShardedDataset(Dataset[Any]):
    """Map-style dataset over an indexed shard set; `dataset[i]` is the i-th sample of the index.

    `transform` receives the decoded sample dict (or raw bytes with decode=False). Each process
    keeps its last shards open and reads a sample with one positioned read; a cached shard's
    member table is worked out once and saved beside it for the other processes.
    """

    def __init__(
        self,
        index: str | ShardIndex,
        cache_dir: str | None = None,
        cache_limit_bytes: int | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        decode: bool = True,
    ) -> None:
        self.index = load_index(index) if isinstance(index, str) else index
        self.cache = ShardCache(cache_dir, cache_limit_bytes)
        self.transform = transform
        self.decode = decode
        self.cumulative: list[int] = []
        total = 0
        for shard in self.index.shards:
            total += shard.nsamples
            self.cumulative.append(total)
        self._reset_handles()

    def __len__(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0

    @property
    def shard_sizes(self) -> list[int]:
        return [s.nsamples for s in self.index.shards]

    def locate(self, index: int) -> tuple[ShardInfo, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} is out of range for {len(self)} samples")
        shard_no = bisect_right(self.cumulative, index)
        start = self.cumulative[shard_no - 1] if shard_no else 0
        return self.index.shards[shard_no], index - start

    def _reset_handles(self) -> None:
        """Fresh handles for this process (a forked worker leaves the parent's alone)."""
        self._open: OrderedDict[str, _OpenShard] = OrderedDict()
        self._open_lock = threading.Lock()  # threads sharing the dataset must not close a file another reads
        self._open_pid = os.getpid()

    def _opened(self, shard: ShardInfo) -> _OpenShard:
        opened = self._open.get(shard.url)
        if opened is not None:
            self._open.move_to_end(shard.url)
            return opened
        cached = shard.url.startswith("s3://")
        for attempt in range(3):
            path = self.cache.get(shard.url) if cached else shard.url
            try:
                f = open(path, "rb")
                break
            except FileNotFoundError:
                if not cached:
                    raise ObjectNotFoundError(f"shard {shard.url} does not exist") from None
                log.debug("shard %s evicted before it was opened (attempt %d)", shard.url, attempt)
        else:
            raise CorruptDataError(f"shard {shard.url} kept disappearing from the cache at {self.cache.directory}")
        size = os.fstat(f.fileno()).st_size
        table = _load_table(path, size) if cached else None
        if table is None or len(table) != shard.nsamples:
            try:
                table = member_table(path, shard.url, shard.nsamples)
            except BaseException:
                f.close()
                raise
            if cached:
                _save_table(path, size, table)
        opened = self._open[shard.url] = _OpenShard(f, table)
        while len(self._open) > _OPEN_SHARDS:
            self._open.popitem(last=False)[1].file.close()
        return opened

    def raw(self, index: int) -> dict[str, Any]:
        shard, offset = self.locate(index)
        if self._open_pid != os.getpid():
            self._reset_handles()
        with self._open_lock:
            opened = self._opened(shard)
            key, start, end, members = opened.table.sample(offset)
            span = os.pread(opened.file.fileno(), end - start, start)  # a sample's members lie together
        if len(span) != end - start:
            raise CorruptDataError(f"shard {shard.url} ends inside sample {key!r}")
        sample: dict[str, Any] = {"__key__": key, "__url__": shard.url}
        for ext, at, size in members:
            sample[ext] = span[at - start : at - start + size]
        return sample

    def __getitem__(self, index: int) -> Any:
        sample = self.raw(index)
        if self.decode:
            sample = decode(sample)
        return self.transform(sample) if self.transform is not None else sample

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_open=OrderedDict(), _open_lock=None, _open_pid=None)  # rebuilt in the process that uses it
        return state

    def close(self) -> None:
        """Close this process's open shard files."""
        if self._open_pid != os.getpid():
            return
        with self._open_lock:
            while self._open:
                self._open.popitem()[1].file.close()

    def prefetching(self, sampler: Iterable[int], shards_ahead: int = 2) -> "PrefetchingSampler":
        """`sampler` with the shards its next indices fall in downloaded ahead (see PrefetchingSampler)."""
        return PrefetchingSampler(sampler, self, shards_ahead)


class PrefetchingSampler(Sampler[int]):
    """Yields `sampler`'s indices unchanged while `shards_ahead` threads download the shards of
    the indices coming next into the dataset's cache.

    The DataLoader draws indices in the training process, ahead of its workers; the workers then
    find each new shard already cached (or wait on the one download under way) instead of all of
    them stopping at every shard boundary. Pass it as the DataLoader's sampler and keep calling
    `set_epoch`/`state_dict` on the wrapped sampler.
    """

    def __init__(self, sampler: Iterable[int], dataset: ShardedDataset, shards_ahead: int = 2) -> None:
        if shards_ahead < 1:
            raise ConfigError(f"shards_ahead {shards_ahead} must be >= 1")
        self.sampler, self.dataset, self.shards_ahead = sampler, dataset, shards_ahead

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        from concurrent.futures import ThreadPoolExecutor

        source = iter(self.sampler)
        window: deque[tuple[int, str]] = deque()  # indices drawn but not yet yielded, with their shard
        in_window: Counter[str] = Counter()  # the window's shards: the one in use and those coming
        scheduled: set[str] = set()
        pool = ThreadPoolExecutor(self.shards_ahead, "shard-prefetch")
        try:
            while True:
                while len(in_window) <= self.shards_ahead:
                    index = next(source, None)
                    if index is None:
                        break
                    url = self.dataset.locate(index)[0].url
                    if url not in scheduled and url.startswith("s3://"):
                        scheduled.add(url)
                        pool.submit(self._fetch, url)
                    window.append((index, url))
                    in_window[url] += 1
                if not window:
                    return
                index, url = window.popleft()
                in_window[url] -= 1
                if not in_window[url]:
                    del in_window[url]
                yield index
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _fetch(self, url: str) -> None:
        try:
            self.dataset.cache.get(url)
        except Exception as exc:  # noqa: BLE001 - the worker that needs the shard reports the error
            log.debug("prefetching %s failed: %s", url, exc)


# Streaming ---------------------------------------------------------------------------------------


def _open_shard(url: str) -> IO[bytes]:
    if url.startswith("s3://"):
        return readahead.open_readahead(s3.parse_uri(url))
    try:
        return open(url, "rb")
    except FileNotFoundError:
        raise ObjectNotFoundError(f"shard {url} does not exist") from None


def iter_shard(url: str, expected: int | None = None, skip: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
    """Raw samples of one shard, read sequentially: those numbered [skip, stop) of the shard.

    Skipped samples are parsed (to count them) but not built; reading ends at `stop`, otherwise
    the sample count is checked against `expected` at the end of the shard.
    """
    stream = _open_shard(url)
    match = _KEY_EXT.match
    count = 0  # samples finished so far
    key: str | None = None
    current: dict[str, Any] | None = None
    try:
        for name, buf, start, size, _ in tar_entries(stream, allow_compressed=True):
            # split_name without the regex in the usual case: the key ends at the basename's first dot
            dot = name.find(".", name.rfind("/") + 1)
            if dot > 0 and name[dot - 1] != "/":
                member_key, ext = name[:dot], name[dot + 1 :]
            else:
                parts = match(name)
                if parts is None:
                    continue
                member_key, ext = parts.group(1), parts.group(2)
            if member_key != key:
                if key is not None:
                    if current is not None:
                        yield current
                    count += 1
                    if stop is not None and count >= stop:
                        return  # the rest of this shard belongs to another range
                key = member_key
                current = {"__key__": key, "__url__": url} if count >= skip else None
            if current is not None:
                ext = ext.lower()
                if ext in current:
                    raise CorruptDataError(f"shard {url}: sample {key!r} has two {ext!r} members")
                current[ext] = buf[start : start + size]
        if key is not None:
            if current is not None:
                yield current
            count += 1
    except TarFormatError as exc:
        raise CorruptDataError(f"shard {url} is not a readable tar: {exc}") from exc
    finally:
        stream.close()
    if expected is not None and count != expected:
        raise CorruptDataError(f"shard {url} holds {count} samples but the index says {expected}")


def rank_quota(total: int, world_size: int) -> int:
    """Samples every rank yields per epoch (the remainder is left out, as with drop_last)."""
    quota = total // world_size
    if quota < 1:
        raise ConfigError(f"{total} samples cannot be split over {world_size} ranks")
    return quota


def dataloader_worker() -> tuple[int, int]:
    """(this DataLoader worker's id, the number of workers); (0, 1) outside a worker."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def worker_range(rank_start: int, quota: int, worker: int, num_workers: int) -> tuple[int, int]:
    """[start, end) of this worker within its rank's contiguous range."""
    base, extra = divmod(quota, num_workers)
    start = rank_start + worker * base + min(worker, extra)
    return start, start + base + (1 if worker < extra else 0)


class SharedInts:
    """A few integers in shared memory: DataLoader workers, persistent ones too, see changes made
    after they started (`set_epoch`, `load_state_dict`).

    Forked workers share the memory; spawned workers get it handed over when they start. Any
    other copy (pickled to disk, deep-copied) gets its own memory holding the current values.
    """

    def __init__(self, values: list[int]) -> None:
        import multiprocessing

        self._shared = multiprocessing.RawArray("q", values)

    def __getitem__(self, i: int) -> int:
        return int(self._shared[i])

    def __setitem__(self, i: int, value: int) -> None:
        self._shared[i] = value

    def __getstate__(self) -> dict[str, Any]:
        from multiprocessing.context import get_spawning_popen

        return {"shared": self._shared} if get_spawning_popen() is not None else {"values": list(self._shared)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "shared" in state:
            self._shared = state["shared"]
        else:
            self.__init__(state["values"])  # type: ignore[misc]


def resume_plan(piece_sizes: list[int], batch_size: int, batches_done: int) -> tuple[list[int], int]:
    """After the DataLoader yielded `batches_done` batches of an iterable dataset: how many came
    from each worker, and which worker's batch comes next. The DataLoader takes one batch from each
    worker in turn and passes over workers that have run out."""
    totals = [-(-size // batch_size) for size in piece_sizes]
    if not 0 <= batches_done <= sum(totals):
        raise ConfigError(f"{batches_done} batches done, but an epoch here has {sum(totals)}")
    done, worker = [0] * len(totals), 0
    for _ in range(batches_done):
        while done[worker] == totals[worker]:
            worker = (worker + 1) % len(totals)
        done[worker] += 1
        worker = (worker + 1) % len(totals)
    return done, worker


_EPOCH, _RESUME_EPOCH, _RESUME_BATCHES, _RESUME_BATCH_SIZE, _RESUME_WORKERS = range(5)


class ShardStream(IterableDataset[Any]):
    """Iterable dataset streaming shards, equal sample counts on every rank.

    Each epoch the shard order is shuffled (seed + epoch, same on every rank) and the resulting
    sample sequence is cut into `world_size` contiguous ranges of `rank_quota` samples, then each
    range into one piece per DataLoader worker. A worker reads only the shards its piece touches,
    so locality stays. Every worker count gives the same per-rank batch count because piece sizes
    depend only on the quota and the number of workers, which all ranks share.
    Call `set_epoch` before iterating; the epoch reaches the DataLoader's workers through shared
    memory, so `persistent_workers=True` reshuffles too.

    Mid-epoch resume: `state_dict(batches_done, batch_size, num_workers)` records how far the
    training loop got; after `load_state_dict`, iterating that epoch again with the same batch size
    and worker count yields exactly the batches that were still to come, in the same order.
    """

    def __init__(
        self,
        index: str | ShardIndex,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 0,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        decode: bool = True,
    ) -> None:
        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
        self.world_size = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
        self.index = load_index(index) if isinstance(index, str) else index
        self.quota = rank_quota(self.index.total, self.world_size)
        self.shuffle = shuffle
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.transform = transform
        self.decode = decode
        self._shared = SharedInts([0, -1, 0, 1, 1])  # epoch, then where to resume (epoch -1: nowhere)

    @property
    def epoch(self) -> int:
        return self._shared[_EPOCH]

    def set_epoch(self, epoch: int) -> None:
        self._shared[_EPOCH] = epoch

    def __len__(self) -> int:
        return self.quota

    def piece_sizes(self, num_workers: int) -> list[int]:
        """Samples each of `num_workers` DataLoader workers yields per epoch (0 workers: one piece)."""
        workers = max(num_workers, 1)
        return [end - start for start, end in (worker_range(0, self.quota, w, workers) for w in range(workers))]

    def batches_per_epoch(self, batch_size: int, num_workers: int) -> int:
        return sum(-(-size // batch_size) for size in self.piece_sizes(num_workers))

    def state_dict(self, batches_done: int, batch_size: int, num_workers: int) -> dict[str, int]:
        """Where this epoch stands after the training loop finished `batches_done` batches of a
        DataLoader(batch_size=..., num_workers=...) over this stream."""
        resume_plan(self.piece_sizes(num_workers), batch_size, batches_done)  # checks the count
        finished = batches_done == self.batches_per_epoch(batch_size, num_workers)
        return {
            "epoch": self.epoch + finished,
            "batches": 0 if finished else batches_done,
            "batch_size": batch_size,
            "num_workers": max(num_workers, 1),
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            raise ConfigError(f"stream state was saved with seed {state['seed']}, this stream has {self.seed}")
        self.set_epoch(int(state["epoch"]))
        self._shared[_RESUME_EPOCH] = int(state["epoch"]) if int(state["batches"]) else -1
        self._shared[_RESUME_BATCHES] = int(state["batches"])
        self._shared[_RESUME_BATCH_SIZE] = int(state["batch_size"])
        self._shared[_RESUME_WORKERS] = int(state["num_workers"])

    def shard_order(self) -> list[ShardInfo]:
        shards = list(self.index.shards)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(shards)
        return shards

    def raw_samples(self, worker: int = 0, num_workers: int = 1, skip: int = 0) -> Iterator[dict[str, Any]]:
        start, end = worker_range(self.rank * self.quota, self.quota, worker, num_workers)
        start = min(start + skip, end)
        position = 0
        for shard in self.shard_order():
            shard_end = position + shard.nsamples
            if shard_end > start and position < end:
                first, stop = max(start - position, 0), min(end, shard_end) - position
                yield from iter_shard(shard.url, shard.nsamples, first, stop if stop < shard.nsamples else None)
            position = shard_end
            if position >= end:
                return

    def _resume_point(self, worker: int, num_workers: int) -> tuple[int, int]:
        """(the piece this worker reads, samples of it already consumed) for this epoch."""
        if self._shared[_RESUME_EPOCH] != self.epoch:
            return worker, 0
        saved_workers, batch_size = self._shared[_RESUME_WORKERS], self._shared[_RESUME_BATCH_SIZE]
        if saved_workers != num_workers:
            raise ConfigError(
                f"the stream's state was saved with {saved_workers} DataLoader worker(s) and is resumed with "
                f"{num_workers}: resume with the same num_workers (0 and 1 count as 1)"
            )
        done, next_worker = resume_plan(self.piece_sizes(num_workers), batch_size, self._shared[_RESUME_BATCHES])
        # A new DataLoader starts its round at worker 0: worker 0 takes the piece whose batch was next.
        piece = (next_worker + worker) % num_workers
        return piece, done[piece] * batch_size

    def __iter__(self) -> Iterator[Any]:
        worker, num_workers = dataloader_worker()
        piece, consumed = self._resume_point(worker, num_workers)
        buffered = self.shuffle and self.shuffle_buffer > 1
        # Without a shuffle buffer the consumed samples are skipped unread; with one, the piece is
        # replayed through the same buffer and its first outputs dropped, which keeps the order exact.
        samples: Iterator[dict[str, Any]] = self.raw_samples(piece, num_workers, 0 if buffered else consumed)
        if buffered:
            rng = random.Random((self.seed, self.epoch, self.rank, piece).__hash__())
            samples = itertools.islice(_buffer_shuffle(samples, self.shuffle_buffer, rng), consumed, None)
        for sample in samples:
            if self.decode:
                sample = decode(sample)
            yield self.transform(sample) if self.transform is not None else sample


def _buffer_shuffle(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    buffer: list[Any] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        i = rng.randrange(size)
        buffer[i], sample = sample, buffer[i]
        yield sample
    rng.shuffle(buffer)
    yield from buffer
