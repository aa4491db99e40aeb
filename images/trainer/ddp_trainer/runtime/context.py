"""The running rank's context: what a `module:function` target is handed, and `ddp_trainer.context()`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import env


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device; typed loosely so this module imports without torch
    job: env.JobInfo


_context: RankContext | None = None


def context() -> RankContext:
    """The running rank's context; only valid inside code started by the entrypoint."""
    if _context is None:
        raise RuntimeError("ddp_trainer.context() is only available inside `python -m ddp_trainer run`")
    return _context


def set_context(value: RankContext | None) -> None:
    """The entrypoint's: the context while the user's code runs, None before and after."""
    global _context
    _context = value
