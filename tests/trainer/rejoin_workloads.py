"""ddp_workloads.train, with a rank that never rejoins its gang after an in-place restart, once: the
import of this module blocks in the first rank-1 process an InPlace pod's runtime starts for attempt 1
(until SIGTERM), as a rank stuck in its setup would. $WL_MARK: a file saying it happened."""

from __future__ import annotations

import os
import time
from pathlib import Path

if os.environ.get("RANK") == "1" and os.environ.get("DDP_ATTEMPT") == "1" and os.environ.get("DDP_SUPERVISED") == "1":
    _mark = Path(os.environ["WL_MARK"])
    if not _mark.exists():
        _mark.touch()
        print("rank 1 blocks in its import", flush=True)
        while True:
            time.sleep(1)

from ddp_workloads import train

__all__ = ["train"]
