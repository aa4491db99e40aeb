"""Kept folders (spec.keepFolders): the rules for what of a local folder is kept in S3 and restored.

A version of a file is kept when it is whole (Rule): while the pod's ranks run, once no process holds
the file open for writing (it is between two writes, however often it is rewritten), or once its size
and modification time stayed unchanged for `settle` seconds (files held open: logs, event files; and
everywhere where /proc cannot tell); when the ranks end by exiting 0, every file. A version left by a
writer that ended while it held the file open may be cut short: only settling keeps it. A file still
changing when its rank fails or is stopped is not kept: its last kept version stays. A checkpoint
folder, which its tool writes file by file, is restored only whole, that is holding the file the tool
writes last:

    checkpoint-<step>/ (Hugging Face Trainer)                  trainer_state.json
    a folder of *.distcp files (torch.distributed.checkpoint)  .metadata

Files are uploaded with those markers last, and a marker only once the other files of its folder here
are kept as they are (unkept_beside), so a listing that shows a marker shows its folder's other files
too. Some files of a checkpoint each rank writes, in its own pod: a Trainer checkpoint's
rng_state_<rank>.pth, a torch.distributed.checkpoint's __<rank>_<n>.distcp. The marker is kept only
once every rank's are (parts_from_other_pods), so that a checkpoint restored whole is the one the
ranks wrote.

The rules, and what they read of the local folder (its files, a .metadata); storage/keptstore.py
moves the bytes.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from enum import Enum

HF_CHECKPOINT = re.compile(r"^checkpoint-\d+$")
HF_MARKER = "trainer_state.json"
HF_RANK_RNG = re.compile(r"^rng_state_\d+\.pth$")
DCP_SUFFIX = ".distcp"
DCP_MARKER = ".metadata"
MARKERS = (HF_MARKER, DCP_MARKER)


@dataclass(frozen=True)
class FileState:
    """What tells a file's versions apart without reading it."""

    size: int
    mtime_ns: int


def scan(root: str) -> dict[str, FileState]:
    """Every regular file below `root` by its path relative to it ('/'-separated); {} if `root` is
    missing. Symbolic links and other special files are not kept."""
    found: dict[str, FileState] = {}
    stack = [""]
    while stack:
        relative = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, relative) if relative else root))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            name = f"{relative}/{entry.name}" if relative else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(name)
                elif entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    found[name] = FileState(info.st_size, info.st_mtime_ns)
            except FileNotFoundError:
                continue  # removed between the listing and the stat
    return found


def scan_one(path: str) -> FileState | None:
    """The state of the regular file at `path`, or None if there is none."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return FileState(found.st_size, found.st_mtime_ns) if stat.S_ISREG(found.st_mode) else None


class Settler:
    """Which files have kept the same state for `settle` seconds, from the scans it is shown."""

    def __init__(self, settle: float) -> None:
        self.settle = settle
        self._since: dict[str, tuple[FileState, float]] = {}

    def observe(self, files: Mapping[str, FileState], now: float) -> None:
        for name, state in files.items():
            seen = self._since.get(name)
            if seen is None or seen[0] != state:
                self._since[name] = (state, now)
        for name in [name for name in self._since if name not in files]:
            del self._since[name]

    def settled(self, now: float) -> dict[str, FileState]:
        return {name: state for name, (state, since) in self._since.items() if now - since >= self.settle}


class Rule(Enum):
    """Why a file's version may be kept now."""

    ENDED = "the ranks exited 0"
    SETTLED = "unchanged for the settle time"
    WHOLE = "held open for writing by no process: between two writes"


def ready(files: Mapping[str, FileState], settled: Mapping[str, FileState], writing: Set[str] | None,
          ended_cleanly: bool) -> dict[str, Rule]:
    """Which files of a scan (`files`) may be kept now, and by which rule: every file once the ranks
    exited 0; else those `settled` (unchanged since), and those not in `writing` (held open for writing,
    or left by a writer that ended: Writers.writing()). `writing` None: the whole rule is off (the ranks
    are not all running, or /proc cannot tell), only settled files are ready."""
    if ended_cleanly:
        return dict.fromkeys(files, Rule.ENDED)
    found = {name: Rule.SETTLED for name, state in settled.items() if files.get(name) == state}
    if writing is not None:
        found.update({name: Rule.WHOLE for name in files if name not in writing and name not in found})
    return found


class Writers:
    """The files of a folder that processes hold open for writing, look after look. A file that a
    process held at the last look and none holds now, all those processes having ended since, may have
    been cut short by its writer's death (a kill, an OOM): that version counts as still being written,
    and only settling keeps it."""

    def __init__(self) -> None:
        self._held: dict[str, frozenset[int]] = {}
        self._left: dict[str, FileState] = {}

    def observe(self, files: Mapping[str, FileState], held: Mapping[str, frozenset[int]],
                ended: Callable[[int], bool]) -> None:
        """One look: `held`, the files of `files` held open for writing and by which processes."""
        for name, pids in self._held.items():
            if name not in held and name in files and all(ended(pid) for pid in pids):
                self._left[name] = files[name]
        self._left = {name: state for name, state in self._left.items() if files.get(name) == state}
        self._held = dict(held)

    def writing(self) -> set[str]:
        return set(self._held) | set(self._left)


class Behind:
    """The files here that S3 does not hold as they are, and since when (a POSIX time) each such
    change was first seen, after pass after pass."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}

    def observe(self, files: Mapping[str, FileState], kept: Mapping[str, FileState], now: float) -> None:
        self._since = {name: self._since.get(name, now) for name, state in files.items() if kept.get(name) != state}

    def pending(self) -> int:
        return len(self._since)

    def since(self) -> float | None:
        return min(self._since.values(), default=None)


def to_upload(ready: Mapping[str, FileState], kept: Mapping[str, FileState]) -> list[str]:
    """The files of `ready` whose state differs from what is kept, markers after every other file."""
    return sorted((name for name, state in ready.items() if kept.get(name) != state), key=upload_order)


def upload_order(name: str) -> tuple[bool, str]:
    return (posixpath.basename(name) in MARKERS, name)


def parts_from_other_pods(marker: str, local: Iterable[str], root: str, world: int) -> tuple[str, list[str]]:
    """For a checkpoint's marker, (its folder, the files of it that each rank writes, so maybe in another
    pod, which must be kept before the marker is); ("", []) for any other file.

    Trainer's checkpoint-<step>/: every rank's rng_state_<rank>.pth, where `local` holds one (a world of
    more than one rank). A torch.distributed.checkpoint folder: every file its .metadata (below `root`)
    says holds data; each rank writes its own."""
    folder, base = posixpath.split(marker)
    if base == HF_MARKER and HF_CHECKPOINT.match(posixpath.basename(folder)):
        return folder, rank_states(folder, local, world)
    if base == DCP_MARKER and folder:
        return folder, dcp_data_files(root, folder)
    return "", []


def unkept_beside(marker: str, checkpoint: str, files: Mapping[str, FileState],
                  kept: Mapping[str, FileState]) -> list[str]:
    """The files of the checkpoint folder `checkpoint` here (`files`), other than its `marker`, whose
    version is not kept: the marker waits for them, so that it never stands beside an older one."""
    return sorted(name for name, state in files.items()
                  if name != marker and within(name, [checkpoint]) and kept.get(name) != state)


def rank_states(checkpoint: str, local: Iterable[str], world: int) -> list[str]:
    """Every rank's RNG state of the Trainer `checkpoint` of a `world` of ranks, where `local` holds one
    (Trainer writes rng_state_<rank>.pth when there is more than one rank); [] where it holds none (one
    rank's rng_state.pth, or save_only_model)."""
    if not any(posixpath.dirname(n) == checkpoint and HF_RANK_RNG.match(posixpath.basename(n)) for n in local):
        return []
    return [f"{checkpoint}/rng_state_{rank}.pth" for rank in range(world)]


def dcp_data_files(root: str, checkpoint: str) -> list[str]:
    """The files the .metadata of the torch.distributed.checkpoint folder `checkpoint` (below `root`)
    names as holding its data; [] where torch cannot read it as one."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(os.path.join(root, checkpoint)).read_metadata()
        paths = {info.relative_path for info in (metadata.storage_data or {}).values()}
    except Exception:  # noqa: BLE001 - not a .metadata this torch writes (a pickle of anything): nothing to wait for
        return []
    return sorted(f"{checkpoint}/{path}" for path in paths)


def to_delete(local: Iterable[str], kept: Iterable[str]) -> tuple[list[str], list[str]]:
    """What the mirror removes for files it kept that are gone here: (folders, files). A folder gone
    whole is removed whole, with what other pods kept in it, as rmtree on a shared filesystem would."""
    present = set(local)
    gone = sorted(set(kept) - present)
    present_dirs = {parent for name in present for parent in parents(name)}
    folders: list[str] = []
    files: list[str] = []
    for name in gone:
        missing = [parent for parent in parents(name) if parent not in present_dirs]
        if not missing:
            files.append(name)
        elif missing[0] not in folders:  # the outermost folder gone
            folders.append(missing[0])
    return folders, files


def parents(name: str) -> list[str]:
    """`a/b/c.txt` -> ['a', 'a/b'], outermost first."""
    parts = name.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def checkpoint_folders(names: Iterable[str]) -> set[str]:
    """The checkpoint folders among `names`' parents: Hugging Face's checkpoint-<step>, and folders
    holding *.distcp files."""
    found: set[str] = set()
    for name in names:
        found.update(parent for parent in parents(name) if HF_CHECKPOINT.match(posixpath.basename(parent)))
        if name.endswith(DCP_SUFFIX) and posixpath.dirname(name):
            found.add(posixpath.dirname(name))
    return found


def incomplete_checkpoints(names: Iterable[str]) -> set[str]:
    """The checkpoint folders among `names`' parents that lack the file their tool writes last."""
    present = set(names)
    return {folder for folder in checkpoint_folders(present) if not _finished(folder, present)}


def _finished(folder: str, present: set[str]) -> bool:
    marker = HF_MARKER if HF_CHECKPOINT.match(posixpath.basename(folder)) else DCP_MARKER
    return f"{folder}/{marker}" in present


def not_whole_in(local: Iterable[str], kept: Iterable[str]) -> set[str]:
    """The checkpoint folders here (`local`) that are not whole in what is kept: a later attempt's pods
    must all resume from the same checkpoint, so each drops those the others cannot have."""
    kept_names = set(kept)
    whole = checkpoint_folders(kept_names) - incomplete_checkpoints(kept_names)
    return checkpoint_folders(local) - whole


def within(name: str, folders: Iterable[str]) -> bool:
    return any(name == folder or name.startswith(folder + "/") for folder in folders)


def restorable(names: Iterable[str]) -> tuple[list[str], set[str]]:
    """(the files to restore, the incomplete checkpoint folders left out) of a kept folder's listing."""
    listed = list(names)
    torn = incomplete_checkpoints(listed)
    return sorted(name for name in listed if not within(name, torn)), torn


def folder_times(files: Mapping[str, int]) -> dict[str, int]:
    """Each folder's modification time (ns) after a restore: the newest of the files below it, so
    that tools ordering their checkpoints by the folder's time (Hugging Face's rotation) find the
    same order as before. `files`: file -> mtime_ns."""
    times: dict[str, int] = {}
    for name, mtime in files.items():
        for parent in parents(name):
            times[parent] = max(times.get(parent, mtime), mtime)
    return times
