"""The job's vocabulary as the operator writes it: phases, conditions, reasons, failure kinds, and the
names of what it puts in a rank's pod.

Elsewhere: the spec's defaults and limits (spec.py), what the kubelet and the node lifecycle say
(kubelet.py), the operator process's settings (config.py); what the ranks must agree on too (API,
labels, env var names, exit codes, backends) is ddp_contract's.
"""

from __future__ import annotations

from typing import Final

from ddp_contract.exitcodes import ExitCode

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


# --- status --------------------------------------------------------------------
PHASE_PENDING: Final = "Pending"
PHASE_STARTING: Final = "Starting"
PHASE_RUNNING: Final = "Running"
PHASE_RESTARTING: Final = "Restarting"
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"
PHASE_SUSPENDED: Final = "Suspended"
PHASES: Final = (
    PHASE_PENDING,
    PHASE_STARTING,
    PHASE_RUNNING,
    PHASE_RESTARTING,
    PHASE_SUCCEEDED,
    PHASE_FAILED,
    PHASE_SUSPENDED,
)
TERMINAL_PHASES: Final = frozenset({PHASE_SUCCEEDED, PHASE_FAILED})


# Condition types (metav1.Condition); one per phase that a client may wait on.
COND_CREATED: Final = "Created"
COND_RUNNING: Final = "Running"
COND_RESTARTING: Final = "Restarting"
COND_SUCCEEDED: Final = "Succeeded"
COND_FAILED: Final = "Failed"
COND_SUSPENDED: Final = "Suspended"
# True while some rank of the current attempt is held up for a reason someone gave (the scheduler,
# the kubelet); its reason is the cause most ranks share, its message names the ranks.
COND_RANKS_BLOCKED: Final = "RanksBlocked"
# Elastic jobs: True while the gang runs with fewer ranks than spec.worldSize.
COND_SHRUNK: Final = "Shrunk"
# spec.dataWorkers: True while every data worker pod is ready.
COND_DATA_WORKERS_READY: Final = "DataWorkersReady"

# Reasons (CamelCase, as metav1.Condition requires).
REASON_CREATED: Final = "PodsCreated"
REASON_WAITING: Final = "WaitingForRanks"
REASON_UNSCHEDULABLE: Final = "Unschedulable"
REASON_NAME_IN_USE: Final = "NameInUse"
REASON_NOT_BLOCKED: Final = "NoRankBlocked"
REASON_DATA_WORKERS_READY: Final = "AllDataWorkersReady"
REASON_DATA_WORKERS_STARTING: Final = "DataWorkersStarting"
REASON_DATA_WORKERS_NOT_KEPT: Final = "JobNotRunning"
REASON_ALL_READY: Final = "AllRanksReady"
REASON_SUSPENDED: Final = "Suspended"
# Kueue: the gang waits for its Workload's admission; Kueue evicted it (preemption, a stopped queue).
REASON_QUEUED: Final = "Queued"
REASON_EVICTED: Final = "Evicted"
REASON_RANK_FAILED: Final = "RankFailed"
REASON_RANK_EVICTED: Final = "RankEvicted"
REASON_RANK_MISSING: Final = "RankMissing"
REASON_NODE_LOST: Final = "NodeLost"
REASON_GANG_TOO_LARGE: Final = "GangTooLarge"
REASON_SUCCEEDED: Final = "AllRanksSucceeded"
REASON_BACKOFF_LIMIT: Final = "BackoffLimitExceeded"
REASON_PERMANENT: Final = "PermanentFailure"
REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_INVALID_SPEC: Final = "InvalidSpec"
# A pass raised on the job for a cause that is not the API server's (passerrors.py): said on the job
# and tried again with backoff; ranks its creation pass could not make are held up with it.
REASON_RECONCILE_ERROR: Final = "ReconcileError"
REASON_HUNG: Final = "Hung"
REASON_DETERMINISTIC: Final = "DeterministicFailure"
REASON_IN_PLACE_TIMED_OUT: Final = "InPlaceRestartTimedOut"
# An elastic job's gang re-formed smaller (ranks that do not fit left out) or bigger (waiting pods
# taken in); the Shrunk condition is False with FullSize once it has every rank again.
REASON_SHRUNK: Final = "Shrunk"
REASON_GROWN: Final = "Grown"
REASON_FULL_SIZE: Final = "FullSize"
# The API server refused an object the job needs (admission.py): by who refused. A quota may free up;
# the others refuse until someone changes the cluster or the spec, so the job fails at once.
REASON_POD_SECURITY: Final = "PodSecurity"
REASON_QUOTA_EXCEEDED: Final = "QuotaExceeded"
REASON_QUOTA_NEEDS_RESOURCES: Final = "QuotaRequiresResources"
REASON_LIMIT_RANGE: Final = "LimitRange"
REASON_ADMISSION_DENIED: Final = "AdmissionDenied"
REASON_FORBIDDEN: Final = "Forbidden"
# The kubelet will not start a root image in a pod that asks for a non-root user (podsecurity.py).
REASON_IMAGE_RUNS_AS_ROOT: Final = "ImageRunsAsRoot"
# Ranks held up for one of these fail the job at once: waiting cannot help.
FAIL_AT_ONCE_REASONS: Final = frozenset({
    REASON_POD_SECURITY, REASON_QUOTA_NEEDS_RESOURCES, REASON_LIMIT_RANGE, REASON_ADMISSION_DENIED, REASON_FORBIDDEN,
    REASON_INVALID_SPEC, REASON_IMAGE_RUNS_AS_ROOT,
})

# Whose fault a failure is; each kind has its own restart budget.
KIND_PROGRAM: Final = "Program"
KIND_INFRASTRUCTURE: Final = "Infrastructure"
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
