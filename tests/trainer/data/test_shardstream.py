"""ShardStream: equal batches on every rank, reshuffling, exact mid-epoch resume, DDP runs."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import pytest
import torch
from shardhelp import SHARD_SIZES, assert_same_sample, keys, upload_wds_shards, webdataset_and_index
from torch.utils.data import DataLoader
from trainerhelp import launch

from ddp_contract import envnames
from ddp_trainer.data.shardstream import ShardStream, resume_plan
from ddp_trainer.errors import ConfigError, CorruptDataError
from ddp_trainer.storage import s3


@pytest.fixture
def wds_shards(tmp_path: Path, bucket: str) -> tuple[Path, str, list[dict]]:
    return upload_wds_shards(tmp_path, bucket)


def test_streaming_gives_every_rank_the_same_batches(wds_shards) -> None:
    _, bucket, _ = wds_shards
    world, workers, batch = 3, 2, 2
    total = sum(SHARD_SIZES)
    seen: list[str] = []
    batch_counts = []
    for rank in range(world):
        stream = ShardStream(f"s3://{bucket}/sets/wds/index.json", rank=rank, world_size=world, seed=5)
        stream.set_epoch(2)
        loader = DataLoader(
            stream,
            batch_size=batch,
            num_workers=workers,
            multiprocessing_context="fork",
            collate_fn=lambda samples: [s["__key__"] for s in samples],
        )
        batches = list(loader)
        batch_counts.append(len(batches))
        seen.extend(k for b in batches for k in b)
    quota = total // world
    assert batch_counts == [batch_counts[0]] * world
    worker_quotas = [quota // workers + (w < quota % workers) for w in range(workers)]
    assert batch_counts[0] == sum(-(-q // batch) for q in worker_quotas)
    assert len(seen) == quota * world and len(set(seen)) == len(seen)  # no sample twice in an epoch
    orders = []
    for epoch in (0, 1):
        stream = ShardStream(f"s3://{bucket}/sets/wds/index.json", rank=0, world_size=1, seed=5, shuffle_buffer=4)
        stream.set_epoch(epoch)
        orders.append([s["__key__"] for s in stream])
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_persistent_workers_reshuffle_every_epoch(wds_shards, start_method: str) -> None:
    local, _, _ = wds_shards
    stream = ShardStream(str(local / "index.json"), rank=0, world_size=1, seed=5, shuffle_buffer=4, decode=False)
    expected = []
    for epoch in (0, 1, 2):  # what fresh workers give each epoch
        stream.set_epoch(epoch)
        expected.append(list(DataLoader(stream, batch_size=3, num_workers=2, collate_fn=keys, multiprocessing_context="fork")))
    assert expected[0] != expected[1] != expected[2]

    loader = DataLoader(
        stream, batch_size=3, num_workers=2, collate_fn=keys, multiprocessing_context=start_method, persistent_workers=True
    )
    for epoch in (0, 1, 2):
        stream.set_epoch(epoch)
        assert list(loader) == expected[epoch]
    copied = pickle.loads(pickle.dumps(stream))  # outside a worker's start: a copy with its own epoch
    copied.set_epoch(7)
    assert (copied.epoch, stream.epoch) == (7, 2)


def test_resume_plan_follows_the_dataloaders_round_robin() -> None:
    # pieces of 7, 7 and 3 samples in batches of 3: batches per worker 3, 3, 1
    assert resume_plan([7, 7, 3], 3, 0) == ([0, 0, 0], 0)
    assert resume_plan([7, 7, 3], 3, 4) == ([2, 1, 1], 1)  # w0 w1 w2 w0 | next in turn: w1
    assert resume_plan([7, 7, 3], 3, 5) == ([2, 2, 1], 2)  # w0 w1 w2 w0 w1 | w2's turn, but it is out
    assert resume_plan([7, 7, 3], 3, 6) == ([3, 2, 1], 1)  # ... w0 (w2 passed over) | w1
    assert resume_plan([7, 7, 3], 3, 7) == ([3, 3, 1], 2)  # the whole epoch
    with pytest.raises(ConfigError, match="8 batches done, but an epoch here has 7"):
        resume_plan([7, 7, 3], 3, 8)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 3 on 2 cores: on purpose
@pytest.mark.parametrize("workers, shuffle_buffer", [(0, 0), (2, 0), (3, 0), (3, 4)])
def test_streaming_resumes_mid_epoch_with_exactly_the_batches_to_come(wds_shards, workers: int, shuffle_buffer: int) -> None:
    local, _, _ = wds_shards
    batch = 3

    def stream() -> ShardStream:
        return ShardStream(str(local / "index.json"), rank=1, world_size=2, seed=4, shuffle_buffer=shuffle_buffer, decode=False)

    def batches(source: ShardStream) -> list[list[str]]:
        loader = DataLoader(source, batch_size=batch, num_workers=workers, collate_fn=keys,
                            multiprocessing_context="fork" if workers else None)
        return list(loader)

    original = stream()
    original.set_epoch(3)
    epoch = batches(original)
    assert len(epoch) == original.batches_per_epoch(batch, workers)
    for done in range(len(epoch) + 1):
        state = original.state_dict(done, batch, workers)
        resumed = stream()
        resumed.load_state_dict(state)
        if done == len(epoch):
            assert state["epoch"] == 4 and state["batches"] == 0  # the epoch was finished: the next one, whole
            original.set_epoch(4)
            assert batches(resumed) == batches(original)
            original.set_epoch(3)
        else:
            assert resumed.epoch == 3 and batches(resumed) == epoch[done:], done
            resumed.set_epoch(4)  # the resume applies to its own epoch only
            original.set_epoch(4)
            assert batches(resumed) == batches(original)
            original.set_epoch(3)


def test_streaming_resume_with_another_worker_count_is_refused(wds_shards) -> None:
    local, _, _ = wds_shards
    stream = ShardStream(str(local / "index.json"), rank=0, world_size=1, decode=False)
    stream.load_state_dict(stream.state_dict(2, 3, num_workers=2))
    loader = DataLoader(stream, batch_size=3, num_workers=0, collate_fn=keys)
    with pytest.raises(ConfigError, match="saved with 2 DataLoader worker"):
        list(loader)


def stream_gang(local: Path, world: int, state: dict | None, shuffle_buffer: int) -> list[ShardStream]:
    """Every rank's stream of a gang of `world`, resumed from rank 0's checkpointed `state`."""
    streams = [ShardStream(str(local / "index.json"), rank=r, world_size=world, seed=4, shuffle_buffer=shuffle_buffer,
                           decode=False) for r in range(world)]
    for stream in streams:
        stream.set_epoch(2)
        if state is not None:
            stream.load_state_dict(state)
    return streams


def stream_steps(streams: list[ShardStream], workers: int, batch: int, steps: int | None,
                 seen: dict[int, list[str]]) -> dict:
    """Every rank takes `steps` batches (None: to the epoch's end), as DDP does, through a DataLoader
    with `workers`, adding their keys to seen[rank]; rank 0's state after, as a checkpoint keeps it."""
    start, counts = streams[0].start_batch, set()
    for rank, stream in enumerate(streams):
        assert stream.start_batch == start
        loader = DataLoader(stream, batch_size=batch, num_workers=workers, collate_fn=keys,
                            multiprocessing_context="fork" if workers else None)
        taken = list(itertools.islice(loader, steps))
        counts.add(len(taken))
        seen.setdefault(rank, []).extend(key for b in taken for key in b)
    assert len(counts) == 1  # every rank as many batches
    return streams[0].state_dict(start + counts.pop(), batch, workers)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("shuffle_buffer", [0, 4])
def test_an_epoch_streamed_at_other_world_sizes_yields_each_sample_at_most_once(wds_shards, shuffle_buffer: int) -> None:
    """35 samples: 3 ranks take 2 batches of 2 (2 workers), the gang shrinks to 2 (1 worker, batches of
    3) for 1 batch, grows to 4 (3 workers) and ends the epoch. No sample twice; left out only what
    the last size cannot split (35 - 12 - 6 = 17 samples over 4 ranks: 1), as any epoch leaves out
    fewer than its world size."""
    local, _, _ = wds_shards
    by_rank: dict[int, list[str]] = {}
    state = stream_steps(stream_gang(local, 3, None, shuffle_buffer), 2, 2, 2, by_rank)
    assert (state["world_size"], state["batches"], state["segments"]) == (3, 2, [])
    state = stream_steps(stream_gang(local, 2, state, shuffle_buffer), 1, 3, 1, by_rank)
    assert state["segments"] == [[3, 2, 2, 2]] and state["batches"] == 1
    last = stream_gang(local, 4, state, shuffle_buffer)
    assert len(last[0]) == (35 - 12 - 6) // 4 and last[0].start_batch == 0
    final = stream_steps(last, 3, 2, None, by_rank)
    seen = [key for keys_of_rank in by_rank.values() for key in keys_of_rank]
    assert len(seen) == len(set(seen)) == 35 - 1
    assert (final["epoch"], final["batches"], final["segments"]) == (3, 0, [])
    # The samples are the epoch's: those a single rank streams, but one.
    whole = [key for b in DataLoader(stream_gang(local, 1, None, shuffle_buffer)[0], batch_size=5, collate_fn=keys)
             for key in b]
    assert set(seen) < set(whole) and len(whole) == 35


def test_a_resized_epoch_resumes_at_its_new_size_too_and_a_state_from_before_sizes_were_kept_loads(wds_shards) -> None:
    local, _, _ = wds_shards
    before: dict[int, list[str]] = {}
    state = stream_steps(stream_gang(local, 2, None, 4), 2, 2, 2, before)
    expected: dict[int, list[str]] = {}
    stream_steps(stream_gang(local, 3, state, 4), 2, 2, None, expected)  # the rest of the epoch at 3, in one go
    again: dict[int, list[str]] = {}
    resumed = stream_steps(stream_gang(local, 3, state, 4), 2, 2, 1, again)  # or with a restart at 3 after a batch
    stream_steps(stream_gang(local, 3, resumed, 4), 2, 2, None, again)
    assert again == expected  # each rank the same samples in the same order
    assert not {k for keys_of_rank in before.values() for k in keys_of_rank} & {k for v in expected.values() for k in v}
    old = {key: value for key, value in state.items() if key not in ("world_size", "segments")}
    plain = stream_gang(local, 3, old, 4)[0]
    assert plain.start_batch == old["batches"] and len(plain) == 35 // 3


@pytest.mark.timeout(120)
def test_streaming_ddp_with_uneven_shards_does_not_hang(wds_shards, s3_env) -> None:
    _, bucket, _ = wds_shards
    env = {**s3_env, "WL_INDEX": f"s3://{bucket}/sets/wds/index.json", "DDP_INIT_TIMEOUT_SECONDS": "30"}
    results = launch("ddp_workloads:stream_train", 3, env, timeout=90)
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr[-3000:] for r in results]
    quota = sum(SHARD_SIZES) // 3  # 11 -> workers get 6 and 5 -> 3 + 3 batches of 2
    for r in results:
        assert f"rank {r.rank} epoch 0 batches 6" in r.stdout and f"rank {r.rank} epoch 1 batches 6" in r.stdout
    assert quota == 11


@pytest.mark.timeout(300)
def test_streaming_ddp_killed_mid_epoch_resumes_to_the_same_parameters(wds_shards, s3_env, tmp_path: Path) -> None:
    _, bucket, _ = wds_shards
    base = {**s3_env, "WL_INDEX": f"s3://{bucket}/sets/wds/index.json", "DDP_INIT_TIMEOUT_SECONDS": "30",
            "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAMESPACE": "team-s", "WL_CKPT_EVERY": "3"}
    straight = launch("ddp_workloads:stream_train", 3,
                      {**base, "DDP_JOB_NAME": "straight", "WL_OUT": str(tmp_path / "a.pt")}, timeout=120)
    assert [r.returncode for r in straight] == [0, 0, 0], [r.stderr[-3000:] for r in straight]

    # 6 batches an epoch: killed at step 5, the last checkpoint is step 3, mid-epoch 0 (worker 1's turn next).
    crashy = {**base, "DDP_JOB_NAME": "crashy", "WL_OUT": str(tmp_path / "b.pt")}
    first = launch("ddp_workloads:stream_train", 3, {**crashy, "WL_CRASH_AT_STEP": "5"}, timeout=120)
    assert first[0].returncode == -9
    second = launch("ddp_workloads:stream_train", 3, crashy, timeout=120)
    assert [r.returncode for r in second] == [0, 0, 0], [r.stderr[-3000:] for r in second]
    assert "rank 0 resumed from step 3 (epoch 0, batch 3)" in second[0].stdout
    assert "rank 0 epoch 0 batches 3" in second[0].stdout  # the other 3 batches of epoch 0, not 6
    expected, resumed = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name


@pytest.mark.parametrize("part_bytes, ahead", [("8388608", "3"), ("4096", "2"), ("4096", "0")])
def test_webdataset_shards_stream_back_identically(wds_shards, monkeypatch, part_bytes: str, ahead: str) -> None:
    """Also with shards fetched as many small ranged parts (4 KB: every member spans a part boundary)."""
    monkeypatch.setenv(envnames.S3_READ_PART_BYTES, part_bytes)
    monkeypatch.setenv(envnames.S3_READ_AHEAD, ahead)
    theirs, index = webdataset_and_index(*wds_shards)
    streamed = list(ShardStream(index, rank=0, world_size=1, shuffle=False))
    assert len(streamed) == len(theirs)
    for ours, expected in zip(streamed, theirs, strict=True):
        assert_same_sample(ours, expected)


def test_a_corrupt_shard_is_named_by_the_stream(wds_shards) -> None:
    _, bucket, _ = wds_shards
    prefix = "sets/wds"
    s3.put_bytes(s3.S3Url(bucket, f"{prefix}/part-001.tar"), b"\x00garbage" * 300)
    stream = ShardStream(f"s3://{bucket}/{prefix}/index.json", rank=0, world_size=1, shuffle=False)
    with pytest.raises(CorruptDataError, match=f"shard s3://{bucket}/{prefix}/part-001.tar"):
        list(stream)


def test_resume_with_in_order_false_is_exact_with_one_worker_and_refused_with_more(wds_shards) -> None:
    local, _, _ = wds_shards

    def stream() -> ShardStream:
        return ShardStream(str(local / "index.json"), rank=0, world_size=1, seed=2, decode=False)

    def loader(source: ShardStream, workers: int) -> DataLoader:
        return DataLoader(source, batch_size=3, num_workers=workers, collate_fn=keys, in_order=False,
                          multiprocessing_context="fork" if workers else None)

    original = stream()
    epoch = list(loader(original, 1))  # one worker: its batches come in order whatever in_order says
    assert len(epoch) == original.batches_per_epoch(3, 1)
    for done in (0, 4, len(epoch) - 1):
        resumed = stream()
        resumed.load_state_dict(original.loader_state_dict(loader(original, 1), done))
        assert list(loader(resumed, 1)) == epoch[done:], done

    with pytest.raises(ConfigError, match="in_order=False and 2 workers.*use in_order=True"):
        original.loader_state_dict(loader(original, 2), 4)
    with pytest.raises(ConfigError, match="in_order=False"):
        original.state_dict(4, 3, num_workers=2, in_order=False)
    assert original.loader_state_dict(DataLoader(original, batch_size=3, num_workers=2), 4) == original.state_dict(4, 3, 2)
