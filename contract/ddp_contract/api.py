"""The DDPJob API as the CRD in crds/ serves it."""

from __future__ import annotations

from typing import Final

GROUP: Final = "ddpoperator.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "DDPJob"
PLURAL: Final = "ddpjobs"
SINGULAR: Final = "ddpjob"
SHORT_NAME: Final = "ddpj"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# spec.restartStrategy. Recreate: a failure deletes every rank's pod and the next attempt creates them
# again. InPlace: only pods that cannot go on are replaced; the runtime in every other pod starts its
# rank processes again for the next attempt.
RESTART_IN_PLACE: Final = "InPlace"
RESTART_RECREATE: Final = "Recreate"
RESTART_STRATEGIES: Final = (RESTART_IN_PLACE, RESTART_RECREATE)

# spec.trainerRuntime, for a command job. Auto: the command runs under the trainer runtime where the
# image has it (the trainer image and images built FROM it), as it is elsewhere. Off: always as it is.
TRAINER_RUNTIME_AUTO: Final = "Auto"
TRAINER_RUNTIME_OFF: Final = "Off"
TRAINER_RUNTIMES: Final = (TRAINER_RUNTIME_AUTO, TRAINER_RUNTIME_OFF)

# spec.launcher, for a command in a pod of several ranks (ranksPerPod > 1): who starts them. Auto: a
# launcher the command names (torchrun, accelerate launch, ...) does, else torchrun --no-python starts one
# copy of the command per rank. Command: the command itself does (mp.spawn), so it runs once per pod.
LAUNCHER_AUTO: Final = "Auto"
LAUNCHER_COMMAND: Final = "Command"
LAUNCHERS: Final = (LAUNCHER_AUTO, LAUNCHER_COMMAND)

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


def members_of(value: object) -> tuple[int, ...] | None:
    """status.members as pod indices in rank order; None where it is absent or not a list of distinct
    non-negative integers."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value) or len(set(value)) != len(value):
        return None
    return tuple(value)
