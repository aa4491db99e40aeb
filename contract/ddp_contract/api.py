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

# spec.managedBy: the controller that runs the job, set at creation and never changed (as a batch Job's).
# Unset or MANAGED_BY_OPERATOR: this operator. MANAGED_BY_MULTIKUEUE: Kueue's MultiKueue runs a copy on a
# worker cluster and copies its status back; the operator here only creates the job's Workload. Any other
# value: another controller, and the operator leaves the job alone.
MANAGED_BY_OPERATOR: Final = "ddpoperator.io/operator"
MANAGED_BY_MULTIKUEUE: Final = "kueue.x-k8s.io/multikueue"
MAX_MANAGED_BY: Final = 63

def members_of(value: object) -> tuple[int, ...] | None:
    """status.members as pod indices in rank order; None where it is absent or not a list of distinct
    non-negative integers."""
    if not isinstance(value, list) or not value:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value) or len(set(value)) != len(value):
        return None
    return tuple(value)
