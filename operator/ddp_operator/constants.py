"""Names, keys and defaults shared by the CRD, the builders and the handlers. Defined only here."""

from __future__ import annotations

from typing import Final

# The ranks' side of the contract (env var names, the API they write progress to) is defined by
# the trainer runtime; these modules import neither torch nor boto3.
from ddp_trainer import env as rank_env
from ddp_trainer import jobstatus

# --- API -------------------------------------------------------------------
GROUP: Final = jobstatus.GROUP
VERSION: Final = jobstatus.VERSION
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DDPJob"
PLURAL: Final = jobstatus.PLURAL
SINGULAR: Final = "ddpjob"
SHORT_NAME: Final = "ddpj"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# --- labels and annotations on children -------------------------------------
LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_RANK: Final = f"{GROUP}/rank"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "ddp-operator"
ANNOTATION_WORLD_SIZE: Final = f"{GROUP}/world-size"
ANNOTATION_MASTER_ADDR: Final = f"{GROUP}/master-addr"
# Labels the operator owns on pods; a template may not override them.
RESERVED_LABELS: Final = frozenset({LABEL_JOB_NAME, LABEL_RANK, LABEL_ATTEMPT})

# --- env vars injected into every rank ---------------------------------------
ENV_MASTER_ADDR: Final = rank_env.MASTER_ADDR
ENV_MASTER_PORT: Final = rank_env.MASTER_PORT
ENV_RANK: Final = rank_env.RANK
ENV_WORLD_SIZE: Final = rank_env.WORLD_SIZE
ENV_LOCAL_RANK: Final = rank_env.LOCAL_RANK
ENV_LOCAL_WORLD_SIZE: Final = rank_env.LOCAL_WORLD_SIZE
ENV_NODE_RANK: Final = rank_env.NODE_RANK
ENV_JOB_NAME: Final = rank_env.JOB_NAME
ENV_JOB_NAMESPACE: Final = rank_env.JOB_NAMESPACE
ENV_JOB_UID: Final = rank_env.JOB_UID
ENV_ATTEMPT: Final = "DDP_ATTEMPT"
ENV_BACKEND: Final = rank_env.BACKEND
ENV_ENTRYPOINT: Final = rank_env.ENTRYPOINT
ENV_S3_ENDPOINT: Final = rank_env.S3_ENDPOINT
ENV_S3_REGION: Final = rank_env.S3_REGION
ENV_DATASET_URI: Final = rank_env.DATASET_URI
ENV_RESULTS_URI: Final = rank_env.RESULTS_URI
ENV_AWS_ACCESS_KEY_ID: Final = rank_env.AWS_ACCESS_KEY_ID
ENV_AWS_SECRET_ACCESS_KEY: Final = rank_env.AWS_SECRET_ACCESS_KEY
# Keys expected in spec.s3.credentialsSecret; named like the env vars they feed.
SECRET_KEY_ACCESS_KEY_ID: Final = ENV_AWS_ACCESS_KEY_ID
SECRET_KEY_SECRET_ACCESS_KEY: Final = ENV_AWS_SECRET_ACCESS_KEY
# Set by the operator; a user's spec.env / template env may not override them.
RESERVED_ENV: Final = frozenset(
    {
        ENV_MASTER_ADDR,
        ENV_MASTER_PORT,
        ENV_RANK,
        ENV_WORLD_SIZE,
        ENV_LOCAL_RANK,
        ENV_LOCAL_WORLD_SIZE,
        ENV_NODE_RANK,
        ENV_JOB_NAME,
        ENV_JOB_NAMESPACE,
        ENV_JOB_UID,
        ENV_ATTEMPT,
        ENV_BACKEND,
        ENV_ENTRYPOINT,
    }
)

# --- pods --------------------------------------------------------------------
CONTAINER_NAME: Final = "trainer"
GPU_RESOURCE: Final = "nvidia.com/gpu"
SHM_VOLUME: Final = "dshm"
SHM_PATH: Final = "/dev/shm"
CLUSTER_DOMAIN: Final = "cluster.local"
# The trainer image's runtime, the command when spec.entrypoint is given: `run` with no target runs
# $DDP_ENTRYPOINT, and "--" passes the container's args (spec.args) through to it.
TRAINER_COMMAND: Final = ("python", "-m", "ddp_trainer", "run", "--")

# --- spec values and defaults -------------------------------------------------
BACKEND_AUTO: Final = "auto"
BACKEND_NCCL: Final = "nccl"
BACKEND_GLOO: Final = "gloo"
BACKENDS: Final = (BACKEND_AUTO, BACKEND_NCCL, BACKEND_GLOO)

POLICY_ON_FAILURE: Final = "OnFailure"
POLICY_NEVER: Final = "Never"
POLICY_EXIT_CODE: Final = "ExitCode"
RESTART_POLICIES: Final = (POLICY_ON_FAILURE, POLICY_NEVER, POLICY_EXIT_CODE)

DEFAULT_MASTER_PORT: Final = 29500
DEFAULT_BACKOFF_LIMIT: Final = 3
DEFAULT_GPUS_PER_RANK: Final = 1
DEFAULT_BACKEND: Final = BACKEND_AUTO
DEFAULT_RESTART_POLICY: Final = POLICY_ON_FAILURE
MAX_WORLD_SIZE: Final = 4096
MAX_GPUS_PER_RANK: Final = 16
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

# Reasons (CamelCase, as metav1.Condition requires).
REASON_CREATED: Final = "PodsCreated"
REASON_WAITING: Final = "WaitingForRanks"
REASON_ALL_READY: Final = "AllRanksReady"
REASON_SUSPENDED: Final = "Suspended"
REASON_RESUMED: Final = "Resumed"
REASON_RANK_FAILED: Final = "RankFailed"
REASON_RANK_EVICTED: Final = "RankEvicted"
REASON_RANK_MISSING: Final = "RankMissing"
REASON_SUCCEEDED: Final = "AllRanksSucceeded"
REASON_BACKOFF_LIMIT: Final = "BackoffLimitExceeded"
REASON_PERMANENT: Final = "PermanentFailure"
REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_INVALID_SPEC: Final = "InvalidSpec"

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
