"""The failure model: a rank that failed (`RankFailure`: which, where, how, its last words, and whose
fault), a rank held up (`PodProblem`: why, in whose words), and how both are said in a job's status
and Events: "ranks 0-3, 6 (Unschedulable): ...".

podsummary.py finds them in a job's pods; decision.py and policy.py judge them.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Final

from ddp_contract.exitcodes import ExitCode, is_infrastructure_exit
from ddp_contract.failureline import FailureLine, parse_line
from ddp_operator import constants as c

# A rank whose collective failed (its peer died) is acted on only after this long, unless the peer's
# own failure shows up first: that one is the cause, and decides the restart's budget.
ECHO_GRACE_SECONDS: Final = 3.0
# Rank 0's rendezvous timing out waits longer for the rank that could not join: that rank's own wait
# for rank 0's port ends on its own clock (it may have started later), and names it with its node.
RENDEZVOUS_ECHO_GRACE_SECONDS: Final = 60.0

# How much of a failed rank's output its status and Event keep.
OUTPUT_LINES = 20
OUTPUT_CHARS = 2000


@dataclass(frozen=True)
class RankFailure:
    pod_index: int  # the failed pod's index (the rank itself when a pod holds one)
    pod: str
    exit_code: int | None
    reason: str
    evicted: bool  # the node or the scheduler took the pod away, not the training code
    finished_at: str | None = None
    node: str | None = None
    output: str | None = None  # the container's termination message: its last lines
    attempt: int | None = None
    ranks_per_pod: int = 1
    in_place: bool = False  # a rank process its runtime reported (status.processFailures); the pod goes on

    @cached_property
    def line(self) -> FailureLine | None:
        """The runtime's failure line in the output (step, error), when the rank ran the runtime."""
        return parse_line(self.output)

    @property
    def echo_grace_s(self) -> float | None:
        """For a failure most often caused by another rank, how long to wait for that rank's own: a
        collective that broke (COMMUNICATION_ERROR), or rank 0's rendezvous timing out
        (RENDEZVOUS_FAILED: rank 0 holds the store the others join, so it times out because one of
        them could not join, and that rank is the one to name). None: not an echo."""
        if self.exit_code == ExitCode.COMMUNICATION_ERROR:
            return ECHO_GRACE_SECONDS
        if self.exit_code == ExitCode.RENDEZVOUS_FAILED and self.pod_index == 0:
            return RENDEZVOUS_ECHO_GRACE_SECONDS
        return None

    @property
    def is_echo(self) -> bool:
        return self.echo_grace_s is not None

    @property
    def kind(self) -> str:
        """Infrastructure (evicted, preempted, node lost, hung, killed from outside, the network or
        storage failed) or Program (the code's own error, an OOM kill): they draw on separate budgets."""
        if self.evicted or self.exit_code is None or is_infrastructure_exit(self.exit_code, self.oom_killed):
            return c.KIND_INFRASTRUCTURE
        return c.KIND_PROGRAM

    @property
    def signal(self) -> str | None:
        """SIGKILL for exit code 137 and the like: a process killed by signal N exits 128+N."""
        if self.exit_code is None or not 128 < self.exit_code < 128 + signal.NSIG:
            return None
        try:
            return signal.Signals(self.exit_code - 128).name
        except ValueError:
            return None

    @property
    def oom_killed(self) -> bool:
        return self.reason == "OOMKilled"

    @property
    def global_rank(self) -> int:
        """The rank that failed: the pod's, or in a pod of several the one whose failure line it is
        (else the pod's first)."""
        if self.ranks_per_pod == 1:
            return self.pod_index
        return self.line.rank if self.line and self.line.rank is not None else self.pod_index * self.ranks_per_pod

    @property
    def who(self) -> str:
        if self.ranks_per_pod > 1 and not (self.line and self.line.rank is not None):
            return rank_list(range(self.pod_index * self.ranks_per_pod, (self.pod_index + 1) * self.ranks_per_pod))
        return f"rank {self.global_rank}"

    def describe(self) -> str:
        where = f"{self.who} (pod {self.pod}{f' on node {self.node}' if self.node else ''})"
        if self.exit_code is not None:
            killed = f", {self.signal}" if self.signal else ""
            said = ""
            if self.line is not None:
                said = f" at step {self.line.step}" if self.line.step is not None else " before its first step"
                said += f": {self.line.error}"
            return f"{where} exited with code {self.exit_code} ({self.reason}{killed}){said}"
        if self.evicted:
            return f"{where} was lost: {self.reason}" + (f" ({self.output})" if self.output else "")
        return f"{where} failed: {self.reason}"

    def as_status(self) -> dict[str, Any]:
        """The status.failedRank object."""
        return {"rank": self.global_rank, "pod": self.pod, "node": self.node, "exitCode": self.exit_code,
                "signal": self.signal, "oomKilled": self.oom_killed, "reason": self.reason,
                "message": self.output, "kind": self.kind, "attempt": self.attempt,
                "step": self.line.step if self.line else None}


@dataclass(frozen=True)
class PodProblem:
    """Why a pod of the job is not running (a rank's pod of the current attempt, or a data worker): a
    machine-readable reason and the words of whoever said so (the scheduler, the kubelet, the API server)."""

    index: int  # the pod's index among the ranks' pods, or the data worker's
    reason: str
    message: str = ""


def last_lines(text: str | None, lines: int = OUTPUT_LINES, chars: int = OUTPUT_CHARS) -> str | None:
    """The end of a container's output, small enough for a status field and an Event."""
    if not text or not text.strip():
        return None
    tail = "\n".join(text.rstrip().splitlines()[-lines:])
    return tail if len(tail) <= chars else "..." + tail[-(chars - 3):]


def describe_problems(problems: Iterable[PodProblem], noun: str = "rank") -> tuple[str, str]:
    """(the reason most ranks share, a message naming the ranks, those with one cause and message together).

    "ranks 0-3, 6 (Unschedulable): 0/4 nodes are available: 4 Insufficient nvidia.com/gpu.; rank 5
    (ImagePullError): ..."
    """
    groups: dict[tuple[str, str], list[int]] = {}
    for problem in problems:
        groups.setdefault((problem.reason, problem.message), []).append(problem.index)
    if not groups:
        return "", ""
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1][0]))
    parts = [f"{rank_list(ranks, noun)} ({reason}): {message}" if message else f"{rank_list(ranks, noun)} ({reason})"
             for (reason, message), ranks in ordered]
    return ordered[0][0][0], "; ".join(parts)


def rank_list(ranks: Iterable[int], noun: str = "rank") -> str:
    """'rank 3', 'ranks 0-3, 6' (or 'pod 3', 'pods 0-1')."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    return f"{noun} {spans[0]}" if len(ordered) == 1 else f"{noun}s {', '.join(spans)}"
