"""The rank's context: what run() hands the user's function, and `ddp_trainer.context()`."""

from __future__ import annotations

import pytest

import ddp_trainer
from ddp_trainer.env import JobInfo
from ddp_trainer.runtime.context import RankContext, set_context


def test_the_context_is_only_available_inside_a_rank() -> None:
    with pytest.raises(RuntimeError, match=r"only available inside `python -m ddp_trainer run`"):
        ddp_trainer.context()


def test_ddp_trainer_context_returns_the_context_run_set() -> None:
    context = RankContext(rank=1, world_size=2, local_rank=0, backend="gloo", device="cpu", job=JobInfo("j", "ns", "uid"))
    set_context(context)
    try:
        assert ddp_trainer.context() is context and ddp_trainer.RankContext is RankContext
    finally:
        set_context(None)
