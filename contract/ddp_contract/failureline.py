"""The runtime's last line when a rank fails, which the operator reads back from the termination
message: which rank, at which training step, with which exit code, and the error.

    ddp-trainer: error (rank 1, step 120, exit 1 USER_ERROR, permanent): ZeroDivisionError: division by zero

"step -" means before the first step. The operator compares failures of consecutive attempts by
`signature` (the same error at the same step is deterministic) and shows the step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "ddp-trainer: error"
_LINE = re.compile(
    rf"^{re.escape(PREFIX)} \((?:rank (?P<rank>\d+)|startup), step (?P<step>\d+|-), "
    r"exit (?P<code>\d+) (?P<name>\w+), (?:retryable|permanent)\): (?P<error>.*)$"
)


@dataclass(frozen=True)
class FailureLine:
    rank: int | None
    step: int | None  # None: failed before the first training step
    exit_code: int
    error: str

    @property
    def signature(self) -> str:
        """What two failures of the same bug share, whichever rank hit it."""
        return f"step {'-' if self.step is None else self.step}, exit {self.exit_code}: {self.error}"


def format_line(rank: int | None, step: int | None, code: int, code_name: str, retryable: bool, error: str) -> str:
    where = f"rank {rank}" if rank is not None else "startup"
    kind = "retryable" if retryable else "permanent"
    flat = " ".join(error.split())
    return f"{PREFIX} ({where}, step {'-' if step is None else step}, exit {code} {code_name}, {kind}): {flat}"


def describe_hang(step: int | None, stalled_s: float, timeout_s: float) -> str:
    """What a rank whose training step stopped advancing says (before it exits HUNG)."""
    return f"no progress for {stalled_s:.0f}s since step {step} (hang timeout {timeout_s:g}s)"


def parse_line(text: str | None) -> FailureLine | None:
    """The runtime's failure line in a container's termination message or log tail, if there is one."""
    for line in reversed((text or "").splitlines()):
        match = _LINE.match(line.strip())
        if match:
            rank, step = match.group("rank"), match.group("step")
            return FailureLine(
                rank=int(rank) if rank is not None else None,
                step=None if step == "-" else int(step),
                exit_code=int(match.group("code")),
                error=match.group("error"),
            )
    return None
