"""Readable text from a DDPJob's status and its pods: `kubectl ddp status`, and `wait()`'s progress line."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddp_contract import keptstatus, labels, recoveries
from ddp_contract.jobstatus import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_SUCCEEDED,
    STATUS_CHECKPOINTS_BEHIND,
    STATUS_INFRASTRUCTURE_RESTARTS,
    STATUS_KEPT,
    STATUS_LAST_CHECKPOINT,
    STATUS_MEMORY_SNAPSHOTS,
    STATUS_MESSAGE,
    STATUS_PHASE,
    STATUS_PROGRAM_RESTARTS,
    STATUS_PROGRESS,
    STATUS_READY,
    STATUS_REASON,
    STATUS_RECOVERY,
    STATUS_RESTARTS,
    STATUS_WORLD_SIZE,
)
from ddp_contract.resource import JobStatus

FINISHED = (PHASE_SUCCEEDED, PHASE_FAILED)


def ranks_text(ranks: Iterable[int]) -> str:
    """`0-3, 5, 7-8` for a set of ranks."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for rank in ordered:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def pod_state(pod: Mapping[str, Any]) -> str:
    """Pending, Running, Succeeded, Failed or Terminating (being deleted)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    return str((pod.get("status") or {}).get("phase") or "Pending")


def ranks_by_state(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    states: dict[str, list[int]] = {}
    for pod in pods:
        rank = (pod.get("metadata") or {}).get("labels", {}).get(labels.LABEL_RANK)
        if rank is not None:
            states.setdefault(pod_state(pod), []).append(int(rank))
    return {state: sorted(ranks) for state, ranks in sorted(states.items())}


def _number(value: Any, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def progress_text(status: Mapping[str, Any]) -> str:
    """`epoch 2, step 120, loss 0.4321, 812 samples/s, 45% done, 12m30s left` from status.progress (''
    before the first report; how far only where the code says it)."""
    progress = status.get(STATUS_PROGRESS) or {}
    if not progress:
        return ""
    parts = [f"epoch {_number(progress.get('epoch'))}", f"step {_number(progress.get('step'))}",
             f"loss {_number(progress.get('loss'))}"]
    if progress.get("samplesPerSecond") is not None:
        parts.append(f"{progress['samplesPerSecond']:.0f} samples/s")
    if progress.get("percent") is not None:
        parts.append(f"{progress['percent']:g}% done")
    if progress.get("remaining"):
        parts.append(f"{progress['remaining']} left")
    return ", ".join(parts)


def progress_line(name: str, status: Mapping[str, Any]) -> str:
    """One line for `wait()`: phase, ready ranks, restarts and progress."""
    parts = [f"{name}: {status.get(STATUS_PHASE) or PHASE_PENDING}"]
    if status.get(STATUS_READY):
        parts.append(f"ready {status[STATUS_READY]}")
    if status.get(STATUS_RESTARTS):
        parts.append(f"restarts {status[STATUS_RESTARTS]}")
    progress = progress_text(status)
    if progress:
        parts.append(progress)
    return ", ".join(parts)


def failed_rank_lines(failed: Mapping[str, Any], label: str) -> list[str]:
    """`LABEL: rank 1 (pod j-1 on node gpu-3): Error (exit code 1, ...)` and the rank's last output."""
    where = f"rank {failed.get('rank')} (pod {failed.get('pod')}"
    where += f" on node {failed['node']})" if failed.get("node") else ")"
    how = [f"exit code {failed.get('exitCode')}"] if failed.get("exitCode") is not None else []
    how += [f"signal {failed['signal']}"] if failed.get("signal") else []
    how += ["OOM-killed"] if failed.get("oomKilled") else []
    how += [f"step {failed['step']}"] if failed.get("step") is not None else []
    how += [f"attempt {failed['attempt']}"] if failed.get("attempt") is not None else []
    how += [f"{failed['kind']} failure"] if failed.get("kind") else []
    lines = [f"{label}: {where}: {failed.get('reason') or 'Failed'}" + (f" ({', '.join(how)})" if how else "")]
    if failed.get("message"):
        lines.append("its last output:")
        lines.extend(f"    {line}" for line in str(failed["message"]).rstrip().splitlines())
    return lines


def failure_text(status: Mapping[str, Any]) -> str:
    """Why the job failed: reason, message, and the failed rank's last output."""
    lines = []
    if status.get(STATUS_REASON) or status.get(STATUS_MESSAGE):
        lines.append(f"reason: {status.get(STATUS_REASON) or '-'}: {status.get(STATUS_MESSAGE) or ''}".rstrip(": "))
    failed = JobStatus.of(status).failed_rank or {}
    if failed:
        lines.extend(failed_rank_lines(failed, "failed rank"))
    return "\n".join(lines)


def last_restart_text(status: Mapping[str, Any]) -> str:
    """Of a job that has not failed: the rank whose failure caused the gang's last restart ('' if none).
    History, not a failure: the job went on (and may have succeeded) after it."""
    failed = JobStatus.of(status).failed_rank or {}
    return "\n".join(failed_rank_lines(failed, "caused by")) if failed else ""


def outcome_text(name: str, status: Mapping[str, Any]) -> str:
    """The line `wait()` ends with, and on failure why."""
    phase = status.get(STATUS_PHASE) or PHASE_PENDING
    head = f"{name}: {phase}"
    progress = progress_text(status)
    if progress:
        head += f" at {progress}"
    if phase == PHASE_FAILED:
        return head + "\n" + failure_text(status)
    return head


def size_text(count: int) -> str:
    """`812 B`, `4.1 kB`, `1.2 GB` (decimal units)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def kept_text(status: Mapping[str, Any]) -> str:
    """`out: 12 files, 1.2 GB, behind by 2 files since <time>; runs: 3 files, 40.1 kB (at <time>)` from
    status.kept, each folder by its path as spec.keepFolders writes it ('' before any)."""
    kept = status.get(STATUS_KEPT) or {}
    folders = kept.get(keptstatus.FOLDERS) or []
    if not folders:
        return ""
    parts = [kept_folder_text(folder) for folder in folders]
    return "; ".join(parts) + (f" (at {kept[keptstatus.TIME]})" if kept.get(keptstatus.TIME) else "")


def kept_folder_text(folder: Mapping[str, Any]) -> str:
    text = (f"{folder.get(keptstatus.PATH)}: {files_text(int(folder.get(keptstatus.FILES) or 0))}, "
            f"{size_text(int(folder.get(keptstatus.BYTES) or 0))}")
    pending = int(folder.get(keptstatus.PENDING) or 0)
    if pending and folder.get(keptstatus.BEHIND_SINCE):
        text += f", behind by {files_text(pending)} since {folder[keptstatus.BEHIND_SINCE]}"
    return text


def files_text(count: int) -> str:
    return f"{count} file{'' if count == 1 else 's'}"


def behind_text(status: Mapping[str, Any]) -> str:
    """`step 140 waits for S3, unreachable since <time> (<error>)` while a checkpoint waits ('' else)."""
    behind = status.get(STATUS_CHECKPOINTS_BEHIND)
    if not isinstance(behind, Mapping):
        return ""
    error = f" ({behind['error']})" if behind.get("error") else ""
    return f"step {behind.get('step')} waits for S3, unreachable since {behind.get('since')}{error}"


def recovery_text(status: Mapping[str, Any]) -> str:
    """Where the current attempt resumed from ('' before any restart said so)."""
    found = status.get(STATUS_RECOVERY)
    return recoveries.text(found) if isinstance(found, Mapping) else ""


def snapshots_text(status: Mapping[str, Any]) -> str:
    """`every step in pod memory, 2 copies of 1.2 GB a pod`, or why they are off ('' without any)."""
    said = status.get(STATUS_MEMORY_SNAPSHOTS)
    if not isinstance(said, Mapping):
        return ""
    if said.get("off"):
        return str(said["off"])
    return (f"{said.get('every', '?')} in pod memory ({said.get('directory', '/dev/shm')}), {said.get('copies', 2)} "
            f"copies of {size_text(int(said.get('bytes') or 0))} a pod")


def world_size_text(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """`4 ranks`, or for an elastic job `2 of 4 ranks (minimum 2)` while its gang runs short."""
    target, current = spec.get("worldSize"), status.get(STATUS_WORLD_SIZE)
    minimum = spec.get("minWorldSize")
    if minimum is None or minimum == target:
        return f"{target} ranks"
    return f"{current if current is not None else target} of {target} ranks (minimum {minimum})"


def spares_text(spec: Mapping[str, Any], status: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str:
    """`train-2 Running`: the job's pods waiting outside its gang to take a lost pod's place (spec.sparePods);
    '' for a job without spares."""
    if not spec.get("sparePods"):
        return ""
    members = JobStatus.of(status).members
    gang = set(members) if members is not None else set(range(int(spec.get("worldSize") or 0)
                                                              // int(spec.get("ranksPerPod") or 1)))
    waiting = sorted((int(index), (pod.get("metadata") or {}).get("name", ""), pod_state(pod)) for pod in pods
                     if (index := ((pod.get("metadata") or {}).get("labels") or {}).get(labels.LABEL_RANK)) is not None
                     and int(index) not in gang)
    return ", ".join(f"{name} {state}" for _, name, state in waiting) or "none yet"


def status_text(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]]) -> str:
    """`kubectl ddp status`: phase, ranks by state, progress, last checkpoint, failure reason."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    read = JobStatus.of(status)
    lines = [f"Job:          {meta.get('namespace')}/{meta.get('name')}",
             f"Phase:        {status.get(STATUS_PHASE) or PHASE_PENDING}"
             + (f" ({status[STATUS_REASON]})" if status.get(STATUS_REASON) else ""),
             f"World size:   {world_size_text(spec, status)}, {spec.get('gpusPerRank', 1)} GPU(s) each",
             f"Attempt:      {read.attempt} (restarts: {read.restarts}, program "
             f"{status.get(STATUS_PROGRAM_RESTARTS, 0)}, infrastructure {status.get(STATUS_INFRASTRUCTURE_RESTARTS, 0)})"]
    pods = list(pods)
    states = ranks_by_state(pods)
    if spares_text(spec, status, pods):
        lines.append(f"Spare pods:   {spares_text(spec, status, pods)}")
    lines.append("Ranks:        " + ("; ".join(f"{state} {ranks_text(ranks)}" for state, ranks in states.items())
                                     or "no pods"))
    lines.append(f"Progress:     {progress_text(status) or 'none reported yet'}")
    checkpoint = status.get(STATUS_LAST_CHECKPOINT) or {}
    lines.append(f"Checkpoint:   step {checkpoint.get('step')} at {checkpoint.get('uri')} ({checkpoint.get('time')})"
                 if checkpoint else "Checkpoint:   none committed")
    if behind_text(status):
        lines.append(f"              {behind_text(status)}")
    if snapshots_text(status):
        lines.append(f"Snapshots:    {snapshots_text(status)}")
    if recovery_text(status):
        lines.append(f"Recovery:     {recovery_text(status)}")
    if (job.get("spec") or {}).get("keepFolders"):
        lines.append(f"Kept:         {kept_text(status) or 'nothing yet'}")
    if status.get(STATUS_MESSAGE) and status.get(STATUS_PHASE) != PHASE_FAILED:
        lines.append(f"Message:      {status[STATUS_MESSAGE]}")
    failed = status.get(STATUS_PHASE) == PHASE_FAILED
    section, text = ("Failure:", failure_text(status)) if failed else ("Last restart:", last_restart_text(status))
    if text:
        lines.append(section)
        lines.extend(f"  {line}" for line in text.splitlines())
    return "\n".join(lines)
