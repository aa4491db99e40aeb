"""Streaming reading of indexed shards: `ShardStream`, an iterable dataset.

Shards are read sequentially (s3:// objects as ranged GETs ahead of the reader), split by rank and
DataLoader worker so that every rank yields exactly the same number of samples (and batches) per
epoch.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from ..errors import ConfigError, CorruptDataError
from ..storage import urls
from .partition import dataloader_worker, rank_and_world_size
from .samples import decode, group_members, transformed, unreadable_shard
from .shardindex import ShardIndex, ShardInfo, load_index
from .tarreader import TarEnd, TarFormatError, tar_entries


def iter_shard(
    url: str, expected: int | None = None, skip: int = 0, stop: int | None = None
) -> Iterator[dict[str, Any]]:
    """Raw samples of one shard, read sequentially: those numbered [skip, stop) of the shard.

    Reading ends at `stop`; otherwise the sample count is checked against `expected` at the end
    of the shard. Skipped samples are read and dropped.
    """
    stream = urls.open_url(url)
    count = 0  # samples read so far
    try:
        end = TarEnd()
        entries = tar_entries(stream, allow_compressed=True, end=end)
        members = ((m.name, m.buffer[m.start : m.start + m.size]) for m in entries)
        for sample in group_members(members, url, end):
            count += 1
            if count > skip:
                yield sample
            if count == stop:
                return  # the rest of this shard belongs to another range
    except TarFormatError as exc:
        raise unreadable_shard(url, exc) from exc
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


def worker_range(rank_start: int, quota: int, worker: int, num_workers: int) -> tuple[int, int]:
    """[start, end) of this worker within its rank's contiguous range."""
    base, extra = divmod(quota, num_workers)
    start = rank_start + worker * base + min(worker, extra)
    return start, start + base + (1 if worker < extra else 0)


def piece_sizes(quota: int, num_workers: int) -> list[int]:
    """Samples each of `num_workers` DataLoader workers yields of a rank's `quota` (0 workers: one piece)."""
    workers = max(num_workers, 1)
    return [end - start for start, end in (worker_range(0, quota, w, workers) for w in range(workers))]


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


_EPOCH, _RESUME_EPOCH, _RESUME_BATCHES, _RESUME_BATCH_SIZE, _RESUME_WORKERS, _SEGMENTS = range(6)
MAX_SEGMENTS = 64  # world sizes one epoch can go through before its state is refused
_SEGMENT_FIELDS = 4  # world size, batch size, workers, batches done


def _segment_rng(seed: int, epoch: int, rank: int, piece: int, segment: int) -> random.Random:
    # Segment 0 is keyed without its number: the key a state that holds no segments was shuffled with.
    key = (seed, epoch, rank, piece) if segment == 0 else (seed, epoch, rank, piece, segment)
    return random.Random(key.__hash__())


def remaining_positions(total: int, segments: list[list[int]], seed: int, epoch: int, shuffle_buffer: int) -> list[int]:
    """Positions in the epoch's sample sequence that no rank consumed at the earlier world sizes
    `segments` ([world size, batch size, workers, batches done] each, oldest first), in order.

    At each size the positions then left are cut as an epoch is (rank_quota per rank, a piece per
    worker, the rest left for later); a piece's consumed samples are its first outputs, through the
    shuffle buffer when there is one (replayed on positions: the buffer's draws do not depend on
    what it holds)."""
    remaining = list(range(total))
    for number, (world, batch_size, num_workers, batches) in enumerate(segments):
        quota = rank_quota(len(remaining), world)
        workers = max(num_workers, 1)
        done, _ = resume_plan(piece_sizes(quota, workers), batch_size, batches)
        taken: set[int] = set()
        for rank in range(world):
            for piece in range(workers):
                start, end = worker_range(rank * quota, quota, piece, workers)
                outputs: Iterator[int] = iter(remaining[start:end])
                if shuffle_buffer > 1:
                    outputs = _buffer_shuffle(outputs, shuffle_buffer, _segment_rng(seed, epoch, rank, piece, number))
                taken.update(itertools.islice(outputs, done[piece] * batch_size))
        remaining = [p for p in remaining if p not in taken]
    return remaining


# Why not torchdata's StatefulDataLoader (checked with torchdata 0.11 on torch 2.14): it snapshots
# a no-argument `dataset.state_dict()` in each worker, which this class's state_dict(batches_done, ...)
# clashes with, and adopting it would make every training script use its DataLoader (a dependency the
# image does not have) for what resume_plan works out from three numbers. With in_order=False its
# resume did not give each sample exactly once either, so it lifts no limit that this model has.


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

    At another world size (an elastic job that shrank or grew) the samples of the epoch that no rank
    consumed are cut again over the ranks there are now, the same way (their quota each, a piece per
    worker; fewer than the world size left out, as in any epoch): within the epoch no sample is
    repeated, however often the size changes. The state keeps each earlier size (`segments`).
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
        self.rank, self.world_size = rank_and_world_size(rank, world_size)
        self.index = load_index(index) if isinstance(index, str) else index
        rank_quota(self.index.total, self.world_size)  # checks there is a sample for every rank
        self.shuffle = shuffle
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.transform = transform
        self.decode = decode
        # epoch, where to resume (epoch -1: nowhere), segment count, then the segments
        self._shared = SharedInts([0, -1, 0, 1, 1, 0] + [0] * (MAX_SEGMENTS * _SEGMENT_FIELDS))
        self._positions_for: tuple[Any, list[int]] | None = None  # the last _positions(), and for what

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_positions_for": None}  # worked out again where needed, not shipped

    @property
    def epoch(self) -> int:
        return self._shared[_EPOCH]

    def set_epoch(self, epoch: int) -> None:
        self._shared[_EPOCH] = epoch

    def _segments(self) -> list[list[int]]:
        """The epoch's earlier world sizes, when this epoch is the one resumed."""
        if self._shared[_RESUME_EPOCH] != self.epoch:
            return []
        base = _SEGMENTS + 1
        return [[self._shared[base + i * _SEGMENT_FIELDS + f] for f in range(_SEGMENT_FIELDS)]
                for i in range(self._shared[_SEGMENTS])]

    def _positions(self) -> list[int] | None:
        """The epoch's positions left to the ranks there are now; None: all of them (no resize)."""
        segments = self._segments()
        if not segments:
            return None
        key = (self.epoch, tuple(map(tuple, segments)))
        if self._positions_for is None or self._positions_for[0] != key:
            positions = remaining_positions(self.index.total, segments, self.seed, self.epoch,
                                            self.shuffle_buffer if self.shuffle else 0)
            self._positions_for = (key, positions)
        return self._positions_for[1]

    @property
    def start_batch(self) -> int:
        """Batches of this epoch, at this world size, done before the next iteration starts (non-zero
        right after a resume): count `batches_done` for `state_dict` on from here."""
        return self._shared[_RESUME_BATCHES] if self._shared[_RESUME_EPOCH] == self.epoch else 0

    @property
    def quota(self) -> int:
        """Samples this rank yields this epoch (every rank as many)."""
        positions = self._positions()
        return rank_quota(self.index.total if positions is None else len(positions), self.world_size)

    def __len__(self) -> int:
        return self.quota

    def piece_sizes(self, num_workers: int) -> list[int]:
        """Samples each of `num_workers` DataLoader workers yields per epoch (0 workers: one piece)."""
        return piece_sizes(self.quota, num_workers)

    def batches_per_epoch(self, batch_size: int, num_workers: int) -> int:
        return sum(-(-size // batch_size) for size in self.piece_sizes(num_workers))

    def state_dict(self, batches_done: int, batch_size: int, num_workers: int, in_order: bool = True) -> dict[str, Any]:
        """Where this epoch stands after the training loop finished `batches_done` batches of a
        DataLoader(batch_size=..., num_workers=..., in_order=...) over this stream."""
        if not in_order and num_workers > 1:
            raise ConfigError(
                f"the stream cannot record where a DataLoader with in_order=False and {num_workers} workers stands: "
                "it hands out batches as workers finish them, so which samples the batches done held is unknown; "
                "use in_order=True (the default) to resume mid-epoch"
            )
        resume_plan(self.piece_sizes(num_workers), batch_size, batches_done)  # checks the count
        finished = batches_done == self.batches_per_epoch(batch_size, num_workers)
        return {
            "epoch": self.epoch + finished,
            "batches": 0 if finished else batches_done,
            "batch_size": batch_size,
            "num_workers": max(num_workers, 1),
            "seed": self.seed,
            "world_size": self.world_size,
            "segments": [] if finished else self._segments(),
        }

    def loader_state_dict(self, loader: DataLoader[Any], batches_done: int) -> dict[str, Any]:
        """`state_dict` with the batch size, worker count and in_order of `loader`, a DataLoader over this stream."""
        if loader.batch_size is None:
            raise ConfigError("the stream's position is counted in batches: give the DataLoader a batch_size")
        return self.state_dict(batches_done, loader.batch_size, loader.num_workers, getattr(loader, "in_order", True))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state of this stream's, saved at any world size (a state without `world_size` is taken as
        saved at this one)."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise ConfigError(f"stream state was saved with seed {state['seed']}, this stream has {self.seed}")
        segments = [[int(x) for x in segment] for segment in state.get("segments", [])]
        batches, batch_size, workers = int(state["batches"]), int(state["batch_size"]), int(state["num_workers"])
        saved_world = int(state.get("world_size", self.world_size))
        if batches and saved_world != self.world_size:
            segments.append([saved_world, batch_size, workers, batches])
            batches = 0
        if len(segments) > MAX_SEGMENTS:
            raise ConfigError(f"the stream's state went through {len(segments)} world sizes in one epoch; "
                              f"it keeps at most {MAX_SEGMENTS}: start the epoch again without it")
        self.set_epoch(int(state["epoch"]))
        self._shared[_RESUME_EPOCH] = int(state["epoch"]) if batches or segments else -1
        self._shared[_RESUME_BATCHES] = batches
        self._shared[_RESUME_BATCH_SIZE] = batch_size
        self._shared[_RESUME_WORKERS] = workers
        self._shared[_SEGMENTS] = len(segments)
        for i, segment in enumerate(segments):
            for f, value in enumerate(segment):
                self._shared[_SEGMENTS + 1 + i * _SEGMENT_FIELDS + f] = value
        positions = self._positions()
        if positions is not None and len(positions) < self.world_size:
            self.set_epoch(self.epoch + 1)  # fewer samples left than ranks: the epoch is over

    def shard_order(self) -> list[ShardInfo]:
        shards = list(self.index.shards)
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(shards)
        return shards

    def raw_samples(self, worker: int = 0, num_workers: int = 1, skip: int = 0) -> Iterator[dict[str, Any]]:
        positions = self._positions()
        quota = rank_quota(self.index.total if positions is None else len(positions), self.world_size)
        start, end = worker_range(self.rank * quota, quota, worker, num_workers)
        if positions is not None:
            yield from self._samples_at(positions[start + skip : end])
            return
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

    def _samples_at(self, positions: list[int]) -> Iterator[dict[str, Any]]:
        """The samples at `positions` (ascending) of the epoch's sequence, each shard they touch read
        once from the first of them to the last."""
        wanted = set(positions)
        offset = 0
        for shard in self.shard_order():
            first, last = bisect.bisect_left(positions, offset), bisect.bisect_left(positions, offset + shard.nsamples)
            if first < last:
                skip, stop = positions[first] - offset, positions[last - 1] - offset + 1
                numbered = enumerate(iter_shard(shard.url, shard.nsamples, skip, stop if stop < shard.nsamples else None),
                                     start=offset + skip)
                yield from (sample for position, sample in numbered if position in wanted)
            offset += shard.nsamples

    def _resume_point(self, worker: int, num_workers: int) -> tuple[int, int]:
        """(the piece this worker reads, samples of it already consumed) for this epoch."""
        if self._shared[_RESUME_EPOCH] != self.epoch or self._shared[_RESUME_BATCHES] == 0:
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
            rng = _segment_rng(self.seed, self.epoch, self.rank, piece, len(self._segments()))
            samples = itertools.islice(_buffer_shuffle(samples, self.shuffle_buffer, rng), consumed, None)
        for sample in samples:
            if self.decode:
                sample = decode(sample)
            yield transformed(self.transform, sample) if self.transform is not None else sample


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
