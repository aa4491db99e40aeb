"""Kueue on the local control plane (localcluster/kueue.sh): its webhooks answer the API server over
TLS on 127.0.0.1, it listens nowhere else, and a stopped Kueue leaves no webhook and no process."""

from __future__ import annotations

import json
import uuid

import pytest
from kubernetes import client

import lanes
from ddp_operator.kueue.rules import KUEUE_GROUP, KUEUE_VERSION
from kube import Cluster, wait_until
from kueue import KUEUE_SCRIPT, kueue_script
from procs import alive, is_loopback, listening_addresses

pytestmark = pytest.mark.alone("takes Kueue down and up, its webhooks with it")

WEBHOOK_CONFIG = "ddp-local-kueue"
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"


def kueue_pid(cluster: Cluster) -> int:
    state = cluster.kubeconfig.rsplit("/", 1)[0]
    with open(f"{state}/kueue/kueue.pid") as pid:
        return int(pid.read())


def test_kueues_webhooks_are_called_by_the_api_server(kube_api, kueue: None) -> None:
    custom = client.CustomObjectsApi(kube_api)
    name = f"webhook-{uuid.uuid4().hex[:6]}"
    # Kueue's mutating webhook puts its finalizer on every new ClusterQueue: the API server reached it.
    created = custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"resourceGroups": []}})
    try:
        assert RESOURCE_IN_USE in created["metadata"]["finalizers"]
        # Its validating webhook refuses what the schema lets through: a negative quota.
        bad = {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "ClusterQueue",
               "metadata": {"name": f"{name}-bad"},
               "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                   {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "-1"}]}]}]}}
        with pytest.raises(client.ApiException) as refused:
            custom.create_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", bad)
        message = json.loads(refused.value.body)["message"]
        assert message.startswith('admission webhook "vclusterqueue.kb.io" denied') and "nominalQuota" in message
        # v1beta1, deprecated but still served, is converted from the stored v1beta2 by its conversion webhook.
        converted = custom.get_cluster_custom_object(KUEUE_GROUP, "v1beta1", "clusterqueues", name)
        assert converted["apiVersion"] == f"{KUEUE_GROUP}/v1beta1"
    finally:
        custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", name)
    wait_until(lambda: not custom.list_cluster_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", field_selector=f"metadata.name={name}")["items"],
        30, "Kueue to remove its finalizer")


def test_kueue_listens_on_loopback_only(cluster: Cluster, kueue: None) -> None:
    addresses = listening_addresses([kueue_pid(cluster)])
    assert addresses, "Kueue listens nowhere"
    assert [a for a in addresses if not is_loopback(a)] == []


def test_kueue_down_removes_its_webhooks_and_process_and_up_is_idempotent(cluster: Cluster, kube_api,
                                                                        kueue: None) -> None:
    admission = client.AdmissionregistrationV1Api(kube_api)
    pid = kueue_pid(cluster)
    assert "already up" in kueue_script("up").stderr
    assert kueue_pid(cluster) == pid
    try:
        kueue_script("down")
        assert not alive(pid)
        assert WEBHOOK_CONFIG not in {w.metadata.name for w in admission.list_validating_webhook_configuration().items}
        assert WEBHOOK_CONFIG not in {w.metadata.name for w in admission.list_mutating_webhook_configuration().items}
        crd = client.ApiextensionsV1Api(kube_api).read_custom_resource_definition(f"workloads.{KUEUE_GROUP}")
        assert crd.spec.conversion.strategy == "None"
        assert kueue_script("status", check=False).returncode != 0
    finally:
        kueue_script("up", env={"DDP_KUEUE_OWNER_PID": lanes.owner_pid()})
    assert alive(kueue_pid(cluster)) and KUEUE_SCRIPT.exists()
