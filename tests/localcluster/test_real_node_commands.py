"""The code people already have, as command jobs in containers on the local cluster's real node: an image
built FROM the trainer image with the real packages added as the user guide says (examples/frameworks/,
transformers, accelerate and Lightning pinned as in requirements/test.txt), running Hugging Face Trainer,
Lightning, torchrun, torch.distributed.launch and plain tqdm scripts that import nothing of ours.

Each job trains one model across its gang: every rank ends with the same parameters (a digest of their
bytes: DDP keeps the replicas identical, its all-reduce giving every rank the same sums) and a world of
the job's size. While they run, the job's status shows their epoch, step, loss and percent, read from what
they print and what their trainers say, and once they succeeded their last step and 100%; their output is
kept in S3. Under restartStrategy InPlace a killed rank process restarts the command in its pod; an elastic
job's torchrun ranks see the smaller gang after a shrink. Folders a job keeps (keepFolders) come back into
new pods, which resume from them: test_real_node_kept.py. Select with `pytest -m node`."""

from __future__ import annotations

import os
import signal

import pytest
from kubernetes import client

from commandjobs import (
    ProgressWatch,
    assert_one_model,
    assert_output_kept,
    command_job,
    finish,
    params,
    trained_with_progress,
)
from ddp_operator import constants as c
from kube import Jobs, wait_until
from procs import command_pids
from realnode import create_job

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(900)]


def test_hugging_face_trainer_scripts_as_commands_and_as_an_entrypoint_train_one_model_and_show_progress(
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str, kubectl) -> None:
    endpoint, ns, train = commands_s3, jobs.namespace, ["--samples", "2048", "--epochs", "2"]
    command_job(jobs, "hf-torchrun", frameworks_image, endpoint, ["torchrun", "hf_trainer.py", *train])
    command_job(jobs, "hf-nobar", frameworks_image, endpoint, ["python", "hf_trainer.py", *train, "--no-bar"])
    # The same function as an entrypoint (the image's working folder holds it): the runtime forms the gang,
    # the Trainer finds it formed. Without its bar, only the Trainer itself says its step of how many.
    create_job(jobs, "hf-entry", image=frameworks_image, entrypoint="hf_trainer:main", args=[*train, "--no-bar"],
               backoffLimit=0,
               env=[{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "DDP_PROGRESS_INTERVAL_SECONDS", "value": "1"}])
    names = ["hf-torchrun", "hf-nobar", "hf-entry"]

    def shown_by_kubectl(watch: ProgressWatch) -> None:
        wait_until(lambda: any(watch.seen[n] for n in names), 300, "progress in a job's status")
        table = kubectl("get", "ddpjobs", "-n", ns).stdout
        assert "PROGRESS%" in table.splitlines()[0], table

    trained_with_progress(jobs, names, shown_by_kubectl)
    table = kubectl("get", "ddpjobs", "-n", ns).stdout.splitlines()
    columns = table[0].split()
    for name in names:  # what `kubectl get ddpjobs` shows of each job that succeeded: its last step, 100%
        row = next(line.split() for line in table[1:] if line.split()[0] == name)
        last = next(p["global_step"] for p in params(jobs, name, 2) if p["rank"] == 0)
        assert (row[columns.index("STEP")], row[columns.index("PROGRESS%")]) == (str(last), "100"), table
    assert_output_kept(endpoint, ns, "hf-torchrun", "'learning_rate'")


def test_lightning_and_tqdm_scripts_as_commands_with_and_without_their_bars(
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str) -> None:
    endpoint, ns = commands_s3, jobs.namespace
    command_job(jobs, "pl-bar", frameworks_image, endpoint, ["python", "lightning_train.py", "--nodes", "2"])
    command_job(jobs, "pl-nobar", frameworks_image, endpoint, ["python", "lightning_train.py", "--nodes", "2",
                                                                "--no-bar"])
    command_job(jobs, "loop", frameworks_image, endpoint, ["python", "tqdm_loop.py"])
    trained_with_progress(jobs, ["pl-bar", "pl-nobar", "loop"], steps={"loop": 4 * 40})  # tqdm_loop's epochs x steps
    assert_output_kept(endpoint, ns, "loop", "Epoch 4/4")


def test_torchrun_and_torch_distributed_launch_scripts_form_the_job_s_world_one_rank_a_pod_and_several(
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str) -> None:
    endpoint = commands_s3
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
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str, kubectl) -> None:
    endpoint, ns = commands_s3, jobs.namespace
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
        jobs: Jobs, kube_api, real_node, frameworks_image: str, commands_s3: str,
        pool_label: tuple[str, str]) -> None:
    core, node = client.CoreV1Api(kube_api), real_node.metadata.name
    command_job(jobs, "shrinks", frameworks_image, commands_s3,
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
