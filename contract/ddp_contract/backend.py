"""Which torch.distributed backend a rank uses."""

from __future__ import annotations

from typing import Final

AUTO: Final = "auto"
NCCL: Final = "nccl"
GLOO: Final = "gloo"
BACKENDS: Final = (AUTO, NCCL, GLOO)


def resolve_backend(requested: str, has_gpu: bool) -> str:
    """'auto' is nccl where the rank has a GPU and gloo where it has none; others stand as asked."""
    if requested != AUTO:
        return requested
    return NCCL if has_gpu else GLOO
