"""Labels the operator puts on a job's children, and the trainer container's name."""

from __future__ import annotations

from typing import Final

from .api import GROUP

LABEL_JOB_NAME: Final = f"{GROUP}/job-name"
LABEL_RANK: Final = f"{GROUP}/rank"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
# On a data worker pod (spec.dataWorkers), its index; a data worker pod has no rank or attempt label.
LABEL_DATA_WORKER: Final = f"{GROUP}/data-worker"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "ddp-operator"
# Labels the operator owns on pods; a template may not override them.
RESERVED_LABELS: Final = frozenset({LABEL_JOB_NAME, LABEL_RANK, LABEL_ATTEMPT, LABEL_DATA_WORKER})
CONTAINER_NAME: Final = "trainer"
DATA_WORKER_CONTAINER_NAME: Final = "data-worker"
ANNOTATION_WORLD_SIZE: Final = f"{GROUP}/world-size"
