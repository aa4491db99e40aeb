"""Datasets the data worker tests send to real data worker processes (which import this module)."""

from __future__ import annotations

import random

import numpy
import torch
from torch.utils.data import Dataset, get_worker_info


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
