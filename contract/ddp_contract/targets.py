"""What a rank runs, written by the client and the user, read by the operator and the runtime."""

from __future__ import annotations

import re
from typing import Final

# spec.entrypoint: `package.module:function`, run by the trainer runtime.
ENTRYPOINT_RE: Final = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# A function in a script file, `path/train.py:train`, as the client ships it and the runtime imports it.
SCRIPT_FUNCTION_RE: Final = re.compile(r"^(?P<script>.+\.py):(?P<function>[A-Za-z_]\w*)$")
