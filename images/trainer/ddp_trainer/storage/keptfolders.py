"""Kept folders (spec.keepFolders): the rules for what of a local folder is kept in S3 and restored.

A file is kept once it has settled: its size and modification time unchanged for `settle` seconds
while its rank runs, or when the rank ends by exiting 0. A file still changing when its rank fails or
is stopped is not kept: its last settled version stays. A checkpoint folder, which its tool writes
file by file, is restored only whole, that is holding the file the tool writes last:

    checkpoint-<step>/ (Hugging Face Trainer)                  trainer_state.json
    a folder of *.distcp files (torch.distributed.checkpoint)  .metadata

Files are uploaded with those markers last, so a listing that shows a marker shows its folder's
other files too. Some files of a checkpoint each rank writes, in its own pod: a Trainer checkpoint's
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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
