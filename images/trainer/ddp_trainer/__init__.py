"""The trainer runtime every DDPJob rank runs: entrypoint, S3 datasets, results, checkpoints.

Start a rank with ``python -m ddp_trainer run module:function``; see images/trainer/README.md.
Heavy modules (torch, boto3) load on first use of the names below.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .errors import ExitCode

_EXPORTS = {
    "RankContext": "entrypoint",
    "context": "entrypoint",
    "S3ImageFolder": "imagefolder",
    "ShardedDataset": "mapdataset",
    "ShardListDataset": "mapdataset",
    "ShardStream": "shardstream",
    "ShardCache": "shardcache",
    "load_index": "shardindex",
    "DistributedChunkedSampler": "sampler",
    "S3ResultsHandler": "results",
    "DaskResultsHandler": "results",
    "CheckpointManager": "checkpoint",
    "training_state": "checkpoint",
    "restore_training_state": "checkpoint",
    "ProgressReporter": "progress",
    "default_reporter": "progress",
    "open_dataset": "datasets",
    "make_shards": "convert",
    "heartbeat": "heartbeat",
}

__all__ = ["ExitCode", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddp_trainer' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
