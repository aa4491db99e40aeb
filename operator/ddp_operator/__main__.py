"""`python -m ddp_operator`: run the operator for every namespace of the cluster, or for those listed.

Settings are environment variables (config.py, ENV_*; docs/operating.md lists them). With a lease name
set, the process waits as a standby until it holds the lease, and exits (status 1) if it loses it.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys

import kopf

from ddp_contract import kubeclient
from ddp_operator import handlers  # noqa: F401  (registers the handlers)
from ddp_operator.config import ConfigError, default_identity, from_env, kopf_scope, own_namespace
from ddp_operator.endpoints import METRICS_PATH, Endpoint, Health
from ddp_operator.kubeapi import measured
from ddp_operator.leader import LeaderElector

log = logging.getLogger("ddp_operator")


def main() -> None:
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack
    try:
        config = from_env(os.environ, own_namespace())
    except ConfigError as error:
        sys.exit(f"ddp-operator: {error}")
    kopf.configure(verbose=config.verbose)
    health = Health()
    endpoint = Endpoint(config.metrics_address, config.metrics_port, health)
    endpoint.start()
    log.info("metrics on http://%s:%d%s", config.metrics_address, endpoint.port, METRICS_PATH)
    elector = None
    if config.lease is not None:
        # Lost: stop as on SIGTERM (kopf's own handler). Not kopf's stop_flag: a threading.Event there is
        # awaited on an executor thread that nothing ends on a plain SIGTERM, so the process never exited.
        elector = LeaderElector(measured(kubeclient.api_client(os.environ.get("KUBECONFIG"))), config.lease,
                                on_lost=lambda: os.kill(os.getpid(), signal.SIGTERM))
        health.add("leader-election", lambda: elector.alive or elector.lost)
        elector.start()
    try:
        kopf.run(
            standalone=True,  # no kopf peering objects: the Lease decides which replica acts
            # kopf would make one from the user's name, which a uid without a passwd entry (the
            # image's 65532) does not have: getpass raises.
            # (kopf types it as its own NewType of str, which it does not export.)
            identity=config.lease.identity if config.lease else default_identity(),  # type: ignore[arg-type]
            liveness_endpoint=config.liveness,
            memo=kopf.Memo(config=config, elector=elector, health=health),
            **kopf_scope(config.namespaces),
        )
    finally:
        endpoint.stop()
    if elector is not None and elector.lost:
        sys.exit(1)  # restarted by its pod, as a standby


if __name__ == "__main__":
    main()
