"""Open the job's dataset from a URI ($DDP_DATASET_URI by default).

* ``s3://bucket/prefix/index.json`` (or a local ``.json``): indexed shards, map-style
  (`ShardedDataset`) or, with ``streaming=True``, `ShardStream`;
* ``s3://bucket/prefix``: an image folder, `S3ImageFolder`.
"""

from __future__ import annotations

from typing import Any

from ddp_contract import envnames

from .. import env
from ..errors import ConfigError


def open_dataset(uri: str | None = None, streaming: bool = False, **kwargs: Any) -> Any:
    uri = uri or env.dataset_uri()
    if uri.endswith(".json"):
        if streaming:
            from .shardstream import ShardStream

            return ShardStream(uri, **kwargs)
        from .mapdataset import ShardedDataset

        return ShardedDataset(uri, **kwargs)
    if streaming:
        raise ConfigError(f"{envnames.DATASET_URI}={uri!r}: streaming needs a shard index (.json), not an image folder")
    from .imagefolder import S3ImageFolder

    return S3ImageFolder.from_uri(uri, **kwargs)
