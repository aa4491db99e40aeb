"""The job's status, named once: every field of a DDPJob's status (the CRD's status schema; the
contract tests hold the two equal), the phases, condition types, reasons and failure kinds the operator
writes, and `StatusPatch`, the type of what it writes. The operator writes most fields, the ranks'
runtime `progress`, `rendezvous`, `lastCheckpoint`, `recovery`, `memorySnapshots`, `kept` and
`processFailures`; the client reads them all (through `resource.JobStatus` where it can).
"""

from __future__ import annotations

from typing import Any, Final, TypedDict

# --- fields ---------------------------------------------------------------------------------------
STATUS_PHASE: Final = "phase"
STATUS_ATTEMPT: Final = "attempt"  # the current gang attempt: 0, then +1 per restart or resize
STATUS_RECREATED_ATTEMPT: Final = "recreatedAttempt"  # the attempt whose pods were last all created anew
STATUS_ATTEMPT_TIME: Final = "attemptTime"  # when the current attempt began
STATUS_ATTEMPT_CAUSE: Final = "attemptCause"  # {attempt, reason, message, time}: why that attempt began
STATUS_RENDEZVOUS: Final = "rendezvous"  # {attempt, ...}: rank 0 says the attempt's gang formed
STATUS_LAST_CHECKPOINT: Final = "lastCheckpoint"  # {uri, step, ...}: the job's newest committed checkpoint
# {since, step, error}: rank 0's checkpoint waits for S3, which it cannot reach; cleared once one is committed
STATUS_CHECKPOINTS_BEHIND: Final = "checkpointsBehind"
# rank 0's, once the gang restored its state: where the attempt resumed from (ddp_contract.recoveries)
STATUS_RECOVERY: Final = "recovery"
# rank 0's: how the pods keep snapshots of the state in memory ({every, copies, bytes, directory}), or why
# they do not ({off}), said at the first snapshot
STATUS_MEMORY_SNAPSHOTS: Final = "memorySnapshots"
STATUS_FAILED_RANK: Final = "failedRank"  # the failure that ended or restarted the last attempt
STATUS_RESTARTS: Final = "restarts"
STATUS_REASON: Final = "reason"
STATUS_MESSAGE: Final = "message"
STATUS_START_TIME: Final = "startTime"  # when the job (last) started running; suspension clears it
STATUS_COMPLETION_TIME: Final = "completionTime"
STATUS_CONDITIONS: Final = "conditions"
STATUS_PROGRAM_RESTARTS: Final = "programRestarts"  # restarts drawn on spec.backoffLimit
STATUS_INFRASTRUCTURE_RESTARTS: Final = "infrastructureRestarts"  # ... on spec.infrastructureBackoffLimit
STATUS_READY_RANKS: Final = "readyRanks"
STATUS_TOTAL_RANKS: Final = "totalRanks"
STATUS_READY_PODS: Final = "readyPods"
STATUS_TOTAL_PODS: Final = "totalPods"
STATUS_READY: Final = "ready"  # "readyRanks/totalRanks", for kubectl get
STATUS_OBSERVED_GENERATION: Final = "observedGeneration"
STATUS_DATA_WORKERS: Final = "dataWorkers"  # {ready, total}: spec.dataWorkers' pods
STATUS_PROGRESS: Final = "progress"  # rank 0's: epoch, step, loss, ... (the runtime's jobstatus.py)
STATUS_KEPT: Final = "kept"  # rank 0's: what spec.keepFolders keeps in S3

# status.processFailures: under InPlace, a pod's runtime reports here (keyed by the pod's index, as a
# string) that a rank process failed while its container goes on; the operator reads it as it reads a
# failed container. Each entry: attempt, exitCode, reason, message (the rank's last words), finishedAt.
STATUS_PROCESS_FAILURES: Final = "processFailures"

# Elastic world size (spec.minWorldSize below spec.worldSize): the operator records each attempt's gang
# in status.members, the pods' indices in rank order (the pod at members[i] holds ranks
# i*ranksPerPod .. (i+1)*ranksPerPod-1, rank 0's pod is members[0]), and its size in ranks in
# status.worldSize. A pod whose index is not a member waits, its rank processes not started, until an
# attempt takes it in. Jobs that are not elastic leave both unset: every pod, in index order.
STATUS_MEMBERS: Final = "members"
STATUS_WORLD_SIZE: Final = "worldSize"
# Set by the operator while an elastic job waits for a checkpoint to grow at, {since: time, afterStep:
# lastCheckpoint.step when asked}: each pod's runtime tells its rank processes
# (envnames.CHECKPOINT_REQUEST_FILE), and rank 0's CheckpointManager.requested() says so, so the training
# loop commits one at its next step; the first checkpoint past afterStep is the one grown at.
STATUS_CHECKPOINT_REQUESTED: Final = "checkpointRequested"


# --- phases, conditions, reasons ------------------------------------------------------------------
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
REASON_NOT_SCHEDULED: Final = "NotScheduled"
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
# What Kueue's admission asks of the pods (a flavor's node labels, an admission check's update)
# contradicts their template: as Kueue does for its own job kinds, the job does not start.
REASON_PLACEMENT_CONFLICT: Final = "PlacementConflict"
# spec.topology required, and no domain has room for the whole gang now: it waits, tried again.
REASON_NO_TOPOLOGY_DOMAIN: Final = "NoTopologyDomain"
# The kubelet will not start a root image in a pod that asks for a non-root user (podsecurity.py).
REASON_IMAGE_RUNS_AS_ROOT: Final = "ImageRunsAsRoot"

# Whose fault a failure is; each kind has its own restart budget.
KIND_PROGRAM: Final = "Program"
KIND_INFRASTRUCTURE: Final = "Infrastructure"


class StatusPatch(TypedDict, total=False):
    """What the operator writes to a job's status, as a JSON merge patch: a field it leaves out stays as
    it is, a None removes it."""

    phase: str
    attempt: int
    recreatedAttempt: int
    attemptTime: str
    attemptCause: dict[str, Any]
    restarts: int
    programRestarts: int
    infrastructureRestarts: int
    readyRanks: int
    totalRanks: int
    readyPods: int
    totalPods: int
    ready: str
    worldSize: int
    members: list[int]
    checkpointRequested: dict[str, Any] | None
    processFailures: None  # the operator only clears them: the ranks' runtime writes them
    reason: str
    message: str
    startTime: str | None
    completionTime: str | None
    conditions: list[dict[str, Any]]
    observedGeneration: int
    failedRank: dict[str, Any]
    dataWorkers: dict[str, Any] | None
