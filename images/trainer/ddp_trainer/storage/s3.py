"""S3 access for any S3-compatible endpoint: per-process clients, retries, errors that name keys.

boto3 clients must not cross fork(): `client()` caches one per process id, so a DataLoader worker
(fork or spawn) builds its own on first use. Objects holding S3 state drop it when pickled.
"""

from __future__ import annotations

import io
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, TypeVar

from ddp_contract import envnames

from .. import env
from ..errors import (
    ConfigError,
    ObjectNotFoundError,
    StorageError,
    StorageUnavailableError,
    TrainerError,
)

T = TypeVar("T")

QUICK_TIMEOUT_S = 3  # connecting and reading, for `unreachable`

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "InvalidToken", "ExpiredToken"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "ServiceUnavailable", "503", "500"}


@dataclass(frozen=True)
class S3Url:
    bucket: str
    key: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    def join(self, *parts: str) -> S3Url:
        return S3Url(self.bucket, join_key(self.key, *parts))


def parse_uri(uri: str) -> S3Url:
    """`s3://bucket/some/prefix` -> S3Url("bucket", "some/prefix")."""
    if not uri.startswith("s3://"):
        raise ConfigError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ConfigError(f"{uri!r} has no bucket name")
    return S3Url(bucket, key.strip("/"))


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


def make_client(settings: env.S3Settings | None = None, unsigned: bool = False, quick: bool = False) -> Any:
    """A new boto3 S3 client with adaptive retries (backoff on throttling, 5xx and connection errors);
    `unsigned`: anonymous requests, for public buckets (no credentials looked for or sent); `quick`: one
    try with short timeouts, to ask whether S3 answers now (`unreachable`)."""
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    settings = settings or env.S3Settings.from_env()
    config = Config(
        region_name=settings.region,
        retries={"max_attempts": 1 if quick else settings.max_attempts, "mode": "adaptive"},
        connect_timeout=QUICK_TIMEOUT_S if quick else 10,
        read_timeout=QUICK_TIMEOUT_S if quick else 60,
        max_pool_connections=32,
        **settings.options.config_kwargs(),
        **({"signature_version": UNSIGNED} if unsigned else {}),
    )
    session = boto3.session.Session(
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        region_name=settings.region,
        botocore_session=_botocore_session(),
    )
    paths = _data_loader.search_paths  # boto3 appends its data path on every Session: keep the shared list short
    paths[:] = list(dict.fromkeys(paths))
    client = session.client("s3", endpoint_url=settings.endpoint_url, config=config, **settings.options.client_kwargs())
    return settings.options.prepare(client)


_data_loader: Any = None


def _botocore_session() -> Any:
    """A new botocore session sharing one data loader (parsed service models) per process tree.

    Parsing the S3 model is most of the ~0.1 s CPU a client costs; DataLoader workers forked after
    the parent made its client inherit the parsed models and build theirs in about a tenth of that.
    Only the loader (read-only data) is shared; sessions, credentials and connections are not.
    """
    import botocore.session

    global _data_loader
    core = botocore.session.get_session()
    if _data_loader is None:
        _data_loader = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _data_loader)
    return core


_clients: dict[tuple[int, bool, bool], Any] = {}
_clients_lock = threading.Lock()


def client(unsigned: bool = False, quick: bool = False) -> Any:
    """This process's shared client (an anonymous one if `unsigned`, a `quick` one: see make_client),
    created on first use after fork/spawn."""
    key = (os.getpid(), unsigned, quick)
    existing = _clients.get(key)
    if existing is not None:
        return existing
    with _clients_lock:
        if key not in _clients:
            for stale in [k for k in _clients if k[0] != key[0]]:
                del _clients[stale]  # entries inherited through fork belong to the parent
            _clients[key] = make_client(unsigned=unsigned, quick=quick)
        return _clients[key]


def _forget_clients_in_child() -> None:
    # A thread of the parent may have held the lock when it forked (a prefetch thread making the
    # parent's first client while the DataLoader starts its workers): the child starts afresh.
    global _clients_lock
    _clients_lock = threading.Lock()
    _clients.clear()


os.register_at_fork(after_in_child=_forget_clients_in_child)


def reset_clients() -> None:
    """Forget cached clients (after changing S3 settings in the environment)."""
    from . import crtupload

    with _clients_lock:
        _clients.clear()
    crtupload.reset()


def _endpoint(s3: Any) -> str:
    return str(getattr(getattr(s3, "meta", None), "endpoint_url", "S3"))


def translate(exc: BaseException, url: S3Url | str, action: str, s3: Any = None) -> TrainerError:
    """Turn a botocore exception into a runtime error naming the object and the cause."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, SSLError

    where = f"{action} {url}"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        bucket = url.bucket if isinstance(url, S3Url) else str(url)
        if code == "NoSuchBucket":
            return ObjectNotFoundError(f"{where}: bucket {bucket!r} does not exist")
        if code in _NOT_FOUND:
            return ObjectNotFoundError(f"{where}: object does not exist")
        if code in _DENIED:
            return StorageError(
                f"{where}: access denied ({code}); check {envnames.AWS_ACCESS_KEY_ID}/{envnames.AWS_SECRET_ACCESS_KEY} "
                f"and the bucket policy"
            )
        if code in _THROTTLED:
            return StorageUnavailableError(f"{where}: S3 still failing after retries ({code})")
        return StorageError(f"{where}: {code or 'error'}: {exc}")
    if isinstance(exc, NoCredentialsError):
        return StorageError(f"{where}: no S3 credentials; set {envnames.AWS_ACCESS_KEY_ID}/{envnames.AWS_SECRET_ACCESS_KEY}")
    if isinstance(exc, SSLError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):  # retrying will not help
        return StorageError(f"{where}: the certificate of S3 endpoint {_endpoint(s3)} is not trusted ({exc}); for a "
                            f"private CA give its certificates as spec.s3.caBundle ({envnames.S3_CA_BUNDLE})")
    if isinstance(exc, BotoCoreError):
        return StorageUnavailableError(f"{where}: S3 endpoint {_endpoint(s3)} unreachable: {exc}")
    return StorageUnavailableError(f"{where}: {type(exc).__name__}: {exc}")


def call(action: str, url: S3Url, fn: Callable[[], T], s3: Any = None) -> T:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn()
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, url, action, s3) from exc


def streaming_errors() -> tuple[type[BaseException], ...]:
    """What reading a response body raises when the connection breaks or the body comes up short."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import IncompleteReadError, ReadTimeoutError, ResponseStreamingError
    from urllib3.exceptions import ProtocolError

    return (ResponseStreamingError, ProtocolError, ReadTimeoutError, BotoConnectionError, IncompleteReadError)


def body_retry_pause(attempt: int) -> float:
    """Seconds to wait before asking again for a body cut mid-stream (exponential, with jitter)."""
    return min(0.1 * 2**attempt, 5.0) * (1 + random.random())


def get_bytes(url: S3Url, s3: Any = None, byte_range: tuple[int, int] | None = None, attempts: int = 5) -> bytes:
    """GET an object; a body cut mid-stream is retried (botocore only retries the request)."""
    s3 = s3 or client()
    extra = {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"} if byte_range else {}
    for attempt in range(attempts):
        response = call("reading", url, lambda: s3.get_object(Bucket=url.bucket, Key=url.key, **extra), s3)
        try:
            return response["Body"].read()
        except streaming_errors() as exc:
            if attempt == attempts - 1:
                raise StorageUnavailableError(f"reading {url}: body interrupted {attempts} times: {exc}") from exc
            time.sleep(body_retry_pause(attempt))
    raise AssertionError("unreachable")


def open_stream(url: S3Url, s3: Any = None) -> IO[bytes]:
    """A file-like streaming body for sequential reads (tar streaming)."""
    s3 = s3 or client()
    return call("reading", url, lambda: s3.get_object(Bucket=url.bucket, Key=url.key), s3)["Body"]


def put_bytes(url: S3Url, data: bytes, s3: Any = None, content_type: str | None = None) -> None:
    s3 = s3 or client()
    extra = {"ContentType": content_type} if content_type else {}
    call("writing", url, lambda: s3.put_object(Bucket=url.bucket, Key=url.key, Body=data, **extra), s3)


def upload_fileobj(
    fileobj: IO[bytes],
    url: S3Url,
    s3: Any = None,
    part_size: int = 64 * 1024 * 1024,
    concurrency: int = 8,
    metadata: dict[str, str] | None = None,
) -> None:
    """Upload, switching to multipart above `part_size`; parts go up `concurrency` at a time."""
    from boto3.s3.transfer import TransferConfig

    s3 = s3 or client()
    config = TransferConfig(
        multipart_threshold=part_size, multipart_chunksize=part_size, max_concurrency=concurrency, use_threads=True
    )
    extra = {"ExtraArgs": {"Metadata": metadata}} if metadata else {}
    call("writing", url, lambda: s3.upload_fileobj(fileobj, url.bucket, url.key, Config=config, **extra), s3)


def put_large(url: S3Url, data: bytes, part_size: int = 8 * 1024 * 1024) -> None:
    """One object from bytes in memory, in parallel parts above `part_size`: through the AWS CRT where
    awscrt is installed (a third of boto3's CPU per byte; storage/crtupload.py), else boto3's upload."""
    s3 = client()
    if _use_crt():
        call("writing", url, lambda: _crt_uploader(s3).put(url.bucket, url.key, data, part_size), s3)
    else:
        upload_fileobj(io.BytesIO(data), url, s3, part_size=part_size)


def put_written(url: S3Url, write: Callable[[IO[bytes]], None], part_size: int = 8 * 1024 * 1024,
                metadata: dict[str, str] | None = None) -> None:
    """One object from what `write(file)` writes: through the AWS CRT where awscrt is installed, parts
    going up while `write` runs (never the whole object in memory); else written to memory, then put.
    If `write` raises, no object is made or replaced. `metadata`: the object's user metadata."""
    s3 = client()
    if _use_crt():
        call("writing", url,
             lambda: _crt_uploader(s3).put_written(url.bucket, url.key, write, part_size, metadata), s3)
        return
    buffer = io.BytesIO()
    write(buffer)
    buffer.seek(0)
    upload_fileobj(buffer, url, s3, part_size=part_size, metadata=metadata)


def _use_crt() -> bool:
    from . import crtupload

    return env.S3Settings.from_env().crt and crtupload.available()


def _crt_uploader(s3: Any) -> Any:
    """This process's CRT uploader, signing as `s3` does. Made inside `call`, so that its first check of
    the endpoint's certificate is said as boto3's own is (`translate`)."""
    from . import crtupload

    return crtupload.uploader(s3._get_credentials())


def unreachable(bucket: str) -> StorageUnavailableError | None:
    """Why S3 does not answer now, asked once (HEAD of the bucket, no retries, short timeouts), else None:
    a write's own retries can outlast an outage, and the code waiting for it would not know. Any answer
    (a refusal or no such bucket among them) counts as S3 answering."""
    s3 = client(quick=True)
    try:
        call("reaching", S3Url(bucket, ""), lambda: s3.head_bucket(Bucket=bucket), s3)
    except StorageUnavailableError as error:
        return error
    except TrainerError:
        return None
    return None


def head(url: S3Url, s3: Any = None) -> dict[str, Any]:
    s3 = s3 or client()
    return call("checking", url, lambda: s3.head_object(Bucket=url.bucket, Key=url.key), s3)


def list_objects(url: S3Url, s3: Any = None) -> Iterator[tuple[str, int]]:
    """Yield (key, size) under a prefix, in key order."""
    s3 = s3 or client()
    prefix = url.key + "/" if url.key and not url.key.endswith("/") else url.key
    paginator = s3.get_paginator("list_objects_v2")
    pages = paginator.paginate(Bucket=url.bucket, Prefix=prefix)
    iterator = iter(pages)
    while True:
        page = call("listing", S3Url(url.bucket, prefix), lambda: next(iterator, None), s3)
        if page is None:
            return
        for item in page.get("Contents", []):
            yield item["Key"], int(item["Size"])


def delete_keys(bucket: str, keys: Iterable[str], s3: Any = None) -> None:
    s3 = s3 or client()
    batch = list(keys)
    for start in range(0, len(batch), 1000):
        chunk = batch[start : start + 1000]
        call(
            "deleting",
            S3Url(bucket, chunk[0]),
            lambda: s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True}),
            s3,
        )


__all__ = [
    "S3Url",
    "parse_uri",
    "join_key",
    "make_client",
    "client",
    "reset_clients",
    "translate",
    "get_bytes",
    "open_stream",
    "streaming_errors",
    "body_retry_pause",
    "put_bytes",
    "upload_fileobj",
    "put_large",
    "put_written",
    "unreachable",
    "head",
    "list_objects",
    "delete_keys",
]
