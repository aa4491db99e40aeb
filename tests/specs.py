"""DDPJob spec fixtures shared by the unit tests and the CRD tests."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def changed(base: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    """A deep copy of base with fields replaced; a None value removes the field."""
    spec = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec
