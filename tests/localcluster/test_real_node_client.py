"""The Python client and `kubectl ddp` with ranks in trainer-image containers on the real node: a
function in a local script, with a module of the user's beside it, shipped in a ConfigMap the kubelet
mounts; the job deleted the moment it finishes (ttlSecondsAfterFinished: 0), and still its outcome,
followed logs, results and metrics come back. Select with `pytest -m node`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

import ddp_client
import demo
from kube import REPO, Cluster, Jobs, wait_until
from realnode import node_address, trainer_image

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(600)]

BUCKET = "ddp-client"
CODE = Path(__file__).resolve().parent / "clientcode"
STEPS = 12


@pytest.fixture(scope="module")
def s3_endpoint_on_the_bridge(real_node: client.V1Node) -> Iterator[str]:
    with demo.s3_server(0, buckets=(BUCKET,), host=node_address(real_node)) as endpoint:
        yield endpoint


def kubectl_ddp(cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DDP_"))}
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / p) for p in ("client", "contract"))
    return subprocess.Popen([sys.executable, "-m", "ddp_client", *args, "--kubeconfig", cluster.kubeconfig],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def columns(table: str) -> dict[str, str]:
    """kubectl's one-row table by its header's columns (an empty cell is blank, so splitting on spaces
    would shift the cells after it)."""
    header, row = table.splitlines()[:2]
    starts = [i for i, ch in enumerate(header) if ch != " " and (i == 0 or header[i - 1] == " ")]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def submit_script(jobs: Jobs, kube_api: Any, endpoint: str, script: str, env: dict[str, str],
                  spec: dict[str, Any] | None = None) -> ddp_client.Job:
    """`submit("<script>:train", files=[helpers.py])` of clientcode/, as a notebook user does: two CPU ranks
    in trainer-image containers, results under s3://BUCKET/runs with the job's own S3 credentials."""
    jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": "s3-credentials"}, "stringData": {
        "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})
    return ddp_client.submit(
        f"{CODE}/{script}:train", files=[CODE / "helpers.py"], image=trainer_image(), world_size=2, gpus=0,
        s3=ddp_client.S3(endpoint=endpoint, region="us-east-1", credentials_secret="s3-credentials",
                         results=f"s3://{BUCKET}/runs"),
        env=env, spec=spec or {}, namespace=jobs.namespace, api_client=kube_api)


def test_a_script_s_function_and_its_module_run_in_containers_and_a_job_deleted_as_it_ends_still_reports(
        jobs: Jobs, kube_api, cluster: Cluster, real_node, images_on_the_node: None,
        s3_endpoint_on_the_bridge: str, tmp_path: Path) -> None:
    endpoint, ns = s3_endpoint_on_the_bridge, jobs.namespace
    job = submit_script(jobs, kube_api, endpoint, "train.py", {"DDP_PROGRESS_INTERVAL_SECONDS": "0.5"},
                        {"ttlSecondsAfterFinished": 0, "backoffLimit": 0})
    assert job.name == "train"
    follower = kubectl_ddp(cluster, "logs", job.name, "-n", ns, "-f")  # S3 settings: the job's own

    shown = (tmp_path / "wait.txt").open("w")
    status = job.wait(timeout=300, out=shown)  # the job is deleted as soon as it finishes
    shown.close()
    lines = (tmp_path / "wait.txt").read_text().splitlines()
    assert status["phase"] == "Succeeded", lines
    assert lines[-1].startswith(f"train: Succeeded at epoch 0, step {STEPS}, loss "), lines
    wait_until(lambda: jobs.get(job.name) is None, 60, "ttlSecondsAfterFinished: 0 to delete the job")

    # Followed to the end although the job went: every step of both ranks, as the ranks printed them.
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    for rank in (0, 1):
        steps = [json.loads(line.removeprefix(f"[rank {rank}] "))["step"] for line in out.splitlines()
                 if line.startswith(f"[rank {rank}] {{\"step\"")]
        assert steps == list(range(1, STEPS + 1)), out

    # The handle still knows where the deleted job kept its output.
    merged = job.logs()
    assert sorted(line for line in merged.splitlines() if '"step"' in line) == \
        sorted(line for line in out.splitlines() if '"step"' in line)
    downloaded = ddp_client.process_results(job, tmp_path / "results", wait=lambda **_: status)
    assert [p.name for p in downloaded] == ["weights.json"]
    assert len(json.loads(downloaded[0].read_text())[0]) == 3
    records = job.metrics()
    assert sorted((r["rank"], r["step"]) for r in records) == [(rank, s) for rank in (0, 1) for s in range(1, STEPS + 1)]
    losses = [r["loss"] for r in sorted(records, key=lambda r: r["step"]) if r["rank"] == 0]
    assert losses[-1] < losses[0] / 2, losses  # it learned


def test_code_that_only_prints_its_metrics_shows_progress_while_it_runs_and_plots_after(
        jobs: Jobs, kube_api, kubectl, real_node, images_on_the_node: None, s3_endpoint_on_the_bridge: str,
        tmp_path: Path) -> None:
    ns = jobs.namespace
    job = submit_script(jobs, kube_api, s3_endpoint_on_the_bridge, "dask_train.py",
                        {"DDP_PROGRESS_INTERVAL_SECONDS": "0.5", "DDP_LOG_UPLOAD_INTERVAL_SECONDS": "2"})

    def row() -> dict[str, str] | None:
        said = columns(kubectl("get", "ddpjobs", job.name, "-n", ns).stdout)
        return said if said["PHASE"] == "Running" and said["STEP"] and said["LOSS"] else None

    # NAME PHASE READY RESTARTS EPOCH STEP LOSS REASON AGE, while the ranks still train.
    running = wait_until(row, 180, "EPOCH, STEP and LOSS in kubectl get ddpjobs while Running")
    assert running["EPOCH"] in ("0", "1") and int(running["STEP"]) < 40 and float(running["LOSS"]) > 0, running  # type: ignore[index]
    status = job.wait(timeout=300)
    assert status["phase"] == "Succeeded" and status["progress"]["step"] == 40, status

    series = job.plot(tmp_path / "dask.png")
    assert [step for step, _ in series["loss"]] == list(range(1, 41))
    assert series["loss"][-1][1] < series["loss"][0][1] / 2  # it learned
    assert (tmp_path / "dask.png").stat().st_size > 1000


def printed_batches(logs: str, rank: int) -> list[Any]:
    prefix = f"[rank {rank}] "
    return [json.loads(line.removeprefix(prefix))["batch"] for line in logs.splitlines()
            if line.startswith(prefix + '{"epoch"')]


def local_batches(rank: int) -> list[Any]:
    """What clientcode/datatrain.py's rank gets from a local DataLoader (worker processes here). Equal to
    the bit to what the containers make on any CPU: torch's CPU generator (mt19937) draws the same
    numbers everywhere, each sample is one elementwise float32 add (no reduction whose order a CPU
    could change), and the image pins the torch this venv has."""
    sys.path.insert(0, str(CODE))
    try:
        import datatrain
    finally:
        sys.path.remove(str(CODE))
    return [batch.tolist() for _ in range(datatrain.EPOCHS) for batch in datatrain.loader(rank, datatrain.Noisy())]


def data_workers(replicas: int, memory: str = "1Gi") -> dict[str, Any]:
    return {"dataWorkers": {"replicas": replicas, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                                                "limits": {"memory": memory}}}, "backoffLimit": 0}


def test_a_scripts_dataset_on_data_workers_makes_a_local_loaders_batches_through_an_oom_kill(
        jobs: Jobs, kube_api, real_node, images_on_the_node: None, s3_endpoint_on_the_bridge: str) -> None:
    """A dataset class of the script itself, on two data worker pods; on data worker 0 each logical
    worker goes over the pod's memory limit at its third batch, and the kernel kills it (under cgroup
    v1, as on this node, the session's process; under v2 the whole container, which its kubelet
    restarts as OOMKilled): no gang restart, and every batch of every rank as a local DataLoader makes
    it, none lost or repeated."""
    job = submit_script(jobs, kube_api, s3_endpoint_on_the_bridge, "datatrain.py", {"OOM_AFTER": "2"}, data_workers(2))
    status = job.wait(timeout=300)
    assert status["phase"] == "Succeeded" and status["restarts"] == 0, status
    logs = job.logs()
    moved = [line for line in logs.splitlines() if "going on elsewhere" in line]
    assert len(moved) >= 2 and all(f"{job.name}-data-0" in line for line in moved), logs[-3000:]
    for rank in (0, 1):
        assert printed_batches(logs, rank) == local_batches(rank), f"rank {rank}"


def test_a_dataset_error_on_a_data_worker_fails_the_rank_naming_the_sample(
        jobs: Jobs, kube_api, real_node, images_on_the_node: None, s3_endpoint_on_the_bridge: str) -> None:
    job = submit_script(jobs, kube_api, s3_endpoint_on_the_bridge, "datatrain.py", {"FAIL_AT": "13"}, data_workers(1))
    status = job.wait(timeout=300, raise_on_failure=False)
    assert status["phase"] == "Failed" and status["failedRank"]["reason"] == "Error", status
    said = status["failedRank"]["message"]
    assert "ValueError" in said and "sample 13 is corrupt" in said and f"data worker {job.name}-data-0" in said, said
