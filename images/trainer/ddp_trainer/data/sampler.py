"""DistributedChunkedSampler: per-epoch shuffle that keeps locality and splits evenly across ranks.

The index range is cut into contiguous chunks (ideally about one shard each). Every epoch the
chunk order and the order inside each chunk are shuffled with `seed + epoch`, the same on every
rank; the resulting list is padded (by wrapping) to a multiple of the world size and rank r takes
the r-th contiguous slice. Each rank thus reads few shards at a time, all ranks get the same
number of samples (no DDP hang), and every rank sees different data each epoch.

Resuming mid-epoch: `state_dict(samples_consumed)` records the epoch and how far this rank got;
after `load_state_dict`, the next iteration skips what was consumed, later epochs start at 0.
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
        if drop_last:
            self.num_samples = self.size // num_replicas
        else:
            self.num_samples = -(-self.size // num_replicas)

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._resume_offset = 0
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
        order = self.global_order()
        total = self.num_samples * self.num_replicas
        while len(order) < total:
            order.extend(order[: total - len(order)])
        start = self.rank * self.num_samples
        return order[start : start + self.num_samples]

    def __iter__(self) -> Iterator[int]:
        indices = self.rank_indices()[self._resume_offset :]
        self._yielded = self._resume_offset
        self._resume_offset = 0
        for index in indices:
            self._yielded += 1
            yield index

    def state_dict(self, samples_consumed: int | None = None) -> dict[str, Any]:
        """`samples_consumed` is how many of this epoch's samples the training loop finished;
        by default, how many this sampler yielded (exact only with num_workers=0)."""
        consumed = self._yielded if samples_consumed is None else samples_consumed
        if consumed >= self.num_samples:
            return {"epoch": self.epoch + 1, "offset": 0, "seed": self.seed}
        return {"epoch": self.epoch, "offset": int(consumed), "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state.get("seed", self.seed)) != self.seed:
            raise ValueError(f"sampler state was saved with seed {state['seed']}, this sampler has {self.seed}")
        self.epoch = int(state["epoch"])
        self._resume_offset = int(state["offset"])
