"""Nodes a test makes for itself, to lose or to count, so the cluster's shared nodes are never touched.

They carry a taint (`OWN_NODE_TAINT`) that only the test's own pods tolerate (`pinned`), so the other tests'
pods running beside it (the real node's training among them) never land there.

kwok plays the kubelet of the nodes it manages and cannot be told to let one go silent (it keeps
posting a node's status even after losing the node's Lease), so a node that must go NotReady is one
whose kubelet the test plays itself (`HandPlayedNode`) and then stops.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from ddp_contract.timestamps import rfc3339
from kube import wait_until
from podstatus import pod_status

KWOK_ANNOTATION = {"kwok.x-k8s.io/node": "fake"}
LEASE_NAMESPACE = "kube-node-lease"
HEARTBEAT = 1.0  # seconds between a hand-played kubelet's rounds
LEASE_SECONDS = 40
OWN_NODE_TAINT = "ddp-operator-test/own-node"


def pinned(labels: dict[str, str]) -> dict[str, Any]:
    """A pod template's spec that lands its pods on the test's own nodes with these labels, and nowhere else."""
    return {"nodeSelector": labels,
            "tolerations": [{"key": OWN_NODE_TAINT, "operator": "Exists", "effect": "NoSchedule"}]}


def node_body(name: str, labels: dict[str, str], gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "512Gi", "pods": "256", "nvidia.com/gpu": str(gpus)}
    stamp = rfc3339(datetime.now(UTC))
    return {
        "metadata": {"name": name, "annotations": {"node.alpha.kubernetes.io/ttl": "0", **(annotations or {})},
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok", **labels}},
        "spec": {"taints": [{"key": OWN_NODE_TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastHeartbeatTime": stamp,
                            "lastTransitionTime": stamp}],
        },
    }


def is_ready(core: client.CoreV1Api, name: str) -> bool:
    conditions = core.read_node(name).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


class HandPlayedNode:
    """A node whose kubelet is a thread of the test: it renews the node's Lease, reports every pod
    bound to the node Running and Ready, and finishes their deletion, until `die` stops it."""

    def __init__(self, api: client.ApiClient, name: str) -> None:
        self.name = name
        self._core = client.CoreV1Api(api)
        self._leases = client.CoordinationV1Api(api)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kubelet-{name}", daemon=True)

    def start(self, labels: dict[str, str], gpus: int) -> None:
        self._core.create_node(node_body(self.name, labels, gpus))
        self._renew()
        self._thread.start()
        wait_until(lambda: is_ready(self._core, self.name), 30, f"node {self.name} Ready")

    def die(self) -> datetime:
        """The kubelet stops, and the node says so as the node lifecycle controller would after
        --node-monitor-grace-period (50 s) without a heartbeat: Ready Unknown. Returns the condition's
        lastTransitionTime (whole seconds, as the API keeps it)."""
        self.stop()
        now = datetime.now(UTC).replace(microsecond=0)
        condition = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                     "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": rfc3339(now),
                     "lastTransitionTime": rfc3339(now)}
        self._core.patch_node_status(self.name, {"status": {"conditions": [condition]}})
        return now

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        renewed = time.monotonic()
        while not self._stop.wait(HEARTBEAT):
            try:
                if time.monotonic() - renewed > LEASE_SECONDS / 4:
                    self._renew()
                    renewed = time.monotonic()
                self._play_pods()
            except ApiException:  # a pod gone between the list and the patch: the next round sees
                continue

    def _renew(self) -> None:
        lease = {"metadata": {"name": self.name, "namespace": LEASE_NAMESPACE},
                 "spec": {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS,
                          "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}
        try:
            self._leases.replace_namespaced_lease(self.name, LEASE_NAMESPACE, lease)
        except ApiException as error:
            if error.status != 404:
                raise
            self._leases.create_namespaced_lease(LEASE_NAMESPACE, lease)

    def _play_pods(self) -> None:
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.name}").items
        for pod in pods:
            meta = pod.metadata
            if meta.deletion_timestamp is not None:
                self._core.delete_namespaced_pod(meta.name, meta.namespace, grace_period_seconds=0,
                                                 body=client.V1DeleteOptions(preconditions={"uid": meta.uid}))
            elif pod.status.phase == "Pending":
                container = pod.spec.containers[0]
                self._core.patch_namespaced_pod_status(meta.name, meta.namespace,
                                                       {"status": pod_status(container.name, container.image)})


class NodeMaker:
    """Makes nodes named gpu-node-test-<id> and deletes every one of them at the end."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self.core = client.CoreV1Api(api)
        self._made: list[str] = []
        self._played: list[HandPlayedNode] = []

    def _name(self) -> str:
        name = f"gpu-node-test-{uuid.uuid4().hex[:6]}"
        self._made.append(name)
        return name

    def kwok(self, labels: dict[str, str], gpus: int = 8) -> str:
        """A node kwok plays the kubelet of, as the cluster's own."""
        name = self._name()
        self.core.create_node(node_body(name, labels, gpus, KWOK_ANNOTATION))
        wait_until(lambda: is_ready(self.core, name), 30, f"node {name} Ready")
        return name

    def kwok_many(self, labels: dict[str, str], count: int, gpus: int = 8) -> list[str]:
        """`count` nodes as `kwok` makes one, created together and then waited for."""
        names = [self._name() for _ in range(count)]
        for name in names:
            self.core.create_node(node_body(name, labels, gpus, KWOK_ANNOTATION))
        wait_until(lambda: all(is_ready(self.core, name) for name in names), 60, f"{count} nodes Ready")
        return names

    def hand_played(self, labels: dict[str, str], gpus: int = 8) -> HandPlayedNode:
        node = HandPlayedNode(self._api, self._name())
        self._played.append(node)
        node.start(labels, gpus)
        return node

    def delete(self, name: str) -> None:
        self.core.delete_node(name)

    def cleanup(self) -> None:
        for node in self._played:
            node.stop()
            try:
                client.CoordinationV1Api(self._api).delete_namespaced_lease(node.name, LEASE_NAMESPACE)
            except ApiException as error:
                if error.status != 404:
                    raise
        for name in self._made:
            try:
                self.core.delete_node(name)
            except ApiException as error:
                if error.status != 404:
                    raise
        wait_until(lambda: not any(n.metadata.name in self._made for n in self.core.list_node().items), 30,
                   "the test's nodes to be deleted")
