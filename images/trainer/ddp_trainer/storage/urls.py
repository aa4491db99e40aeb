"""One URL layer for data: ``s3://bucket/key`` and local paths (``file://`` or plain), like webdataset's gopen.

Each scheme is a row of `SCHEMES` that says how to open a URL for sequential reading, read it
whole, write it, fetch it into a local file, list what lies under it, join a name onto it and
resolve a relative URL against it. Callers hand URLs to the functions below and never test for a prefix themselves.
Errors name the URL (S3 errors name the bucket and key, see `s3.translate`).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from ..errors import ConfigError, ObjectNotFoundError
from . import readahead, s3

FILE_PREFIX = "file://"


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary name beside `path` to write to: renamed to `path` when the block succeeds,
    removed when it fails, so readers (other processes too) never see a partial file."""
    tmp = f"{path}.part.{os.getpid()}.{threading.get_ident()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _local(url: str) -> str:
    return url[len(FILE_PREFIX) :] if url.startswith(FILE_PREFIX) else url


def _open_local(url: str) -> IO[bytes]:
    try:
        return open(_local(url), "rb")
    except FileNotFoundError:
        raise ObjectNotFoundError(f"reading {_local(url)}: file does not exist") from None


def _read_local(url: str) -> bytes:
    with _open_local(url) as f:
        return f.read()


def _write_local(url: str, data: bytes) -> None:
    path = _local(url)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def _fetch_local(url: str, path: str) -> None:
    try:
        shutil.copyfile(_local(url), path)
    except FileNotFoundError:
        raise ObjectNotFoundError(f"reading {_local(url)}: file does not exist") from None


def _list_local(url: str) -> list[str]:
    root = _local(url)
    if not os.path.isdir(root):
        raise ConfigError(f"{url!r} is neither an s3:// URI nor a local directory")
    names: list[str] = []
    for directory, _, files in os.walk(root, followlinks=True):
        rel = os.path.relpath(directory, root)
        names.extend(os.path.join(rel, name).replace(os.sep, "/").removeprefix("./") for name in files)
    return names


def _resolve_local(base: str, relative: str) -> str:
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(_local(base))), relative))


def _open_s3(url: str) -> IO[bytes]:
    return readahead.open_readahead(s3.parse_uri(url))  # type: ignore[return-value]  # file-like: read, close


def _fetch_s3(url: str, path: str) -> None:
    readahead.download(s3.parse_uri(url), path)  # looked up on each call: tests count downloads


def _list_s3(url: str) -> list[str]:
    root = s3.parse_uri(url)
    base = len(root.key) + 1 if root.key else 0
    return [key[base:] for key, _ in s3.list_objects(root)]


def _resolve_s3(base: str, relative: str) -> str:
    bucket_and_key = base[len("s3://") :]
    return "s3://" + posixpath.normpath(posixpath.join(posixpath.dirname(bucket_and_key), relative))


@dataclass(frozen=True)
class Scheme:
    local: bool  # readable in place with open(); remote ones go through a local cache
    open: Callable[[str], IO[bytes]]  # sequential reads (tar streaming)
    read: Callable[[str], bytes]
    write: Callable[[str, bytes], None]
    fetch: Callable[[str, str], None]  # (url, local path): the whole object into a file
    list: Callable[[str], list[str]]  # the objects under a directory URL, '/'-separated names relative to it
    join: Callable[[str, str], str]
    resolve: Callable[[str, str], str]  # (base URL, relative URL): relative to base's directory


SCHEMES: dict[str, Scheme] = {
    "s3": Scheme(
        local=False,
        open=_open_s3,
        read=lambda url: s3.get_bytes(s3.parse_uri(url)),
        write=lambda url, data: s3.put_bytes(s3.parse_uri(url), data),
        fetch=_fetch_s3,
        list=_list_s3,
        join=lambda url, name: url.rstrip("/") + "/" + name,
        resolve=_resolve_s3,
    ),
    "file": Scheme(
        local=True,
        open=_open_local,
        read=_read_local,
        write=_write_local,
        fetch=_fetch_local,
        list=_list_local,
        join=os.path.join,
        resolve=_resolve_local,
    ),
}


def scheme_name(url: str) -> str:
    """`s3` or `file`; a path without a scheme is a local file."""
    head, sep, _ = url.partition("://")
    return head.lower() if sep and "/" not in head else "file"


def scheme(url: str) -> Scheme:
    name = scheme_name(url)
    found = SCHEMES.get(name)
    if found is None:
        raise ConfigError(f"{url!r}: unsupported URL scheme {name!r} (supported: s3://, file:// and local paths)")
    return found


def has_scheme(url: str) -> bool:
    head, sep, _ = url.partition("://")
    return bool(sep) and "/" not in head


def is_local(url: str) -> bool:
    return scheme(url).local


def local_path(url: str) -> str:
    """The file system path of a local URL (``file://`` dropped)."""
    return _local(url)


def open_url(url: str) -> IO[bytes]:
    return scheme(url).open(url)


def read_bytes(url: str) -> bytes:
    return scheme(url).read(url)


def write_bytes(url: str, data: bytes) -> None:
    """Write a whole object; a local file is replaced atomically."""
    scheme(url).write(url, data)


def fetch(url: str, path: str) -> None:
    scheme(url).fetch(url, path)


def list_names(url: str) -> list[str]:
    """Every object under a directory (local) or prefix (s3://), relative to it, in listing order."""
    return scheme(url).list(url)


def join(url: str, name: str) -> str:
    return scheme(url).join(url, name)


def resolve(base: str, url: str) -> str:
    """`url` relative to the directory of `base` (as wids resolves shard URLs against the index);
    an absolute path or a URL with a scheme stands as it is, less ``file://``."""
    if has_scheme(url) or os.path.isabs(url):
        return _local(url)
    return scheme(base).resolve(base, url)
