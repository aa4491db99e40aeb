"""ddp_workloads.train, with a rank that never rejoins its gang after an in-place restart, once: the
import of this module blocks in the first rank-1 process an InPlace pod's runtime starts for attempt 1
(until SIGTERM), as a rank stuck in its setup would. $WL_MARK: a file saying it happened.

Only a pod kept from attempt 0 blocks: its rank-1 process of attempt 0 leaves a file in the pod's own
memory (beside $DDP_SNAPSHOT_DIR), which a pod created anew for attempt 1 does not have. Without that, a
gang that took longer than the deadline to form for another reason (a loaded machine) would be
recreated with a pod that blocks, and nothing would recreate it again."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ddp_trainer import env

if os.environ.get("RANK") == "1" and os.environ.get("DDP_SUPERVISED") == "1":
    _trained_attempt_0 = Path(env.snapshot_dir()).parent / "rejoin-workloads-attempt-0"
    if os.environ.get("DDP_ATTEMPT") == "0":
        _trained_attempt_0.parent.mkdir(parents=True, exist_ok=True)
        _trained_attempt_0.touch()
    elif os.environ.get("DDP_ATTEMPT") == "1" and _trained_attempt_0.exists():
        _mark = Path(os.environ["WL_MARK"])
        if not _mark.exists():
            _mark.touch()
            print("rank 1 blocks in its import", flush=True)
            while True:
                time.sleep(1)

from ddp_workloads import train

__all__ = ["train"]
