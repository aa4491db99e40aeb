"""ShardCache: whole shards on local disk, bounded, shared by the processes of one node."""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
from collections.abc import Iterator
from fcntl import LOCK_EX, LOCK_UN, flock

from .. import env
from ..errors import ConfigError
from ..storage import urls


class ShardCache:
    """Whole shards on local disk, at most `limit_bytes` (plus the shard being read).

    Safe across DataLoader worker processes sharing the directory: a shard is fetched by one of
    them while the others wait for it (a lock file per shard under `.locks/`), downloads land under a
    temporary name and are renamed into place; an evicted shard that another process has open
    stays readable (POSIX), and one evicted before it was opened is fetched again. A shard's
    member table (`<shard>.members.json`, written by ShardedDataset) is removed with it.
    """

    LOCKS = ".locks"
    TABLE_SUFFIX = ".members.json"

    def __init__(self, directory: str | None = None, limit_bytes: int | None = None) -> None:
        limit_bytes = env.shard_cache_bytes() if limit_bytes is None else limit_bytes
        if limit_bytes <= 0:
            raise ConfigError(f"shard cache limit {limit_bytes} must be > 0 bytes")
        self.directory = directory or env.shard_cache_dir() or os.path.join(tempfile.gettempdir(), "ddp-shard-cache")
        self.limit_bytes = limit_bytes

    def path_for(self, url: str) -> str:
        digest = hashlib.sha1(url.encode()).hexdigest()[:16]
        return os.path.join(self.directory, f"{digest}-{posixpath.basename(url)}")

    def get(self, url: str) -> str:
        path = self.path_for(url)
        if self._touch(path):
            return path
        locks = os.path.join(self.directory, self.LOCKS)
        os.makedirs(locks, exist_ok=True)
        # Workers of one DataLoader ask for the same shard at once (a chunked sampler hands them
        # consecutive batches): one downloads it, the rest wait instead of downloading it again.
        with open(os.path.join(locks, os.path.basename(path)), "a") as lock:
            flock(lock, LOCK_EX)
            try:
                self._fetch(url, path)
            finally:
                # Unlock explicitly: a process forked meanwhile (a DataLoader worker, while a
                # prefetch thread downloads) shares this open file, and closing ours alone
                # would leave the lock held until that process exits.
                flock(lock, LOCK_UN)
        self.evict(keep=path)
        return path

    def _fetch(self, url: str, path: str) -> None:
        if self._touch(path):
            return  # another process fetched it while this one waited
        with urls.atomic_path(path) as tmp:
            urls.fetch(url, tmp)
            self._remove(path + self.TABLE_SUFFIX)  # left by a process that died while evicting

    @staticmethod
    def _touch(path: str) -> bool:
        """Marks a cached shard as recently used; False if it is not cached."""
        try:
            os.utime(path)
            return True
        except FileNotFoundError:
            return False

    def _shards(self) -> Iterator[tuple[os.stat_result, str]]:
        """(stat, path) of each complete shard in the cache."""
        for name in os.listdir(self.directory) if os.path.isdir(self.directory) else []:
            if ".part." in name or name == self.LOCKS or self.TABLE_SUFFIX in name:
                continue
            full = os.path.join(self.directory, name)
            try:
                yield os.stat(full), full
            except FileNotFoundError:
                continue

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used shards until the cache fits its limit."""
        entries = sorted((stat.st_mtime, stat.st_size, full) for stat, full in self._shards())
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, full in entries:
            if total <= self.limit_bytes:
                break
            if full == keep:
                continue
            if self._remove(full):
                removed.append(full)
            self._remove(full + self.TABLE_SUFFIX)
            total -= size
        return removed

    @staticmethod
    def _remove(path: str) -> bool:
        try:
            os.remove(path)
            return True
        except FileNotFoundError:
            return False

    def size_bytes(self) -> int:
        return sum(stat.st_size for stat, _ in self._shards())
