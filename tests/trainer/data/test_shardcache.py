"""ShardCache: bounded, least recently used first, one download per shard across processes."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
from pathlib import Path

import pytest
from shardhelp import upload_wds_shards

from ddp_trainer.data import shardcache
from ddp_trainer.data.mapdataset import ShardedDataset
from ddp_trainer.data.shardcache import ShardCache
from ddp_trainer.data.shardindex import load_index
from ddp_trainer.storage import readahead, s3

WAIT_S = 30.0  # how long a slow download waits for the others to ask for its shard


@pytest.fixture
def wds_shards(tmp_path: Path, bucket: str) -> tuple[Path, str, list[dict]]:
    return upload_wds_shards(tmp_path, bucket)


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


def test_processes_asking_for_one_shard_at_once_download_it_once(wds_shards, tmp_path: Path, monkeypatch) -> None:
    _, bucket, _ = wds_shards
    url = load_index(f"s3://{bucket}/sets/wds/index.json").shards[2].url
    context = multiprocessing.get_context("fork")
    downloads, asking, barrier = context.Value("i", 0), context.Value("i", 0), context.Barrier(4)
    asked = context.Condition()
    real_download, real_flock = readahead.download, shardcache.flock

    def counted_flock(file, operation: int) -> None:
        if operation != fcntl.LOCK_UN:
            with asked:
                asking.value += 1
                asked.notify_all()
        real_flock(file, operation)

    def counted_download(*args, **kwargs):
        with downloads.get_lock():
            downloads.value += 1
        with asked:  # a slow link: the download lasts until every process has asked for the shard's lock
            asked.wait_for(lambda: asking.value == 4, timeout=WAIT_S)
        return real_download(*args, **kwargs)

    monkeypatch.setattr(shardcache, "flock", counted_flock)
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
    assert asking.value == 4  # each asked while the shard was not there yet
    assert downloads.value == 1
    assert cache.size_bytes() == len(s3.get_bytes(s3.parse_uri(url)))


def test_a_process_forked_during_a_download_is_not_locked_out(wds_shards, tmp_path: Path, monkeypatch) -> None:
    """A prefetch thread downloads (holding the shard's lock) when the DataLoader forks a worker
    that wants the same shard: the worker waits for that download, then goes on."""
    import threading

    _, bucket, _ = wds_shards
    url = load_index(f"s3://{bucket}/sets/wds/index.json").shards[1].url
    context = multiprocessing.get_context("fork")
    real_download, real_flock, downloading, child_asked = readahead.download, shardcache.flock, threading.Event(), context.Event()
    parent = os.getpid()

    def watched_flock(file, operation: int) -> None:
        if operation != fcntl.LOCK_UN and os.getpid() != parent:
            child_asked.set()
        real_flock(file, operation)

    def slow_download(*args, **kwargs):
        downloading.set()
        child_asked.wait(WAIT_S)  # a slow link: the download lasts until the forked worker asks for the lock
        return real_download(*args, **kwargs)

    monkeypatch.setattr(shardcache, "flock", watched_flock)
    monkeypatch.setattr(readahead, "download", slow_download)
    cache = ShardCache(str(tmp_path / "cache"), limit_bytes=1 << 30)
    s3.client()  # the parent's client exists before the thread: only the lock is in play here
    downloader = threading.Thread(target=cache.get, args=(url,))
    downloader.start()
    assert downloading.wait(10)

    def worker() -> None:
        path = cache.get(url)
        os._exit(0 if Path(path).read_bytes() == s3.get_bytes(s3.parse_uri(url)) else 1)

    child = context.Process(target=worker)
    child.start()  # forked while the download holds the lock
    downloader.join(30)
    child.join(30)
    if child.exitcode is None:
        child.kill()
    assert child_asked.is_set()  # the worker asked for the lock while the download held it
    assert child.exitcode == 0
