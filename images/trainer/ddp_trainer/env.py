"""Settings the operator injects into every rank, read from the environment.

The variables' names are the contract's (ddp_contract.envnames); their defaults and checks are here.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from ddp_contract import envnames as names
from ddp_contract.backend import BACKENDS
from ddp_contract.envnumbers import EnvNumberError, N, env_number
from ddp_contract.s3options import S3OptionError, S3Options

from .errors import ConfigError

DEFAULT_INIT_TIMEOUT_SECONDS = 600.0
DEFAULT_PROGRESS_FILE = "/tmp/ddp-progress.json"
DEFAULT_PROGRESS_INTERVAL_SECONDS = 10.0
DEFAULT_S3_REGION = "us-east-1"
DEFAULT_S3_MAX_ATTEMPTS = 8
DEFAULT_S3_READ_PART_BYTES = 8 * 1024**2  # the ranged-GET size S3's performance guidance suggests (8 or 16 MB)
DEFAULT_S3_READ_AHEAD = 3
DEFAULT_SHARD_CACHE_BYTES = 10 * 1024**3
DEFAULT_JOB_NAMESPACE = "default"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"


def _require(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigError(f"environment variable {name} is not set (the operator injects it into every rank)")
    return value


def _int(environ: Mapping[str, str], name: str, *, default: int | None = None, minimum: int = 0) -> int:
    raw = _require(environ, name) if default is None else environ.get(name, "").strip()
    return _number(name, raw, int, default or 0, minimum=minimum)


def _float(environ: Mapping[str, str], name: str, default: float, zero_means_off: bool = False) -> float:
    return _number(name, environ.get(name, "").strip(), float, default, exclusive=not zero_means_off)


def _number(name: str, raw: str, kind: type[N], default: N, *, minimum: int = 0, exclusive: bool = False) -> N:
    try:
        return env_number(name, raw, kind, default, minimum=minimum, exclusive=exclusive)
    except EnvNumberError as error:
        raise ConfigError(str(error)) from None


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
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DistSettings:
        env = os.environ if environ is None else environ
        world_size = _int(env, names.WORLD_SIZE, minimum=1)
        rank = _int(env, names.RANK)
        if rank >= world_size:
            raise ConfigError(f"environment variable {names.RANK}={rank} must be < {names.WORLD_SIZE}={world_size}")
        port = _int(env, names.MASTER_PORT, minimum=1)
        if port > 65535:
            raise ConfigError(f"environment variable {names.MASTER_PORT}={port} is not a TCP port")
        backend = env.get(names.BACKEND, "auto").strip().lower() or "auto"
        if backend not in BACKENDS:
            raise ConfigError(f"environment variable {names.BACKEND}={backend!r} must be one of {', '.join(BACKENDS)}")
        init_timeout = _float(env, names.INIT_TIMEOUT_SECONDS, DEFAULT_INIT_TIMEOUT_SECONDS)
        return cls(
            master_addr=_require(env, names.MASTER_ADDR),
            master_port=port,
            rank=rank,
            world_size=world_size,
            local_rank=_int(env, names.LOCAL_RANK, default=0),
            local_world_size=_int(env, names.LOCAL_WORLD_SIZE, default=1, minimum=1),
            node_rank=_int(env, names.NODE_RANK, default=rank),
            backend=backend,
            init_timeout_s=init_timeout,
            master_wait_s=_float(env, names.MASTER_WAIT_SECONDS, init_timeout),
        )


@dataclass(frozen=True)
class JobInfo:
    """Identity of the DDPJob; optional so code also runs outside the operator."""

    name: str
    namespace: str
    uid: str
    attempt: int = 0  # the gang attempt this rank belongs to (0 first, +1 per gang restart)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobInfo:
        env = os.environ if environ is None else environ
        return cls(
            name=env.get(names.JOB_NAME, "").strip(),
            namespace=env.get(names.JOB_NAMESPACE, "").strip() or DEFAULT_JOB_NAMESPACE,
            uid=env.get(names.JOB_UID, "").strip(),
            attempt=_int(env, names.ATTEMPT, default=0),
        )

    def require_name(self) -> str:
        if not self.name:
            raise ConfigError(f"environment variable {names.JOB_NAME} is not set; it names the job's results prefix")
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
    options: S3Options = S3Options()  # checksums, addressing style, CA bundle
    crt: bool = True  # large uploads through the AWS CRT where awscrt is installed (storage/crtupload.py)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if environ is None else environ
        key_id = env.get(names.AWS_ACCESS_KEY_ID, "").strip() or None
        secret = env.get(names.AWS_SECRET_ACCESS_KEY, "").strip() or None
        if (key_id is None) != (secret is None):
            missing = names.AWS_SECRET_ACCESS_KEY if secret is None else names.AWS_ACCESS_KEY_ID
            raise ConfigError(f"environment variable {missing} is not set but its pair is (check the S3 Secret)")
        endpoint = env.get(names.S3_ENDPOINT, "").strip() or None
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"environment variable {names.S3_ENDPOINT}={endpoint!r} must start with http:// or https://")
        region = env.get(names.S3_REGION, "").strip() or env.get(names.AWS_REGION, "").strip() or DEFAULT_S3_REGION
        return cls(
            endpoint_url=endpoint,
            region=region,
            access_key_id=key_id,
            secret_access_key=secret,
            max_attempts=_int(env, names.S3_MAX_ATTEMPTS, default=DEFAULT_S3_MAX_ATTEMPTS, minimum=1),
            read_part_bytes=_int(env, names.S3_READ_PART_BYTES, default=DEFAULT_S3_READ_PART_BYTES, minimum=4096),
            read_ahead=_int(env, names.S3_READ_AHEAD, default=DEFAULT_S3_READ_AHEAD, minimum=0),
            options=_s3_options(env, endpoint),
            crt=_int(env, names.S3_CRT, default=1, minimum=0) != 0,
        )


def _s3_options(env: Mapping[str, str], endpoint: str | None) -> S3Options:
    try:
        options = S3Options.from_env(env, endpoint)
    except S3OptionError as error:
        raise ConfigError(f"environment variable {error}") from None
    if options.ca_bundle is not None and not os.path.isfile(options.ca_bundle):
        raise ConfigError(f"environment variable {names.S3_CA_BUNDLE}={options.ca_bundle!r} names no file "
                          "(the CA bundle of the S3 endpoint; spec.s3.caBundle mounts it)")
    return options


def dataset_uri(environ: Mapping[str, str] | None = None) -> str:
    return _require(os.environ if environ is None else environ, names.DATASET_URI)


def results_uri(environ: Mapping[str, str] | None = None) -> str:
    return _require(os.environ if environ is None else environ, names.RESULTS_URI)


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank; 0 outside a distributed job."""
    return _int(os.environ if environ is None else environ, names.RANK, default=0)


def progress_file(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(names.PROGRESS_FILE, "").strip() or DEFAULT_PROGRESS_FILE


def progress_interval_s(environ: Mapping[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    return _float(env, names.PROGRESS_INTERVAL_SECONDS, DEFAULT_PROGRESS_INTERVAL_SECONDS)


def shard_cache_dir(environ: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if environ is None else environ
    return env.get(names.SHARD_CACHE_DIR, "").strip() or None


def shard_cache_bytes(environ: Mapping[str, str] | None = None) -> int:
    return _int(os.environ if environ is None else environ, names.SHARD_CACHE_BYTES, default=DEFAULT_SHARD_CACHE_BYTES, minimum=1)


def termination_message_path(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get(names.TERMINATION_MESSAGE_PATH, "").strip() or DEFAULT_TERMINATION_MESSAGE_PATH


DEFAULT_HANG_MIN_SECONDS = 300.0


def hang_timeout_s(environ: Mapping[str, str] | None = None) -> float | None:
    """$DDP_HANG_TIMEOUT_SECONDS: None when unset (derive it), 0 for never."""
    env = os.environ if environ is None else environ
    if not env.get(names.HANG_TIMEOUT_SECONDS, "").strip():
        return None
    return _float(env, names.HANG_TIMEOUT_SECONDS, 0.0, zero_means_off=True)


def hang_min_s(environ: Mapping[str, str] | None = None) -> float:
    return _float(os.environ if environ is None else environ, names.HANG_MIN_SECONDS, DEFAULT_HANG_MIN_SECONDS)


def resume_from(environ: Mapping[str, str] | None = None) -> str | None:
    """$DDP_RESUME_FROM: the checkpoint the operator tells a restarted gang to resume from."""
    return (os.environ if environ is None else environ).get(names.RESUME_FROM, "").strip() or None


def checkpoint_request_file(environ: Mapping[str, str] | None = None) -> str | None:
    """$DDP_CHECKPOINT_REQUEST_FILE: where the InPlace runtime says the job asks for a checkpoint."""
    return (os.environ if environ is None else environ).get(names.CHECKPOINT_REQUEST_FILE, "").strip() or None


def local_world_size(environ: Mapping[str, str] | None = None) -> int:
    return _int(os.environ if environ is None else environ, names.LOCAL_WORLD_SIZE, default=1, minimum=1)


def node_rank(environ: Mapping[str, str] | None = None) -> int:
    return _int(os.environ if environ is None else environ, names.NODE_RANK, default=0)

DEFAULT_LOG_UPLOAD_INTERVAL_SECONDS = 30.0


def metrics_from_output(environ: Mapping[str, str] | None = None) -> bool:
    """$DDP_METRICS_FROM_OUTPUT: whether printed metric lines drive progress and metrics (default on)."""
    env = os.environ if environ is None else environ
    return env.get(names.METRICS_FROM_OUTPUT, "").strip().lower() not in names.OFF_WORDS


def log_upload_interval_s(environ: Mapping[str, str] | None = None) -> float:
    """$DDP_LOG_UPLOAD_INTERVAL_SECONDS: seconds between uploads of the rank's output; 0: at exit only."""
    env = os.environ if environ is None else environ
    return _float(env, names.LOG_UPLOAD_INTERVAL_SECONDS, DEFAULT_LOG_UPLOAD_INTERVAL_SECONDS, zero_means_off=True)


DEFAULT_S3_OUTAGE_SECONDS = 600.0


def s3_outage_s(environ: Mapping[str, str] | None = None) -> float:
    """$DDP_S3_OUTAGE_SECONDS: how long S3 may stay unreachable while the ranks train on (0: not at all)."""
    env = os.environ if environ is None else environ
    return _float(env, names.S3_OUTAGE_SECONDS, DEFAULT_S3_OUTAGE_SECONDS, zero_means_off=True)


DEFAULT_KEEP_INTERVAL_SECONDS = 5.0
DEFAULT_KEEP_SETTLE_SECONDS = 10.0


def keep_interval_s(environ: Mapping[str, str] | None = None) -> float:
    """$DDP_KEEP_INTERVAL_SECONDS: seconds between looks at the kept folders."""
    env = os.environ if environ is None else environ
    return _float(env, names.KEEP_INTERVAL_SECONDS, DEFAULT_KEEP_INTERVAL_SECONDS)


def keep_settle_s(environ: Mapping[str, str] | None = None) -> float:
    """$DDP_KEEP_SETTLE_SECONDS: how long a file in a kept folder stays unchanged before it is kept."""
    env = os.environ if environ is None else environ
    return _float(env, names.KEEP_SETTLE_SECONDS, DEFAULT_KEEP_SETTLE_SECONDS)


DEFAULT_DATA_WORKER_PORT = names.DEFAULT_DATA_WORKER_PORT


def data_workers(environ: Mapping[str, str] | None = None) -> list[str]:
    """$DDP_DATA_WORKERS: the job's data workers, host:port each; empty when it has none."""
    env = os.environ if environ is None else environ
    return [a.strip() for a in env.get(names.DATA_WORKERS, "").split(",") if a.strip()]


def data_worker_token(environ: Mapping[str, str] | None = None) -> bytes | None:
    """$DDP_DATA_WORKER_TOKEN, the job's secret both ends of a data connection prove they hold."""
    token = (os.environ if environ is None else environ).get(names.DATA_WORKER_TOKEN, "").strip()
    return token.encode() if token else None


def data_worker_port(environ: Mapping[str, str] | None = None) -> int:
    return _int(os.environ if environ is None else environ, names.DATA_WORKER_PORT, default=DEFAULT_DATA_WORKER_PORT)


DEFAULT_SNAPSHOT_DIR = "/dev/shm/ddp-snapshots"


def local_rank(environ: Mapping[str, str] | None = None) -> int:
    return _int(os.environ if environ is None else environ, names.LOCAL_RANK, default=0)


def snapshot_dir(environ: Mapping[str, str] | None = None) -> str:
    """$DDP_SNAPSHOT_DIR: where the pod keeps its memory snapshots (a memory-backed /dev/shm by default)."""
    env = os.environ if environ is None else environ
    return env.get(names.SNAPSHOT_DIR, "").strip() or DEFAULT_SNAPSHOT_DIR


def pod_name(environ: Mapping[str, str] | None = None) -> str:
    """The pod's name (its hostname, as Kubernetes sets it)."""
    env = os.environ if environ is None else environ
    return env.get("HOSTNAME", "").strip() or socket.gethostname()


def pod_ip(environ: Mapping[str, str] | None = None) -> str:
    """$POD_IP (the downward API's status.podIP), else what the pod's name resolves to."""
    env = os.environ if environ is None else environ
    found = env.get(names.POD_IP, "").strip()
    if found:
        return found
    try:
        return socket.gethostbyname(pod_name(env))
    except OSError:
        return "127.0.0.1"


def job_token(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The job's token ($DDP_JOB_TOKEN, else the data workers'), which peers of the job prove to each other."""
    env = os.environ if environ is None else environ
    found = env.get(names.JOB_TOKEN, "").strip() or env.get(names.DATA_WORKER_TOKEN, "").strip()
    return found.encode() if found else None
