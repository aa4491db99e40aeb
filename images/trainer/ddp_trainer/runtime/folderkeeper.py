"""Kept folders (spec.keepFolders): local folders the job's code writes (Hugging Face's output_dir,
lightning_logs/, TensorBoard's runs/) mirrored to `<results>/<namespace>/<job>/kept/<folder>/` while
the ranks run and when they end, and restored into the pod before each attempt's ranks start, so that
code which resumes from its own folder finds it after a gang restart, a replaced pod or a resize.

The rules (which files are kept, which checkpoint folders are restored) are storage/keptfolders.py's;
the bytes move through storage/keptstore.py, and which files are held open for writing is read from
/proc (openfiles.py). The keeper runs in the process that supervises the ranks, on a thread of its
own, never in a training process.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ddp_contract import envnames, keptstatus, layout
from ddp_contract.exitcodes import ExitCode
from ddp_contract.jobstatus import STATUS_KEPT
from ddp_contract.timestamps import rfc3339

from .. import env, jobstatus
from ..errors import ConfigError, TrainerError
from ..storage import keptfolders
from ..storage.keptfolders import Behind, FileState, Rule, Settler, Writers
from ..storage.keptstore import KeptPasses, KeptStore
from . import openfiles
from .rankprocesses import RankProcesses

log = logging.getLogger(__name__)

Held = Callable[[], Mapping[str, frozenset[int]] | None]  # what the pod's processes hold open for writing

# Before it restores, how long a pod waits for the last passes of the earlier attempts' pods (one that
# is gone without its last pass, killed or lost with its node, is waited for this long).
PASSES_WAIT_SECONDS = 60.0
# At its last pass, how long a pod waits for the other pods' last passes to bring a checkpoint's files
# their ranks wrote (parts_from_other_pods) before it gives up on keeping that checkpoint's marker.
PARTS_WAIT_SECONDS = 15.0
STATUS_EVERY_SECONDS = 30.0  # status.kept: written at most this often while the ranks run, and at their end

# How long the last pass may take: when the ranks ended by themselves nobody waits for the pod, and a
# large last checkpoint is worth the wait; when the pod is stopped, its grace period (30 s) bounds it.
ENDED_UPLOAD_SECONDS = 600.0
STOPPED_UPLOAD_SECONDS = 20.0



@dataclass
class KeptFolder:
    """One folder of spec.keepFolders: as written, where it is here, and its copy in S3."""

    path: str
    local: str
    store: KeptStore
    kept: dict[str, FileState] = field(default_factory=dict)  # what is in S3 as this pod knows it
    rewritten: set[str] = field(default_factory=set)  # files that changed while they went up: copied first


def folders_from_env(environ: Mapping[str, str]) -> list[str]:
    """The folders $DDP_KEEP_FOLDERS names (a JSON list of paths), [] where it is unset."""
    raw = environ.get(envnames.KEEP_FOLDERS, "").strip()
    if not raw:
        return []
    try:
        paths = json.loads(raw)
    except ValueError as error:
        raise ConfigError(f"environment variable {envnames.KEEP_FOLDERS} is not a JSON list of paths: {error}") from None
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ConfigError(f"environment variable {envnames.KEEP_FOLDERS} must be a JSON list of paths, not {raw!r}")
    for path in paths:
        try:
            layout.kept_folder_key(path)
        except ValueError as error:
            raise ConfigError(f"environment variable {envnames.KEEP_FOLDERS}: kept folder {error}") from None
    return paths


def make_folder_keeper(environ: Mapping[str, str], cwd: str | None = None,
                       ranks: Callable[[], Sequence[int]] | None = None) -> FolderKeeper | None:
    """The keeper of the folders the job names, or None where it names none (`ranks`: the ids of the
    processes the pod started for the attempt). Raises ConfigError where it names some but has no
    results prefix to keep them under."""
    from ..storage.results import job_prefix

    paths = folders_from_env(environ)
    if not paths:
        return None
    if not environ.get(envnames.RESULTS_URI, "").strip():
        raise ConfigError(f"{envnames.KEEP_FOLDERS} names folders to keep, but the job has no results prefix "
                          f"(spec.s3.results) to keep them under")
    job = job_prefix(env.results_uri(environ), env.JobInfo.from_env(environ))
    writer = environ.get("HOSTNAME", "") or socket.gethostname()
    base = cwd or os.getcwd()
    folders = [KeptFolder(path, os.path.join(base, path),
                          KeptStore(job.join(layout.KEPT, layout.kept_folder_key(path)), writer)) for path in paths]
    return FolderKeeper(folders, env.keep_interval_s(environ), env.keep_settle_s(environ),
                        report=lambda kept: jobstatus.record({STATUS_KEPT: kept}),
                        passes=KeptPasses(job.join(layout.KEPT_PASSES), writer), ranks=ranks)


class FolderKeeper:
    """Mirrors its folders every `interval_s` from `start` to `finish`: files no process holds open for
    writing while the ranks run, and files settled for `settle_s`."""

    def __init__(self, folders: list[KeptFolder], interval_s: float = env.DEFAULT_KEEP_INTERVAL_SECONDS,
                 settle_s: float = env.DEFAULT_KEEP_SETTLE_SECONDS, clock: Callable[[], float] = time.monotonic,
                 report: Callable[[dict[str, Any]], object] | None = None, passes: KeptPasses | None = None,
                 passes_wait_s: float = PASSES_WAIT_SECONDS, parts_wait_s: float = PARTS_WAIT_SECONDS,
                 ranks: Callable[[], Sequence[int]] | None = None) -> None:
        """report: where status.kept goes (the job's status, from the pod that holds rank 0 in the attempt:
        `start` says whether this one does); passes: where the
        pods say when they keep, per attempt (none: a later attempt does not wait for anyone); ranks: the
        ids of the processes the pod started for the attempt (none: files are kept once settled only)."""
        self.folders = folders
        self.ranks = ranks or (lambda: ())
        self.passes = passes
        self.passes_wait_s = passes_wait_s
        self.parts_wait_s = parts_wait_s
        self._parts_deadline = 0.0  # time.monotonic() until which the last pass waits for other pods' parts
        self.attempt = 0
        self.world = 1  # the attempt's number of ranks, across its pods
        self.interval_s = interval_s
        self.clock = clock
        self.report = report
        self.reporting = True
        self._changed = False
        self._reported_at = float("-inf")
        self._settlers = {folder.path: Settler(settle_s) for folder in folders}
        self._writers = {folder.path: Writers() for folder in folders}
        self._behind = {folder.path: Behind() for folder in folders}
        self._behind_said: list[tuple[int, float | None]] = [(0, None)] * len(folders)
        self._copies = True  # copies aside are made until one finds no room
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one pass at a time: the thread's, or finish()'s
        self._thread: threading.Thread | None = None
        self._warned = False

    def restore(self, attempt: int = 0) -> str:
        """Once the earlier attempts' pods made their last passes, bring each folder's kept files here
        (those missing or different) and leave out checkpoint folders kept incomplete; in a later attempt,
        also remove the checkpoint folders here that are not whole in S3, which the other pods cannot
        have. Returns the start-up line's part."""
        started = time.monotonic()
        waited = self._wait_for_last_passes(attempt)
        count = size = 0
        notes: list[str] = []
        for folder in self.folders:
            restored, restored_bytes, torn = self._restore(folder, later=attempt > 0)
            count, size = count + restored, size + restored_bytes
            notes += [f"{folder.path}/{name}" for name in sorted(torn)]
        line = f"restored {count} kept file(s), {size / 1e6:.1f} MB, in {time.monotonic() - started:.1f} s"
        if notes:
            line += f"; left out incomplete checkpoint folder(s) {', '.join(notes)}"
        return line + waited

    def _wait_for_last_passes(self, attempt: int) -> str:
        """'' once no earlier attempt's pod is still making its last pass, else what was waited for."""
        if self.passes is None or attempt == 0:
            return ""
        deadline = time.monotonic() + self.passes_wait_s
        while unfinished := self.passes.unfinished(attempt):
            if time.monotonic() >= deadline:
                log.warning("restoring without the last pass of %s: not done after %.0f s", ", ".join(unfinished),
                            self.passes_wait_s)
                return f" (without the last pass of {', '.join(unfinished)})"
            time.sleep(1.0)
        return ""

    def _restore(self, folder: KeptFolder, later: bool) -> tuple[int, int, set[str]]:
        listing = folder.store.listing()
        names, torn = keptfolders.restorable(listing)
        local = keptfolders.scan(folder.local)
        folder.kept = {}
        times: dict[str, int] = {}
        count = size = 0
        for name in names:
            here = local.get(name)
            meta = folder.store.kept(name)
            if here is not None and meta is not None and here == FileState(listing[name], meta.mtime_ns or -1):
                folder.kept[name] = here
                continue
            state = folder.store.fetch(name, os.path.join(folder.local, name), meta)
            folder.kept[name] = state
            times[name] = state.mtime_ns
            count, size = count + 1, size + state.size
        for parent, mtime in keptfolders.folder_times(times).items():
            os.utime(os.path.join(folder.local, parent), ns=(mtime, mtime))
        dropped = keptfolders.not_whole_in(local, listing) if later else \
            keptfolders.incomplete_checkpoints([*local, *listing])
        for name in sorted(dropped):
            where = os.path.join(folder.local, name)
            if os.path.isdir(where):
                log.warning("removed %s: a checkpoint folder not whole in S3, which the job's other pods cannot "
                            "resume from", where)
                shutil.rmtree(where, ignore_errors=True)
        return count, size, torn

    def start(self, attempt: int = 0, world: int = 1, reporting: bool = True) -> FolderKeeper:
        """Mirror the folders every interval for `attempt`; `reporting`: whether this pod holds rank 0 in
        it and says in the job's status what is kept (a spare that took rank 0's place, an elastic gang
        that placed its pods anew: not always the pod of index 0)."""
        if reporting and not self.reporting:
            self._changed = True  # its first pass says what it kept: the pod that said it before may be gone
        self.attempt, self.world, self.reporting = attempt, world, reporting
        if self.passes is not None:
            self._mark("started")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._every_interval, name="ddp-folder-keeper", daemon=True)
        self._thread.start()
        return self

    def _every_interval(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.keep(ended_cleanly=False, final=False)

    def keep(self, ended_cleanly: bool, final: bool) -> None:
        """One pass over every folder: upload what is ready (keptfolders.ready: every file once the ranks
        exited 0; else files between two writes while the ranks run, and settled files), remove what was
        kept and is gone. Errors are logged, not raised: the ranks go on."""
        with self._lock:
            held = functools.cache(lambda: None if final or ended_cleanly else self._held_for_writing())
            for folder in self.folders:
                try:
                    self._keep(folder, ended_cleanly, final, held)
                except (TrainerError, OSError) as error:
                    if final or not self._warned:
                        self._warned = True
                        log.warning("keeping %s in S3 failed%s: %s", folder.path,
                                    "" if final else " (tried again every interval)", error)
            if self._behind_now() != self._behind_said:
                self._changed = True
            due = final or self.clock() - self._reported_at >= STATUS_EVERY_SECONDS
            if self.report is not None and self.reporting and self._changed and due:
                self._report_status()

    def _ranks_running(self) -> bool:
        """Whether the processes the pod started for the attempt all run: while they do, a file none
        holds open for writing is whole (one that ended may have died halfway through a write)."""
        pids = self.ranks()
        return bool(pids) and all(openfiles.running(pid) for pid in pids)

    def _held_for_writing(self) -> dict[str, frozenset[int]] | None:
        """What the pod's processes hold open for writing below the folders; None: the whole rule is off."""
        pids = self.ranks()
        if not self._ranks_running():
            return None
        return openfiles.writers_below([os.path.realpath(folder.local) for folder in self.folders], pids)

    def _behind_now(self) -> list[tuple[int, float | None]]:
        return [(self._behind[f.path].pending(), self._behind[f.path].since()) for f in self.folders]

    def status(self) -> dict[str, Any]:
        """status.kept: each folder's files and bytes in S3 now, and when; and how far behind it is."""
        folders = []
        for folder, (pending, since) in zip(self.folders, self._behind_now(), strict=True):
            listing = folder.store.listing()
            folders.append(keptstatus.folder(folder.path, str(folder.store.prefix), len(listing), sum(listing.values()),
                                             pending, since))
        return {keptstatus.TIME: rfc3339(time.time()), keptstatus.FOLDERS: folders}

    def _report_status(self) -> None:
        assert self.report is not None
        try:
            self.report(self.status())
        except (TrainerError, OSError) as error:
            log.warning("could not say in the job's status what is kept: %s", error)
            return
        self._changed = False
        self._reported_at = self.clock()
        self._behind_said = self._behind_now()

    def _keep(self, folder: KeptFolder, ended_cleanly: bool, final: bool, held: Held) -> None:
        """One pass over `folder`; `held()`: the files the pod's processes hold open for writing (absolute
        paths), None where the whole rule is off."""
        now, seen_at = self.clock(), time.time()
        files = keptfolders.scan(folder.local)
        settler = self._settlers[folder.path]
        settler.observe(files, now)
        ready = keptfolders.ready(files, settler.settled(now), self._writing(folder, files, held), ended_cleanly)
        for name in keptfolders.to_upload({name: files[name] for name in ready}, folder.kept):
            path = os.path.join(folder.local, name)
            state = files[name]
            if keptfolders.scan_one(path) != state:
                continue  # changed since the scan: not ready after all
            checkpoint, parts = keptfolders.parts_from_other_pods(name, files, folder.local, self.world)
            if checkpoint and keptfolders.unkept_beside(name, checkpoint, files, folder.kept):
                continue  # a marker goes up after its folder's other files
            if parts and not self._parts_kept(folder, checkpoint, parts, final):
                continue
            if name not in folder.kept:
                other = folder.store.kept(name)
                if other is not None and other.writer and other.writer != folder.store.writer:
                    log.warning("%s/%s: pod %s replaces the copy pod %s kept (the last writer wins, as on a "
                                "shared filesystem)", folder.path, name, folder.store.writer, other.writer)
            if not self._upload(folder, name, state, ready[name]):
                continue  # it changed while it went up: not whole after all, and S3 keeps what it had
            folder.kept[name] = state
            self._changed = True
        gone_folders, gone_files = keptfolders.to_delete(files, folder.kept)
        if gone_folders or gone_files:
            folder.store.delete(gone_files, gone_folders)
            self._changed = True
            for name in [n for n in folder.kept if n in gone_files or keptfolders.within(n, gone_folders)]:
                del folder.kept[name]
        folder.rewritten.intersection_update(files)
        self._behind[folder.path].observe(files, folder.kept, seen_at)

    def _writing(self, folder: KeptFolder, files: Mapping[str, FileState], held: Held) -> set[str] | None:
        """The files of `folder` (its scan, `files`) that are not whole by the whole rule, None where it
        is off. /proc is read only where a file changed since it was kept."""
        if all(folder.kept.get(name) == state for name, state in files.items()):
            return set()
        if (open_now := held()) is None:
            return None
        root = os.path.realpath(folder.local) + "/"
        here = {path[len(root):]: pids for path, pids in open_now.items() if path.startswith(root)}
        watch = self._writers[folder.path]
        watch.observe(files, {name: pids for name, pids in here.items() if name in files},
                      lambda pid: not openfiles.running(pid))
        return watch.writing()

    def _upload(self, folder: KeptFolder, name: str, state: FileState, rule: Rule) -> bool:
        """Put the file's version `state` by `rule`; False where it changed, or (the whole rule) the
        ranks stopped, while it was read. A file between two writes goes up straight from the folder,
        and, once it changed while it went up, from a copy made aside (which is quicker to make)."""
        path = os.path.join(folder.local, name)
        if rule is not Rule.WHOLE:
            return folder.store.upload(name, path, state)
        if name in folder.rewritten and self._copies and (copied := self._upload_copy(folder, name, path, state)) \
                is not None:
            return copied
        if folder.store.upload(name, path, state, still=self._ranks_running):
            return True
        if keptfolders.scan_one(path) != state:
            folder.rewritten.add(name)
        return False

    def _upload_copy(self, folder: KeptFolder, name: str, path: str, state: FileState) -> bool | None:
        """Copy the file into a private temporary file, check that it stayed `state` meanwhile, upload the
        copy. None where no copy can be made (no room): files go up straight from the folder from then on."""
        try:
            handle, copy = tempfile.mkstemp(prefix="ddp-kept-")
        except OSError as error:
            self._no_copies(folder, name, error)
            return None
        os.close(handle)
        try:
            try:
                shutil.copyfile(path, copy)
            except FileNotFoundError:
                return False  # removed meanwhile
            except OSError as error:
                self._no_copies(folder, name, error)
                return None
            if keptfolders.scan_one(path) != state or os.path.getsize(copy) != state.size or not self._ranks_running():
                return False
            os.utime(copy, ns=(state.mtime_ns, state.mtime_ns))
            return folder.store.upload(name, copy, state)
        finally:
            os.unlink(copy)

    def _no_copies(self, folder: KeptFolder, name: str, error: OSError) -> None:
        self._copies = False
        log.warning("no copy of %s/%s could be made in %s (%s): files rewritten while they go up are read "
                    "straight from the folder from now on", folder.path, name, tempfile.gettempdir(), error)

    def _parts_kept(self, folder: KeptFolder, checkpoint: str, parts: list[str], final: bool) -> bool:
        """Whether the `parts` of `checkpoint` (its ranks' own files) are all in S3, kept by this pod or
        listed there from the others, so that its marker may go up."""
        missing = [name for name in parts if name not in folder.kept]
        while missing:
            listed = folder.store.names_below(checkpoint)
            missing = [name for name in missing if name not in listed]
            if not missing or not final or time.monotonic() >= self._parts_deadline:
                break
            time.sleep(1.0)  # the other pods' last passes run now too
        if missing and final:
            log.warning("%s/%s is not kept whole: %s, written by other ranks, never came to S3, so a later "
                        "attempt resumes from an earlier checkpoint", folder.path, checkpoint, ", ".join(missing))
        return not missing

    def finish(self, ended_cleanly: bool, upload_s: float) -> None:
        """The last pass, when the ranks have ended: every file if they exited 0, else those settled
        (a file still changing when a rank failed or was stopped keeps its last settled version).
        Waits up to `upload_s` for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(upload_s)
        self._parts_deadline = time.monotonic() + min(self.parts_wait_s, upload_s / 2)
        last = threading.Thread(target=self.keep, args=(ended_cleanly, True), name="ddp-folder-keeper-last",
                                daemon=True)
        last.start()
        last.join(upload_s)
        if last.is_alive():
            log.warning("the kept folders' last changes may not be in S3: their upload took over %.0f s", upload_s)
        elif self.passes is not None:
            self._mark("done")

    def _mark(self, state: str) -> None:
        assert self.passes is not None
        try:
            self.passes.mark(self.attempt, state)
        except (TrainerError, OSError) as error:
            log.warning("could not say in S3 that this pod's keeping %s: %s", state, error)


class KeptRanks:
    """A pod's rank processes (RankProcesses) whose pod keeps spec.keepFolders: each attempt's ranks
    start once the folders are restored, which are mirrored while they run and once more as they end."""

    def __init__(self, ranks: RankProcesses, keeper: FolderKeeper) -> None:
        self.ranks = ranks
        self.keeper = keeper
        self.count = ranks.count

    def __enter__(self) -> KeptRanks:
        self.ranks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ranks.__exit__(*exc)

    def prepare_zygote(self, environ: Mapping[str, str]) -> None:
        self.ranks.prepare_zygote(environ)

    def pids(self) -> list[int]:
        return self.ranks.pids()

    def start(self, environ: Mapping[str, str]) -> None:
        attempt = env.JobInfo.from_env(environ).attempt
        log.info("%s", self.keeper.restore(attempt))
        self.keeper.start(attempt, int(environ.get(envnames.WORLD_SIZE) or 1), reporting=env.node_rank(environ) == 0)
        self.ranks.start(environ)

    def supervise(self, interrupted: Callable[[], bool] = lambda: False) -> bool:
        stopped = self.ranks.supervise(interrupted)
        cleanly = not stopped and self.ranks.outcome()[0] == ExitCode.OK
        self.keeper.finish(cleanly, STOPPED_UPLOAD_SECONDS if stopped else ENDED_UPLOAD_SECONDS)
        return stopped

    def signal_all(self, signum: int) -> None:
        self.ranks.signal_all(signum)

    def outcome(self) -> tuple[int, str]:
        return self.ranks.outcome()


def kept_ranks(ranks: RankProcesses, environ: Mapping[str, str]) -> RankProcesses:
    """`ranks` keeping the folders the job names, or `ranks` itself where it names none."""
    keeper = make_folder_keeper(environ, ranks=ranks.pids)
    return ranks if keeper is None else KeptRanks(ranks, keeper)
