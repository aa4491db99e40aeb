"""Rank, world size and DataLoader worker: one answer for every dataset and sampler."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from ddp_trainer.data.partition import dataloader_worker, rank_and_world_size
from ports import free_port


def test_given_values_win_and_no_process_group_means_one_rank() -> None:
    assert not dist.is_initialized()
    assert rank_and_world_size() == (0, 1)
    assert rank_and_world_size(2, None) == (2, 1) and rank_and_world_size(None, 4) == (0, 4)
    assert rank_and_world_size(3, 4) == (3, 4)


def test_the_process_group_gives_rank_and_world_size() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        assert rank_and_world_size() == (0, 1)
        assert rank_and_world_size(None, 5) == (0, 5)
    finally:
        dist.destroy_process_group()


class _Workers(IterableDataset):
    def __iter__(self):
        yield list(dataloader_worker())


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_worker(workers: int) -> None:
    assert dataloader_worker() == (0, 1)
    context = "fork" if workers else None
    loader = DataLoader(_Workers(), batch_size=None, num_workers=workers, multiprocessing_context=context)
    assert sorted(loader) == ([[0, 1]] if not workers else [[0, 2], [1, 2]])
