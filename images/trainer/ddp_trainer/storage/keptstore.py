"""A kept folder's copy in S3, `<job>/kept/<folder key>/<path>`: one object per file, the tree as it
is on disk (browsable, and `aws s3 sync` gives the folder back). Each object carries its file's
modification time and the pod that kept it as user metadata."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from ..errors import ObjectNotFoundError
from . import readahead, s3
from .keptfolders import FileState, scan_one

CHUNK_BYTES = 8 * 1024 * 1024
MTIME = "ddp-mtime-ns"
WRITER = "ddp-writer"


class FileChanged(Exception):
    """The file changed while it was being uploaded: what went up is not one version of it."""


@dataclass(frozen=True)
class Kept:
    """An object's user metadata: the file's time and the pod that kept it ('' if not ours)."""

    mtime_ns: int | None
    writer: str


def relative_listing(prefix: s3.S3Url) -> Iterator[tuple[str, int]]:
    """(key relative to `prefix`, size) of every object below it."""
    start = len(prefix.key.rstrip("/")) + 1 if prefix.key else 0
    for key, size in s3.list_objects(prefix):
        yield key[start:], size


class KeptStore:
    def __init__(self, prefix: s3.S3Url, writer: str) -> None:
        self.prefix = prefix
        self.writer = writer

    def url(self, name: str) -> s3.S3Url:
        return self.prefix.join(name)

    def listing(self) -> dict[str, int]:
        """Every kept file's name (relative to the folder) and size."""
        return dict(relative_listing(self.prefix))

    def names_below(self, folder: str) -> set[str]:
        """The kept files below `folder`, named as in listing()."""
        return {f"{folder}/{name}" for name, _ in relative_listing(self.url(folder))}

    def kept(self, name: str) -> Kept | None:
        """The object's metadata, or None if there is no such object."""
        try:
            response = s3.head(self.url(name))
        except ObjectNotFoundError:
            return None
        metadata = {k.lower(): v for k, v in (response.get("Metadata") or {}).items()}
        raw = metadata.get(MTIME, "")
        return Kept(int(raw) if raw.isdigit() else None, metadata.get(WRITER, ""))

    def upload(self, name: str, path: str, state: FileState, still: Callable[[], bool] = lambda: True) -> bool:
        """Put the file as it is in `state`; False, with nothing replaced, if it changed while it was read,
        or `still()` says no once it is read (a multipart upload is abandoned before it completes, a single
        PUT is never sent)."""
        def copy(out: IO[bytes]) -> None:
            with open(path, "rb") as source:
                while chunk := source.read(CHUNK_BYTES):
                    out.write(chunk)
                if scan_one(path) != state or source.tell() != state.size or not still():
                    raise FileChanged(path)

        try:
            s3.put_written(self.url(name), copy, metadata={MTIME: str(state.mtime_ns), WRITER: self.writer})
        except (FileChanged, FileNotFoundError):
            return False
        return True

    def delete(self, files: list[str], folders: list[str]) -> None:
        keys = [self.url(name).key for name in files]
        for folder in folders:
            keys += [key for key, _ in s3.list_objects(self.url(folder))]
        if keys:
            s3.delete_keys(self.prefix.bucket, keys)

    def fetch(self, name: str, path: str, meta: Kept | None) -> FileState:
        """Download the object to `path` (through a temporary file beside it, renamed when whole) with
        its kept modification time (`meta`, its `kept()`); returns the local file's state."""
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        partial = f"{path}.ddp-restoring"
        try:
            readahead.download(self.url(name), partial)
            if meta is not None and meta.mtime_ns is not None:
                os.utime(partial, ns=(meta.mtime_ns, meta.mtime_ns))
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
        stat = os.stat(path)
        return FileState(stat.st_size, stat.st_mtime_ns)


class KeptPasses:
    """Each pod's keeper in each attempt, `<job>/kept-passes/attempt-<n>/<pod>.started` while it keeps
    and `.done` once its last pass is in S3: a later attempt's pods wait for every last pass before they
    restore, so that they all see the same files (the checkpoint each resumes from among them)."""

    def __init__(self, prefix: s3.S3Url, pod: str) -> None:
        self.prefix = prefix
        self.pod = pod

    def mark(self, attempt: int, state: str) -> None:
        s3.put_bytes(self.prefix.join(f"attempt-{attempt}", f"{self.pod}.{state}"), b"")

    def unfinished(self, before: int) -> list[str]:
        """The pods of attempts before `before` whose keeper started and has not finished its last pass."""
        states: dict[tuple[int, str], set[str]] = {}
        for relative, _ in relative_listing(self.prefix):
            folder, _, name = relative.partition("/")
            pod, _, state = name.rpartition(".")
            if folder.startswith("attempt-") and folder[8:].isdigit() and int(folder[8:]) < before:
                states.setdefault((int(folder[8:]), pod), set()).add(state)
        return [f"{pod} (attempt {attempt})" for (attempt, pod), seen in sorted(states.items())
                if "started" in seen and "done" not in seen]
