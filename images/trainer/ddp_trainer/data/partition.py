"""Which part of the data this process reads: its distributed rank and DataLoader worker."""

from __future__ import annotations


def rank_and_world_size(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): the values given, else those of the initialised process group, else (0, 1)."""
    import torch.distributed as dist

    initialised = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    if world_size is None:
        world_size = dist.get_world_size() if initialised else 1
    return rank, world_size


def dataloader_worker() -> tuple[int, int]:
    """(this DataLoader worker's id, the number of workers); (0, 1) outside a worker."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)
