"""`python -m ddp_operator`: run the operator for every namespace of the cluster."""

from __future__ import annotations

import faulthandler
import os
import signal

import kopf

from ddp_operator import handlers  # noqa: F401  (registers the handlers)


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    kopf.configure(verbose=bool(os.environ.get("DDP_OPERATOR_VERBOSE")))
    kopf.run(
        clusterwide=True,
        standalone=True,  # one replica (the chart uses the Recreate strategy), no peering objects
        liveness_endpoint=os.environ.get("DDP_OPERATOR_LIVENESS"),
    )


if __name__ == "__main__":
    main()
