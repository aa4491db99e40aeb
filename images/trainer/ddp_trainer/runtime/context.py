"""The running rank's context: what a `module:function` target is handed, and `ddp_trainer.context()`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ddp_contract import envnames as names
from ddp_contract.envnumbers import EnvNumberError, env_number

from .. import env
from ..errors import ConfigError


@dataclass(frozen=True)
class RankContext:
    """`world_size` is the size of the gang this attempt runs with; `target_world_size` the job's
    spec.worldSize. They differ only while an elastic job runs short (spec.minWorldSize)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device; typed loosely so this module imports without torch
    job: env.JobInfo
    target_world_size: int

    @property
    def world_size_ratio(self) -> float:
        """world_size / target_world_size: 1.0 at full size, less while an elastic job runs short.

        To train as the full-size job would, either keep the global batch (accumulate gradients over
        target_world_size // world_size steps per optimizer step, where it divides), or keep the
        per-rank batch and scale the learning rate linearly: lr * world_size_ratio.
        """
        return self.world_size / self.target_world_size


def target_world_size(environ: Mapping[str, str], world_size: int) -> int:
    """$DDP_TARGET_WORLD_SIZE (the job's spec.worldSize); `world_size` where it is unset."""
    try:
        return env_number(names.TARGET_WORLD_SIZE, environ.get(names.TARGET_WORLD_SIZE, "").strip(), int, world_size,
                          minimum=1)
    except EnvNumberError as error:
        raise ConfigError(str(error)) from None


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
