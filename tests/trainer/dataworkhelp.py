"""Datasets the data worker tests send to real data worker processes (which import this module)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class Augmented(Dataset[tuple[torch.Tensor, int]]):
    """Each sample drawn from torch's, Python's and numpy's random streams, as augmentations do, and
    marked with the worker that made it."""

    def __init__(self, size: int = 64, fail_at: int | None = None) -> None:
        self.size = size
        self.fail_at = fail_at
        self.base = torch.arange(size * 4, dtype=torch.float32).reshape(size, 4)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if index == self.fail_at:
            raise KeyError(f"sample {index} is missing")
        info = get_worker_info()
        noise = torch.rand(4) + random.random() + float(numpy.random.rand())
        return self.base[index] + noise, index * 10 + (info.id if info is not None else 99)


def init_worker(worker_id: int) -> None:
    """A worker_init_fn that draws from the worker's stream, so its draw is part of the batches."""
    torch.rand(worker_id + 1)


class Stream(IterableDataset[tuple[torch.Tensor, int]]):
    """An iterable dataset as ShardStream is one: each worker streams its own share (equal shares, so
    torch's order is the same on every run), each sample drawn from the worker's random streams and
    marked with the worker that made it; `uneven`: worker 0 streams two samples more."""

    def __init__(self, size: int = 48, uneven: bool = False) -> None:
        self.size = size
        self.uneven = uneven

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        extra = [self.size, self.size + 1] if self.uneven and worker == 0 else []
        for index in [*range(worker, self.size, workers), *extra]:
            noise = torch.rand(2) + random.random() + float(numpy.random.rand())
            yield torch.full((2,), float(index)) + noise, index * 10 + worker


class Large(Dataset[torch.Tensor]):
    """Samples of 32 MB, more than a socket's buffers hold; each __getitem__ leaves a file named for
    its index in `folder`, so a test sees which samples a data worker has made."""

    def __init__(self, folder: str, size: int = 4) -> None:
        self.folder = folder
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        sample = torch.full((8 * 1024 * 1024,), float(index))
        (Path(self.folder) / str(index)).touch()
        return sample
