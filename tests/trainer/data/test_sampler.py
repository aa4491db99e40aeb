"""DistributedChunkedSampler: even split, locality, reshuffling, resume, resume at another world size."""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest

from ddp_trainer.data.sampler import DistributedChunkedSampler


def test_chunked_sampler_splits_evenly_keeps_locality_and_reshuffles() -> None:
    size, world, chunk = 103, 4, 10
    samplers = [DistributedChunkedSampler(size, num_replicas=world, rank=r, chunksize=chunk, seed=1) for r in range(world)]
    epoch0 = [list(s) for s in samplers]
    assert {len(x) for x in epoch0} == {26}  # ceil(103 / 4), padded by wrapping
    assert set().union(*map(set, epoch0)) == set(range(size))
    for indices in epoch0:
        assert len({i // chunk for i in indices}) <= 26 // chunk + 2  # a few whole chunks, not scattered
    for s in samplers:
        s.set_epoch(1)
    epoch1 = [list(s) for s in samplers]
    assert epoch1 != epoch0 and set().union(*map(set, epoch1)) == set(range(size))
    # Resume mid-epoch: skip what was consumed, later epochs start from the beginning.
    resumed = DistributedChunkedSampler(size, num_replicas=world, rank=2, chunksize=chunk, seed=1)
    resumed.load_state_dict(samplers[2].state_dict(samples_consumed=10))
    assert list(resumed) == epoch1[2][10:]
    assert samplers[2].state_dict(samples_consumed=26) == {"epoch": 2, "offset": 0, "seed": 1, "worldSize": 4,
                                                            "segments": []}


def gang(size: int, world: int, state: dict[str, Any] | None, drop_last: bool = False) -> list[DistributedChunkedSampler]:
    """Every rank's sampler of a gang of `world`, resumed from rank 0's checkpointed `state`."""
    samplers = [DistributedChunkedSampler(size, num_replicas=world, rank=r, chunksize=7, seed=3, drop_last=drop_last)
                for r in range(world)]
    for sampler in samplers:
        if state is not None:
            sampler.load_state_dict(state)
    return samplers


def train(samplers: list[DistributedChunkedSampler], steps: int | None, seen: collections.Counter) -> dict[str, Any]:
    """Every rank takes `steps` samples (None: to the epoch's end) in lockstep; rank 0's state after."""
    epoch, start = samplers[0].epoch, samplers[0].start_offset
    counts = set()
    for sampler in samplers:
        assert (sampler.epoch, sampler.start_offset) == (epoch, start)
        taken = list(sampler)[:steps]
        counts.add(len(taken))
        seen.update(taken)
    assert len(counts) == 1  # every rank as many: DDP's lockstep
    return samplers[0].state_dict(samples_consumed=start + counts.pop())


def test_an_epoch_resumed_at_other_world_sizes_sees_every_sample_exactly_once() -> None:
    size, seen = 84, collections.Counter()  # 84 splits evenly over 4, 2, 3 and 6 ranks: no padding
    state = train(gang(size, 4, None), 5, seen)  # 4 ranks take 5 each, then two are lost
    assert state == {"epoch": 0, "offset": 5, "seed": 3, "worldSize": 4, "segments": []}
    state = train(gang(size, 2, state), 11, seen)  # the gang goes on at 2
    assert state["segments"] == [[4, 5]] and state["offset"] == 11
    state = train(gang(size, 3, state), 4, seen)  # grows to 3
    samplers = gang(size, 6, state)  # and to 6, to the epoch's end
    assert len(samplers[0]) == (size - 4 * 5 - 2 * 11 - 3 * 4) // 6
    state = train(samplers, None, seen)
    assert seen == collections.Counter(range(size))
    assert state == {"epoch": 1, "offset": 0, "seed": 3, "worldSize": 6, "segments": []}
    # The next epoch is a whole one at the size the job has now.
    nxt = gang(size, 6, state)
    assert nxt[0].epoch == 1 and len(nxt[0]) == size // 6 and nxt[0].start_offset == 0


@pytest.mark.parametrize("drop_last", [False, True])
def test_random_resizes_lose_no_sample_and_repeat_only_padding(drop_last: bool) -> None:
    """Sizes that do not divide the samples left: every sample is seen; the only repeats are padding
    (a rank whose share runs past the samples left takes some from the start again, as torch's
    DistributedSampler pads an epoch, fewer than the world size each time a size reaches it). With
    drop_last nothing repeats and fewer than the last world size are left out."""
    rng = random.Random(11)
    for _ in range(300):
        size, seen, state = rng.randint(20, 120), collections.Counter(), None
        worlds = [rng.randint(1, 8)]
        for _ in range(rng.randint(0, 4)):
            samplers = gang(size, worlds[-1], state, drop_last)
            if samplers[0].epoch > 0 or len(samplers[0]) - samplers[0].start_offset < 2:
                break
            state = train(samplers, rng.randint(1, len(samplers[0]) - samplers[0].start_offset - 1), seen)
            worlds.append(rng.randint(1, 8))
        last = gang(size, worlds[-1], state, drop_last)
        if last[0].epoch == 0:
            assert train(last, None, seen)["epoch"] == 1
        else:  # with drop_last, fewer samples left than ranks: the epoch is over
            assert drop_last and len(last[0]) == size // worlds[-1]
        repeats = sum(count - 1 for count in seen.values())
        missed = size - len(seen)
        if drop_last:
            assert repeats == 0 and missed < worlds[-1], (size, worlds, state)
        else:
            assert missed == 0 and repeats <= sum(w - 1 for w in worlds), (size, worlds, state)


def test_a_state_from_before_world_sizes_were_kept_resumes_at_the_same_size() -> None:
    seen: collections.Counter = collections.Counter()
    train(gang(40, 4, None), 3, seen)
    train(gang(40, 4, {"epoch": 0, "offset": 3, "seed": 3}), None, seen)
    assert seen == collections.Counter(range(40))


def test_a_size_that_leaves_no_sample_for_each_rank_starts_the_next_epoch() -> None:
    """drop_last at 4 ranks leaves 6 of 10 samples after one step each; 8 ranks cannot share 6 evenly."""
    state = train(gang(10, 4, None, drop_last=True), 1, collections.Counter())
    after = gang(10, 8, state, drop_last=True)
    assert after[0].epoch == 1 and len(after[0]) == 1 and after[0].start_offset == 0
