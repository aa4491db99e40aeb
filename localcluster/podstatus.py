"""Pod status as a kubelet reports it, for the stand-ins that play one (podrunner.py, the tests, the benchmark)."""

from __future__ import annotations

import time
from typing import Any

from ddp_contract.exitcodes import ExitCode
from ddp_contract.failureline import describe_hang, format_line
from ddp_contract.timestamps import rfc3339


def now() -> str:
    return rfc3339(time.time())


def pod_status(container: str, image: str, exit_code: int | None = None, reason: str | None = None,
               started: str | None = None, message: str | None = None) -> dict[str, Any]:
    """Running (exit_code None) or terminated with exit_code (and a termination message): phase,
    conditions and the container's state."""
    running = exit_code is None
    if running:
        state: dict[str, Any] = {"running": {"startedAt": started or now()}}
        phase = "Running"
    else:
        state = {"terminated": {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                                "startedAt": started or now(), "finishedAt": now()}}
        if message:
            state["terminated"]["message"] = message
        phase = "Succeeded" if exit_code == 0 else "Failed"
    ready = "True" if running else "False"
    return {
        "phase": phase,
        "startTime": started or now(),
        "conditions": [{"type": kind, "status": value, "lastTransitionTime": now()} for kind, value in
                       (("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", ready),
                        ("Ready", ready))],
        "containerStatuses": [{"name": container, "image": image, "imageID": "", "ready": running,
                               "restartCount": 0, "started": running, "state": state}],
    }


def evicted_status(message: str = "The node was low on resource: memory.") -> dict[str, Any]:
    return {"phase": "Failed", "reason": "Evicted", "message": message}


def hung_status(container: str, image: str, rank: int, step: int, dumps: str) -> dict[str, Any]:
    """A rank that exited HUNG at `step` after 300 s without progress, with its stacks in `dumps`."""
    line = format_line(rank, step, ExitCode.HUNG, ExitCode.HUNG.name, True, f"{describe_hang(step, 300, 300)}; stacks in {dumps}")
    return pod_status(container, image, ExitCode.HUNG, "Error", message=line)
