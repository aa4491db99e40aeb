"""Sequential reads of one S3 object at more than one connection's speed.

S3 serves each connection at a bounded rate and scales with parallel connections; its guidance is
ranged GETs of 8-16 MB in parallel (s3torchconnector and `aws s3 cp` read large objects this way).
`ReadAhead` streams the first part on the calling thread, so the first bytes come as soon as with a
plain GET, while `ahead` threads fetch the following parts; `read()` hands the bytes out in order.
A body cut mid-stream is resumed from where it stopped (ranged parts are retried by `s3.get_bytes`).
"""

from __future__ import annotations

import re
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .. import env
from ..errors import StorageError, StorageUnavailableError
from . import s3

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_RESUME_ATTEMPTS = 5
_WHOLE_OBJECT = 1 << 62  # a first "part" that is the whole object: one GET, no threads


def open_readahead(url: s3.S3Url, client: Any = None, settings: env.S3Settings | None = None) -> ReadAhead:
    """A file-like reader of the whole object: ranged parallel GETs, or one GET if read_ahead is 0
    (resumed after a cut either way)."""
    settings = settings or env.S3Settings.from_env()
    part_size = settings.read_part_bytes if settings.read_ahead else _WHOLE_OBJECT
    return ReadAhead(url, part_size, max(settings.read_ahead, 1), client)


def download(url: s3.S3Url, path: str, client: Any = None, settings: env.S3Settings | None = None) -> None:
    """Write the object to a local file, read the same way."""
    settings = settings or env.S3Settings.from_env()
    with open_readahead(url, client, settings) as reader, open(path, "wb") as out:
        while chunk := reader.read(settings.read_part_bytes):
            out.write(chunk)


def part_ranges(start: int, size: int, part_size: int) -> list[tuple[int, int]]:
    """[start, end) of each part from `start` to the end of the object."""
    return [(at, min(at + part_size, size)) for at in range(start, size, part_size)]


def object_size(response: dict[str, Any]) -> int | None:
    """The whole object's size from a ranged GET's Content-Range; None if the store ignored the Range."""
    match = _CONTENT_RANGE.fullmatch(str(response.get("ContentRange") or "").strip())
    return int(match.group(3)) if match else None


class ReadAhead:
    def __init__(self, url: s3.S3Url, part_size: int, ahead: int, client: Any = None) -> None:
        self.url = url
        self._s3 = client or s3.client()
        response = self._get_first_part(part_size)
        size = object_size(response)
        if size is None:  # the whole object came back: stream it all, nothing to fetch in parallel
            size = int(response["ContentLength"])
            self._end = size
        else:
            self._end = min(part_size, size)  # where the streamed first part stops
        self.size = size
        self._body: Any = response["Body"]
        self._pos = 0
        self._ranges = deque(part_ranges(self._end, size, part_size))
        self._ahead = ahead
        self._pool = ThreadPoolExecutor(min(ahead, len(self._ranges)), "s3-read-ahead") if self._ranges else None
        self._pending: deque[tuple[tuple[int, int], Future[bytes]]] = deque()
        self._part, self._offset = b"", 0
        self.parts_fetched = 0  # ranged GETs issued after the first part
        self._submit()

    def _get_first_part(self, part_size: int) -> dict[str, Any]:
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = self.url.bucket, self.url.key
        try:
            return self._s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{part_size - 1}")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "InvalidRange":  # an empty object has no byte 0
                raise s3.translate(exc, self.url, "reading", self._s3) from exc
        except BotoCoreError as exc:
            raise s3.translate(exc, self.url, "reading", self._s3) from exc
        return s3.call("reading", self.url, lambda: self._s3.get_object(Bucket=bucket, Key=key), self._s3)

    def _submit(self) -> None:
        while self._pool is not None and self._ranges and len(self._pending) < self._ahead:
            byte_range = self._ranges.popleft()
            self._pending.append((byte_range, self._pool.submit(s3.get_bytes, self.url, self._s3, byte_range)))
            self.parts_fetched += 1

    def _next_part(self) -> bool:
        if not self._pending:
            return False
        (start, end), future = self._pending.popleft()
        self._submit()
        data = future.result()
        if len(data) != end - start:
            raise StorageError(f"reading {self.url}: bytes {start}-{end - 1} came back as {len(data)} bytes")
        self._part, self._offset = data, 0
        return True

    def _read_body(self, size: int) -> bytes:
        for attempt in range(_RESUME_ATTEMPTS):
            try:
                data = self._body.read(size)
            except s3.streaming_errors() as exc:
                if attempt == _RESUME_ATTEMPTS - 1:
                    raise StorageUnavailableError(
                        f"reading {self.url}: body interrupted {_RESUME_ATTEMPTS} times: {exc}") from exc
                time.sleep(s3.body_retry_pause(attempt))
                self._resume()
                continue
            self._pos += len(data)
            return data
        raise AssertionError("unreachable")

    def _resume(self) -> None:
        self._body.close()
        bucket, key, at, end = self.url.bucket, self.url.key, self._pos, self._end
        response = s3.call("reading", self.url,
                           lambda: self._s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={at}-{end - 1}"), self._s3)
        self._body = response["Body"]

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(1 << 30), b""))
        while size:
            if self._body is not None:
                if self._pos < self._end:
                    data = self._read_body(min(size, self._end - self._pos))
                    if not data:
                        raise StorageError(f"reading {self.url}: the object ended at byte {self._pos} of {self._end}")
                    return data
                self._body.close()
                self._body = None
            elif self._offset < len(self._part):
                start = self._offset
                self._offset = min(start + size, len(self._part))
                return self._part[start : self._offset]  # the whole part without a copy when size allows
            if not self._next_part():
                return b""
        return b""

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._part = b""

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
