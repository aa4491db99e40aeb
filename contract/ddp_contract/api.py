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
