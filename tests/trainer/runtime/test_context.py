"""The rank's context: what run() hands the user's function, and `ddp_trainer.context()`."""

from __future__ import annotations

import pytest

import ddp_trainer
from ddp_contract import envnames
from ddp_trainer.env import JobInfo
from ddp_trainer.errors import ConfigError
from ddp_trainer.runtime.context import RankContext, set_context, target_world_size


def test_the_context_is_only_available_inside_a_rank() -> None:
    with pytest.raises(RuntimeError, match=r"only available inside `python -m ddp_trainer run`"):
        ddp_trainer.context()


def test_ddp_trainer_context_returns_the_context_run_set() -> None:
    context = RankContext(rank=1, world_size=2, local_rank=0, backend="gloo", device="cpu", job=JobInfo("j", "ns", "uid"),
                          target_world_size=2)
    set_context(context)
    try:
        assert ddp_trainer.context() is context and ddp_trainer.RankContext is RankContext
    finally:
        set_context(None)


def test_the_target_world_size_is_the_jobs_and_the_gangs_where_the_operator_gives_none() -> None:
    assert target_world_size({envnames.TARGET_WORLD_SIZE: "8"}, 6) == 8
    assert target_world_size({}, 6) == 6 and target_world_size({envnames.TARGET_WORLD_SIZE: " "}, 6) == 6
    for bad in ("eight", "0"):
        with pytest.raises(ConfigError, match=envnames.TARGET_WORLD_SIZE):
            target_world_size({envnames.TARGET_WORLD_SIZE: bad}, 6)


def test_the_ratio_says_how_short_of_its_target_the_gang_runs() -> None:
    def ratio(world_size: int, target: int) -> float:
        return RankContext(rank=0, world_size=world_size, local_rank=0, backend="gloo", device="cpu",
                           job=JobInfo("j", "ns", "uid"), target_world_size=target).world_size_ratio

    assert ratio(4, 4) == 1.0 and ratio(2, 8) == 0.25
