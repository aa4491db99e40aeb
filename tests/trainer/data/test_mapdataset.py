"""ShardedDataset and PrefetchingSampler over shards written by webdataset, in S3."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
from shardhelp import assert_same_sample, upload_wds_shards, webdataset_and_index
from torch.utils.data import DataLoader

from ddp_contract import envnames
from ddp_trainer.data import mapdataset
from ddp_trainer.data.mapdataset import ShardedDataset
from ddp_trainer.data.sampler import DistributedChunkedSampler
from ddp_trainer.data.shardcache import ShardCache
from ddp_trainer.data.shardindex import load_index
from ddp_trainer.errors import CorruptDataError, ObjectNotFoundError
from ddp_trainer.storage import s3
from waiting import wait_until


@pytest.fixture
def wds_shards(tmp_path: Path, bucket: str) -> tuple[Path, str, list[dict]]:
    return upload_wds_shards(tmp_path, bucket)


def test_member_tables_are_worked_out_once_per_cache(wds_shards, tmp_path: Path, monkeypatch) -> None:
    local, bucket, _ = wds_shards
    index = load_index(f"s3://{bucket}/sets/wds/index.json")
    first = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)
    expected = [first[i] for i in range(len(first))]
    first.close()

    def no_parsing(*args, **kwargs):
        raise AssertionError("the shard was parsed again")

    with monkeypatch.context() as patch:
        patch.setattr(mapdataset, "member_table", no_parsing)
        second = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)  # another process would do the same
        assert [second[i] for i in range(len(second))] == expected
        second.close()

    table = Path(first.cache.path_for(index.shards[1].url) + ShardCache.TABLE_SUFFIX)
    table.write_text(json.dumps({"size": 1, "samples": []}))  # not this shard's: ignored and rewritten
    third = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)
    assert [third[i] for i in range(len(third))] == expected
    assert json.loads(table.read_text())["size"] == (local / "part-001.tar").stat().st_size
    third.close()


def test_map_style_with_dataloader_workers(wds_shards, tmp_path: Path) -> None:
    _, bucket, _ = wds_shards
    dataset = ShardedDataset(
        f"s3://{bucket}/sets/wds/index.json",
        cache_dir=str(tmp_path / "cache"),
        transform=lambda s: (torch.tensor(s["npy"]), s["cls"]),
    )
    sampler = DistributedChunkedSampler(dataset, num_replicas=1, rank=0, chunksize=5, seed=3)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2, multiprocessing_context="fork")
    firsts = torch.cat([x[:, 0] for x, _ in loader]).long().tolist()
    assert firsts == list(sampler)  # npy[0] == sample number
    assert sorted(firsts) == list(range(len(dataset)))


def test_map_style_in_spawned_workers(wds_shards, tmp_path: Path) -> None:
    _, bucket, _ = wds_shards
    dataset = ShardedDataset(f"s3://{bucket}/sets/wds/index.json", cache_dir=str(tmp_path / "cache"), decode=False)
    assert dataset[0]["__key__"] == "s00000"  # the parent holds an open shard and a lock: neither may travel
    loader = DataLoader(dataset, batch_size=5, num_workers=2, collate_fn=list, multiprocessing_context="spawn")
    assert [sample["__key__"] for batch in loader for sample in batch] == [f"s{i:05d}" for i in range(len(dataset))]
    dataset.close()


def test_threads_sharing_a_map_style_dataset_read_the_right_samples(wds_shards, tmp_path: Path) -> None:
    """Threads hopping between shards make the dataset close files (2 kept open) while others read."""
    from concurrent.futures import ThreadPoolExecutor

    _, bucket, written = wds_shards
    dataset = ShardedDataset(f"s3://{bucket}/sets/wds/index.json", cache_dir=str(tmp_path / "cache"), decode=False)
    expected = {i: dataset[i] for i in range(len(dataset))}
    order = [i for _ in range(40) for i in random.Random(7).sample(range(len(dataset)), len(dataset))]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(dataset.__getitem__, order))
    assert got == [expected[i] for i in order]
    dataset.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_prefetching_sampler_downloads_the_next_shards_ahead(wds_shards, tmp_path: Path, workers: int) -> None:
    _, bucket, _ = wds_shards
    dataset = ShardedDataset(
        f"s3://{bucket}/sets/wds/index.json", cache_dir=str(tmp_path / "cache"), transform=lambda s: int(s["npy"][0])
    )
    sampler = DistributedChunkedSampler(dataset, num_replicas=1, rank=0, chunksize=4, seed=5)
    shard_order = list(dict.fromkeys(dataset.locate(i)[0].url for i in sampler))  # shards in the order first used
    prefetching = dataset.prefetching(sampler, shards_ahead=2)
    assert len(prefetching) == len(sampler)

    drawn = iter(prefetching)
    first = next(drawn)
    assert dataset.locate(first)[0].url == shard_order[0]
    cached = [dataset.cache.path_for(url) for url in shard_order]
    wait_until(lambda: all(os.path.exists(path) for path in cached[:3]), 30, "the shard in use and the next two cached",
               interval=0.05)
    assert not any(os.path.exists(path) for path in cached[3:])  # nothing further ahead
    assert [first, *drawn] == list(sampler)

    sampler.set_epoch(1)  # the wrapped sampler's epoch is used
    loader = DataLoader(dataset, batch_size=3, sampler=prefetching, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    assert torch.cat(list(loader)).tolist() == list(sampler) != list(range(len(dataset)))


@pytest.mark.parametrize("part_bytes, ahead", [("8388608", "3"), ("4096", "2"), ("4096", "0")])
def test_webdataset_shards_read_back_identically(wds_shards, tmp_path: Path, monkeypatch, part_bytes: str, ahead: str) -> None:
    """Also with shards fetched as many small ranged parts (4 KB: every member spans a part boundary)."""
    monkeypatch.setenv(envnames.S3_READ_PART_BYTES, part_bytes)
    monkeypatch.setenv(envnames.S3_READ_AHEAD, ahead)
    theirs, index = webdataset_and_index(*wds_shards)
    assert index.shards[1].url == f"s3://{wds_shards[1]}/sets/wds/part-001.tar"
    mapped = ShardedDataset(index, cache_dir=str(tmp_path / "cache"))
    assert len(mapped) == len(theirs)
    for i, expected in enumerate(theirs):
        assert_same_sample(mapped[i], expected)
    assert mapped[8]["json"] == {"n": 8, "tag": "t8"} and mapped[8]["cls"] == 0


def test_corrupt_truncated_and_missing_shards_name_their_key(wds_shards, tmp_path: Path) -> None:
    local, bucket, _ = wds_shards
    prefix = "sets/wds"
    good = (local / "part-001.tar").read_bytes()
    s3.put_bytes(s3.S3Url(bucket, f"{prefix}/part-001.tar"), b"\x00garbage" * 300)
    dataset = ShardedDataset(f"s3://{bucket}/{prefix}/index.json", cache_dir=str(tmp_path / "c1"))
    with pytest.raises(CorruptDataError, match=f"shard s3://{bucket}/{prefix}/part-001.tar"):
        dataset[8]

    # A truncated shard has fewer samples than the index promises (would unbalance ranks).
    s3.put_bytes(s3.S3Url(bucket, f"{prefix}/part-001.tar"), good[: len(good) // 2])
    dataset = ShardedDataset(f"s3://{bucket}/{prefix}/index.json", cache_dir=str(tmp_path / "c2"))
    with pytest.raises(CorruptDataError, match="part-001.tar holds [0-9] samples but the index says 3"):
        dataset[8]

    s3.client().delete_object(Bucket=bucket, Key=f"{prefix}/part-002.tar")
    with pytest.raises(ObjectNotFoundError, match=f"s3://{bucket}/{prefix}/part-002.tar: object does not exist"):
        dataset[12]


def test_a_missing_local_shard_is_named(wds_shards, tmp_path: Path) -> None:
    local, _, _ = wds_shards
    (local / "part-002.tar").unlink()
    dataset = ShardedDataset(str(local / "index.json"), cache_dir=str(tmp_path / "unused-cache"))
    with pytest.raises(ObjectNotFoundError, match=f"shard {local / 'part-002.tar'} does not exist"):
        dataset[12]
    assert dataset[0]["__key__"] == "s00000" and not (tmp_path / "unused-cache").exists()  # read in place


def _png_and_class(sample: dict) -> tuple[tuple[int, int], int]:
    return sample[".png"].size, sample[".cls"]


def _plus_one(pair: tuple[tuple[int, int], int]) -> tuple[tuple[int, int], int]:
    return pair[0], pair[1] + 1


def test_wids_shard_list_dataset_by_its_import(wds_shards, tmp_path: Path) -> None:
    """wids' `wids.ShardListDataset(url, cache_dir=..., keep=True).add_transform(make_sample)`,
    with its dotted keys, in DataLoader workers with the chunked sampler."""
    from ddp_trainer import ShardListDataset

    _, bucket, written = wds_shards
    dataset = ShardListDataset(f"s3://{bucket}/sets/wds/index.json", cache_dir=str(tmp_path / "cache"), keep=True)
    raw = dataset[5]
    assert {".png", ".cls", ".json", ".txt", ".npy", "__key__"} <= raw.keys()
    assert raw[".cls"] == written[5]["cls"] and raw[".txt"] == written[5]["txt"]
    assert dataset.add_transform(_png_and_class).add_transform(_plus_one) is dataset
    sampler = DistributedChunkedSampler(dataset, num_replicas=1, rank=0, chunksize=7, shuffle=True)
    loader = DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=2)
    got = sorted((list(size), cls) for size, cls in loader)
    assert got == sorted(([*written[i]["png"].size], written[i]["cls"] + 1) for i in range(len(written)))

    def broken(pair: tuple) -> None:
        raise KeyError(".jpg")

    dataset.add_transform(broken)
    with pytest.raises(KeyError) as failed:
        dataset[3]
    assert f"in sample {written[3]['__key__']!r} of shard" in "".join(failed.value.__notes__)
