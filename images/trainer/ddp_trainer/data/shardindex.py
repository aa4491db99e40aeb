"""The shard index, in wids format: ``{"wids_version": 1, "shardlist": [{"url": ..., "nsamples": N}, ...]}``.

Relative shard URLs resolve against the index's own location (s3:// or a local path).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..errors import CorruptDataError
from ..storage import urls


@dataclass(frozen=True)
class ShardInfo:
    url: str  # absolute: s3://bucket/key or a local path
    nsamples: int


@dataclass(frozen=True)
class ShardIndex:
    url: str
    shards: list[ShardInfo]
    extra: dict[str, Any]

    @property
    def total(self) -> int:
        return sum(s.nsamples for s in self.shards)


def parse_index(data: bytes, index_url: str) -> ShardIndex:
    try:
        doc = json.loads(data)
        if doc.get("wids_version") != 1:
            raise ValueError(f"wids_version is {doc.get('wids_version')!r}, expected 1")
        shards = [ShardInfo(urls.resolve(index_url, str(s["url"])), int(s["nsamples"])) for s in doc["shardlist"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptDataError(f"shard index {index_url} is not a valid wids index: {exc}") from exc
    if not shards or any(s.nsamples < 0 for s in shards):
        raise CorruptDataError(f"shard index {index_url} lists no shards or a negative nsamples")
    extra = {k: v for k, v in doc.items() if k not in ("wids_version", "shardlist")}
    return ShardIndex(url=index_url, shards=shards, extra=extra)


def load_index(index_url: str) -> ShardIndex:
    return parse_index(urls.read_bytes(index_url), index_url)


def write_index(index_url: str, shards: list[tuple[str, int]], **extra: Any) -> None:
    """`shards` holds (url relative to the index or absolute, nsamples)."""
    doc = {"wids_version": 1, **extra, "shardlist": [{"url": u, "nsamples": n} for u, n in shards]}
    urls.write_bytes(index_url, json.dumps(doc, indent=1).encode())
