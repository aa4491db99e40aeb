"""Checkpoints in S3, written by rank 0, committed by a manifest.

Layout under ``<job prefix>/checkpoints/``::

    step-<012d>/state.pt        torch.save of the state dict (multipart above part_size)
    step-<012d>/MANIFEST.json   written last: {"step", "files": {"state.pt": {"size", "crc32c"}}, ...}

A checkpoint exists only once its manifest does, so a crash mid-save leaves nothing that looks
complete. Pruning deletes the manifest of an old checkpoint before its data, and only after the
new one is committed. `load_latest` takes the newest checkpoint whose manifest matches its data.

torch.save writes straight into the upload (s3.put_written): parts go up while it writes, so the
serialised checkpoint is never whole in memory where the AWS CRT is installed (the trainer image).

The manifest's checksum is the AWS CRT's CRC32C (hardware-accelerated: 0.06 CPU-s/GB against SHA-256's
0.7), which catches what it is there for, a torn or altered upload; without awscrt, SHA-256. Either
one is verified on load, so checkpoints written by either load anywhere awscrt is installed.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from ddp_contract import layout, recoveries
from ddp_contract.jobstatus import (
    STATUS_CHECKPOINTS_BEHIND,
    STATUS_LAST_CHECKPOINT,
    STATUS_MEMORY_SNAPSHOTS,
    STATUS_RECOVERY,
)
from ddp_contract.timestamps import rfc3339

from .. import env
from ..errors import ConfigError, CorruptDataError, ObjectNotFoundError, StorageUnavailableError, TrainerError
from . import recovery, s3
from .committer import Behind, Committer
from .podsnapshots import PodSnapshots, SnapshotsDoNotFit, SnapshotTaker, crc32c_function
from .statebytes import copied_to_cpu

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
STATE = "state.pt"
CHECKSUMS = frozenset({"crc32c", "sha256"})  # a manifest entry records one: crc32c where awscrt is installed
_STEP_DIR = re.compile(r"^step-(\d{12})$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    state: dict[str, Any]
    url: s3.S3Url
    manifest: dict[str, Any]


def unwrap(model: Any) -> Any:
    """The module inside DistributedDataParallel, so checkpoints load without DDP."""
    return getattr(model, "module", model)


def training_state(
    model: Any,
    optimizer: Any = None,
    sampler: Any = None,
    samples_consumed: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The usual checkpoint: model (unwrapped from DDP), optimizer, sampler position, extras.

    `samples_consumed` is how many of this epoch's samples this rank trained on; pass it when
    the DataLoader has workers (they prefetch, so the sampler alone over-counts).
    """
    state: dict[str, Any] = {"model": unwrap(model).state_dict()}
    if optimizer is not None:
        state["optimizer"] = optimizer.state_dict()
    if sampler is not None:
        state["sampler"] = sampler.state_dict() if samples_consumed is None else sampler.state_dict(samples_consumed)
    state.update(extra)
    return state


def restore_training_state(state: Mapping[str, Any], model: Any, optimizer: Any = None, sampler: Any = None) -> None:
    unwrap(model).load_state_dict(state["model"])
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if sampler is not None and "sampler" in state:
        sampler.load_state_dict(state["sampler"])


def serialize_into(state: Mapping[str, Any], file: IO[bytes]) -> None:
    import torch

    torch.save(dict(state), file)


class _Digesting(io.RawIOBase):
    """Passes writes on to the file given to `into`, counting their size and checksum (the manifest's)."""

    def __init__(self) -> None:
        super().__init__()
        self._crc32c = crc32c_function()
        self._crc = 0
        self._sha256 = None if self._crc32c else hashlib.sha256()
        self.size = 0
        self._file: IO[bytes] | None = None

    def into(self, file: IO[bytes]) -> IO[bytes]:
        self._file = file
        return cast(IO[bytes], self)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        assert self._file is not None
        if self._crc32c is not None:
            self._crc = self._crc32c(data, self._crc)
        else:
            assert self._sha256 is not None
            self._sha256.update(data)
        self.size += memoryview(data).nbytes
        return self._file.write(data)

    def entry(self) -> dict[str, Any]:
        """The manifest's record of what was written."""
        if self._sha256 is not None:
            return {"size": self.size, "sha256": self._sha256.hexdigest()}
        return {"size": self.size, "crc32c": f"{self._crc:08x}"}


def matches(data: bytes, entry: Mapping[str, Any]) -> bool:
    """Whether `data` is what a manifest's entry records (size and CRC32C or SHA-256)."""
    if len(data) != entry["size"]:
        return False
    if "crc32c" in entry:
        crc32c = crc32c_function()
        if crc32c is None:
            raise ConfigError("this checkpoint's manifest has a CRC32C checksum, which needs the AWS CRT "
                              "to verify: pip install 'boto3[crt]' (the trainer image has it)")
        return f"{crc32c(data, 0):08x}" == entry["crc32c"]
    return hashlib.sha256(data).hexdigest() == entry["sha256"]


@dataclass(frozen=True)
class MemoryPolicy:
    """How often a snapshot of the state is kept in the pod's memory: every `steps` steps or `seconds`
    seconds, whichever comes first."""

    steps: int | None = None
    seconds: float | None = None

    def due(self, step: int, now: float, last: tuple[int, float] | None) -> bool:
        if last is None:
            return True
        last_step, last_time = last
        return ((self.steps is not None and step - last_step >= self.steps)
                or (self.seconds is not None and now - last_time >= self.seconds))

    def words(self) -> str:
        said = []
        if self.steps is not None:
            said.append("every step" if self.steps == 1 else f"every {self.steps} steps")
        if self.seconds is not None:
            said.append(f"every {self.seconds:g} s")
        return " or ".join(said)


class CheckpointManager:
    """Save (rank 0 only), prune to the last `keep`, and load the latest committed checkpoint."""

    def __init__(
        self,
        prefix: s3.S3Url | str | None = None,
        keep: int = 3,
        async_save: bool = False,
        part_size: int = 8 * 1024 * 1024,
        rank: int | None = None,
        job_status: Any = None,
        memory_every: int | None = None,
        memory_every_s: float | None = None,
        memory_dir: str | Path | None = None,
        s3_outage_s: float | None = None,
    ) -> None:
        """job_status: where rank 0 records each committed checkpoint (a jobstatus.JobStatusSink);
        default: the job's own status when the rank runs under the operator, else nowhere.

        memory_every (steps) or memory_every_s (seconds): how often `snapshot()` keeps the state in the
        pod's memory, from which a restarted gang resumes when it is newer than the last checkpoint in S3
        (both None: no snapshots; `snapshot()` does nothing). memory_dir: where (default $DDP_SNAPSHOT_DIR,
        else /dev/shm/ddp-snapshots).

        s3_outage_s: how long S3 may stay unreachable while training goes on (default
        $DDP_S3_OUTAGE_SECONDS, 600): a save that cannot reach S3 returns, its state is written in the
        background once S3 answers (a later save replaces it), and status.checkpointsBehind says since
        when; past it the next save(), wait() or close() raises StorageUnavailableError (exit 203)."""
        if keep < 1:
            raise ConfigError(f"CheckpointManager keep={keep} must be >= 1")
        if memory_every is not None and (not isinstance(memory_every, int) or memory_every < 1):
            raise ConfigError(f"CheckpointManager memory_every={memory_every!r} must be a whole number of steps >= 1")
        if memory_every_s is not None and not memory_every_s > 0:
            raise ConfigError(f"CheckpointManager memory_every_s={memory_every_s!r} must be > 0 seconds")
        if isinstance(prefix, str):
            prefix = s3.parse_uri(prefix)
        if prefix is None:
            from .results import job_prefix

            prefix = job_prefix()
        self.prefix = prefix.join(layout.CHECKPOINTS)
        self.keep = keep
        self.async_save = async_save
        self.part_size = part_size
        self.rank = env.rank() if rank is None else rank
        outage_s = env.s3_outage_s() if s3_outage_s is None else s3_outage_s
        if not outage_s >= 0:
            raise ConfigError(f"CheckpointManager s3_outage_s={s3_outage_s!r} must be >= 0 seconds")
        self._commits: Committer[tuple[int, Mapping[str, Any]], s3.S3Url] = Committer(
            lambda saved: self._write(*saved), outage_s, "checkpoint", behind=self._behind,
            describe=lambda saved: f"the checkpoint of step {saved[0]}",
            probe=lambda: s3.unreachable(self.prefix.bucket))
        self._written: s3.S3Url | None = None  # the last save's, where it wrote itself rather than handed it
        self._job_status = job_status
        self._honored: str | None = None  # the job's checkpoint request the last save answered
        self.memory = MemoryPolicy(memory_every, memory_every_s) if memory_every or memory_every_s else None
        self.pod_snapshots = PodSnapshots(memory_dir or env.snapshot_dir())
        self._taker: SnapshotTaker | None = None
        self._memory_off: str | None = None  # why snapshots are off, once they are
        self._last_snapshot: tuple[int, float] | None = None  # (step, monotonic time)

    def requested(self) -> bool:
        """Whether the job asks for a checkpoint now: an elastic job whose left-out ranks run again grows
        at the next one, so a loop that checkpoints rarely can save at once instead:

            if step % every == 0 or checkpoints.requested():
                checkpoints.save(step, training_state(model, optimizer, sampler))

        True on rank 0 only (the one that saves; the others' save() does nothing), from the request
        until a save after it: do nothing in that branch that needs the other ranks."""
        if self.rank != 0:  # asked every step on every rank: the others read nothing
            return False
        stamp = self._request()
        return stamp is not None and stamp != self._honored

    def _request(self) -> str | None:
        path = env.checkpoint_request_file()
        if path is None:
            return None
        try:
            with open(path) as found:
                return found.read() or None
        except OSError:
            return None

    def step_url(self, step: int) -> s3.S3Url:
        return self.prefix.join(f"step-{step:012d}")

    # Saving ---------------------------------------------------------------------------------

    def save(self, step: int, state: Mapping[str, Any]) -> s3.S3Url | None:
        """Write checkpoint `step` (rank 0; other ranks return None at once).

        Asynchronous mode copies tensors to CPU here, then serialises and uploads in a
        background thread; at most one save is in flight, so a second save waits for the first.
        Errors of a background save are raised by the next save(), wait() or close().
        While S3 cannot be reached (up to s3_outage_s) a save copies the state and returns: it is
        written once S3 answers, unless a later save replaces it first. A save that waits for the one
        in flight asks S3 every few seconds whether it answers, and stops waiting once it does not
        (the S3 client's own retries of that write can take longer than the outage).
        """
        if self.rank != 0:
            return None
        if step < 0:
            raise ConfigError(f"checkpoint step {step} must be >= 0")
        self._honored = self._request()
        self._commits.room()
        self._written = None
        if self.async_save or self._commits.out:
            self._commits.hand((step, copied_to_cpu(state)))
            return self.step_url(step)
        try:
            self._written = self._write(step, state)
            return self._written
        except StorageUnavailableError as error:
            self._commits.hand((step, copied_to_cpu(state)), failed=error)
            return self.step_url(step)

    def wait(self) -> s3.S3Url | None:
        """Block until the saves handed to the background (asynchronous, or waiting for S3) are committed;
        re-raise the error of one that failed. Returns the newest committed checkpoint's URL."""
        committed = self._commits.wait()
        return self._written or committed

    def close(self) -> None:
        try:
            self._commits.close()
        finally:
            if self._taker is not None:
                self._taker.wait()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _behind(self, behind: Behind[tuple[int, Mapping[str, Any]]] | None) -> None:
        """status.checkpointsBehind while a checkpoint waits for S3; cleared once one is committed."""
        said = None if behind is None else {"since": rfc3339(behind.since), "step": behind.value[0],
                                            "error": behind.error[:300]}
        self._say({STATUS_CHECKPOINTS_BEHIND: said})

    def _write(self, step: int, state: Mapping[str, Any]) -> s3.S3Url:
        started = time.monotonic()
        url = self.step_url(step)
        digest = _Digesting()
        s3.put_written(url.join(STATE), lambda file: serialize_into(state, digest.into(file)), part_size=self.part_size)
        manifest = {
            "version": 1,
            "step": step,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": {STATE: digest.entry()},
        }
        s3.put_bytes(url.join(MANIFEST), json.dumps(manifest).encode(), content_type="application/json")
        log.info("checkpoint step %d committed to %s (%d bytes, %.2fs)", step, url, digest.size, time.monotonic() - started)
        self._record(step, url)
        try:
            self._prune(step)
        except (TrainerError, OSError) as error:  # committed all the same: the next save prunes them
            log.warning("checkpoints older than step %d were not pruned: %s", step, error)
        return url

    def _record(self, step: int, url: s3.S3Url) -> None:
        """status.lastCheckpoint, so a restarted gang is told where to resume (and people can see it)."""
        from ..jobstatus import last_checkpoint

        self._say({STATUS_LAST_CHECKPOINT: last_checkpoint(step, str(url))})

    def _say(self, fields: dict[str, Any]) -> None:
        """Writes `fields` to the job's status (rank 0), where there is one to write to."""
        from ..jobstatus import in_cluster_sink

        if self._job_status is None:
            try:
                self._job_status = in_cluster_sink() or False
            except Exception as error:  # noqa: BLE001 - e.g. no service-account token: S3 still has it
                log.warning("checkpoints, snapshots and recoveries are not written to the job's status: %s", error)
                self._job_status = False
        if self._job_status:
            self._job_status.patch(fields)

    def _prune(self, committed: int) -> None:
        steps = self._scan()
        complete = sorted((s for s, has_manifest in steps.items() if has_manifest), reverse=True)
        doomed = set(complete[self.keep :])
        # Directories without a manifest older than the committed step are leftovers of a crash.
        doomed |= {s for s, has_manifest in steps.items() if not has_manifest and s < committed}
        for step in sorted(doomed):
            url = self.step_url(step)
            s3.delete_keys(url.bucket, [url.join(MANIFEST).key])
            s3.delete_keys(url.bucket, [key for key, _ in s3.list_objects(url)])

    def _scan(self) -> dict[int, bool]:
        """step -> whether its manifest exists."""
        steps: dict[int, bool] = {}
        base = self.prefix.key + "/"
        for key, _ in s3.list_objects(self.prefix):
            directory, _, name = key[len(base) :].partition("/")
            match = _STEP_DIR.match(directory)
            if match:
                step = int(match.group(1))
                steps[step] = steps.get(step, False) or name == MANIFEST
        return steps

    # Snapshots in the pod's memory -----------------------------------------------------------

    def snapshot(self, step: int, state: Mapping[str, Any] | Callable[[], Mapping[str, Any]]) -> bool:
        """Keep `state` (or what the callable returns, made only when a snapshot is due) of `step` in the
        pod's memory when one is due (memory_every, memory_every_s); call it on every rank after each
        step. Returns whether one was taken. The pod's first rank copies it (every rank holds the same
        state): the tensors the optimizer does not own at once, the optimizer's while the next step's
        forward and backward run. Does nothing without memory_every or memory_every_s."""
        if self.memory is None or self._memory_off is not None or env.local_rank() != 0:
            return False
        if step < 0:
            raise ConfigError(f"snapshot step {step} must be >= 0")
        self.pod_snapshots.note_reached(step)
        now = time.monotonic()
        if not self.memory.due(step, now, self._last_snapshot):
            return False
        if self._taker is None:
            self._taker = SnapshotTaker(self.pod_snapshots, attempt=env.JobInfo.from_env().attempt)
        first = self._last_snapshot is None
        try:
            self._taker.take(step, state() if callable(state) else state)
        except SnapshotsDoNotFit as reason:
            self._memory_off = str(reason)
            log.warning("%s", reason)
            if self.rank == 0:
                self._say({STATUS_MEMORY_SNAPSHOTS: {"off": self._memory_off}})
            return False
        except (OSError, RuntimeError, TrainerError) as error:  # training goes on; the S3 checkpoints are there
            log.warning("the snapshot of step %d was not kept in the pod's memory: %s", step, error)
            return False
        self._last_snapshot = (step, now)
        if first and self.rank == 0:
            self._say({STATUS_MEMORY_SNAPSHOTS: {"every": self.memory.words(), "copies": 2,
                                                 "bytes": self.pod_snapshots.holds() // 2,
                                                 "directory": str(self.pod_snapshots.directory)}})
        return True

    def _from_memory(self) -> tuple[recovery.Recovered | None, int | None, int | None]:
        """The newest state the gang holds in memory, if it is no older than the job's S3 checkpoint; the
        newest step any of its pods got to before the restart; and rank 0's newest S3 checkpoint, which
        every rank then loads (listing S3 each, they might not agree)."""
        me = recovery.Peer(rank=self.rank, pod=env.pod_name(), host=env.pod_ip(), token=env.job_token(),
                           serves=env.local_rank() == 0)
        found, offers = recovery.from_gang_memory(self.pod_snapshots, me, recovery.Gang.of_process_group(),
                                                  s3_step=self._s3_step() if self.rank == 0 else None)
        return found, recovery.newest_reached(offers), recovery.job_s3_step(offers)

    def _s3_step(self) -> int | None:
        try:
            return max(self._candidates(), default=None)
        except (TrainerError, OSError) as error:  # S3 unreachable: the gang's memory is all there is
            log.warning("the job's checkpoints in S3 cannot be listed: %s", error)
            return None

    def _resumed(self, step: int, source: str, *, pods: tuple[str, ...] = (), uri: str | None = None,
                 reached: int | None = None) -> None:
        """After every rank restored `step`: the pod forgets snapshots past it, and rank 0 says where the
        gang resumed from (status.recovery, and in S3 for the dashboard's restart marks)."""
        if self.memory is not None and env.local_rank() == 0:
            self.pod_snapshots.prune_after(step)
            self.pod_snapshots.note_reached(step)
        attempt = env.JobInfo.from_env().attempt
        if self.rank != 0 or attempt == 0:
            return
        record = recoveries.record(attempt=attempt, step=step, source=source, pods=pods, checkpoint=uri,
                                   reached=reached, memory=self.memory is not None)
        log.info("%s", recoveries.text(record))
        self._say({STATUS_RECOVERY: {**dict.fromkeys(recoveries.FIELDS), **record}})
        from .results import keep_recovery

        threading.Thread(target=keep_recovery, args=(attempt, record), name="recovery-record", daemon=True).start()

    # Loading --------------------------------------------------------------------------------

    def committed_steps(self) -> list[int]:
        return sorted(s for s, has_manifest in self._scan().items() if has_manifest)

    def load(self, step: int, map_location: Any = "cpu", weights_only: bool = True) -> Checkpoint:
        import torch

        url = self.step_url(step)
        manifest_url = url.join(MANIFEST)
        try:
            manifest = json.loads(s3.get_bytes(manifest_url))
            expected = manifest["files"][STATE]
            if not CHECKSUMS & expected.keys() or not isinstance(expected["size"], int):
                raise KeyError(f"{STATE} has no size and {' or '.join(sorted(CHECKSUMS))}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptDataError(f"checkpoint manifest {manifest_url} is malformed: {exc}") from exc
        state_url = url.join(STATE)
        data = s3.get_bytes(state_url)
        if not matches(data, expected):
            raise CorruptDataError(
                f"checkpoint {state_url} does not match its manifest: {len(data)} bytes, manifest says "
                f"{expected['size']}, or the checksum differs"
            )
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)
        return Checkpoint(step=step, state=state, url=url, manifest=manifest)

    def resume(self, model: Any, optimizer: Any = None, sampler: Any = None, map_location: Any = "cpu") -> int:
        """Restore the job's newest state into the model (DDP or not), optimizer and sampler: with memory
        snapshots the newest one a pod of the gang holds, when it is no older than the job's last
        checkpoint in S3 (every rank must call it then, at once), else that checkpoint; returns its step,
        0 when there is none (start from scratch). Not calling it opts out."""
        found, reached, agreed = self._from_memory() if self.memory is not None else (None, None, None)
        if found is not None:
            restore_training_state(found.state, model, optimizer, sampler)
            self._resumed(found.step, recoveries.SOURCE_MEMORY, pods=found.pods, reached=reached)
            return found.step
        latest = self._load_newest(agreed, map_location=map_location)
        if latest is None:
            self._resumed(0, recoveries.SOURCE_NONE, reached=reached)
            return 0
        restore_training_state(latest.state, model, optimizer, sampler)
        log.info("resumed from checkpoint step %d (%s)", latest.step, latest.url)
        self._resumed(latest.step, recoveries.SOURCE_S3, uri=str(latest.url), reached=reached)
        return latest.step

    def resume_step(self) -> int | None:
        """The step of the checkpoint the operator names for this attempt ($DDP_RESUME_FROM, from
        status.lastCheckpoint), when it lies under this manager's prefix."""
        uri = env.resume_from()
        if not uri:
            return None
        url = s3.parse_uri(uri)
        directory = url.key.rpartition("/")[2]
        match = _STEP_DIR.match(directory)
        if url.bucket != self.prefix.bucket or not url.key.startswith(self.prefix.key + "/") or not match:
            log.warning("%s=%s is not a checkpoint under %s; looking for the newest one", "DDP_RESUME_FROM", uri,
                        self.prefix)
            return None
        return int(match.group(1))

    def load_latest(self, map_location: Any = "cpu", weights_only: bool = True) -> Checkpoint | None:
        """The job's newest checkpoint that verifies: the newest committed in S3, or the one the operator
        names (status.lastCheckpoint, $DDP_RESUME_FROM) where S3's listing does not show it; None when
        there is none."""
        return self._load_newest(None, map_location=map_location, weights_only=weights_only)

    def _newest_first(self, first: int | None) -> Iterator[int]:
        if first is not None:
            yield first
        yield from sorted(self._candidates() - {first}, reverse=True)

    def _candidates(self) -> set[int]:
        """The steps of the job's committed checkpoints, and the one the operator names."""
        named = self.resume_step()
        try:
            steps = set(self.committed_steps())
        except (TrainerError, OSError) as error:
            if named is None:
                raise
            log.warning("the job's checkpoints in S3 cannot be listed (%s); trying the one it names", error)
            steps = set()
        return steps if named is None else steps | {named}

    def _load_newest(self, first: int | None, map_location: Any = "cpu",
                     weights_only: bool = True) -> Checkpoint | None:
        """Checkpoint `first` if it verifies (S3 is listed only if not), else the newest of the others that does."""
        for step in self._newest_first(first):
            try:
                return self.load(step, map_location=map_location, weights_only=weights_only)
            except (CorruptDataError, ObjectNotFoundError) as exc:
                log.warning("skipping checkpoint step %d: %s", step, exc)
        return None
