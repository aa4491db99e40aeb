"""`python -m ddp_operator`: run the operator for every namespace of the cluster."""

from __future__ import annotations

import os

import kopf

from ddp_operator import handlers  # noqa: F401  (registers the handlers)


def main() -> None:
    kopf.configure(verbose=bool(os.environ.get("DDP_OPERATOR_VERBOSE")))
    kopf.run(
        clusterwide=True,
        standalone=True,  # one replica (the chart uses the Recreate strategy), no peering objects
        liveness_endpoint=os.environ.get("DDP_OPERATOR_LIVENESS"),
    )


if __name__ == "__main__":
    main()
