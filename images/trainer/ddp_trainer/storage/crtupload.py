"""Large uploads (checkpoints) through the AWS Common Runtime, when `awscrt` is installed (boto3's
optional transfer client, `pip install "boto3[crt]"`; the trainer image has it).

boto3's own multipart upload reads, signs and sends every part from Python threads; the CRT does it from
native threads, at about a third of the CPU per byte (`make bench-checkpoint`), which is what a busy node
(or an S3 server on the same cores) has least of. boto3's CRT transfer manager cannot be used as it
is: it signs for AWS's endpoint whatever the client's is, takes no CA bundle, and always sends a CRC32
trailer, which stores that predate boto3 1.36 refuse. Here the request honours the same S3Options as
every boto3 client of ours: endpoint, region, addressing style, CA bundle, and checksums only when
they are wanted (`when_supported`).
"""

from __future__ import annotations

import collections
import io
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, cast
from urllib.parse import quote, urlsplit

from .. import env
from ..errors import StorageError, StorageUnavailableError

PART_BYTES = 8 * 1024 * 1024  # the CRT's own default; 64 MB parts cost it more CPU per byte
BUFFERED_PARTS = 32  # put_written: parts written ahead of the upload at most (more lets torch.save run ahead)


def available() -> bool:
    try:
        import awscrt.s3  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Target:
    """Where a PUT of `bucket/key` goes: the Host header, the request path, and whether over TLS."""

    host: str
    path: str
    tls: bool


def target(settings: env.S3Settings, bucket: str, key: str) -> Target:
    """The request line botocore would make: path style (`host/bucket/key`) for a custom endpoint
    unless told otherwise, virtual-hosted (`bucket.host/key`) on AWS; the key percent-encoded as S3 signs it."""
    endpoint = settings.endpoint_url or f"https://s3.{settings.region}.amazonaws.com"
    parts = urlsplit(endpoint)
    style = settings.options.config_kwargs().get("s3", {}).get("addressing_style")
    if style in (None, "auto"):
        style = "virtual" if _dns_compatible(bucket) and not settings.endpoint_url else "path"
    base = parts.path.rstrip("/")
    encoded = quote(key, safe="/~")
    if style == "path":
        return Target(parts.netloc, f"{base}/{bucket}/{encoded}", parts.scheme == "https")
    return Target(f"{bucket}.{parts.netloc}", f"{base}/{encoded}", parts.scheme == "https")


def _dns_compatible(bucket: str) -> bool:
    return re.fullmatch(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", bucket) is not None


class CrtUploader:
    """One CRT S3 client (its own event loop threads and connections) for this process's uploads."""

    def __init__(self, settings: env.S3Settings, credentials: Any) -> None:
        """credentials: botocore credentials (refreshed as they expire) or None for anonymous requests."""
        from awscrt.auth import AwsCredentials, AwsCredentialsProvider
        from awscrt.io import ClientBootstrap, ClientTlsContext, DefaultHostResolver, EventLoopGroup, TlsContextOptions
        from awscrt.s3 import S3Client, S3RequestTlsMode, S3RetryConfig

        self.settings = settings
        provider = None
        if credentials is not None:
            def current() -> Any:
                frozen = credentials.get_frozen_credentials()
                return AwsCredentials(frozen.access_key, frozen.secret_key, frozen.token)

            provider = AwsCredentialsProvider.new_delegate(current)
        tls_options = None
        if settings.options.ca_bundle:
            context = TlsContextOptions()
            context.override_default_trust_store_from_path(ca_filepath=settings.options.ca_bundle)
            tls_options = ClientTlsContext(context).new_connection_options()
        https = (settings.endpoint_url or "https://").startswith("https://")
        if https and settings.endpoint_url:
            check_trust(settings.endpoint_url, settings.options.ca_bundle)
        loops = EventLoopGroup()
        self._client = S3Client(
            bootstrap=ClientBootstrap(loops, DefaultHostResolver(loops)),
            region=settings.region,
            tls_mode=S3RequestTlsMode.ENABLED if https else S3RequestTlsMode.DISABLED,
            credential_provider=provider,
            tls_connection_options=tls_options,
            part_size=PART_BYTES,
            retry_config=S3RetryConfig(max_retries=max(settings.max_attempts - 1, 1)),
        )

    def put(self, bucket: str, key: str, data: bytes, part_size: int = PART_BYTES) -> None:
        """PUT `data` as one object (multipart above `part_size`, parts in parallel); raises as
        `translate` says."""
        self._send(bucket, key, io.BytesIO(data), len(data), part_size).wait()

    def put_written(self, bucket: str, key: str, write: Callable[[IO[bytes]], None],
                    part_size: int = PART_BYTES, metadata: dict[str, str] | None = None) -> None:
        """PUT what `write(file)` writes into `file`, uploading parts while it writes: the object is never
        whole in memory (at most BUFFERED_PARTS parts are), and writing and sending overlap. If `write`
        raises, the upload is abandoned and its error raised; if the upload fails, `write` is stopped."""
        pipe = Pipe(limit=BUFFERED_PARTS * part_size)
        sent = self._send(bucket, key, cast(IO[bytes], pipe), None, part_size, metadata)
        sent.request.finished_future.add_done_callback(lambda _: pipe.stop(UploadEnded()))
        try:
            write(cast(IO[bytes], pipe))
        except UploadEnded:
            pass  # the upload failed: its error is raised below
        except BaseException:
            sent.request.cancel()
            pipe.stop(UploadEnded())
            raise
        pipe.finish()
        sent.wait()

    def _send(self, bucket: str, key: str, body: IO[bytes], size: int | None, part_size: int,
              metadata: dict[str, str] | None = None) -> _Sent:
        from awscrt.http import HttpHeaders, HttpRequest
        from awscrt.s3 import S3ChecksumAlgorithm, S3ChecksumConfig, S3ChecksumLocation, S3RequestType

        where = target(self.settings, bucket, key)
        headers = HttpHeaders([("Host", where.host)])
        if size is not None:  # without it the CRT uploads parts as they are read, to the end of the stream
            headers.add("Content-Length", str(size))
        for name, value in (metadata or {}).items():
            headers.add(f"x-amz-meta-{name}", value)
        checksum = None
        if self.settings.options.checksum_mode == "when_supported":
            checksum = S3ChecksumConfig(algorithm=S3ChecksumAlgorithm.CRC32, location=S3ChecksumLocation.TRAILER)
        request = self._client.make_request(type=S3RequestType.PUT_OBJECT,
                                            request=HttpRequest("PUT", where.path, headers, body),
                                            checksum_config=checksum,
                                            part_size=max(part_size, 5 * 1024 * 1024))
        return _Sent(request, bucket, key, self.settings.endpoint_url)


@dataclass(frozen=True)
class _Sent:
    """A CRT request under way; `wait()` raises its failure as `translate` says."""

    request: Any
    bucket: str
    key: str
    endpoint: str | None

    def wait(self) -> None:
        from awscrt.exceptions import AwsCrtError

        try:
            self.request.finished_future.result()
        except AwsCrtError as exc:
            raise translate(exc, self.bucket, self.key, self.endpoint) from exc


class UploadEnded(Exception):
    """Raised into the writer when the upload it feeds has ended (failed, or abandoned)."""


class Pipe(io.RawIOBase):
    """What one thread writes, read by the CRT's threads (readinto), at most `limit` bytes held: the
    writer waits while the reader is behind, the reader while the writer is."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._offset = 0  # into the first chunk
        self._held = 0
        self._limit = limit
        self._ended = False  # no more writes
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        chunk = bytes(data)  # the writer may reuse its buffer
        with self._changed:
            while self._held >= self._limit and self._error is None:
                self._changed.wait()
            if self._error is not None:
                raise self._error
            self._chunks.append(chunk)
            self._held += len(chunk)
            self._changed.notify_all()
        return len(chunk)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        with self._changed:
            while not self._chunks and not self._ended and self._error is None:
                self._changed.wait()
            if self._error is not None:
                return 0
            filled = 0
            while self._chunks and filled < len(view):
                first = self._chunks[0]
                taken = min(len(first) - self._offset, len(view) - filled)
                view[filled:filled + taken] = first[self._offset:self._offset + taken]
                filled += taken
                self._offset += taken
                if self._offset == len(first):
                    self._chunks.popleft()
                    self._offset = 0
            self._held -= filled
            self._changed.notify_all()
            return filled

    def finish(self) -> None:
        """The end of what is written: the reader gets the rest, then the end of the stream."""
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def stop(self, error: BaseException) -> None:
        """A waiting or later write raises `error`; a read gets the end of the stream."""
        with self._changed:
            self._error = error
            self._ended = True
            self._changed.notify_all()


def check_trust(endpoint: str, ca_bundle: str | None) -> None:
    """Raise botocore's SSLError, as boto3 would (s3.translate says it), if `endpoint`'s certificate is
    not trusted. The CRT's TLS (s2n) answers a failed handshake only after a random 10-30 s delay, on
    every retry: minutes before a wrong caBundle is said. Python's ssl reads the same system trust store
    (or the bundle) and says it at once."""
    import socket
    import ssl

    from botocore.exceptions import SSLError

    parts = urlsplit(endpoint)
    host, port = parts.hostname or "", parts.port or 443
    context = ssl.create_default_context(cafile=ca_bundle)
    try:
        with socket.create_connection((host, port), timeout=10) as raw, context.wrap_socket(raw, server_hostname=host):
            pass
    except ssl.SSLCertVerificationError as exc:
        raise SSLError(endpoint_url=endpoint, error=exc) from exc
    except OSError:
        pass  # unreachable now: the upload's own retries and error say so


def translate(exc: Any, bucket: str, key: str, endpoint: str | None) -> Exception:
    """A CRT failure as boto3 would have raised it (a ClientError with the server's code, for s3.call
    to turn into the runtime's error as it does boto3's), or as the runtime's error where boto3 has none."""
    from botocore.exceptions import ClientError

    from ddp_contract import envnames

    where = f"writing s3://{bucket}/{key}"
    status = getattr(exc, "status_code", None)
    if status:  # the server answered: its error code, as botocore reads it
        body = (getattr(exc, "body", None) or b"").decode("utf-8", "replace")
        code = _xml_field(body, "Code") or str(status)
        message = _xml_field(body, "Message") or exc.name
        return ClientError({"Error": {"Code": code, "Message": message}}, exc.operation_name or "PutObject")
    if "TLS" in exc.name and ("CERT" in exc.name or "NEGOTIATION" in exc.name):
        return StorageError(f"{where}: TLS with S3 endpoint {endpoint} failed ({exc.name}: {exc.message}); for a "
                            f"private CA give its certificates as spec.s3.caBundle ({envnames.S3_CA_BUNDLE})")
    return StorageUnavailableError(f"{where}: S3 endpoint {endpoint or 'AWS'} unreachable: {exc.name}: {exc.message}")


def _xml_field(body: str, name: str) -> str | None:
    found = re.search(rf"<{name}>([^<]*)</{name}>", body)
    return found.group(1) if found else None


_uploaders: dict[int, CrtUploader] = {}
_lock = threading.Lock()


def uploader(credentials: Any) -> CrtUploader:
    """This process's uploader (the CRT's threads do not survive fork: a child makes its own)."""
    pid = os.getpid()
    with _lock:
        if pid not in _uploaders:
            _uploaders.clear()
            _uploaders[pid] = CrtUploader(env.S3Settings.from_env(), credentials)
        return _uploaders[pid]


def reset() -> None:
    with _lock:
        _uploaders.clear()


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it when it forked
    _uploaders.clear()


os.register_at_fork(after_in_child=_forget_in_child)
