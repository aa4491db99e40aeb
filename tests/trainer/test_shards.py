"""Indexed tar shards: webdataset interop, cache, sampler, streaming, converter, failures."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import pickle
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from conftest import CONTRACT_SRC, ROOT, TRAINER_SRC
from ddp_contract import envnames
from ddp_trainer import env, readahead, s3
from ddp_trainer.errors import ConfigError, CorruptDataError, ObjectNotFoundError
from ddp_trainer.sampler import DistributedChunkedSampler
from ddp_trainer.shardcache import ShardCache
from ddp_trainer.shards import ShardedDataset, ShardStream, load_index, resolve, write_index
from test_imagefolder import upload_tree, write_tree

SHARD_SIZES = [7, 3, 11, 5, 9]  # uneven on purpose


def _image(i: int) -> Image.Image:
    return Image.new("RGB", (4 + i % 3, 3), color=(i * 5 % 256, 100, 255 - i))


def write_webdataset_shards(directory: Path) -> list[dict]:
    """Shards written by the real webdataset library, plus a wids index; returns the samples."""
    import webdataset as wds

    directory.mkdir(parents=True, exist_ok=True)
    samples, shard_list, n = [], [], 0
    for shard_no, size in enumerate(SHARD_SIZES):
        name = f"part-{shard_no:03d}.tar"
        with wds.TarWriter(str(directory / name)) as sink:
            for _ in range(size):
                sample = {
                    "__key__": f"s{n:05d}",
                    "png": _image(n),
                    "cls": n % 4,
                    "json": {"n": n, "tag": f"t{n}"},
                    "txt": f"caption {n}",
                    "npy": np.arange(n, n + 3, dtype=np.float32),
                }
                sink.write(sample)
                samples.append(sample)
                n += 1
        shard_list.append((name, size))
    write_index(str(directory / "index.json"), shard_list)
    return samples


@pytest.fixture
def wds_shards(tmp_path: Path, bucket: str) -> tuple[Path, str, list[dict]]:
    local = tmp_path / "wds"
    samples = write_webdataset_shards(local)
    for path in local.iterdir():
        s3.put_bytes(s3.S3Url(bucket, f"sets/wds/{path.name}"), path.read_bytes())
    return local, bucket, samples


def _same(ours: dict, theirs: dict) -> None:
    assert ours["__key__"] == theirs["__key__"]
    fields = {k for k in theirs if not k.startswith("__")}
    assert {k for k in ours if not k.startswith("__")} == fields
    for field in fields:
        a, b = ours[field], theirs[field]
        if isinstance(b, Image.Image):
            assert a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes(), (ours["__key__"], field)
        elif isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), (ours["__key__"], field)
        else:
            assert a == b, (ours["__key__"], field)


def test_index_urls_resolve_against_the_index() -> None:
    assert resolve("s3://b/data/idx/index.json", "shard-0.tar") == "s3://b/data/idx/shard-0.tar"
    assert resolve("s3://b/data/idx/index.json", "../other/s.tar") == "s3://b/data/other/s.tar"
    assert resolve("s3://b/i.json", "s3://c/x.tar") == "s3://c/x.tar"
    assert resolve("/data/index.json", "sub/s.tar") == "/data/sub/s.tar"


@pytest.mark.parametrize("part_bytes, ahead", [("8388608", "3"), ("4096", "2"), ("4096", "0")])
def test_webdataset_shards_read_back_identically(wds_shards, tmp_path: Path, monkeypatch, part_bytes: str, ahead: str) -> None:
    """Also with shards fetched as many small ranged parts (4 KB: every member spans a part boundary)."""
    import webdataset as wds

    monkeypatch.setenv(envnames.S3_READ_PART_BYTES, part_bytes)
    monkeypatch.setenv(envnames.S3_READ_AHEAD, ahead)

    local, bucket, written = wds_shards
    urls = [str(local / f"part-{i:03d}.tar") for i in range(len(SHARD_SIZES))]
    theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil"))
    assert len(theirs) == sum(SHARD_SIZES) == len(written)

    index = load_index(f"s3://{bucket}/sets/wds/index.json")
    assert index.shards[1].url == f"s3://{bucket}/sets/wds/part-001.tar"
    mapped = ShardedDataset(index, cache_dir=str(tmp_path / "cache"))
    assert len(mapped) == len(theirs)
    for i, expected in enumerate(theirs):
        _same(mapped[i], expected)
    assert mapped[8]["json"] == {"n": 8, "tag": "t8"} and mapped[8]["cls"] == 0

    streamed = list(ShardStream(index, rank=0, world_size=1, shuffle=False))
    assert len(streamed) == len(theirs)
    for ours, expected in zip(streamed, theirs):
        _same(ours, expected)


def test_cache_is_bounded_and_evicts_least_recently_used(wds_shards, tmp_path: Path) -> None:
    _, bucket, _ = wds_shards
    index = load_index(f"s3://{bucket}/sets/wds/index.json")
    shard_bytes = max(s3.head(s3.parse_uri(s.url))["ContentLength"] for s in index.shards)
    limit = int(shard_bytes * 2.5)
    dataset = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), cache_limit_bytes=limit)
    keys = [dataset[i]["__key__"] for i in range(len(dataset))]
    assert keys == [f"s{i:05d}" for i in range(len(dataset))]
    cache = dataset.cache
    assert cache.size_bytes() <= limit
    files = sorted(p for p in Path(cache.directory).iterdir() if p.is_file() and p.suffix == ".tar")
    assert 1 <= len(files) < len(index.shards)
    assert cache.path_for(index.shards[-1].url) in map(str, files)  # the newest stays
    tables = {str(p)[: -len(ShardCache.TABLE_SUFFIX)] for p in Path(cache.directory).glob("*" + ShardCache.TABLE_SUFFIX)}
    assert tables == set(map(str, files))  # each cached shard has its member table, evicted ones took theirs along
    assert dataset[0]["__key__"] == "s00000"  # evicted shard fetched again
    assert Path(cache.path_for(index.shards[0].url)).exists()


def test_member_tables_are_worked_out_once_per_cache(wds_shards, tmp_path: Path, monkeypatch) -> None:
    from ddp_trainer import shards

    local, bucket, _ = wds_shards
    index = load_index(f"s3://{bucket}/sets/wds/index.json")
    first = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)
    expected = [first[i] for i in range(len(first))]
    first.close()

    def no_parsing(*args, **kwargs):
        raise AssertionError("the shard was parsed again")

    with monkeypatch.context() as patch:
        patch.setattr(shards, "member_table", no_parsing)
        second = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)  # another process would do the same
        assert [second[i] for i in range(len(second))] == expected
        second.close()

    table = Path(first.cache.path_for(index.shards[1].url) + ShardCache.TABLE_SUFFIX)
    table.write_text(json.dumps({"size": 1, "samples": []}))  # not this shard's: ignored and rewritten
    third = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)
    assert [third[i] for i in range(len(third))] == expected
    assert json.loads(table.read_text())["size"] == (local / "part-001.tar").stat().st_size
    third.close()


def test_processes_asking_for_one_shard_at_once_download_it_once(wds_shards, tmp_path: Path, monkeypatch) -> None:
    _, bucket, _ = wds_shards
    url = load_index(f"s3://{bucket}/sets/wds/index.json").shards[2].url
    context = multiprocessing.get_context("fork")
    downloads, barrier = context.Value("i", 0), context.Barrier(4)
    real_download = readahead.download

    def counted_download(*args, **kwargs):
        with downloads.get_lock():
            downloads.value += 1
        time.sleep(0.3)  # a slow link: the others ask while this download runs
        return real_download(*args, **kwargs)

    monkeypatch.setattr(readahead, "download", counted_download)
    cache = ShardCache(str(tmp_path / "cache"), limit_bytes=1 << 30)

    def fetch() -> None:
        barrier.wait()
        path = cache.get(url)
        os._exit(0 if Path(path).read_bytes() == s3.get_bytes(s3.parse_uri(url)) else 1)

    processes = [context.Process(target=fetch) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
    assert [p.exitcode for p in processes] == [0, 0, 0, 0]
    assert downloads.value == 1
    assert cache.size_bytes() == len(s3.get_bytes(s3.parse_uri(url)))


def test_a_process_forked_during_a_download_is_not_locked_out(wds_shards, tmp_path: Path, monkeypatch) -> None:
    """A prefetch thread downloads (holding the shard's lock) when the DataLoader forks a worker
    that wants the same shard: the worker waits for that download, then goes on."""
    import threading

    _, bucket, _ = wds_shards
    url = load_index(f"s3://{bucket}/sets/wds/index.json").shards[1].url
    real_download, downloading = readahead.download, threading.Event()

    def slow_download(*args, **kwargs):
        downloading.set()
        time.sleep(1.0)
        return real_download(*args, **kwargs)

    monkeypatch.setattr(readahead, "download", slow_download)
    cache = ShardCache(str(tmp_path / "cache"), limit_bytes=1 << 30)
    s3.client()  # the parent's client exists before the thread: only the lock is in play here
    downloader = threading.Thread(target=cache.get, args=(url,))
    downloader.start()
    assert downloading.wait(10)

    def worker() -> None:
        path = cache.get(url)
        os._exit(0 if Path(path).read_bytes() == s3.get_bytes(s3.parse_uri(url)) else 1)

    child = multiprocessing.get_context("fork").Process(target=worker)
    child.start()  # forked while the download holds the lock
    downloader.join(30)
    child.join(30)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0


def test_a_client_lock_held_at_fork_does_not_block_the_child(s3_env) -> None:
    def worker() -> None:
        s3.client()  # would wait forever on the lock copied in its held state
        os._exit(0)

    s3.reset_clients()
    with s3._clients_lock:  # as a thread of the parent making its first client would at fork time
        child = multiprocessing.get_context("fork").Process(target=worker)
        child.start()
    child.join(30)
    if child.exitcode is None:
        child.kill()
    assert child.exitcode == 0


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
    deadline = time.monotonic() + 30
    while not all(os.path.exists(path) for path in cached[:3]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(os.path.exists(path) for path in cached[:3])  # the shard in use and the next two
    assert not any(os.path.exists(path) for path in cached[3:])  # nothing further ahead
    assert [first, *drawn] == list(sampler)

    sampler.set_epoch(1)  # the wrapped sampler's epoch is used
    loader = DataLoader(dataset, batch_size=3, sampler=prefetching, num_workers=workers, multiprocessing_context="fork" if workers else None)
    assert torch.cat(list(loader)).tolist() == list(sampler) != list(range(len(dataset)))


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


def _keys(samples: list[dict]) -> list[str]:
    return [sample["__key__"] for sample in samples]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_persistent_workers_reshuffle_every_epoch(wds_shards, start_method: str) -> None:
    local, _, _ = wds_shards
    stream = ShardStream(str(local / "index.json"), rank=0, world_size=1, seed=5, shuffle_buffer=4, decode=False)
    expected = []
    for epoch in (0, 1, 2):  # what fresh workers give each epoch
        stream.set_epoch(epoch)
        expected.append(list(DataLoader(stream, batch_size=3, num_workers=2, collate_fn=_keys, multiprocessing_context="fork")))
    assert expected[0] != expected[1] != expected[2]

    loader = DataLoader(
        stream, batch_size=3, num_workers=2, collate_fn=_keys, multiprocessing_context=start_method, persistent_workers=True
    )
    for epoch in (0, 1, 2):
        stream.set_epoch(epoch)
        assert list(loader) == expected[epoch]
    copied = pickle.loads(pickle.dumps(stream))  # outside a worker's start: a copy with its own epoch
    copied.set_epoch(7)
    assert (copied.epoch, stream.epoch) == (7, 2)


def test_resume_plan_follows_the_dataloaders_round_robin() -> None:
    from ddp_trainer.shards import resume_plan

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
        loader = DataLoader(source, batch_size=batch, num_workers=workers, collate_fn=_keys,
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
    loader = DataLoader(stream, batch_size=3, num_workers=0, collate_fn=_keys)
    with pytest.raises(ConfigError, match="saved with 2 DataLoader worker"):
        list(loader)


def test_corrupt_truncated_and_missing_shards_name_their_key(wds_shards, tmp_path: Path) -> None:
    local, bucket, _ = wds_shards
    prefix = "sets/wds"
    good = (local / "part-001.tar").read_bytes()
    s3.put_bytes(s3.S3Url(bucket, f"{prefix}/part-001.tar"), b"\x00garbage" * 300)
    dataset = ShardedDataset(f"s3://{bucket}/{prefix}/index.json", cache_dir=str(tmp_path / "c1"))
    with pytest.raises(CorruptDataError, match=f"shard s3://{bucket}/{prefix}/part-001.tar"):
        dataset[8]
    stream = ShardStream(f"s3://{bucket}/{prefix}/index.json", rank=0, world_size=1, shuffle=False)
    with pytest.raises(CorruptDataError, match=f"shard s3://{bucket}/{prefix}/part-001.tar"):
        list(stream)

    # A truncated shard has fewer samples than the index promises (would unbalance ranks).
    s3.put_bytes(s3.S3Url(bucket, f"{prefix}/part-001.tar"), good[: len(good) // 2])
    dataset = ShardedDataset(f"s3://{bucket}/{prefix}/index.json", cache_dir=str(tmp_path / "c2"))
    with pytest.raises(CorruptDataError, match="part-001.tar holds [0-9] samples but the index says 3"):
        dataset[8]

    s3.client().delete_object(Bucket=bucket, Key=f"{prefix}/part-002.tar")
    with pytest.raises(ObjectNotFoundError, match=f"s3://{bucket}/{prefix}/part-002.tar: object does not exist"):
        dataset[12]
    with pytest.raises(ObjectNotFoundError, match=f"s3://{bucket}/sets/missing/index.json"):
        load_index(f"s3://{bucket}/sets/missing/index.json")
    s3.put_bytes(s3.S3Url(bucket, "sets/bad/index.json"), b'{"shardlist": []}')
    with pytest.raises(CorruptDataError, match=f"s3://{bucket}/sets/bad/index.json is not a valid wids index"):
        load_index(f"s3://{bucket}/sets/bad/index.json")


def test_make_shards_command_from_local_folder_to_s3(tmp_path: Path, bucket: str, s3_env) -> None:
    import webdataset as wds

    images = tmp_path / "images"
    write_tree(images)
    env = {**s3_env, "PYTHONPATH": os.pathsep.join([str(CONTRACT_SRC), str(TRAINER_SRC)]), "PATH": "/usr/bin:/bin"}
    dest = f"s3://{bucket}/shards/v1"
    result = subprocess.run(
        [sys.executable, "-m", "ddp_trainer", "make-shards", str(images), dest, "--samples-per-shard", "3"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{dest}/index.json"
    assert "make-shards [" in result.stderr and "8/8" in result.stderr  # progress bar

    folder = ImageFolder(str(images))
    index = load_index(f"{dest}/index.json")
    assert [s.nsamples for s in index.shards] == [3, 3, 2]
    assert index.extra["classes"] == folder.classes
    dataset = ShardedDataset(index, cache_dir=str(tmp_path / "cache"), decode=False)
    by_path = {Path(p).relative_to(images).as_posix(): t for p, t in folder.samples}
    got = {}
    for i in range(len(dataset)):
        sample = dataset[i]
        meta = json.loads(sample["json"])
        image_ext = next(k for k in sample if k not in ("__key__", "__url__", "json", "cls"))
        assert sample[image_ext] == (images / meta["path"]).read_bytes()
        got[meta["path"]] = int(sample["cls"])
    assert got == by_path

    # ...and the webdataset library reads our shards too.
    local = tmp_path / "ours"
    local.mkdir()
    for shard in index.shards:
        (local / Path(shard.url).name).write_bytes(s3.get_bytes(s3.parse_uri(shard.url)))
    theirs = list(wds.WebDataset(sorted(map(str, local.iterdir())), shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in theirs] == [dataset[i]["__key__"] for i in range(len(dataset))]


def test_make_shards_from_s3_source(tmp_path: Path, bucket: str) -> None:
    from ddp_trainer.convert import make_shards

    images = tmp_path / "images"
    write_tree(images)
    upload_tree(images, bucket, "raw")
    out = io.StringIO()
    index_url = make_shards(f"s3://{bucket}/raw", str(tmp_path / "out"), samples_per_shard=5, progress=out)
    assert index_url == str(tmp_path / "out" / "index.json")
    dataset = ShardedDataset(index_url, cache_dir=str(tmp_path / "unused-cache"))
    assert Counter(dataset[i]["cls"] for i in range(len(dataset))) == Counter(ImageFolder(str(images)).targets)
    assert "8/8" in out.getvalue()
    assert not (tmp_path / "unused-cache").exists()  # local shards are read in place


@pytest.mark.timeout(120)
def test_streaming_ddp_with_uneven_shards_does_not_hang(wds_shards, s3_env) -> None:
    from conftest import launch

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
    from conftest import launch

    _, bucket, _ = wds_shards
    base = {**s3_env, "WL_INDEX": f"s3://{bucket}/sets/wds/index.json", "DDP_INIT_TIMEOUT_SECONDS": "30",
            "DDP_RESULTS_URI": f"s3://{bucket}/runs", "DDP_JOB_NAMESPACE": "team-s", "WL_CKPT_EVERY": "3"}
    straight = launch("ddp_workloads:stream_train", 3, {**base, "DDP_JOB_NAME": "straight", "WL_OUT": str(tmp_path / "a.pt")}, timeout=120)
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


def _tar_bytes(fmt: int, members: list[tuple[str, bytes | None]], compress: str = "") -> bytes:
    """A tar of `members` ((name, data) files, (name, None) directories) plus a symlink."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=f"w:{compress}", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("a-link.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "s0.txt"
        tar.addfile(link)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt_name", ["USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT"])
@pytest.mark.parametrize("compress", ["", "gz", "bz2", "xz"])
def test_tar_reader_matches_tarfile(tmp_path: Path, fmt_name: str, compress: str) -> None:
    import tarfile

    from ddp_trainer.shards import iter_shard

    long_dir = "d" * 120 if fmt_name != "USTAR_FORMAT" else "p" * 90  # ustar splits into prefix/name
    members: list[tuple[str, bytes | None]] = [("__meta__", b"{}"), ("dir/", None)]
    for i in range(6):
        stem = f"{long_dir}/k{i}" if i % 2 else f"s{i}"
        if fmt_name == "PAX_FORMAT" and i == 3:
            stem = f"dir/ünï{i}"
        members += [(f"{stem}.txt", f"t{i}".encode()), (f"{stem}.SEG.png", bytes(range(i * 97 % 256)) * 9), (f"{stem}.cls", b"")]
    path = tmp_path / f"s.tar{'.' + compress if compress else ''}"
    path.write_bytes(_tar_bytes(getattr(tarfile, fmt_name), members, compress))

    with tarfile.open(path, "r:*") as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar if m.isreg() and m.name != "__meta__"]
    got = [(s["__key__"] + "." + ext, s[ext]) for s in iter_shard(str(path), 6) for ext in s if not ext.startswith("__")]
    assert [(n.rsplit(".", 2)[0] if n.endswith(".png") else n.rsplit(".", 1)[0]) for n, _ in got] == [
        (n.rsplit(".", 2)[0] if n.endswith(".png") else n.rsplit(".", 1)[0]) for n, _ in expected
    ]
    assert sorted(d for _, d in got) == sorted(d for _, d in expected)
    samples = list(iter_shard(str(path), 6))
    assert samples[3]["seg.png"] == bytes(range(3 * 97 % 256)) * 9 and samples[4]["cls"] == b""
    assert [s["__key__"] for s in iter_shard(str(path), 6, skip=2, stop=4)] == [s["__key__"] for s in samples[2:4]]
    if not compress:
        mapped = ShardedDataset(
            load_index_for(tmp_path, path.name, 6), cache_dir=str(tmp_path / "cache"), decode=False
        )
        assert [mapped[i] for i in range(6)] == samples


def load_index_for(directory: Path, name: str, nsamples: int):
    write_index(str(directory / "index.json"), [(name, nsamples)])
    return load_index(str(directory / "index.json"))


def test_tar_reader_rejects_damage(tmp_path: Path) -> None:
    import tarfile

    from ddp_trainer.shards import iter_shard

    good = _tar_bytes(tarfile.USTAR_FORMAT, [(f"s{i}.bin", bytes(1000)) for i in range(4)])
    cases = {
        # members take 3 blocks each: a header and 1000 bytes of data
        "flipped": good[: 512 * 3 + 5] + b"X" + good[512 * 3 + 6 :],  # name byte of the second header
        "cut-in-data": good[: 512 * 4 + 100],
        "cut-in-header": good[: 512 * 3 + 100],
    }
    for label, data in cases.items():
        path = tmp_path / f"{label}.tar"
        path.write_bytes(data)
        with pytest.raises(CorruptDataError, match=f"shard {path}"):
            list(iter_shard(str(path), 4))
    (tmp_path / "whole.tar").write_bytes(good[: 512 * 3])  # ends at a member boundary: fewer samples
    with pytest.raises(CorruptDataError, match="holds 1 samples but the index says 4"):
        list(iter_shard(str(tmp_path / "whole.tar"), 4))
    gz = tmp_path / "gz.tar"
    gz.write_bytes(_tar_bytes(tarfile.USTAR_FORMAT, [("s0.bin", b"x")], "gz"))
    dataset = ShardedDataset(load_index_for(tmp_path, "gz.tar", 1), cache_dir=str(tmp_path / "c"), decode=False)
    with pytest.raises(CorruptDataError, match="gz.tar is not a readable uncompressed tar: gzip-compressed"):
        dataset[0]
