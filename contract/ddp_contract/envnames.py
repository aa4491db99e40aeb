"""Every environment variable a rank reads, by its one name.

The operator sets the rendezvous and job variables (RESERVED: a spec's env may not override them)
and the S3 ones from spec.s3; the rest are the runtime's settings a user may set in spec.env.
"""

from __future__ import annotations

from typing import Final

# Rendezvous, with torchrun's names.
MASTER_ADDR: Final = "MASTER_ADDR"
MASTER_PORT: Final = "MASTER_PORT"
RANK: Final = "RANK"
WORLD_SIZE: Final = "WORLD_SIZE"
LOCAL_RANK: Final = "LOCAL_RANK"
LOCAL_WORLD_SIZE: Final = "LOCAL_WORLD_SIZE"
NODE_RANK: Final = "NODE_RANK"
GROUP_RANK: Final = "GROUP_RANK"  # torchrun's name for the pod's (node's) index, = NODE_RANK

# torchrun's own settings: `torchrun` and `python -m torch.distributed.run/launch` take each flag not given
# on their command line from PET_<FLAG>, so a launcher in a rank's pod joins the job's world (the names
# Kubeflow's PyTorchJob and TrainJob set): the gang's pods, the ranks of each, this pod's place, rank 0's pod.
PET_NNODES: Final = "PET_NNODES"
PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
PET_NODE_RANK: Final = "PET_NODE_RANK"
PET_MASTER_ADDR: Final = "PET_MASTER_ADDR"
PET_MASTER_PORT: Final = "PET_MASTER_PORT"
PET_NAMES: Final = (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT)

# The DDPJob this rank belongs to, and its gang attempt.
JOB_NAME: Final = "DDP_JOB_NAME"
JOB_NAMESPACE: Final = "DDP_JOB_NAMESPACE"
JOB_UID: Final = "DDP_JOB_UID"
ATTEMPT: Final = "DDP_ATTEMPT"
# The job's last committed checkpoint (status.lastCheckpoint.uri) when the attempt's pods were made.
RESUME_FROM: Final = "DDP_RESUME_FROM"
# spec.restartStrategy when it is InPlace: the runtime then supervises the pod's rank processes, and
# starts them again in the same pod for each new attempt (ddp_trainer.runtime.inplace).
RESTART_STRATEGY: Final = "DDP_RESTART_STRATEGY"
# Set by that supervisor for the rank processes it starts, so they run the rank instead of supervising.
SUPERVISED: Final = "DDP_SUPERVISED"
# The size of the current attempt's gang in ranks, which every process group a command's processes form
# must have (a launcher sets WORLD_SIZE for its own workers; this one it leaves alone).
GANG_WORLD_SIZE: Final = "DDP_GANG_WORLD_SIZE"
# Set by the runtime on a command's processes: the folder where each Python process of the command says
# how it failed (its failure line), and the file rank 0 writes once its process group formed.
FAILURE_DIR: Final = "DDP_FAILURE_DIR"
FORMED_FILE: Final = "DDP_FORMED_FILE"
# ... and the socket where rank 0's Hugging Face or Lightning trainer says how far it is (its step of how
# many, epoch, loss), as the in-process hook reads them off the trainer.
PROGRESS_SOCKET: Final = "DDP_PROGRESS_SOCKET"
# spec.launcher Command: the job's command starts the pod's ranks itself, so the runtime runs it once.
LAUNCHER: Final = "DDP_LAUNCHER"
# Set by that supervisor on its zygote (ddp_trainer.runtime.zygote), whose forked children run the
# later attempts' ranks: their /proc/<pid>/environ is the zygote's, their own env is the attempt's.
ZYGOTE: Final = "DDP_ZYGOTE"
# spec.worldSize, the size an elastic job (spec.minWorldSize below it) runs at when every rank fits;
# WORLD_SIZE is the size of the current attempt's gang, which may be smaller.
TARGET_WORLD_SIZE: Final = "DDP_TARGET_WORLD_SIZE"
# Set by that supervisor on the rank processes: a file that exists, holding status.checkpointRequested's
# since, while the job asks for a checkpoint (CheckpointManager.requested()).
CHECKPOINT_REQUEST_FILE: Final = "DDP_CHECKPOINT_REQUEST_FILE"

# What the rank runs, and how.
BACKEND: Final = "DDP_BACKEND"
ENTRYPOINT: Final = "DDP_ENTRYPOINT"
INIT_TIMEOUT_SECONDS: Final = "DDP_INIT_TIMEOUT_SECONDS"
MASTER_WAIT_SECONDS: Final = "DDP_MASTER_WAIT_SECONDS"
PROGRESS_FILE: Final = "DDP_PROGRESS_FILE"
PROGRESS_INTERVAL_SECONDS: Final = "DDP_PROGRESS_INTERVAL_SECONDS"
# A rank whose step has not advanced this long dumps its stacks and exits HUNG (0: never); unset, the
# runtime derives it from the slowest step so far, at least DDP_HANG_MIN_SECONDS.
HANG_TIMEOUT_SECONDS: Final = "DDP_HANG_TIMEOUT_SECONDS"
HANG_MIN_SECONDS: Final = "DDP_HANG_MIN_SECONDS"
# Where a failing rank leaves its last words for the kubelet (the container's terminationMessagePath).
TERMINATION_MESSAGE_PATH: Final = "DDP_TERMINATION_MESSAGE_PATH"
# How often a rank uploads its output to <results>/<ns>/<job>/logs/ (it also does at exit); 0: at exit only.
LOG_UPLOAD_INTERVAL_SECONDS: Final = "DDP_LOG_UPLOAD_INTERVAL_SECONDS"
# Whether the metric lines a rank prints drive its job's progress and metrics (ddp_contract.metriclines);
# false, 0, no or off: only the reporter and log_metrics do. The operator sets it from spec.metricsFromOutput.
METRICS_FROM_OUTPUT: Final = "DDP_METRICS_FROM_OUTPUT"
# The words that turn a yes/no setting off; anything else (or nothing) leaves it on.
OFF_WORDS: Final = frozenset({"false", "0", "no", "off"})

# Data workers (spec.dataWorkers): where a rank's loader finds them (host:port, comma-separated), the
# job's token both sides prove on connect, the port they listen on, and the pod's own address
# (the downward API's status.podIP), the only one a data worker listens on.
DATA_WORKERS: Final = "DDP_DATA_WORKERS"
DATA_WORKER_TOKEN: Final = "DDP_DATA_WORKER_TOKEN"
DATA_WORKER_PORT: Final = "DDP_DATA_WORKER_PORT"
DEFAULT_DATA_WORKER_PORT: Final = 29600
POD_IP: Final = "POD_IP"
# The job's token (its Secret, which the data token's is): the pods of an InPlace job prove it to each other
# when one hands its memory snapshots to another. And where a pod keeps them (a memory-backed /dev/shm).
JOB_TOKEN: Final = "DDP_JOB_TOKEN"
SNAPSHOT_DIR: Final = "DDP_SNAPSHOT_DIR"

# S3: credentials under the names boto3 reads (and the keys the credentials Secret must hold).
AWS_ACCESS_KEY_ID: Final = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY: Final = "AWS_SECRET_ACCESS_KEY"
AWS_REGION: Final = "AWS_REGION"
S3_ENDPOINT: Final = "DDP_S3_ENDPOINT"
S3_REGION: Final = "DDP_S3_REGION"
S3_MAX_ATTEMPTS: Final = "DDP_S3_MAX_ATTEMPTS"
# How long S3 may stay unreachable while the ranks train on, their checkpoints and metrics waiting for it.
S3_OUTAGE_SECONDS: Final = "DDP_S3_OUTAGE_SECONDS"
S3_READ_PART_BYTES: Final = "DDP_S3_READ_PART_BYTES"
S3_READ_AHEAD: Final = "DDP_S3_READ_AHEAD"
S3_CRT: Final = "DDP_S3_CRT"  # 0: large uploads through boto3 even where awscrt is installed
# How the clients talk to the store (s3options.py): checksums, bucket addressing, a private CA's bundle.
S3_CHECKSUMS: Final = "DDP_S3_CHECKSUMS"
S3_ADDRESSING_STYLE: Final = "DDP_S3_ADDRESSING_STYLE"
S3_CA_BUNDLE: Final = "DDP_S3_CA_BUNDLE"
SHARD_CACHE_DIR: Final = "DDP_SHARD_CACHE_DIR"
SHARD_CACHE_BYTES: Final = "DDP_SHARD_CACHE_BYTES"
DATASET_URI: Final = "DDP_DATASET_URI"
RESULTS_URI: Final = "DDP_RESULTS_URI"
# spec.keepFolders as a JSON list of paths (relative to the container's working directory, or absolute):
# kept under <results>/<namespace>/<job>/kept/ and restored before each attempt (runtime/folderkeeper.py).
KEEP_FOLDERS: Final = "DDP_KEEP_FOLDERS"
KEEP_INTERVAL_SECONDS: Final = "DDP_KEEP_INTERVAL_SECONDS"  # how often the folders are looked at (5)
KEEP_SETTLE_SECONDS: Final = "DDP_KEEP_SETTLE_SECONDS"  # how long a file stays unchanged before it is kept (10)

# Set by the operator for every rank; a spec's env or template may not override them.
RESERVED: Final = frozenset({
    MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, GROUP_RANK,
    JOB_NAME, JOB_NAMESPACE, JOB_UID, ATTEMPT, BACKEND, ENTRYPOINT, RESUME_FROM, RESTART_STRATEGY, SUPERVISED,
    TARGET_WORLD_SIZE, GANG_WORLD_SIZE, FAILURE_DIR, JOB_TOKEN, FORMED_FILE, PROGRESS_SOCKET, LAUNCHER, *PET_NAMES,
})
