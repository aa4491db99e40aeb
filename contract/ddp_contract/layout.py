"""What lies under a job's results prefix, `<results>/<namespace>/<job name>/`, by its one name.

The runtime writes there and the client (`ddp_client`, `kubectl ddp`) reads it back:

    results/<path>                                   S3ResultsHandler.submit_result(path, data)
    metrics/rank-<RRRRR>-<session>-<ppppp>.jsonl     log_metrics(...)
    checkpoints/step-<012d>/...                      CheckpointManager
    hangs/attempt-<n>/rank-<r>.txt                   a hung rank's stacks
    logs/attempt-<n>/rank-<r>/part-<ppppp>.log       every rank's output, per gang attempt
    kept/<folder>/<path>                             spec.keepFolders: the folders' files, as on disk
    kept-passes/attempt-<n>/<pod>.started|.done      each pod's keeping of them, per attempt
    restarts/attempt-<n>.json                        why attempt n began (status.attemptCause), from its rank 0
    restarts/attempt-<n>.recovery.json               where attempt n resumed from (status.recovery), from its rank 0
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Final

RESULTS: Final = "results"
METRICS: Final = "metrics"
CHECKPOINTS: Final = "checkpoints"
HANGS: Final = "hangs"
LOGS: Final = "logs"
KEPT: Final = "kept"
KEPT_PASSES: Final = "kept-passes"
RESTARTS: Final = "restarts"

_LOG_PART = re.compile(r"^attempt-(?P<attempt>\d+)/rank-(?P<rank>\d+)/part-(?P<part>\d+)\.log$")
_ATTEMPT_CAUSE = re.compile(r"^attempt-(?P<attempt>\d+)\.json$")
_ATTEMPT_RECOVERY = re.compile(r"^attempt-(?P<attempt>\d+)\.recovery\.json$")


def job_key(base: str, namespace: str, job: str) -> str:
    """The job's prefix inside the results bucket, from the results URI's own key prefix."""
    return "/".join(p.strip("/") for p in (base, namespace, job) if p.strip("/"))


def is_result_path(path: str) -> bool:
    """Whether `path` names a result as submit_result takes it: a relative path without empty, '.'
    or '..' parts (so no leading or trailing '/' either), which stays below any folder it is joined to."""
    return bool(path) and all(part not in ("", ".", "..") for part in path.split("/"))


def kept_folder_key(path: str) -> str:
    """A kept folder's name under kept/: the path as spec.keepFolders writes it, normalised, without a
    leading '/' (`out`, `workspace/runs`). Raises ValueError for a path that is empty or climbs out ('..')."""
    normal = posixpath.normpath(path.strip())
    parts = [part for part in normal.split("/") if part]
    if not parts or normal in (".", "/") or ".." in parts:
        raise ValueError(f"{path!r} must name a folder below / without '..' parts")
    return "/".join(parts)


def log_part(attempt: int, rank: int, part: int) -> str:
    """A log part's key relative to the job's prefix."""
    return f"{LOGS}/attempt-{attempt}/rank-{rank}/part-{part:05d}.log"


@dataclass(frozen=True, order=True)
class LogPart:
    attempt: int
    rank: int
    part: int


def parse_log_part(relative: str) -> LogPart | None:
    """(attempt, rank, part) of a key relative to the job's prefix, or None for anything else."""
    match = _LOG_PART.match(relative.removeprefix(f"{LOGS}/"))
    if match is None or not relative.startswith(f"{LOGS}/"):
        return None
    return LogPart(int(match["attempt"]), int(match["rank"]), int(match["part"]))


def attempt_cause(attempt: int) -> str:
    """The key, relative to the job's prefix, of why `attempt` began."""
    return f"{RESTARTS}/attempt-{attempt}.json"


def parse_attempt_cause(relative: str) -> int | None:
    """The attempt of an attempt_cause key relative to the job's prefix, or None for anything else."""
    return _restart_record(relative, _ATTEMPT_CAUSE)


def attempt_recovery(attempt: int) -> str:
    """The key, relative to the job's prefix, of where `attempt` resumed from."""
    return f"{RESTARTS}/attempt-{attempt}.recovery.json"


def parse_attempt_recovery(relative: str) -> int | None:
    return _restart_record(relative, _ATTEMPT_RECOVERY)


def _restart_record(relative: str, pattern: re.Pattern[str]) -> int | None:
    match = pattern.match(relative.removeprefix(f"{RESTARTS}/"))
    return int(match["attempt"]) if match is not None and relative.startswith(f"{RESTARTS}/") else None
