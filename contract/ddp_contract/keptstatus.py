"""status.kept: spec.keepFolders as the pod of index 0 keeps them in S3, written by its runtime
(runtime/folderkeeper.py) and read by the client (`kubectl ddp status`'s Kept line):

    {"time": "...", "folders": [{"path": "/home/ddp/out", "uri": "s3://b/runs/ns/job/kept/home/ddp/out",
                                 "files": 12, "bytes": 1234000, "pending": 2, "behindSince": "..."}]}

`pending` and `behindSince` only while the folder holds files, written in that pod, that S3 does not
hold as they are: how many, and when the oldest of those changes was first seen. A merge patch
replaces the list whole, so a folder that caught up loses both.
"""

from __future__ import annotations

from typing import Any, Final

from .timestamps import rfc3339

TIME: Final = "time"
FOLDERS: Final = "folders"
PATH: Final = "path"  # as spec.keepFolders writes it
URI: Final = "uri"
FILES: Final = "files"
BYTES: Final = "bytes"
PENDING: Final = "pending"
BEHIND_SINCE: Final = "behindSince"


def folder(path: str, uri: str, files: int, size: int, pending: int = 0,
           behind_since: float | None = None) -> dict[str, Any]:
    """One entry of status.kept.folders; `behind_since`: a POSIX time, None while nothing is pending."""
    entry: dict[str, Any] = {PATH: path, URI: uri, FILES: files, BYTES: size}
    if pending and behind_since is not None:
        entry[PENDING] = pending
        entry[BEHIND_SINCE] = rfc3339(behind_since)
    return entry
