"""DDP training in trainer-image containers on the local cluster's real node: two jobs on the same
masterPort at once, one of them interrupted three ways (its rank's process killed inside the
container, a rank's pod deleted, a rank OOM-killed by its memory limit) and fed by a data worker pod,
which resumes from its last checkpoint each time and ends with exactly the parameters of the
uninterrupted one, whose ranks make their batches themselves; and the same with restartStrategy
InPlace, where only a deleted pod is replaced; and an elastic job that goes on with two of its four
ranks and grows back. Select with `pytest -m node`."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator

import pytest
import torch
from kubernetes import client

import demo
from ddp_contract import labels, layout
from ddp_operator import constants as c
from kube import Jobs, wait_until
from procs import rank_pid
from realnode import WORKLOADS, WORKLOADS_TEMPLATE, create_job, node_address, trainer_image, workloads_and_credentials

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(900)]

sys.path.insert(0, str(WORKLOADS.parent))
import ddp_workloads  # noqa: E402 - what the ranks run, and the single-process run the DDP gangs must match

BUCKET = "ddp-node"
EPOCHS, BATCH, EVERY = 6, 4, 5
ELASTIC_EPOCHS = 12  # 96 samples: 6 steps an epoch at 4 ranks, 12 at 2


@pytest.fixture(scope="module")
def s3_on_the_bridge(real_node: client.V1Node) -> Iterator[str]:
    """The S3 server on the node's bridge address, where the ranks' containers reach it."""
    with demo.s3_server(0, buckets=(BUCKET,), host=node_address(real_node)) as endpoint:
        yield endpoint


def keys(endpoint: str, prefix: str) -> list[str]:
    return [item["Key"] for item in demo.s3_client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])]


def checkpoint_steps(endpoint: str, namespace: str, job: str) -> list[int]:
    """Steps of the job's committed checkpoints (a MANIFEST.json is written last)."""
    prefix = f"results/{namespace}/{job}/{layout.CHECKPOINTS}/"
    return sorted(int(k.removeprefix(prefix).split("/")[0].removeprefix("step-"))
                  for k in keys(endpoint, prefix) if k.endswith("/MANIFEST.json"))


def final_params(endpoint: str, namespace: str, job: str) -> dict[str, torch.Tensor]:
    body = demo.s3_client(endpoint).get_object(Bucket=BUCKET, Key=f"results/{namespace}/{job}/results/params.pt")["Body"].read()
    return torch.load(io.BytesIO(body))


def assert_equal_params(interrupted: dict[str, torch.Tensor], uninterrupted: dict[str, torch.Tensor]) -> None:
    """Bit for bit: both jobs summed in the same order on this node (one thread a rank), so a resumption
    that continued exactly where its checkpoint left off changes nothing."""
    assert interrupted.keys() == uninterrupted.keys()
    for name in uninterrupted:
        assert torch.equal(interrupted[name], uninterrupted[name]), name


def training_job(jobs: Jobs, name: str, endpoint: str, spec: dict | None = None, **env: str) -> None:
    """ddp_workloads.train (from a ConfigMap, on the image's PYTHONPATH) on masterPort 29500, paced so
    faults can land between checkpoints; `spec`: more of the DDPJob's spec."""
    # One thread a rank (as torchrun sets it): the two gangs' parameters are compared to the bit, so they
    # must sum in the same order whatever torch's default thread count on this node would be.
    settings = {"WL_BATCH": str(BATCH), "WL_EPOCHS": str(EPOCHS), "WL_CKPT_EVERY": str(EVERY),
                "WL_STEP_SECONDS": "0.25", "OMP_NUM_THREADS": "1", **env}
    create_job(jobs, name, image=trainer_image(), entrypoint="ddp_workloads:train", masterPort=29500,
               env=[{"name": k, "value": v} for k, v in settings.items()],
               resources={"limits": {"memory": "1536Mi"}}, backoffLimit=2,
               s3={"endpoint": endpoint, "region": "us-east-1", "credentialsSecret": "s3-credentials",
                   "results": f"s3://{BUCKET}/results"},
               **{"template": WORKLOADS_TEMPLATE, **(spec or {})})


def running_attempt(jobs: Jobs, name: str, attempt: int) -> bool:
    status = jobs.status(name)
    return status.get("phase") == c.PHASE_RUNNING and status.get("attempt") == attempt


def test_a_job_killed_three_ways_resumes_to_the_parameters_of_an_uninterrupted_one_on_the_same_master_port(
        jobs: Jobs, kube_api, real_node, images_on_the_node: None, s3_on_the_bridge: str, kubectl) -> None:
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    workloads_and_credentials(jobs)
    training_job(jobs, "steady", endpoint)
    # Rank 1 fills 2 GiB in its 1.5 GiB container three steps into attempt 2. Its batches come from a
    # data worker pod (two logical workers, prefetching), which stays through the gang restarts.
    training_job(jobs, "bumpy", endpoint, spec={"dataWorkers": {"replicas": 1, "resources": {
        "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}}},
        WL_OOM_ON_ATTEMPT="2", WL_OOM_AFTER_STEPS="3", WL_DATA_WORKERS="1")

    # Both gangs up at once on one node, each with its rank 0 on port 29500 of its own pod address.
    wait_until(lambda: running_attempt(jobs, "steady", 0) and running_attempt(jobs, "bumpy", 0), 300,
               "both jobs Running at the same time")
    data_worker = jobs.core.read_namespaced_pod("bumpy-data-0", ns).metadata.uid

    # Attempt 0: once a checkpoint is committed, rank 1's process is killed inside its container.
    wait_until(lambda: checkpoint_steps(endpoint, ns, "bumpy"), 120, "bumpy's first checkpoint")
    pid = wait_until(lambda: rank_pid(ns, "bumpy", 1), 30, "rank 1's process in its container")
    os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    killed_after = max(checkpoint_steps(endpoint, ns, "bumpy"))
    wait_until(lambda: running_attempt(jobs, "bumpy", 1), 180, "bumpy Running again (attempt 1)")
    assert jobs.status("bumpy")["failedRank"]["exitCode"] == 137

    # Attempt 1: after a checkpoint of its own, rank 0's pod is deleted. The later attempts' pods are told
    # to resume from the checkpoint the status names (DDP_RESUME_FROM), so it is awaited there: one committed
    # in S3 whose pod is deleted before rank 0 says so would be passed over.
    wait_until(lambda: (jobs.status("bumpy").get("lastCheckpoint") or {}).get("step", 0) > killed_after, 120,
               "a checkpoint of attempt 1 on the status")
    jobs.core.delete_namespaced_pod("bumpy-0", ns)
    wait_until(lambda: running_attempt(jobs, "bumpy", 2), 180, "bumpy Running again (attempt 2)")

    # The data worker served every attempt so far from the one pod, without a restart of its own.
    pod = jobs.core.read_namespaced_pod("bumpy-data-0", ns)
    assert pod.metadata.uid == data_worker and pod.status.container_statuses[0].restart_count == 0
    served = kubectl("logs", "bumpy-data-0", "-n", ns).stdout.count("serving logical worker")
    assert served >= 2 * 2 * 2, served  # attempts 0 and 1 at least, each: 2 ranks x 2 logical workers

    # Attempt 2 ends with the OOM kill; attempt 3 finishes.
    bumpy = jobs.wait_phase("bumpy", c.PHASE_SUCCEEDED, timeout=300)
    steady = jobs.wait_phase("steady", c.PHASE_SUCCEEDED, timeout=120)
    assert steady["restarts"] == 0
    assert (bumpy["restarts"], bumpy["programRestarts"], bumpy["infrastructureRestarts"]) == (3, 1, 2), bumpy
    oom = bumpy["failedRank"]
    assert (oom["rank"], oom["attempt"], oom["oomKilled"], oom["kind"]) == (1, 2, True, c.KIND_PROGRAM), oom
    said = kubectl("logs", "bumpy-0", "-n", ns).stdout
    resumed = re.search(r"rank 0 resumed from step (\d+)", said)
    assert resumed and int(resumed.group(1)) > killed_after and int(resumed.group(1)) % EVERY == 0, said[-3000:]
    # Its batches came from the data worker all along: none was moved or made in the rank.
    assert not re.search(r"going on elsewhere|goes on in this process|workers run in this pod", said), said[-3000:]

    # Every resumption continued exactly where the checkpoint left off.
    uninterrupted = final_params(endpoint, ns, "steady")
    assert_equal_params(final_params(endpoint, ns, "bumpy"), uninterrupted)
    ddp_workloads.assert_matches_reference(uninterrupted, 2, BATCH, EPOCHS)


def pod_uids(jobs: Jobs, name: str) -> dict[str, str]:
    return {p.metadata.name: p.metadata.uid for p in jobs.pods(name)}


def test_in_place_a_job_killed_three_ways_keeps_its_pods_and_resumes_to_the_uninterrupted_parameters(
        jobs: Jobs, kube_api, real_node, images_on_the_node: None, s3_on_the_bridge: str, kubectl) -> None:
    """restartStrategy InPlace in containers, with memory snapshots every step: rank 1's process SIGKILLed,
    then OOM-killed, then its pod deleted. The two process failures reschedule nothing; the deletion
    replaces that one pod, which gets the state from rank 0's pod over the pod network."""
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    workloads_and_credentials(jobs)
    training_job(jobs, "steady", endpoint)
    training_job(jobs, "mended", endpoint, spec={"restartStrategy": "InPlace"},
                 WL_OOM_ON_ATTEMPT="1", WL_OOM_AFTER_STEPS="3", WL_MEMORY_EVERY="1")
    wait_until(lambda: running_attempt(jobs, "mended", 0), 300, "mended Running")
    first = pod_uids(jobs, "mended")
    assert len(first) == 2

    # Attempt 0: after a checkpoint, rank 1's rank process is killed inside its container.
    wait_until(lambda: checkpoint_steps(endpoint, ns, "mended"), 120, "mended's first checkpoint")
    pid = wait_until(lambda: rank_pid(ns, "mended", 1, supervised=True), 30, "rank 1's process in its container")
    os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    # Attempt 1: rank 1's process fills 2 GiB of its 1.5 GiB container three steps in; the kernel kills it.
    wait_until(lambda: running_attempt(jobs, "mended", 2), 240, "mended Running again after the OOM kill (attempt 2)")
    oom = jobs.status("mended")["failedRank"]
    assert (oom["rank"], oom["attempt"], oom["oomKilled"], oom["kind"]) == (1, 1, True, c.KIND_PROGRAM), oom
    kept = pod_uids(jobs, "mended")
    assert kept["mended-0"] == first["mended-0"]
    if not os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # cgroup v1: the kernel killed that process only
        assert kept == first, (first, kept)

    # Attempt 2: after a checkpoint of its own, rank 1's pod is deleted: that pod alone is replaced.
    before = max(checkpoint_steps(endpoint, ns, "mended"))
    wait_until(lambda: max(checkpoint_steps(endpoint, ns, "mended")) > before, 120, "a checkpoint of attempt 2")
    jobs.core.delete_namespaced_pod("mended-1", ns)

    mended = jobs.wait_phase("mended", c.PHASE_SUCCEEDED, timeout=300)
    jobs.wait_phase("steady", c.PHASE_SUCCEEDED, timeout=120)
    assert (mended["restarts"], mended["programRestarts"], mended["infrastructureRestarts"]) == (3, 1, 2), mended
    last = {p.metadata.name: (p.metadata.uid, p.metadata.labels[labels.LABEL_ATTEMPT]) for p in jobs.pods("mended")}
    assert last["mended-0"] == (first["mended-0"], "0"), last  # rank 0's pod through all four attempts
    assert last["mended-1"][0] not in (first["mended-1"], kept["mended-1"]) and last["mended-1"][1] == "3", last
    said = kubectl("logs", "mended-0", "-n", ns).stdout
    marks = [said.find(f"attempt {a}: starting the rank process in place") for a in range(4)]
    assert -1 not in marks and marks == sorted(marks), said[-3000:]
    assert len(re.findall(r"rank 0 resumed from step [1-9]\d*", said)) == 3, said[-3000:]
    recovery = mended["recovery"]  # attempt 3's: the replaced pod's rank got the state from rank 0's pod
    assert (recovery["attempt"], recovery["source"], recovery["pods"]) == (3, "Memory", ["mended-0"]), recovery
    assert recovery["stepsLost"] <= 1 and recovery["step"] > before, recovery
    assert f"rank 1 resumed from step {recovery['step']}" in kubectl("logs", "mended-1", "-n", ns).stdout

    assert_equal_params(final_params(endpoint, ns, "mended"), final_params(endpoint, ns, "steady"))


def test_elastic_a_job_that_loses_two_ranks_goes_on_with_two_and_grows_back_seeing_each_sample_once(
        jobs: Jobs, kube_api, real_node, images_on_the_node: None, s3_on_the_bridge: str,
        pool_label: tuple[str, str]) -> None:
    """minWorldSize 2 of 4 in containers: ranks 2 and 3's pods are deleted while no capacity is left for
    them; the gang goes on with ranks 0 and 1 in their own pods, and takes 2 and 3 back at a checkpoint
    once they run again. The ranks record the samples they train on in a host folder."""
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    core, node = client.CoreV1Api(kube_api), real_node.metadata.name
    workloads_and_credentials(jobs)
    indices = tempfile.mkdtemp(prefix="ddp-elastic-indices-")
    os.chmod(indices, 0o777)  # the ranks run as a user of their own
    try:
        volume = {"name": "indices", "hostPath": {"path": indices, "type": "Directory"}}
        training_job(jobs, "elastic", endpoint, spec={
            "worldSize": 4, "minWorldSize": 2, "restartStrategy": "InPlace",
            "template": {"spec": {"nodeSelector": dict([pool_label]),
                                  "volumes": [{"name": "workloads", "configMap": {"name": "workloads"}}, volume],
                                  "containers": [{"name": labels.CONTAINER_NAME, "volumeMounts": [
                                      {"name": "workloads", "mountPath": "/opt/ddp/examples/ddp_workloads.py",
                                       "subPath": WORKLOADS.name},
                                      {"name": "indices", "mountPath": "/indices"}]}]}}},
            WL_EPOCHS=str(ELASTIC_EPOCHS), WL_INDICES="/indices")
        wait_until(lambda: running_attempt(jobs, "elastic", 0), 300, "elastic Running")
        first = pod_uids(jobs, "elastic")
        wait_until(lambda: checkpoint_steps(endpoint, ns, "elastic"), 120, "a checkpoint at full size")

        core.patch_node(node, {"metadata": {"labels": {pool_label[0]: None}}})  # no room for new pods
        for pod in ("elastic-2", "elastic-3"):
            core.delete_namespaced_pod(pod, ns)
        shrunk = jobs.wait_condition("elastic", c.COND_SHRUNK, "True", timeout=120)
        assert shrunk["members"] == [0, 1] and shrunk["worldSize"] == 2, shrunk
        wait_until(lambda: running_attempt(jobs, "elastic", shrunk["attempt"]), 120, "the gang of 2 Running")
        at_shrink = max(checkpoint_steps(endpoint, ns, "elastic"))
        wait_until(lambda: max(checkpoint_steps(endpoint, ns, "elastic")) > at_shrink, 120, "a checkpoint at 2")

        core.patch_node(node, {"metadata": {"labels": dict([pool_label])}})  # capacity is back
        grown = jobs.wait_condition("elastic", c.COND_SHRUNK, "False", timeout=180)
        assert grown["members"] == [0, 1, 2, 3] and grown["worldSize"] == 4, grown
        done = jobs.wait_phase("elastic", c.PHASE_SUCCEEDED, timeout=300)
        assert done["restarts"] == shrunk["restarts"] == done["infrastructureRestarts"] >= 1, done
        last = pod_uids(jobs, "elastic")
        assert {k: last[k] for k in ("elastic-0", "elastic-1")} == {k: first[k] for k in ("elastic-0", "elastic-1")}
        steps = ddp_workloads.kept_steps(indices)
        assert {r["world"] for r in steps} == {2, 4}
        assert ddp_workloads.not_seen_once(steps, ELASTIC_EPOCHS) == {}
    finally:
        shutil.rmtree(indices, ignore_errors=True)
