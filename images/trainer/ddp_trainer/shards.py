"""Indexed tar shards, compatible with webdataset and wids; the pieces live in their own modules:

* `shardindex`: the wids index (`ShardIndex`, `load_index`, `write_index`);
* `samples`: tar members grouped into samples and decoded by extension;
* `mapdataset`: `ShardedDataset` (map-style, whole shards cached locally) and `PrefetchingSampler`;
* `shardstream`: `ShardStream` (iterable, shards streamed and split evenly over ranks and workers).

This module only keeps the name that code outside the runtime still imports from here.
"""

from __future__ import annotations

from .shardstream import ShardStream

__all__ = ["ShardStream"]
