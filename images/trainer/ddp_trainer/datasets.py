"""Open the job's dataset from a URI ($DDP_DATASET_URI by default).

* ``s3://bucket/prefix/index.json`` (or a local ``.json``): indexed shards, map-style
  (`ShardedDataset`) or, with ``streaming=True``, `ShardStream`;
* ``s3://bucket/prefix``: an image folder, `S3ImageFolder`.
"""

from __future__ import annotations

from typing import Any

from ddp_contract import envnames
from . import env, s3
from .errors import ConfigError


def open_dataset(uri: str | None = None, streaming: bool = False, **kwargs: Any) -> Any:
    uri = uri or env.dataset_uri()
    if uri.endswith(".json"):
        from .shards import ShardedDataset, ShardStream

        return ShardStream(uri, **kwargs) if streaming else ShardedDataset(uri, **kwargs)
    if streaming:
        raise ConfigError(f"{envnames.DATASET_URI}={uri!r}: streaming needs a shard index (.json), not an image folder")
    from .imagefolder import S3ImageFolder

    url = s3.parse_uri(uri)
    return S3ImageFolder(url.bucket, url.key, **kwargs)
