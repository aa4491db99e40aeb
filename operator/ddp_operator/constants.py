"""The operator's own names: what it puts in a rank's pod, which failures end a job at once, the
reasons of the runtime's exit codes; the job's status vocabulary (phases, conditions, reasons, failure
kinds) from ddp_contract.jobstatus, so that the operator's modules read all of it as `c.NAME`.

Elsewhere: the spec's defaults and limits (spec.py), what the kubelet and the node lifecycle say
(kubelet.py), the operator process's settings (config.py); what the ranks must agree on too (API,
labels, env var names, exit codes, backends) is ddp_contract's.
"""

from __future__ import annotations

from typing import Final

from ddp_contract.exitcodes import ExitCode
from ddp_contract.jobstatus import (
    COND_CREATED as COND_CREATED,
)
from ddp_contract.jobstatus import (
    COND_DATA_WORKERS_READY as COND_DATA_WORKERS_READY,
)
from ddp_contract.jobstatus import (
    COND_FAILED as COND_FAILED,
)
from ddp_contract.jobstatus import (
    COND_RANKS_BLOCKED as COND_RANKS_BLOCKED,
)
from ddp_contract.jobstatus import (
    COND_RESTARTING as COND_RESTARTING,
)
from ddp_contract.jobstatus import (
    COND_RUNNING as COND_RUNNING,
)
from ddp_contract.jobstatus import (
    COND_SHRUNK as COND_SHRUNK,
)
from ddp_contract.jobstatus import (
    COND_SUCCEEDED as COND_SUCCEEDED,
)
from ddp_contract.jobstatus import (
    COND_SUSPENDED as COND_SUSPENDED,
)
from ddp_contract.jobstatus import (
    KIND_INFRASTRUCTURE as KIND_INFRASTRUCTURE,
)
from ddp_contract.jobstatus import (
    KIND_PROGRAM as KIND_PROGRAM,
)
from ddp_contract.jobstatus import (
    PHASE_FAILED as PHASE_FAILED,
)
from ddp_contract.jobstatus import (
    PHASE_PENDING as PHASE_PENDING,
)
from ddp_contract.jobstatus import (
    PHASE_RESTARTING as PHASE_RESTARTING,
)
from ddp_contract.jobstatus import (
    PHASE_RUNNING as PHASE_RUNNING,
)
from ddp_contract.jobstatus import (
    PHASE_STARTING as PHASE_STARTING,
)
from ddp_contract.jobstatus import (
    PHASE_SUCCEEDED as PHASE_SUCCEEDED,
)
from ddp_contract.jobstatus import (
    PHASE_SUSPENDED as PHASE_SUSPENDED,
)
from ddp_contract.jobstatus import (
    PHASES as PHASES,
)
from ddp_contract.jobstatus import (
    REASON_ADMISSION_DENIED as REASON_ADMISSION_DENIED,
)
from ddp_contract.jobstatus import (
    REASON_ALL_READY as REASON_ALL_READY,
)
from ddp_contract.jobstatus import (
    REASON_BACKOFF_LIMIT as REASON_BACKOFF_LIMIT,
)
from ddp_contract.jobstatus import (
    REASON_CREATED as REASON_CREATED,
)
from ddp_contract.jobstatus import (
    REASON_DATA_WORKERS_NOT_KEPT as REASON_DATA_WORKERS_NOT_KEPT,
)
from ddp_contract.jobstatus import (
    REASON_DATA_WORKERS_READY as REASON_DATA_WORKERS_READY,
)
from ddp_contract.jobstatus import (
    REASON_DATA_WORKERS_STARTING as REASON_DATA_WORKERS_STARTING,
)
from ddp_contract.jobstatus import (
    REASON_DEADLINE as REASON_DEADLINE,
)
from ddp_contract.jobstatus import (
    REASON_DETERMINISTIC as REASON_DETERMINISTIC,
)
from ddp_contract.jobstatus import (
    REASON_EVICTED as REASON_EVICTED,
)
from ddp_contract.jobstatus import (
    REASON_FORBIDDEN as REASON_FORBIDDEN,
)
from ddp_contract.jobstatus import (
    REASON_FULL_SIZE as REASON_FULL_SIZE,
)
from ddp_contract.jobstatus import (
    REASON_GANG_TOO_LARGE as REASON_GANG_TOO_LARGE,
)
from ddp_contract.jobstatus import (
    REASON_GROWN as REASON_GROWN,
)
from ddp_contract.jobstatus import (
    REASON_HUNG as REASON_HUNG,
)
from ddp_contract.jobstatus import (
    REASON_IMAGE_RUNS_AS_ROOT as REASON_IMAGE_RUNS_AS_ROOT,
)
from ddp_contract.jobstatus import (
    REASON_IN_PLACE_TIMED_OUT as REASON_IN_PLACE_TIMED_OUT,
)
from ddp_contract.jobstatus import (
    REASON_INVALID_SPEC as REASON_INVALID_SPEC,
)
from ddp_contract.jobstatus import (
    REASON_LIMIT_RANGE as REASON_LIMIT_RANGE,
)
from ddp_contract.jobstatus import (
    REASON_NAME_IN_USE as REASON_NAME_IN_USE,
)
from ddp_contract.jobstatus import (
    REASON_NO_TOPOLOGY_DOMAIN as REASON_NO_TOPOLOGY_DOMAIN,
)
from ddp_contract.jobstatus import (
    REASON_NODE_LOST as REASON_NODE_LOST,
)
from ddp_contract.jobstatus import (
    REASON_NOT_BLOCKED as REASON_NOT_BLOCKED,
)
from ddp_contract.jobstatus import (
    REASON_NOT_SCHEDULED as REASON_NOT_SCHEDULED,
)
from ddp_contract.jobstatus import (
    REASON_PERMANENT as REASON_PERMANENT,
)
from ddp_contract.jobstatus import (
    REASON_PLACEMENT_CONFLICT as REASON_PLACEMENT_CONFLICT,
)
from ddp_contract.jobstatus import (
    REASON_POD_SECURITY as REASON_POD_SECURITY,
)
from ddp_contract.jobstatus import (
    REASON_QUEUED as REASON_QUEUED,
)
from ddp_contract.jobstatus import (
    REASON_QUOTA_EXCEEDED as REASON_QUOTA_EXCEEDED,
)
from ddp_contract.jobstatus import (
    REASON_QUOTA_NEEDS_RESOURCES as REASON_QUOTA_NEEDS_RESOURCES,
)
from ddp_contract.jobstatus import (
    REASON_RANK_EVICTED as REASON_RANK_EVICTED,
)
from ddp_contract.jobstatus import (
    REASON_RANK_FAILED as REASON_RANK_FAILED,
)
from ddp_contract.jobstatus import (
    REASON_RANK_MISSING as REASON_RANK_MISSING,
)
from ddp_contract.jobstatus import (
    REASON_RECONCILE_ERROR as REASON_RECONCILE_ERROR,
)
from ddp_contract.jobstatus import (
    REASON_SHRUNK as REASON_SHRUNK,
)
from ddp_contract.jobstatus import (
    REASON_SUCCEEDED as REASON_SUCCEEDED,
)
from ddp_contract.jobstatus import (
    REASON_SUSPENDED as REASON_SUSPENDED,
)
from ddp_contract.jobstatus import (
    REASON_UNSCHEDULABLE as REASON_UNSCHEDULABLE,
)
from ddp_contract.jobstatus import (
    REASON_WAITING as REASON_WAITING,
)
from ddp_contract.jobstatus import (
    TERMINAL_PHASES as TERMINAL_PHASES,
)

# --- pods --------------------------------------------------------------------
GPU_RESOURCE: Final = "nvidia.com/gpu"
# What a gang's size is judged by against the nodes' allocatable (capacity.py), GPUs first.
CAPACITY_RESOURCES: Final = (GPU_RESOURCE, "cpu", "memory")
SHM_VOLUME: Final = "dshm"
S3_CA_VOLUME: Final = "ddp-s3-ca"  # spec.s3.caBundle's ConfigMap key
SHM_PATH: Final = "/dev/shm"
# The trainer image's runtime, the command when spec.entrypoint is given: `run` with no target runs
# $DDP_ENTRYPOINT, and "--" passes the container's args (spec.args) through to it.
TRAINER_COMMAND: Final = ("python", "-m", "ddp_trainer", "run", "--")


# --- status: phases, conditions, reasons and failure kinds are ddp_contract.jobstatus's (imported above) ---

# Ranks held up for one of these fail the job at once: waiting cannot help.
FAIL_AT_ONCE_REASONS: Final = frozenset({
    REASON_POD_SECURITY, REASON_QUOTA_NEEDS_RESOURCES, REASON_LIMIT_RANGE, REASON_ADMISSION_DENIED, REASON_FORBIDDEN,
    REASON_INVALID_SPEC, REASON_IMAGE_RUNS_AS_ROOT, REASON_PLACEMENT_CONFLICT,
})

# A rank that exited through the runtime with one of its own codes: the failure's reason, in place
# of the kubelet's plain "Error".
RUNTIME_EXIT_REASONS: Final = {
    ExitCode.HUNG: REASON_HUNG,
    ExitCode.TERMINATED: "Terminated",
    ExitCode.MASTER_UNRESOLVED: "MasterUnresolved",
    ExitCode.RENDEZVOUS_FAILED: "RendezvousFailed",
    ExitCode.COMMUNICATION_ERROR: "CommunicationError",
    ExitCode.STORAGE_UNAVAILABLE: "StorageUnavailable",
    ExitCode.CONFIG_ERROR: "ConfigError",
}
