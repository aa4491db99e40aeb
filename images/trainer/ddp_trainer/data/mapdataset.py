"""Map-style reading of indexed shards: `ShardedDataset` and its `PrefetchingSampler`.

Shards are downloaded whole into a bounded local cache (least recently used shard evicted first)
and members are read by offset. Pair the dataset with `DistributedChunkedSampler(chunksize≈samples
per shard)` for locality, wrapped in `dataset.prefetching(sampler)` to download the next shards ahead.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from bisect import bisect_right
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from torch.utils.data import Dataset, Sampler

from ..errors import ConfigError, CorruptDataError, ObjectNotFoundError
from ..storage import urls
from .samples import decode, group_members, transformed, unreadable_shard
from .shardcache import ShardCache
from .shardindex import ShardIndex, ShardInfo, load_index
from .tarreader import TarEnd, TarFormatError, tar_entries

log = logging.getLogger(__name__)

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
        members = list(zip(self.layouts[self.layout[i]], self.offsets[a:b], self.sizes[a:b], strict=True))
        return self.keys[i], self.offsets[a], self.offsets[b - 1] + self.sizes[b - 1], members

    @classmethod
    def of_samples(cls, samples: Iterable[dict[str, Any]]) -> MemberTable:
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
    end = TarEnd()
    try:
        with open(path, "rb") as f:
            members = [(m.name, (m.offset, m.size)) for m in tar_entries(f, end=end)]
    except TarFormatError as exc:
        raise unreadable_shard(url, exc, "uncompressed tar") from exc
    table = MemberTable.of_samples(group_members(members, url, end))
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
    try:
        with urls.atomic_path(path + ShardCache.TABLE_SUFFIX) as tmp, open(tmp, "w") as f:
            json.dump({"size": size, **dataclasses.asdict(table)}, f, separators=(",", ":"))
    except OSError as exc:  # a cache that cannot hold the table still works: each process parses the shard
        log.debug("could not save the member table of %s: %s", path, exc)


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
        cached = not urls.is_local(shard.url)  # a local shard is read in place
        for attempt in range(3):
            path = self.cache.get(shard.url) if cached else urls.local_path(shard.url)
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
        return transformed(self.transform, sample) if self.transform is not None else sample

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

    def prefetching(self, sampler: Iterable[int], shards_ahead: int = 2) -> PrefetchingSampler:
        """`sampler` with the shards its next indices fall in downloaded ahead (see PrefetchingSampler)."""
        return PrefetchingSampler(sampler, self, shards_ahead)


class ShardListDataset(ShardedDataset):
    """wids' `ShardListDataset` for code ported by its import: `ShardListDataset(index_url,
    cache_dir=..., keep=...)` and `.add_transform(f)` (each transform gets what the one before it
    returned), with samples keyed as wids keys them, by extension with its dot (`sample[".jpg"]`,
    `sample[".cls"]`), decoded as ShardedDataset decodes (images as PIL RGB, class numbers as int).
    Shards are kept in `cache_dir` as with `keep=True`, up to `cache_limit_bytes` (least recently
    used out first)."""

    def __init__(self, shards: str | ShardIndex, cache_dir: str | None = None, keep: bool = True,
                 cache_limit_bytes: int | None = None) -> None:
        super().__init__(shards, cache_dir, cache_limit_bytes)
        self.keep = keep
        self.transforms: list[Callable[[Any], Any]] = []

    def add_transform(self, transform: Callable[[Any], Any]) -> ShardListDataset:
        self.transforms.append(transform)
        return self

    def __getitem__(self, index: int) -> Any:
        sample = {(field if field.startswith("__") else f".{field}"): value
                  for field, value in decode(self.raw(index)).items()}
        return transformed(self._transform_all, sample)

    def _transform_all(self, sample: Any) -> Any:
        for transform in self.transforms:
            sample = transform(sample)
        return sample


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
                    if url not in scheduled and not urls.is_local(url):
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
