"""DistributedChunkedSampler: per-epoch shuffle that keeps locality and splits evenly across ranks.

The index range is cut into contiguous chunks (ideally about one shard each). Every epoch the
chunk order and the order inside each chunk are shuffled with `seed + epoch`, the same on every
rank; the resulting list is padded (by wrapping) to a multiple of the world size and rank r takes
the r-th contiguous slice. Each rank thus reads few shards at a time, all ranks get the same
number of samples (no DDP hang), and every rank sees different data each epoch.

Resuming mid-epoch: `state_dict(samples_consumed)` records the epoch, the world size and how far
every rank got (ranks step together, so one rank's count is every rank's); after `load_state_dict`,
the next iteration skips what was consumed, later epochs start at 0.

Resuming at another world size (an elastic job that shrank or grew): the epoch's samples no rank
consumed yet are split again over the new world size, the same way (padded, contiguous slices), so
within the epoch no sample is repeated or skipped however many times the size changes, beyond the
padding each size needs to give every rank as many (fewer than its world size). The state
keeps each earlier size of the epoch and how far it got (`segments`), which is all it takes to
recompute what is left.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from .partition import rank_and_world_size


class DistributedChunkedSampler(Sampler[int]):
    def __init__(
        self,
        dataset: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        chunksize: int = 1000,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        rank, num_replicas = rank_and_world_size(rank, num_replicas)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        if chunksize < 1:
            raise ValueError(f"chunksize {chunksize} must be >= 1")
        self.size = dataset if isinstance(dataset, int) else len(dataset)
        if self.size < 1:
            raise ValueError("cannot sample from an empty dataset")
        self.num_replicas = num_replicas
        self.rank = rank
        self.chunksize = chunksize
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._resume_offset = 0
        self._yielded = 0
        # Earlier world sizes of this epoch and the samples each rank consumed at them, oldest first.
        self._segments: list[tuple[int, int]] = []
        self.num_samples = _per_rank(self.size, num_replicas, drop_last)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._resume_offset = 0
            self._segments = []
            self.num_samples = _per_rank(self.size, self.num_replicas, self.drop_last)
        self.epoch = epoch

    @property
    def start_offset(self) -> int:
        """Where the next iteration starts in this rank's list (non-zero right after a resume)."""
        return self._resume_offset

    def global_order(self) -> list[int]:
        """This epoch's order over all ranks, before the split (identical on every rank)."""
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        starts = list(range(0, self.size, self.chunksize))
        order: list[int] = []
        for c in torch.randperm(len(starts), generator=generator).tolist():
            start = starts[c]
            length = min(self.chunksize, self.size - start)
            order.extend((start + torch.randperm(length, generator=generator)).tolist())
        return order

    def rank_indices(self) -> list[int]:
        """This rank's samples of the epoch at the current world size (after earlier sizes' shares)."""
        order = self.global_order()
        remaining = _remaining(len(order), self._segments, self.drop_last)
        return [order[p] for p in _rank_slice(remaining, self.num_replicas, self.rank, self.num_samples)]

    def __iter__(self) -> Iterator[int]:
        indices = self.rank_indices()[self._resume_offset :]
        self._yielded = self._resume_offset
        self._resume_offset = 0
        for index in indices:
            self._yielded += 1
            yield index

    def state_dict(self, samples_consumed: int | None = None) -> dict[str, Any]:
        """`samples_consumed` is how many samples of this rank's list (`rank_indices()`, at this world
        size) the training loop finished: `start_offset` plus those of this iteration; by default,
        how many this sampler yielded (exact only with num_workers=0)."""
        consumed = self._yielded if samples_consumed is None else samples_consumed
        if consumed >= self.num_samples:
            return {"epoch": self.epoch + 1, "offset": 0, "seed": self.seed, "worldSize": self.num_replicas,
                    "segments": []}
        return {"epoch": self.epoch, "offset": int(consumed), "seed": self.seed, "worldSize": self.num_replicas,
                "segments": [list(segment) for segment in self._segments]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state of this sampler's, saved at any world size (a state without `worldSize` is taken as
        saved at this one)."""
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(f"sampler state was saved with seed {state['seed']}, this sampler has {self.seed}")
        saved_world = int(state.get("worldSize", self.num_replicas))
        segments = [(int(world), int(consumed)) for world, consumed in state.get("segments", [])]
        offset = int(state["offset"])
        if saved_world != self.num_replicas and offset > 0:
            segments.append((saved_world, offset))
            offset = 0
        self.epoch = int(state["epoch"])
        self._segments = segments
        self._resume_offset = offset
        self.num_samples = _per_rank(len(_remaining(self.size, segments, self.drop_last)), self.num_replicas,
                                     self.drop_last)
        if self.num_samples == 0:  # with drop_last, fewer samples left than ranks: the epoch is over
            self.set_epoch(self.epoch + 1)


def _per_rank(length: int, world: int, drop_last: bool) -> int:
    return length // world if drop_last else -(-length // world)


def _padded(remaining: list[int], length: int) -> list[int]:
    """`remaining` wrapped round to `length` entries (every rank gets as many samples, as
    torch's DistributedSampler pads)."""
    out = list(remaining)
    while out and len(out) < length:
        out.extend(out[: length - len(out)])
    return out[:length]


def _rank_slice(remaining: list[int], world: int, rank: int, per_rank: int) -> list[int]:
    padded = _padded(remaining, per_rank * world)
    return padded[rank * per_rank : (rank + 1) * per_rank]


def _remaining(length: int, segments: list[tuple[int, int]], drop_last: bool) -> list[int]:
    """Positions of the epoch's order no rank consumed at the earlier world sizes `segments`, in order."""
    remaining = list(range(length))
    for world, consumed in segments:
        per_rank = _per_rank(len(remaining), world, drop_last)
        padded = _padded(remaining, per_rank * world)
        taken = {p for rank in range(world) for p in padded[rank * per_rank : rank * per_rank + consumed]}
        remaining = [p for p in remaining if p not in taken]
    return remaining
