"""Code that resumes from its own folder, as command jobs in containers on the local cluster's real node
(the frameworks image of test_real_node_commands.py): the folders a job keeps (keepFolders) come back into
new pods, which resume from them: Hugging Face and Lightning checkpoints, a torchrun script's snapshot, a
torn snapshot never kept, a pod an elastic job takes in. Select with `pytest -m node`."""

from __future__ import annotations

import json
import os
import signal

import pytest

import demo
from commandjobs import (
    BUCKET,
    KEEP_FAST,
    RESUME,
    assert_one_model,
    command_job,
    kept_checkpoints,
    kept_key,
    kept_object,
    kept_snapshot_epochs,
    params,
)
from ddp_contract import labels
from ddp_operator import constants as c
from kube import Jobs, wait_until
from procs import command_pids

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(900)]

PAD_MB = 16  # the large snapshot's padding, written at 4 MB/s: 4 s in which rank 0's process is killed


@pytest.mark.timeout(1500)  # three 2-rank jobs, two started again: 183-893 s on the EPYC VM, 856 s on CI
def test_hugging_face_jobs_restarted_resume_from_their_kept_checkpoint_and_end_as_an_uninterrupted_one(
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str) -> None:
    """Trainer checkpoints into out/ (keepFolders) every 16 steps and resumes from the newest one there, as its
    users write it. One job's rank 1 pod is deleted (the gang is made again: new pods, nothing local), another's
    rank 1 process is killed (InPlace: the pods stay), each after its second checkpoint is kept; both go on from a
    checkpoint of theirs and end with the parameters of a third job that ran through, to the bit: the same
    program on the same CPU (one thread), the same data order (data_seed) and, from the checkpoint, the same
    model, optimizer, scheduler and every rank's RNG state."""
    endpoint, ns = commands_s3, jobs.namespace
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
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str) -> None:
    """Lightning saves ck/last.ckpt (keepFolders) after each epoch and resumes with fit(ckpt_path=...) when it is
    there. Rank 1's pod is deleted once one is kept; the new pods resume from it and end with the parameters of
    a job that ran through, to the bit: a resume at an epoch's end, the sampler's order a function of the epoch."""
    endpoint, ns = commands_s3, jobs.namespace
    train = ["python", "lightning_train.py", "--nodes", "2", "--no-bar", "--epochs", "6", "--checkpoint-dir",
             "/home/ddp/ck", "--step-seconds", "0.1"]
    keep = {"keepFolders": ["/home/ddp/ck"], "env": KEEP_FAST}
    command_job(jobs, "lt-through", frameworks_image, endpoint, train)
    command_job(jobs, "lt-recreated", frameworks_image, endpoint, train, **keep)
    s3 = demo.s3_client(endpoint)
    key = kept_key(ns, "lt-recreated", "home/ddp/ck/last.ckpt")
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


def assert_resumed_together(jobs: Jobs, name: str) -> None:
    """Both ranks of the attempt after the restart loaded the same snapshot, and ended with one model."""
    logs = [jobs.log(f"{name}-{i}", labels.CONTAINER_NAME) for i in (0, 1)]
    resumed = [json.loads(line) for log in logs for line in RESUME.findall(log)]
    assert sorted(r["rank"] for r in resumed) == [0, 1] and len({r["epochs_run"] for r in resumed}) == 1, resumed
    assert_one_model(params(jobs, name, 2), 2)


def test_a_rank_killed_while_writing_a_snapshot_resumes_from_the_last_whole_one(
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str) -> None:
    """pytorch/examples' multinode.py: rank 0 saves snap/snapshot.pt, every rank loads it at start. Rank 0's
    process is SIGKILLed while it writes the next snapshot over the kept one (16 MB at 4 MB/s, as onto a slow
    disk: the write lasts long enough to be caught, polled every 20 ms): the torn file is never kept (it was
    open for writing, and never settled while its rank ran), so the gang, made again in new pods that never
    had a snapshot, restarts with every rank from rank 0's last whole one. An epoch (13 s) outlasts a
    snapshot's write and upload, so one is kept before the next."""
    endpoint, ns = commands_s3, jobs.namespace
    command_job(jobs, "big-snap", frameworks_image, endpoint,
                ["torchrun", "torchrun_train.py", "3", "1", "--step-seconds", "0.4", "--snapshot-path",
                 "/home/ddp/snap/snapshot.pt", "--pad-mb", str(PAD_MB), "--save-mb-per-second", "4"],
                keepFolders=["/home/ddp/snap"], env=KEEP_FAST, backoffLimit=1)
    # A snapshot torch.save has opened but not written for the settle time is kept as it is (an empty file
    # under load): the whole one comes at the next pass after it is written.
    first = wait_until(lambda: (found := kept_object(endpoint, ns, "big-snap", "home/ddp/snap/snapshot.pt"))
                       and found["ContentLength"] > PAD_MB << 20 and found, 600, "the large snapshot kept whole")
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
    assert_resumed_together(jobs, "big-snap")


def test_an_elastic_job_s_pod_taken_in_at_a_restart_restores_the_kept_snapshot(
        jobs: Jobs, real_node, frameworks_image: str, commands_s3: str) -> None:
    """An elastic job a quota holds to 2 of its 3 pods runs at 2 and keeps rank 0's snapshot. Once the quota has
    room, pod 2 comes and waits; the gang takes it in when it re-forms (rank 0's process is killed: an in-place
    restart), and pod 2, new and empty, finds the snapshot where rank 0 left it, as pods 0 and 1 do: all three
    resume from the same epoch and end with one model. 24 epochs at 2 ranks last over 80 s; rank 0 is killed
    about 20 s after the start here (5 s of settling, a kept snapshot, pod 2 started)."""
    endpoint, ns = commands_s3, jobs.namespace
    jobs.quota("pods", {"pods": "2"})
    command_job(jobs, "grows", frameworks_image, endpoint,
                ["torchrun", "torchrun_train.py", "24", "1", "--step-seconds", "0.1", "--snapshot-path",
                 "/home/ddp/snap/snapshot.pt"], worldSize=3, minWorldSize=2, restartStrategy="InPlace",
                elasticSettleSeconds=5, keepFolders=["/home/ddp/snap"], env=KEEP_FAST, backoffLimit=1)
    shrunk = jobs.wait_condition("grows", c.COND_SHRUNK, "True", timeout=300)
    assert shrunk["members"] == [0, 1] and "ResourceQuota pods" in shrunk["message"], shrunk
    # The first epoch's snapshot says 0 epochs run: a restore of it could not be told from a fresh start.
    wait_until(lambda: (kept_snapshot_epochs(endpoint, ns, "grows", "home/ddp/snap/snapshot.pt") or 0) > 0, 300,
               "grows' kept snapshot of a later epoch than the first")
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
