"""The code people already have, as command jobs in containers on the local cluster's real node: an image
built FROM the trainer image with the real packages added as the user guide says (examples/frameworks/,
transformers, accelerate and Lightning pinned as in requirements/test.txt), running Hugging Face Trainer,
Lightning, torchrun, torch.distributed.launch and plain tqdm scripts that import nothing of ours.

Each job trains one model across its gang: every rank ends with the same parameters (a digest of their
bytes: DDP keeps the replicas identical, its all-reduce giving every rank the same sums) and a world of
the job's size. While they run, the job's status shows their epoch, step, loss and percent, read from what
they print and what their trainers say; their output is kept in S3. Under restartStrategy InPlace a
killed rank process restarts the command in its pod; an elastic job's torchrun ranks see the smaller
gang after a shrink. Select with `pytest -m node`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

import demo
from ddp_contract import labels, layout
from ddp_operator import constants as c
from kube import REPO, Jobs, wait_until
from procs import command_pids
from realnode import create_job, node_address, trainer_image

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(900)]

BUCKET = "ddp-commands"
FRAMEWORKS = REPO / "examples" / "frameworks"
PARAMS = re.compile(r'\{"event": "params"[^}]*\}')


@pytest.fixture(scope="module")
def frameworks_image(images_on_the_node: None) -> str:
    """The image a user builds FROM the trainer image (examples/frameworks/Dockerfile), in the node."""
    result = subprocess.run(["bash", str(REPO / "images" / "build.sh"), "derived", "frameworks", str(FRAMEWORKS)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return trainer_image().replace("/trainer:", "/frameworks:")


@pytest.fixture(scope="module")
def s3_on_the_bridge(real_node: client.V1Node) -> Iterator[str]:
    with demo.s3_server(0, buckets=(BUCKET,), host=node_address(real_node)) as endpoint:
        yield endpoint


def command_job(jobs: Jobs, name: str, image: str, endpoint: str, command: list[str], **spec: Any) -> None:
    """A command job of the frameworks image, 2 CPU ranks, its results (and so its logs) in S3."""
    if not any(s.metadata.name == "s3-credentials" for s in jobs.core.list_namespaced_secret(jobs.namespace).items):
        jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": "s3-credentials"}, "stringData": {
            "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})
    env = [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "DDP_PROGRESS_INTERVAL_SECONDS", "value": "1"},
           *spec.pop("env", [])]
    create_job(jobs, name, image=image, command=command, env=env, backoffLimit=spec.pop("backoffLimit", 0),
               resources={"limits": {"memory": "3Gi"}},
               s3={"endpoint": endpoint, "region": "us-east-1", "credentialsSecret": "s3-credentials",
                   "results": f"s3://{BUCKET}/results"}, **spec)


class ProgressWatch:
    """Every status.progress each of the jobs showed while it ran (polled until they all ended)."""

    def __init__(self, jobs: Jobs, names: list[str]) -> None:
        self.jobs, self.names = jobs, names
        self.seen: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> ProgressWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            for name in self.names:
                status = self.jobs.status(name)
                progress = status.get("progress")
                if status.get("phase") == c.PHASE_RUNNING and progress and progress not in self.seen[name][-1:]:
                    self.seen[name].append(progress)


def params(jobs: Jobs, name: str, pods: int) -> list[dict[str, Any]]:
    found = []
    for index in range(pods):
        log = jobs.core.read_namespaced_pod_log(f"{name}-{index}", jobs.namespace, container=labels.CONTAINER_NAME)
        found += [json.loads(p) for p in PARAMS.findall(log)]
    return found


def assert_one_model(found: list[dict[str, Any]], world: int) -> None:
    assert sorted(p["rank"] for p in found) == list(range(world)), found
    assert {p["world_size"] for p in found} == {world} and len({p["digest"] for p in found}) == 1, found


def assert_showed_progress(seen: list[dict[str, Any]], name: str) -> None:
    """Some record, shown while the job trained, had a loss and a percent between 0 and 100."""
    midway = [p for p in seen if p.get("loss") is not None and p.get("percent") is not None and 0 < p["percent"] < 100]
    assert midway, (name, seen)
    assert all(p.get("epoch") is not None or p.get("step") is not None for p in midway), (name, seen)


def assert_output_kept(endpoint: str, namespace: str, name: str, text: str, attempt: int = 0) -> None:
    key = f"results/{namespace}/{name}/{layout.log_part(attempt, 0, 0)}"
    s3 = demo.s3_client(endpoint)
    kept = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"results/{namespace}/{name}/").get("Contents", [])]
    assert key in kept, (key, kept)
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode(errors="replace")
    assert text in body, body[-2000:]


def finish(jobs: Jobs, names: list[str], timeout: float = 600) -> None:
    for name in names:
        status = jobs.wait_phase(name, c.PHASE_SUCCEEDED, timeout=timeout)
        assert status["restarts"] == 0, status


def trained_with_progress(jobs: Jobs, names: list[str], meanwhile: Callable[[ProgressWatch], None] | None = None) -> None:
    """Each job succeeds, having trained one model across its 2 ranks and shown how far it was."""
    with ProgressWatch(jobs, names) as watch:
        if meanwhile is not None:
            meanwhile(watch)
        finish(jobs, names)
    for name in names:
        assert_one_model(params(jobs, name, 2), 2)
        assert_showed_progress(watch.seen[name], name)


def test_hugging_face_trainer_scripts_as_commands_and_as_an_entrypoint_train_one_model_and_show_progress(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str, kubectl) -> None:
    endpoint, ns, train = s3_on_the_bridge, jobs.namespace, ["--samples", "2048", "--epochs", "2"]
    command_job(jobs, "hf-torchrun", frameworks_image, endpoint, ["torchrun", "hf_trainer.py", *train])
    command_job(jobs, "hf-nobar", frameworks_image, endpoint, ["python", "hf_trainer.py", *train, "--no-bar"])
    # The same function as an entrypoint (the image's working folder holds it): the runtime forms the gang,
    # the Trainer finds it formed.
    create_job(jobs, "hf-entry", image=frameworks_image, entrypoint="hf_trainer:main", args=train, backoffLimit=0,
               env=[{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "DDP_PROGRESS_INTERVAL_SECONDS", "value": "1"}])
    names = ["hf-torchrun", "hf-nobar", "hf-entry"]

    def shown_by_kubectl(watch: ProgressWatch) -> None:
        wait_until(lambda: any(watch.seen[n] for n in names), 300, "progress in a job's status")
        table = kubectl("get", "ddpjobs", "-n", ns).stdout
        assert "PROGRESS%" in table.splitlines()[0], table

    trained_with_progress(jobs, names, shown_by_kubectl)
    assert_output_kept(endpoint, ns, "hf-torchrun", "'learning_rate'")


def test_lightning_and_tqdm_scripts_as_commands_with_and_without_their_bars(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    command_job(jobs, "pl-bar", frameworks_image, endpoint, ["python", "lightning_train.py", "--nodes", "2"])
    command_job(jobs, "pl-nobar", frameworks_image, endpoint, ["python", "lightning_train.py", "--nodes", "2",
                                                                "--no-bar"])
    command_job(jobs, "loop", frameworks_image, endpoint, ["python", "tqdm_loop.py"])
    trained_with_progress(jobs, ["pl-bar", "pl-nobar", "loop"])
    assert_output_kept(endpoint, ns, "loop", "Epoch 4/4")


def test_torchrun_and_torch_distributed_launch_scripts_form_the_job_s_world_one_rank_a_pod_and_several(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    endpoint = s3_on_the_bridge
    command_job(jobs, "tr-one", frameworks_image, endpoint, ["torchrun", "torchrun_train.py", "3", "1"])
    command_job(jobs, "tr-two", frameworks_image, endpoint, ["torchrun", "torchrun_train.py", "3", "1"],
                worldSize=4, ranksPerPod=2)
    command_job(jobs, "launch", frameworks_image, endpoint,
                ["python", "-m", "torch.distributed.launch", "launch_train.py"], worldSize=4, ranksPerPod=2)
    finish(jobs, ["tr-one", "tr-two", "launch"])
    assert_one_model(params(jobs, "tr-one", 2), 2)
    assert_one_model(params(jobs, "tr-two", 2), 4)
    assert_one_model(params(jobs, "launch", 2), 4)


def test_in_place_a_command_whose_rank_process_is_killed_starts_again_in_its_pod(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str, kubectl) -> None:
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    command_job(jobs, "hf-inplace", frameworks_image, endpoint,
                ["python", "hf_trainer.py", "--samples", "2048", "--epochs", "2"], restartStrategy="InPlace",
                backoffLimit=1)
    wait_until(lambda: (jobs.status("hf-inplace").get("progress") or {}).get("step"), 300, "hf-inplace training")
    first = {p.metadata.name: p.metadata.uid for p in jobs.pods("hf-inplace")}
    pids = wait_until(lambda: command_pids(ns, "hf-inplace", 1), 30, "rank 1's command process")
    os.kill(pids[0], signal.SIGKILL)  # type: ignore[index]
    done = jobs.wait_phase("hf-inplace", c.PHASE_SUCCEEDED, timeout=600)
    assert (done["restarts"], done["failedRank"]["exitCode"], done["failedRank"]["attempt"]) == (1, 137, 0), done
    assert {p.metadata.name: p.metadata.uid for p in jobs.pods("hf-inplace")} == first  # no pod was replaced
    said = kubectl("logs", "hf-inplace-1", "-n", ns).stdout + kubectl("logs", "hf-inplace-1", "-n", ns).stderr
    assert "attempt 1: starting the rank process in place" in said, said[-3000:]
    assert_one_model(params(jobs, "hf-inplace", 2), 2)
    assert_output_kept(endpoint, ns, "hf-inplace", "'loss'", attempt=1)


def test_elastic_torchrun_ranks_see_the_smaller_gang_after_a_shrink(
        jobs: Jobs, kube_api, real_node, frameworks_image: str, s3_on_the_bridge: str,
        pool_label: tuple[str, str]) -> None:
    core, node = client.CoreV1Api(kube_api), real_node.metadata.name
    command_job(jobs, "shrinks", frameworks_image, s3_on_the_bridge,
                ["torchrun", "torchrun_train.py", "4", "1", "--step-seconds", "0.02"], worldSize=4, minWorldSize=2,
                restartStrategy="InPlace", template={"spec": {"nodeSelector": dict([pool_label])}})
    wait_until(lambda: (jobs.status("shrinks").get("progress") or {}).get("step"), 300, "the gang of 4 training")
    core.patch_node(node, {"metadata": {"labels": {pool_label[0]: None}}})  # no room for new pods
    for pod in ("shrinks-2", "shrinks-3"):
        core.delete_namespaced_pod(pod, jobs.namespace)
    shrunk = jobs.wait_condition("shrinks", c.COND_SHRUNK, "True", timeout=120)
    assert shrunk["members"] == [0, 1] and shrunk["worldSize"] == 2, shrunk
    jobs.wait_phase("shrinks", c.PHASE_SUCCEEDED, timeout=600)
    found = params(jobs, "shrinks", 2)
    assert_one_model(found, 2)  # the last attempt's torchrun ranks: PET_NNODES 2, the gang's rank 0 as master
