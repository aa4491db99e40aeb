"""A MultiKueue manager for the tests: a second local control plane, without nodes, on ports of its own,
with its own Kueue (localcluster/kueue.sh) and its own operator, whose MultiKueue dispatches to the
session's cluster (the worker) through a kubeconfig Secret. Taken down again by `stop`, or by the
watchdogs of cluster.sh and kueue.sh should the test process die first."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml
from kubernetes import client

from ddp_contract import kubeclient
from ddp_operator.config import ENV_NAMESPACES
from kube import OperatorProcess, cluster_script, install_crd, local_kubeconfig, wait_until
from kueue import kueue_script

# Ports apart from the session's cluster and from test_local_cluster.py's second one.
MANAGER = {
    "DDP_NODES": "0",
    "DDP_REAL_NODE": "0",
    "DDP_API_PORT": "18443",
    "DDP_ETCD_PORT": "14379",
    "DDP_ETCD_PEER_PORT": "14380",
    "DDP_KCM_PORT": "21357",
    "DDP_SCHED_PORT": "21359",
    "DDP_KWOK_PORT": "21347",
    "DDP_KUEUE_WEBHOOK_PORT": "21943",
    "DDP_KUEUE_HEALTH_PORT": "21981",
    "DDP_KUEUE_METRICS_PORT": "21983",
}
KUEUE_NAMESPACE = "kueue-system"
WORKER_SECRET = "worker-kubeconfig"


def inline_kubeconfig(path: str) -> str:
    """The kubeconfig at `path` with its certificate and key files read into it: MultiKueue takes no
    file paths from a Secret."""
    config = yaml.safe_load(Path(path).read_text())
    for entry, fields in (("clusters", ("certificate-authority",)), ("users", ("client-certificate", "client-key"))):
        for item in config[entry]:
            body = item["cluster" if entry == "clusters" else "user"]
            for field in fields:
                if field in body:
                    body[f"{field}-data"] = base64.b64encode(Path(body.pop(field)).read_bytes()).decode()
    return yaml.safe_dump(config)


class Manager:
    def __init__(self, folder: Path, namespace: str) -> None:
        self.env = {**MANAGER, "DDP_CLUSTER_DIR": str(folder / "cluster")}
        self.namespace = namespace
        self.log = folder / "operator.log"
        self.operator: OperatorProcess | None = None
        self.api: client.ApiClient | None = None

    def start(self, worker_kubeconfig: str) -> client.ApiClient:
        """Starts the control plane, Kueue and the operator (serving `namespace`, created here as on the
        worker), and gives Kueue the worker's kubeconfig; an API client of the manager."""
        owner = {"DDP_CLUSTER_OWNER_PID": str(os.getpid()), "DDP_KUEUE_OWNER_PID": str(os.getpid())}
        cluster_script("up", env={**self.env, **owner})
        kubeconfig = local_kubeconfig(self.env)
        self.api = kubeclient.api_client(kubeconfig)
        result = kueue_script("up", env={**self.env, **owner}, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"the manager's Kueue failed to start:\n{result.stderr}")
        install_crd(self.api)
        core = client.CoreV1Api(self.api)
        core.create_namespace({"metadata": {"name": self.namespace}})
        wait_until(lambda: core.list_namespaced_service_account(self.namespace).items, 30,
                   f"the default ServiceAccount in the manager's {self.namespace}")
        core.create_namespaced_secret(KUEUE_NAMESPACE, {"metadata": {"name": WORKER_SECRET},
                                                        "stringData": {"kubeconfig": inline_kubeconfig(worker_kubeconfig)}})
        self.operator = OperatorProcess(kubeconfig, self.log, env={ENV_NAMESPACES: self.namespace})
        self.operator.start()
        return self.api

    def stop(self) -> None:
        if self.operator is not None:
            self.operator.stop()
        if self.api is not None:
            self.api.close()
        kueue_script("down", env=self.env, check=False)
        cluster_script("down", env=self.env, check=False)

    def operator_log(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

