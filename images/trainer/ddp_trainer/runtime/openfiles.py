"""Which files the pod's processes hold open for writing, read from /proc: what tells the folder keeper
(folderkeeper.py) that a file is between two writes. Linux only; elsewhere, or where /proc hides the
rank processes, the answer is None and the keeper goes by settling alone."""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence

PROC = "/proc"
O_ACCMODE = 0o3
WRITE_MODES = (os.O_WRONLY, os.O_RDWR)


def writers_below(roots: Sequence[str], ranks: Collection[int], proc: str = PROC) -> dict[str, frozenset[int]] | None:
    """Every file below `roots` (absolute paths without symbolic links) that a process holds open for
    writing, by a file descriptor opened O_WRONLY or O_RDWR or by a shared writable mapping, with the
    ids of those processes. Processes /proc will not show (another user's, one that is not dumpable)
    are passed over; None where it will not show one of the `ranks` (the processes the pod started,
    whose children are as readable as they are), or cannot be listed."""
    prefixes = tuple(root.rstrip("/") + "/" for root in roots)
    try:
        pids = [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return None
    found: dict[str, set[int]] = {}
    for pid in pids:
        try:
            written = _written_by(f"{proc}/{pid}", prefixes)
        except PermissionError:
            if pid in ranks:
                return None
            continue
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        for path in written:
            found.setdefault(path, set()).add(pid)
    return {path: frozenset(held) for path, held in found.items()}


def _written_by(process: str, prefixes: tuple[str, ...]) -> set[str]:
    written = set()
    for fd in os.listdir(f"{process}/fd"):
        try:
            target = os.readlink(f"{process}/fd/{fd}")
            if target.startswith(prefixes) and _open_for_writing(f"{process}/fdinfo/{fd}"):
                written.add(target)
        except FileNotFoundError:
            continue  # closed meanwhile
    with open(f"{process}/maps", encoding="utf-8", errors="surrogateescape") as maps:
        for line in maps:
            fields = line.rstrip("\n").split(maxsplit=5)  # address perms offset device inode path
            if len(fields) == 6 and fields[1][1] == "w" and fields[1][3] == "s" and fields[5].startswith(prefixes):
                written.add(fields[5])
    return written


def _open_for_writing(fdinfo: str) -> bool:
    with open(fdinfo, encoding="ascii") as info:
        for line in info:
            if line.startswith("flags:"):
                return int(line.split()[1], 8) & O_ACCMODE in WRITE_MODES
    return False


def running(pid: int, proc: str = PROC) -> bool:
    """Whether the process `pid` exists and has not ended (a zombie has)."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
