"""Settings the operator injects into every rank, read from the environment.

Every environment variable name the runtime reads is defined here, once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from .errors import ConfigError

# Rendezvous (set by the operator, same names as torchrun).
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
NODE_RANK = "NODE_RANK"

# The DDPJob this rank belongs to.
JOB_NAME = "DDP_JOB_NAME"
JOB_NAMESPACE = "DDP_JOB_NAMESPACE"
JOB_UID = "DDP_JOB_UID"

# Runtime behaviour.
BACKEND = "DDP_BACKEND"
ENTRYPOINT = "DDP_ENTRYPOINT"
INIT_TIMEOUT_SECONDS = "DDP_INIT_TIMEOUT_SECONDS"
MASTER_WAIT_SECONDS = "DDP_MASTER_WAIT_SECONDS"
PROGRESS_FILE = "DDP_PROGRESS_FILE"
PROGRESS_INTERVAL_SECONDS = "DDP_PROGRESS_INTERVAL_SECONDS"

# S3.
AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
S3_ENDPOINT = "DDP_S3_ENDPOINT"
S3_REGION = "DDP_S3_REGION"
AWS_REGION = "AWS_REGION"
S3_MAX_ATTEMPTS = "DDP_S3_MAX_ATTEMPTS"
S3_READ_PART_BYTES = "DDP_S3_READ_PART_BYTES"
S3_READ_AHEAD = "DDP_S3_READ_AHEAD"
SHARD_CACHE_DIR = "DDP_SHARD_CACHE_DIR"
SHARD_CACHE_BYTES = "DDP_SHARD_CACHE_BYTES"
DATASET_URI = "DDP_DATASET_URI"
RESULTS_URI = "DDP_RESULTS_URI"

BACKENDS = ("auto", "nccl", "gloo")
DEFAULT_INIT_TIMEOUT_SECONDS = 600.0
DEFAULT_PROGRESS_FILE = "/tmp/ddp-progress.json"
DEFAULT_PROGRESS_INTERVAL_SECONDS = 10.0
DEFAULT_S3_REGION = "us-east-1"
DEFAULT_S3_MAX_ATTEMPTS = 8
DEFAULT_S3_READ_PART_BYTES = 8 * 1024**2  # the ranged-GET size S3's performance guidance suggests (8 or 16 MB)
DEFAULT_S3_READ_AHEAD = 3
DEFAULT_SHARD_CACHE_BYTES = 10 * 1024**3
DEFAULT_JOB_NAMESPACE = "default"


def _require(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"environment variable {name} is not set (the operator injects it into every rank)")
    return value


def _int(environ: Mapping[str, str], name: str, *, default: int | None = None, minimum: int = 0) -> int:
    raw = environ.get(name, "").strip()
    if not raw:
        if default is None:
            raise ConfigError(f"environment variable {name} is not set (the operator injects it into every rank)")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"environment variable {name}={value} must be >= {minimum}")
    return value


def _float(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not a number") from None
    if value <= 0:
        raise ConfigError(f"environment variable {name}={value} must be > 0")
    return value


@dataclass(frozen=True)
class DistSettings:
    """What a rank needs to join the process group."""

    master_addr: str
    master_port: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    backend: str
    init_timeout_s: float
    master_wait_s: float

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "DistSettings":
        env = os.environ if environ is None else environ
        world_size = _int(env, WORLD_SIZE, minimum=1)
        rank = _int(env, RANK)
        if rank >= world_size:
            raise ConfigError(f"environment variable {RANK}={rank} must be < {WORLD_SIZE}={world_size}")
        port = _int(env, MASTER_PORT, minimum=1)
        if port > 65535:
            raise ConfigError(f"environment variable {MASTER_PORT}={port} is not a TCP port")
        backend = env.get(BACKEND, "auto").strip().lower() or "auto"
        if backend not in BACKENDS:
            raise ConfigError(f"environment variable {BACKEND}={backend!r} must be one of {', '.join(BACKENDS)}")
        init_timeout = _float(env, INIT_TIMEOUT_SECONDS, DEFAULT_INIT_TIMEOUT_SECONDS)
        return cls(
            master_addr=_require(env, MASTER_ADDR),
            master_port=port,
            rank=rank,
            world_size=world_size,
            local_rank=_int(env, LOCAL_RANK, default=0),
            local_world_size=_int(env, LOCAL_WORLD_SIZE, default=1, minimum=1),
            node_rank=_int(env, NODE_RANK, default=rank),
            backend=backend,
            init_timeout_s=init_timeout,
            master_wait_s=_float(env, MASTER_WAIT_SECONDS, init_timeout),
        )


@dataclass(frozen=True)
class JobInfo:
    """Identity of the DDPJob; optional so code also runs outside the operator."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "JobInfo":
        env = os.environ if environ is None else environ
        return cls(
            name=env.get(JOB_NAME, "").strip(),
            namespace=env.get(JOB_NAMESPACE, "").strip() or DEFAULT_JOB_NAMESPACE,
            uid=env.get(JOB_UID, "").strip(),
        )

    def require_name(self) -> str:
        if not self.name:
            raise ConfigError(f"environment variable {JOB_NAME} is not set; it names the job's results prefix")
        return self.name


@dataclass(frozen=True)
class S3Settings:
    """Where S3 is and how to authenticate; credentials may also come from boto3's usual chain."""

    endpoint_url: str | None
    region: str
    access_key_id: str | None
    secret_access_key: str | None
    max_attempts: int = DEFAULT_S3_MAX_ATTEMPTS
    read_part_bytes: int = DEFAULT_S3_READ_PART_BYTES  # a large object is read as ranged GETs of this size
    read_ahead: int = DEFAULT_S3_READ_AHEAD  # parts fetched in parallel ahead of a sequential reader; 0: one GET

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "S3Settings":
        env = os.environ if environ is None else environ
        key_id = env.get(AWS_ACCESS_KEY_ID, "").strip() or None
        secret = env.get(AWS_SECRET_ACCESS_KEY, "").strip() or None
        if (key_id is None) != (secret is None):
            missing = AWS_SECRET_ACCESS_KEY if secret is None else AWS_ACCESS_KEY_ID
            raise ConfigError(f"environment variable {missing} is not set but its pair is (check the S3 Secret)")
        endpoint = env.get(S3_ENDPOINT, "").strip() or None
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"environment variable {S3_ENDPOINT}={endpoint!r} must start with http:// or https://")
        region = env.get(S3_REGION, "").strip() or env.get(AWS_REGION, "").strip() or DEFAULT_S3_REGION
        return cls(
            endpoint_url=endpoint,
            region=region,
            access_key_id=key_id,
            secret_access_key=secret,
            max_attempts=_int(env, S3_MAX_ATTEMPTS, default=DEFAULT_S3_MAX_ATTEMPTS, minimum=1),
            read_part_bytes=_int(env, S3_READ_PART_BYTES, default=DEFAULT_S3_READ_PART_BYTES, minimum=4096),
            read_ahead=_int(env, S3_READ_AHEAD, default=DEFAULT_S3_READ_AHEAD, minimum=0),
        )


def dataset_uri(environ: Mapping[str, str] | None = None) -> str:
    return _require(os.environ if environ is None else environ, DATASET_URI)


def results_uri(environ: Mapping[str, str] | None = None) -> str:
    return _require(os.environ if environ is None else environ, RESULTS_URI)


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank; 0 outside a distributed job."""
    return _int(os.environ if environ is None else environ, RANK, default=0)


def progress_file(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(PROGRESS_FILE, "").strip() or DEFAULT_PROGRESS_FILE


def progress_interval_s(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    return _float(env, PROGRESS_INTERVAL_SECONDS, DEFAULT_PROGRESS_INTERVAL_SECONDS)


def shard_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get(SHARD_CACHE_DIR, "").strip() or None


def shard_cache_bytes(environ: Mapping[str, str] | None = None) -> int:
    return _int(os.environ if environ is None else environ, SHARD_CACHE_BYTES, default=DEFAULT_SHARD_CACHE_BYTES, minimum=1)
