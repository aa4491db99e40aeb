"""One way to reach the Kubernetes API: the pod's service account inside a cluster, else a kubeconfig."""

from __future__ import annotations

import os
from typing import Any

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


def api_client(kubeconfig: str | None = None, pool_size: int | None = None) -> Any:
    """A `kubernetes.client.ApiClient`; kubeconfig (else $KUBECONFIG, else ~/.kube/config) outside a pod."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig is None and os.environ.get(IN_CLUSTER_ENV):
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)
