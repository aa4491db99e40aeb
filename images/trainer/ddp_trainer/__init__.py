"""The trainer runtime every DDPJob rank runs: entrypoint, S3 datasets, results, checkpoints.

Start a rank with ``python -m ddp_trainer run module:function``; see images/trainer/README.md.
Heavy modules (torch, boto3) load on first use of the names below.

The code is in three rooms: `runtime` (what runs a rank), `data` (what it reads) and `storage`
(S3, URLs, results, checkpoints); `env`, `errors`, `values` and `jobstatus` are shared by them.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import ExitCode

if TYPE_CHECKING:
    from .storage import urls as urls

_EXPORTS = {
    "RankContext": "runtime.context",
    "context": "runtime.context",
    "S3ImageFolder": "data.imagefolder",
    "ShardedDataset": "data.mapdataset",
    "ShardListDataset": "data.mapdataset",
    "ShardStream": "data.shardstream",
    "ShardCache": "data.shardcache",
    "load_index": "data.shardindex",
    "DistributedChunkedSampler": "data.sampler",
    "DataLoader": "data.loader",
    "DpexDataLoader": "data.loader",
    "S3ResultsHandler": "storage.results",
    "DaskResultsHandler": "storage.results",
    "CheckpointManager": "storage.checkpoint",
    "training_state": "storage.checkpoint",
    "restore_training_state": "storage.checkpoint",
    "ProgressReporter": "runtime.progress",
    "default_reporter": "runtime.progress",
    "open_dataset": "data.datasets",
    "make_shards": "data.convert",
    "heartbeat": "runtime.heartbeat",
}

# Modules that training code imports by their name here (`from ddp_trainer import urls`, as the examples do).
_MODULES = {
    "urls": "storage.urls",
}

__all__ = ["ExitCode", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return import_module(f".{_MODULES[name]}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddp_trainer' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
