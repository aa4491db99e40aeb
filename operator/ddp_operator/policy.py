"""Which rank failures a job's restartPolicy retries."""

from __future__ import annotations

from ddp_contract.exitcodes import is_retryable_exit
from ddp_operator import constants as c
from ddp_operator.podsummary import RankFailure


def is_retryable(policy: str, failure: RankFailure) -> bool:
    """OnFailure: always; Never: never; ExitCode: evictions, lost pods and exit codes 128-255
    (signals: OOM kill, SIGTERM, ...) are retried, 1-127 (the program's own errors) are permanent.
    A failure with no exit code (the container never ran) counts as retryable under ExitCode."""
    if policy == c.POLICY_ON_FAILURE:
        return True
    if policy == c.POLICY_NEVER:
        return False
    if failure.evicted or failure.exit_code is None:
        return True
    return is_retryable_exit(failure.exit_code)
