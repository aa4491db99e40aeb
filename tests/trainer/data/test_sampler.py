"""DistributedChunkedSampler: even split, locality, reshuffling, resume."""

from __future__ import annotations

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
    assert samplers[2].state_dict(samples_consumed=26) == {"epoch": 2, "offset": 0, "seed": 1}
