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
new pods, which resume from them: Hugging Face and Lightning checkpoints, a snapshot, a pod an elastic job
takes in. Select with `pytest -m node`."""

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
        log = jobs.log(f"{name}-{index}", labels.CONTAINER_NAME)
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


def assert_ended_complete(status: dict[str, Any], name: str, found: list[dict[str, Any]], steps: int | None) -> None:
    """A job that succeeded shows its run's last step (rank 0's `global_step`, else `steps`), 100% and no time
    left, whatever said how far it was and however fast its last steps came."""
    last = next((p["global_step"] for p in found if p["rank"] == 0 and "global_step" in p), steps)
    progress = status.get("progress") or {}
    assert (progress.get("step"), progress.get("percent"), progress.get("remaining")) == (last, 100.0, "0s"), \
        (name, last, progress)


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


def trained_with_progress(jobs: Jobs, names: list[str], meanwhile: Callable[[ProgressWatch], None] | None = None,
                          steps: dict[str, int] | None = None) -> None:
    """Each job succeeds, having trained one model across its 2 ranks, shown how far it was and, at its end,
    its last step (`steps`: those of a script that does not print its global step) and 100%."""
    with ProgressWatch(jobs, names) as watch:
        if meanwhile is not None:
            meanwhile(watch)
        finish(jobs, names)
    for name in names:
        found = params(jobs, name, 2)
        assert_one_model(found, 2)
        assert_showed_progress(watch.seen[name], name)
        assert_ended_complete(jobs.status(name), name, found, (steps or {}).get(name))


def test_hugging_face_trainer_scripts_as_commands_and_as_an_entrypoint_train_one_model_and_show_progress(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str, kubectl) -> None:
    endpoint, ns, train = s3_on_the_bridge, jobs.namespace, ["--samples", "2048", "--epochs", "2"]
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
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    command_job(jobs, "pl-bar", frameworks_image, endpoint, ["python", "lightning_train.py", "--nodes", "2"])
    command_job(jobs, "pl-nobar", frameworks_image, endpoint, ["python", "lightning_train.py", "--nodes", "2",
                                                                "--no-bar"])
    command_job(jobs, "loop", frameworks_image, endpoint, ["python", "tqdm_loop.py"])
    trained_with_progress(jobs, ["pl-bar", "pl-nobar", "loop"], steps={"loop": 4 * 40})  # tqdm_loop's epochs x steps
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


RESUME = re.compile(r'\{"event": "resume"[^}]*\}')
# Files kept once unchanged for 2 s, looked at every second: the jobs here are short.
KEEP_FAST = [{"name": "DDP_KEEP_SETTLE_SECONDS", "value": "2"}, {"name": "DDP_KEEP_INTERVAL_SECONDS", "value": "1"}]


def kept_out_files(endpoint: str, namespace: str, name: str) -> list[str]:
    """What the job keeps of its /home/ddp/out in S3, by path below it."""
    prefix = f"results/{namespace}/{name}/{layout.KEPT}/home/ddp/out/"
    listed = demo.s3_client(endpoint).list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"][len(prefix):] for o in listed)


def kept_checkpoints(endpoint: str, namespace: str, name: str) -> list[int]:
    """The steps of the job's Trainer checkpoints kept whole in S3 (their trainer_state.json is there)."""
    return sorted(int(n.split("/")[0].split("-")[1]) for n in kept_out_files(endpoint, namespace, name)
                  if n.startswith("checkpoint-") and n.endswith("/trainer_state.json"))


def test_hugging_face_jobs_restarted_resume_from_their_kept_checkpoint_and_end_as_an_uninterrupted_one(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    """Trainer checkpoints into out/ (keepFolders) every 16 steps and resumes from the newest one there, as its
    users write it. One job's rank 1 pod is deleted (the gang is made again: new pods, nothing local), another's
    rank 1 process is killed (InPlace: the pods stay), each after its second checkpoint is kept; both go on from a
    checkpoint of theirs and end with the parameters of a third job that ran through, to the bit: the same
    program on the same CPU (one thread), the same data order (data_seed) and, from the checkpoint, the same
    model, optimizer, scheduler and every rank's RNG state."""
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    # 128 steps of at least 0.25 s: 24 s or more of training after the second checkpoint (step 32), so that
    # both interruptions land while the jobs still train (at 0.1 s a step, the in-place one, interrupted
    # second, had once trained to its end by then, and its pod's log held the ends of more than one attempt).
    train = ["python", "hf_trainer.py", "--output-dir", "/home/ddp/out", "--samples", "1024", "--epochs", "2",
             "--save-steps", "16", "--step-seconds", "0.25", "--no-bar"]
    keep = {"keepFolders": ["/home/ddp/out"], "env": KEEP_FAST}
    command_job(jobs, "hf-through", frameworks_image, endpoint, train)
    command_job(jobs, "hf-recreated", frameworks_image, endpoint, train, **keep)
    command_job(jobs, "hf-in-place", frameworks_image, endpoint, train, restartStrategy="InPlace", backoffLimit=1,
                **keep)
    wait_until(lambda: max(kept_checkpoints(endpoint, ns, "hf-recreated"), default=0) >= 32, 600,
               "hf-recreated's checkpoint-32")
    jobs.core.delete_namespaced_pod("hf-recreated-1", ns)
    wait_until(lambda: max(kept_checkpoints(endpoint, ns, "hf-in-place"), default=0) >= 32, 600,
               "hf-in-place's checkpoint-32")
    pids = wait_until(lambda: command_pids(ns, "hf-in-place", 1), 30, "hf-in-place's rank 1 process")
    os.kill(pids[0], signal.SIGKILL)  # type: ignore[index]
    through = jobs.wait_phase("hf-through", c.PHASE_SUCCEEDED, timeout=600)
    assert through["restarts"] == 0, through
    reference = params(jobs, "hf-through", 2)
    assert_one_model(reference, 2)
    for name in ("hf-recreated", "hf-in-place"):
        done = jobs.wait_phase(name, c.PHASE_SUCCEEDED, timeout=600)
        assert done["restarts"] == 1, done
        logs = [jobs.log(f"{name}-{i}", labels.CONTAINER_NAME) for i in (0, 1)]
        resumed = [json.loads(line) for log in logs for line in RESUME.findall(log)]
        starts = {r["from"] for r in resumed if r["from"] is not None}  # both ranks of the attempt that resumed
        assert len(starts) == 1 and int(starts.pop().split("-")[-1]) >= 32, (name, resumed)
        found = params(jobs, name, 2)
        assert [p["global_step"] for p in found] == [p["global_step"] for p in reference] == [128, 128], found
        # What Trainer and the keeper said of RNG states (rng_state_<rank>.pth) in the pods that resumed.
        rng_said = [line for log in logs for line in log.splitlines() if "RNG" in line or "rng" in line]
        assert {p["digest"] for p in found} == {p["digest"] for p in reference}, (name, resumed, rng_said)
        assert done["kept"]["folders"][0]["path"] == "/home/ddp/out" and done["kept"]["folders"][0]["files"] > 0, done


def test_a_lightning_job_whose_pod_is_deleted_resumes_from_its_kept_last_ckpt_and_ends_as_an_uninterrupted_one(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    """Lightning saves ck/last.ckpt (keepFolders) after each epoch and resumes with fit(ckpt_path=...) when it is
    there. Rank 1's pod is deleted once one is kept; the new pods resume from it and end with the parameters of
    a job that ran through, to the bit: a resume at an epoch's end, the sampler's order a function of the epoch."""
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    train = ["python", "lightning_train.py", "--nodes", "2", "--no-bar", "--epochs", "6", "--checkpoint-dir",
             "/home/ddp/ck", "--step-seconds", "0.1"]
    keep = {"keepFolders": ["/home/ddp/ck"], "env": KEEP_FAST}
    command_job(jobs, "lt-through", frameworks_image, endpoint, train)
    command_job(jobs, "lt-recreated", frameworks_image, endpoint, train, **keep)
    s3 = demo.s3_client(endpoint)
    key = f"results/{ns}/lt-recreated/{layout.KEPT}/home/ddp/ck/last.ckpt"
    wait_until(lambda: s3.list_objects_v2(Bucket=BUCKET, Prefix=key).get("KeyCount"), 600, "lt-recreated's last.ckpt")
    jobs.core.delete_namespaced_pod("lt-recreated-1", ns)
    through = jobs.wait_phase("lt-through", c.PHASE_SUCCEEDED, timeout=600)
    assert through["restarts"] == 0, through
    reference = params(jobs, "lt-through", 2)
    done = jobs.wait_phase("lt-recreated", c.PHASE_SUCCEEDED, timeout=600)
    assert done["restarts"] == 1, done
    logs = [jobs.log(f"lt-recreated-{i}", labels.CONTAINER_NAME) for i in (0, 1)]
    resumed = [json.loads(line) for log in logs for line in RESUME.findall(log)]
    assert [r["from"] for r in resumed] == ["/home/ddp/ck/last.ckpt"] * 2, resumed
    found = params(jobs, "lt-recreated", 2)
    assert [p["global_step"] for p in found] == [p["global_step"] for p in reference], (found, reference)
    assert {p["digest"] for p in found} == {p["digest"] for p in reference}, (found, reference)


def kept_object(endpoint: str, namespace: str, name: str, path: str) -> dict[str, Any] | None:
    """HEAD of a kept file's object (its metadata holds the file's time), None while there is none."""
    key = f"results/{namespace}/{name}/{layout.KEPT}/{path}"
    try:
        return demo.s3_client(endpoint).head_object(Bucket=BUCKET, Key=key)
    except Exception:  # noqa: BLE001 - botocore's 404
        return None


def test_a_snapshot_script_whose_pod_is_deleted_resumes_every_rank_from_rank_0_s_kept_snapshot(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    """pytorch/examples' multinode.py: rank 0 saves snap/snapshot.pt, every rank loads it at start. Rank 1's
    new pod, which never had it, loads rank 0's (kept) as rank 0 does."""
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    command_job(jobs, "snap", frameworks_image, endpoint,
                ["torchrun", "torchrun_train.py", "10", "1", "--step-seconds", "0.1", "--snapshot-path",
                 "/home/ddp/snap/snapshot.pt"], keepFolders=["/home/ddp/snap"], env=KEEP_FAST)
    wait_until(lambda: kept_object(endpoint, ns, "snap", "home/ddp/snap/snapshot.pt"), 600, "snap's kept snapshot")
    jobs.core.delete_namespaced_pod("snap-1", ns)
    done = jobs.wait_phase("snap", c.PHASE_SUCCEEDED, timeout=600)
    assert done["restarts"] == 1, done
    logs = [jobs.log(f"snap-{i}", labels.CONTAINER_NAME) for i in (0, 1)]
    resumed = [json.loads(line) for log in logs for line in RESUME.findall(log)]
    assert sorted(r["rank"] for r in resumed) == [0, 1] and len({r["epochs_run"] for r in resumed}) == 1, resumed
    assert_one_model(params(jobs, "snap", 2), 2)


def test_a_rank_killed_while_writing_a_1_gb_snapshot_resumes_from_the_last_whole_one(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    """Rank 0's process is SIGKILLed while torch.save writes the next 1 GB snapshot over the kept one: the torn
    file is never kept (it never settled while its rank ran), so the gang restarts from the last whole one.
    An epoch (13 s) outlasts a snapshot's upload here, so one is kept before the next is written."""
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    command_job(jobs, "big-snap", frameworks_image, endpoint,
                ["torchrun", "torchrun_train.py", "3", "1", "--step-seconds", "0.4", "--snapshot-path",
                 "/home/ddp/snap/snapshot.pt", "--pad-mb", "1024"], keepFolders=["/home/ddp/snap"], env=KEEP_FAST,
                backoffLimit=1)
    # A snapshot torch.save has opened but not written for the settle time is kept as it is (an empty file
    # under load): the whole one comes at the next pass after it is written.
    first = wait_until(lambda: (found := kept_object(endpoint, ns, "big-snap", "home/ddp/snap/snapshot.pt"))
                       and found["ContentLength"] > 1 << 30 and found, 600, "the 1 GB snapshot kept whole")
    kept_time = int(first["Metadata"]["ddp-mtime-ns"])  # type: ignore[index]

    def mid_write() -> list[int] | None:
        """Rank 0's command processes while its snapshot is being written anew (newer and not yet whole)."""
        pids = command_pids(ns, "big-snap", 0)
        for pid in pids:
            try:
                stat = os.stat(f"/proc/{pid}/root/home/ddp/snap/snapshot.pt")
            except OSError:
                continue
            if stat.st_mtime_ns > kept_time and stat.st_size < first["ContentLength"]:  # type: ignore[index]
                return pids
        return None

    pids = wait_until(mid_write, 300, "rank 0 writing its next snapshot", interval=0.02)
    for pid in pids:  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
    done = jobs.wait_phase("big-snap", c.PHASE_SUCCEEDED, timeout=900)
    assert done["restarts"] == 1 and done["failedRank"]["rank"] == 0, done
    logs = [jobs.log(f"big-snap-{i}", labels.CONTAINER_NAME) for i in (0, 1)]
    resumed = [json.loads(line) for log in logs for line in RESUME.findall(log)]
    assert sorted(r["rank"] for r in resumed) == [0, 1] and len({r["epochs_run"] for r in resumed}) == 1, resumed
    assert_one_model(params(jobs, "big-snap", 2), 2)


def test_an_elastic_job_s_pod_taken_in_at_a_restart_restores_the_kept_snapshot(
        jobs: Jobs, real_node, frameworks_image: str, s3_on_the_bridge: str) -> None:
    """An elastic job a quota holds to 2 of its 3 pods runs at 2 and keeps rank 0's snapshot. Once the quota has
    room, pod 2 comes and waits; the gang takes it in when it re-forms (rank 0's process is killed: an in-place
    restart), and pod 2, new and empty, finds the snapshot where rank 0 left it, as pods 0 and 1 do: all three
    resume from the same epoch and end with one model. 24 epochs at 2 ranks last over 80 s; rank 0 is killed
    about 20 s after the start here (5 s of settling, a kept snapshot, pod 2 started)."""
    endpoint, ns = s3_on_the_bridge, jobs.namespace
    jobs.quota("pods", {"pods": "2"})
    command_job(jobs, "grows", frameworks_image, endpoint,
                ["torchrun", "torchrun_train.py", "24", "1", "--step-seconds", "0.1", "--snapshot-path",
                 "/home/ddp/snap/snapshot.pt"], worldSize=3, minWorldSize=2, restartStrategy="InPlace",
                elasticSettleSeconds=5, keepFolders=["/home/ddp/snap"], env=KEEP_FAST, backoffLimit=1)
    shrunk = jobs.wait_condition("grows", c.COND_SHRUNK, "True", timeout=300)
    assert shrunk["members"] == [0, 1] and "ResourceQuota pods" in shrunk["message"], shrunk
    wait_until(lambda: kept_object(endpoint, ns, "grows", "home/ddp/snap/snapshot.pt"), 300, "grows' kept snapshot")
    jobs.core.patch_namespaced_resource_quota("pods", ns, {"spec": {"hard": {"pods": "3"}}})
    wait_until(lambda: any(p.metadata.name == "grows-2" and p.status.phase == "Running" for p in jobs.pods("grows")),
               120, "pod 2 running")
    pids = wait_until(lambda: command_pids(ns, "grows", 0), 30, "rank 0's command process")
    os.kill(pids[0], signal.SIGKILL)  # type: ignore[index]
    done = jobs.wait_phase("grows", c.PHASE_SUCCEEDED, timeout=600)
    assert done["restarts"] == 1 and done["members"] == [0, 1, 2], done
    logs = [jobs.log(f"grows-{i}", labels.CONTAINER_NAME) for i in (0, 1, 2)]
    resumed = [json.loads(line) for line in RESUME.findall(logs[2])]
    assert [r["rank"] for r in resumed] == [2] and resumed[0]["epochs_run"] > 0, logs[2][-3000:]
    last = [json.loads(line) for log in logs[:2] for line in RESUME.findall(log)]
    assert {r["epochs_run"] for r in last} == {resumed[0]["epochs_run"]}, (last, resumed)
    assert_one_model(params(jobs, "grows", 3), 3)
