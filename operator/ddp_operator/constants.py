"""The operator's own names and defaults: pods, spec values, phases, conditions, reasons.

What the ranks must agree on too (API, labels, env var names, exit codes, backends) is ddp_contract's.
"""

from __future__ import annotations

from typing import Final

from ddp_contract import backend
from ddp_contract.exitcodes import ExitCode

# --- pods --------------------------------------------------------------------
GPU_RESOURCE: Final = "nvidia.com/gpu"
# What a gang's size is judged by against the nodes' allocatable (capacity.py), GPUs first.
CAPACITY_RESOURCES: Final = (GPU_RESOURCE, "cpu", "memory")
# The NoExecute taints the node lifecycle controller puts on a node that is NotReady (Ready False)
# or unreachable (Ready Unknown); rank pods tolerate them for spec.nodeLostGraceSeconds.
TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
NODE_LOST_TAINTS: Final = (TAINT_NOT_READY, TAINT_UNREACHABLE)
SHM_VOLUME: Final = "dshm"
SHM_PATH: Final = "/dev/shm"
# The trainer image's runtime, the command when spec.entrypoint is given: `run` with no target runs
# $DDP_ENTRYPOINT, and "--" passes the container's args (spec.args) through to it.
TRAINER_COMMAND: Final = ("python", "-m", "ddp_trainer", "run", "--")

# --- spec values and defaults -------------------------------------------------
POLICY_ON_FAILURE: Final = "OnFailure"
POLICY_NEVER: Final = "Never"
POLICY_EXIT_CODE: Final = "ExitCode"
RESTART_POLICIES: Final = (POLICY_ON_FAILURE, POLICY_NEVER, POLICY_EXIT_CODE)

DEFAULT_MASTER_PORT: Final = 29500
DEFAULT_BACKOFF_LIMIT: Final = 3
DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT: Final = 10
# A rank whose collective failed (its peer died) is acted on only after this long, unless the peer's
# own failure shows up first: that one is the cause, and decides the restart's budget.
ECHO_GRACE_SECONDS: Final = 3.0
# Rank 0's rendezvous timing out waits longer for the rank that could not join: that rank's own wait
# for rank 0's port ends on its own clock (it may have started later), and names it with its node.
RENDEZVOUS_ECHO_GRACE_SECONDS: Final = 60.0
DEFAULT_STARTUP_DEADLINE_SECONDS: Final = 900
DEFAULT_NODE_LOST_GRACE_SECONDS: Final = 60
DEFAULT_GPUS_PER_RANK: Final = 1
DEFAULT_BACKEND: Final = backend.AUTO
DEFAULT_RESTART_POLICY: Final = POLICY_ON_FAILURE
MAX_WORLD_SIZE: Final = 4096
MAX_GPUS_PER_RANK: Final = 16
MAX_RANKS_PER_POD: Final = 64
# worldSize * gpusPerRank above this is almost certainly a typo, not a job.
MAX_TOTAL_GPUS: Final = 16384

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

# Reasons (CamelCase, as metav1.Condition requires).
REASON_CREATED: Final = "PodsCreated"
REASON_WAITING: Final = "WaitingForRanks"
REASON_UNSCHEDULABLE: Final = "Unschedulable"
REASON_NAME_IN_USE: Final = "NameInUse"
REASON_NOT_BLOCKED: Final = "NoRankBlocked"
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
REASON_HUNG: Final = "Hung"
REASON_DETERMINISTIC: Final = "DeterministicFailure"

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

# pod.status.reason values (and DisruptionTarget reasons) that mean the node or the
# scheduler took the pod away, not the training code.
EVICTION_REASONS: Final = frozenset(
    {
        "Evicted",
        "NodeLost",
        "Preempted",
        "Preempting",
        "DeletionByTaintManager",
        "DeletionByPodGC",
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "TerminationByKubelet",
        "NodeShutdown",
        "Shutdown",
        "Terminated",
        "UnexpectedAdmissionError",
    }
)
# kubelet admission rejections look like "OutOfcpu", "OutOfnvidia.com/gpu".
EVICTION_REASON_PREFIX: Final = "OutOf"

# The trainer container's waiting reasons, as the kubelet gives them, by the cause a user acts on.
WAITING_REASONS: Final = {
    "ErrImagePull": "ImagePullError",
    "ImagePullBackOff": "ImagePullError",
    "InvalidImageName": "ImagePullError",
    "ErrImageNeverPull": "ImagePullError",
    "CreateContainerConfigError": "ContainerConfigError",  # a missing Secret, ConfigMap or key
    "CreateContainerError": "ContainerConfigError",
    "RunContainerError": "ContainerConfigError",
    "CrashLoopBackOff": "CrashLoop",
}
# Waiting reasons of a pull that reached the registry: the pod's imagePullSecrets are worth naming.
PULL_FAILED_REASONS: Final = frozenset({"ErrImagePull", "ImagePullBackOff"})
# Waiting that is just the way to Running.
WAITING_NORMALLY: Final = frozenset({"ContainerCreating", "PodInitializing"})

# --- the operator process's settings: environment variables (config.py reads them) -------------------------------
ENV_VERBOSE: Final = "DDP_OPERATOR_VERBOSE"  # log every decision at debug level; empty, 0, false, no, off: not
ENV_LIVENESS: Final = "DDP_OPERATOR_LIVENESS"  # kopf's own liveness endpoint, e.g. http://0.0.0.0:8081/healthz
ENV_METRICS_ADDRESS: Final = "DDP_OPERATOR_METRICS_ADDRESS"  # where /metrics and /healthz listen
ENV_METRICS_PORT: Final = "DDP_OPERATOR_METRICS_PORT"  # 0: any free port (the log says which)
ENV_NAMESPACES: Final = "DDP_OPERATOR_NAMESPACES"  # comma-separated; empty: the whole cluster
ENV_LEASE_NAME: Final = "DDP_OPERATOR_LEASE_NAME"  # a coordination.k8s.io Lease; empty: no leader election
ENV_LEASE_NAMESPACE: Final = "DDP_OPERATOR_LEASE_NAMESPACE"
ENV_LEASE_DURATION: Final = "DDP_OPERATOR_LEASE_DURATION"  # seconds a standby waits after the last renewal it saw
ENV_LEASE_RENEW_DEADLINE: Final = "DDP_OPERATOR_LEASE_RENEW_DEADLINE"  # a leader unable to renew this long stops
ENV_LEASE_RETRY_PERIOD: Final = "DDP_OPERATOR_LEASE_RETRY_PERIOD"  # seconds between tries (renewals, takeovers)
ENV_IDENTITY: Final = "DDP_OPERATOR_IDENTITY"  # the lease holder's name (the chart: the pod's); else host-pid

DEFAULT_METRICS_ADDRESS: Final = "127.0.0.1"
DEFAULT_METRICS_PORT: Final = 8080
# client-go's defaults for controllers' leader election.
DEFAULT_LEASE_DURATION: Final = 15.0
DEFAULT_LEASE_RENEW_DEADLINE: Final = 10.0
DEFAULT_LEASE_RETRY_PERIOD: Final = 2.0
