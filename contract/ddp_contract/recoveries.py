"""Where a restarted gang resumed from: status.recovery, written by its rank 0 once every rank restored
the state, kept in S3 for the dashboard's restart marks, and said in words by the client.

    {"attempt": 3, "step": 1200, "source": "Memory", "pods": ["job-1"], "reachedStep": 1201,
     "stepsLost": 1, "snapshots": true, "time": "..."}

source: "Memory" (pods of the gang held it: `pods`), "S3" (the job's checkpoint: `checkpoint`, its URI) or
"None" (nothing to resume from: step 0). reachedStep: the newest step a pod of the gang got to before the
restart, where one told (pods that keep memory snapshots do); stepsLost follows from it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from .timestamps import rfc3339

SOURCE_MEMORY: Final = "Memory"
SOURCE_S3: Final = "S3"
SOURCE_NONE: Final = "None"
# Every field a record may have: written to the status with None for those it lacks, so that a merge
# patch leaves nothing of the attempt before behind.
FIELDS: Final = ("attempt", "step", "source", "snapshots", "pods", "checkpoint", "reachedStep", "stepsLost", "time")


def record(*, attempt: int, step: int, source: str, pods: Sequence[str] = (), checkpoint: str | None = None,
           reached: int | None = None, memory: bool = False, now: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"attempt": attempt, "step": step, "source": source, "snapshots": memory}
    if pods:
        out["pods"] = list(pods)
    if checkpoint:
        out["checkpoint"] = checkpoint
    if reached is not None:
        out["reachedStep"] = reached
        out["stepsLost"] = max(reached - step, 0)
    out["time"] = rfc3339(time.time() if now is None else now)
    return out


def text(found: Mapping[str, Any]) -> str:
    """One line: 'attempt 3 resumed at step 1200 from the memory of pod job-1 (1 step lost)'."""
    step, source = found.get("step", 0), found.get("source")
    if source == SOURCE_MEMORY:
        pods = list(found.get("pods") or [])
        named = f"pod {pods[0]}" if len(pods) == 1 else f"pods {', '.join(pods[:3])}" + (
            f" and {len(pods) - 3} more" if len(pods) > 3 else "")
        said = f"resumed at step {step} from the memory of {named}"
    elif source == SOURCE_S3:
        said = f"resumed at step {step} from the checkpoint in S3"
        if found.get("snapshots"):
            said += " (no pod of the gang held a newer state in memory)"
    else:
        said = "started again from step 0 (no checkpoint yet)"
    lost = found.get("stepsLost")
    if isinstance(lost, int):
        said += f", {lost} step{'' if lost == 1 else 's'} lost"
    return f"attempt {found.get('attempt', '?')} {said}"
