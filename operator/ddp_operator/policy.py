"""Which rank failures a job's restartPolicy retries, on which budget, and which are deterministic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddp_contract.exitcodes import is_retryable_exit
from ddp_contract.failureline import parse_line
from ddp_contract.jobspec import POLICY_NEVER, POLICY_ON_FAILURE, JobSpec
from ddp_contract.jobstatus import STATUS_INFRASTRUCTURE_RESTARTS, STATUS_PROGRAM_RESTARTS
from ddp_operator import constants as c
from ddp_operator.failures import RankFailure

# status fields counting each kind's gang restarts, and the spec field limiting them
RESTART_COUNTERS = {c.KIND_PROGRAM: STATUS_PROGRAM_RESTARTS, c.KIND_INFRASTRUCTURE: STATUS_INFRASTRUCTURE_RESTARTS}
BUDGET_FIELDS = {c.KIND_PROGRAM: "backoffLimit", c.KIND_INFRASTRUCTURE: "infrastructureBackoffLimit"}


def is_retryable(policy: str, failure: RankFailure) -> bool:
    """OnFailure: always; Never: never; ExitCode: evictions, lost pods and exit codes 128-255
    (signals: OOM kill, SIGTERM, ...) are retried, 1-127 (the program's own errors) are permanent.
    A failure with no exit code (the container never ran) counts as retryable under ExitCode."""
    if policy == POLICY_ON_FAILURE:
        return True
    if policy == POLICY_NEVER:
        return False
    if failure.evicted or failure.exit_code is None:
        return True
    return is_retryable_exit(failure.exit_code)


def budget(spec: JobSpec, kind: str) -> int:
    """Gang restarts allowed for failures of `kind`."""
    return spec.backoff_limit if kind == c.KIND_PROGRAM else spec.infrastructure_backoff_limit


def repeats_previous(previous: Mapping[str, Any] | None, failure: RankFailure) -> bool:
    """Whether `failure` is the program error the attempt before it ended with, at the same step
    (whichever rank hit it): retrying will fail the same way again.

    Needs the runtime's failure line on both (ranks started by `entrypoint`); a `command` job's
    failures are never judged deterministic.
    """
    if not previous or failure.kind != c.KIND_PROGRAM or previous.get("kind") != c.KIND_PROGRAM:
        return False
    if failure.attempt is None or previous.get("attempt") != failure.attempt - 1:
        return False
    before = parse_line(previous.get("message"))
    return before is not None and failure.line is not None and before.signature == failure.line.signature
