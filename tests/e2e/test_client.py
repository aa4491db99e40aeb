"""The Python client and `kubectl ddp` against the local cluster, the S3 server and real rank processes."""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from PIL import Image

import ddp_client
from ddp_client.job import Job
from ddp_client.jobspec import build_job
from ddp_client.metricrecords import series
from ddp_contract import labels
from e2ehelp import BUCKET
from kube import REPO, Cluster, Jobs, wait_until
from ports import free_port

sys.path.insert(0, str(REPO / "localcluster"))
import demo

SECRET = "s3-credentials"
IMAGE = "ddp-operator/trainer:0.1.0"
DASK_SCRIPT = Path(__file__).resolve().parent / "dask_style_train.py"
RESULTS = f"s3://{BUCKET}/results"
# The demo dataset: 48 images of each of 3 classes; 2 ranks with batches of 16 take 5 steps an epoch.
EPOCHS, BATCH, STEPS = 2, 16, 2 * 5


@pytest.fixture
def s3_secret(jobs: Jobs) -> str:
    jobs.core.create_namespaced_secret(jobs.namespace, {
        "metadata": {"name": SECRET},
        "stringData": {"AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY},
    })
    return SECRET


@pytest.fixture
def kubectl_ddp(cluster: Cluster, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """`kubectl ddp ...` through kubectl's plugin lookup, with a `kubectl-ddp` on PATH that runs this tree's client."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "kubectl-ddp"
    path = os.pathsep.join(str(REPO / p) for p in ("client", "contract"))
    plugin.write_text(f'#!/bin/sh\nPYTHONPATH="{path}" exec "{sys.executable}" -m ddp_client "$@"\n')
    plugin.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DDP_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([cluster.kubectl, "ddp", *args, "--kubeconfig", cluster.kubeconfig], env=env,
                              capture_output=True, text=True, check=check, timeout=120)

    return run


def local_spec(**spec: object) -> dict:
    """A template that puts the ranks on the pod runner's node (which runs them as local processes) and
    a free rendezvous port: every rank of every job on this machine listens on it."""
    template = demo.on_local_runner({"spec": {}})["spec"]["template"]
    return {"template": template, "masterPort": free_port(), **spec}


def client_s3(endpoint: str) -> ddp_client.S3:
    return ddp_client.S3(endpoint=endpoint, region="us-east-1", credentials_secret=SECRET,
                         dataset=f"s3://{BUCKET}/shapes/train", results=RESULTS)


def follow_in_background(job: Job) -> tuple[threading.Thread, io.StringIO]:
    followed = io.StringIO()
    thread = threading.Thread(target=job.logs, kwargs={"follow": True, "out": followed, "poll_s": 1.0}, daemon=True)
    thread.start()
    return thread, followed


def test_a_dask_style_script_runs_from_the_client_and_its_progress_results_metrics_plot_and_logs_come_back(
        jobs: Jobs, kube_api, s3_endpoint: str, podrunner: Path, s3_secret: str, kubectl_ddp, tmp_path: Path) -> None:
    job = ddp_client.submit(str(DASK_SCRIPT), image=IMAGE, world_size=2, gpus=0, s3=client_s3(s3_endpoint),
                            args=[BUCKET, "shapes/train", str(EPOCHS), str(BATCH)],
                            env={"DDP_PROGRESS_INTERVAL_SECONDS": "1", "DDP_LOG_UPLOAD_INTERVAL_SECONDS": "2"},
                            spec=local_spec(backoffLimit=0),
                            namespace=jobs.namespace, api_client=kube_api)
    assert job.name == "dask-style-train"
    follower, followed = follow_in_background(job)
    shown = io.StringIO()
    status = job.wait(timeout=300, out=shown)
    lines = shown.getvalue().splitlines()
    assert status["phase"] == "Succeeded", shown.getvalue()
    # Ready 1/2 or 0/2 is as right as 2/2 here: ten steps take about a second, so a report can land while
    # one rank's pod is still starting or already done.
    assert any(re.search(r"Running, ready \d/2, epoch \d, step \d+, loss [\d.e-]+, \d+ samples/s", line) for line in lines), lines
    assert lines[-1].startswith(f"dask-style-train: Succeeded at epoch {EPOCHS - 1}, step {STEPS}, loss "), lines

    # The same name again is refused before anything is changed (the running job's code included).
    (tmp_path / "other.py").write_text("print('other code')\n")
    with pytest.raises(ValueError, match=f"DDPJob {jobs.namespace}/dask-style-train already exists"):
        ddp_client.submit(str(tmp_path / "other.py"), image=IMAGE, name=job.name, namespace=jobs.namespace,
                          api_client=kube_api)
    code = jobs.core.read_namespaced_config_map("dask-style-train-code", jobs.namespace)
    assert code.data == {DASK_SCRIPT.name: DASK_SCRIPT.read_text()}
    assert code.metadata.owner_references[0].name == job.name

    # What the ranks submitted, listed, and downloaded as process_results did.
    submitted = {f"logs/data_{rank}_{epoch}.json" for rank in (0, 1) for epoch in range(EPOCHS)} | {"model.pkl"}
    assert {item.path for item in job.results()} == submitted
    downloaded = ddp_client.process_results(job, tmp_path / "training")
    assert {p.relative_to(tmp_path / "training").as_posix() for p in downloaded} == submitted
    assert "module.0.weight" in pickle.loads((tmp_path / "training" / "model.pkl").read_bytes())

    # Metrics and their plot: rank 0's loss and accuracy at every step.
    records = job.metrics()
    assert sorted((r["rank"], r["step"]) for r in records) == [(rank, s) for rank in (0, 1) for s in range(1, STEPS + 1)]
    drawn = job.plot(tmp_path / "loss.png")
    assert drawn == series(records) and sorted(drawn) == ["accuracy", "loss"]
    assert [step for step, _ in drawn["loss"]] == list(range(1, STEPS + 1))
    with Image.open(tmp_path / "loss.png") as png:
        assert png.format == "PNG" and png.size == (800, 500)  # 8 in x 2 panels of 2.5 in, at 100 dpi

    # Every rank's output, merged; also as it came, followed while the job ran.
    merged = job.logs()
    for rank in (0, 1):
        assert f'[rank {rank}] {{"loss": ' in merged and f'"worker": {rank}}}' in merged
        assert sum(line.startswith(f"[rank {rank}] {{\"loss\"") for line in merged.splitlines()) == STEPS
    follower.join(30)
    assert not follower.is_alive()
    assert sorted(followed.getvalue().splitlines()) == sorted(merged.splitlines())

    # kubectl ddp, with S3 settings from the job's spec.s3 and its Secret.
    ns = ["-n", jobs.namespace]
    summary = kubectl_ddp("status", job.name, *ns).stdout
    assert "Phase:        Succeeded" in summary and "Ranks:        Succeeded 0-1" in summary, summary
    assert f"step {STEPS}" in summary
    one_rank = kubectl_ddp("logs", job.name, *ns, "--rank", "1").stdout.splitlines()
    assert one_rank and all(line.startswith("[rank 1] ") for line in one_rank)
    listing = kubectl_ddp("results", job.name, *ns).stdout
    assert all(path in listing for path in submitted)
    kubectl_ddp("results", job.name, *ns, "--download", str(tmp_path / "cli"))
    assert (tmp_path / "cli" / "model.pkl").read_bytes() == (tmp_path / "training" / "model.pkl").read_bytes()
    plotted = kubectl_ddp("plot", job.name, *ns, "-o", str(tmp_path / "cli.png")).stdout
    assert f"loss ({STEPS} points)" in plotted
    with Image.open(tmp_path / "cli.png") as png:
        assert png.format == "PNG" and png.size == (800, 500)

    # The pods go (as ttlSecondsAfterFinished or a gang restart takes them): the logs stay readable.
    jobs.core.delete_collection_namespaced_pod(jobs.namespace, label_selector=f"{labels.LABEL_JOB_NAME}={job.name}")
    wait_until(lambda: not jobs.pods(job.name, include_deleting=True), 60, "the job's pods to be deleted")
    assert job.logs() == merged
    # And the job itself: its logs through its results URI, S3 settings from flags.
    job.delete()
    wait_until(lambda: jobs.get(job.name) is None, 60, "the job to be deleted")
    kept = kubectl_ddp("logs", job.name, *ns, "--results", RESULTS, "--s3-endpoint", s3_endpoint,
                       "--s3-access-key-id", demo.ACCESS_KEY, "--s3-secret-access-key", demo.SECRET_KEY).stdout
    assert kept == merged
    gone = kubectl_ddp("status", job.name, *ns, check=False)
    assert gone.returncode == 1 and f"DDPJob {jobs.namespace}/{job.name} does not exist" in gone.stderr


def test_a_failed_job_says_why_and_its_logs_start_with_the_failed_rank(
        jobs: Jobs, kube_api, s3_endpoint: str, podrunner: Path, s3_secret: str, kubectl_ddp) -> None:
    path = os.pathsep.join(str(REPO / p) for p in ("contract", "images/trainer", "tests/trainer"))
    job = ddp_client.submit("ddp_workloads:fail_at_step", image=IMAGE, world_size=2, gpus=0,
                            s3=client_s3(s3_endpoint), env={"PYTHONPATH": path}, name="buggy",
                            spec=local_spec(backoffLimit=0),
                            namespace=jobs.namespace, api_client=kube_api)
    shown = io.StringIO()
    with pytest.raises(ddp_client.JobFailed) as failed:
        job.wait(timeout=240, out=shown)
    text = str(failed.value)
    assert text.startswith("buggy: Failed") and "failed rank: rank 1 (pod buggy-1" in text, text
    assert "its last output:" in text and "ValueError: a bug that fires at step 3" in text
    assert shown.getvalue().rstrip().endswith(text.rstrip())

    def both_ranks_kept() -> str | None:
        merged = job.logs()
        return merged if "[rank 0] " in merged and "[rank 1] " in merged else None

    merged = wait_until(both_ranks_kept, 30, "both ranks' logs")
    assert isinstance(merged, str) and merged.splitlines()[0].startswith("[rank 1] ")
    assert "[rank 1] ddp-trainer: error (rank 1, step 3, exit 1 USER_ERROR, permanent): ValueError" in merged
    cli = kubectl_ddp("logs", "buggy", "-n", jobs.namespace).stdout
    assert cli.splitlines()[0].startswith("[rank 1] ")
    summary = kubectl_ddp("status", "buggy", "-n", jobs.namespace).stdout
    assert "Phase:        Failed" in summary and "Failure:" in summary and "failed rank: rank 1" in summary, summary


def test_each_gang_attempts_output_is_kept_through_restarts(
        jobs: Jobs, kube_api, s3_endpoint: str, podrunner: Path, s3_secret: str, kubectl_ddp, tmp_path: Path) -> None:
    path = os.pathsep.join(str(REPO / p) for p in ("contract", "images/trainer", "tests/trainer"))
    env = {"PYTHONPATH": path, "WL_CRASH_AT_STEP": "3", "WL_EPOCHS": "50", "WL_OUT": str(tmp_path / "model.pt"),
           "DDP_LOG_UPLOAD_INTERVAL_SECONDS": "1"}
    # Rank 0 kills itself (SIGKILL) at step 3 of every attempt: one gang restart, then Failed. The
    # job is submitted whole, as YAML text.
    body = build_job("ddp_workloads:train", name="crashing", image=IMAGE, world_size=2, gpus=0, s3=client_s3(s3_endpoint),
                     env=env, spec=local_spec(infrastructureBackoffLimit=1))
    job = ddp_client.submit(yaml.safe_dump(body), namespace=jobs.namespace, api_client=kube_api)
    assert job.name == "crashing"
    with pytest.raises(ddp_client.JobFailed) as failed:
        job.wait(timeout=240, out=None)
    assert failed.value.status["restarts"] == 1 and "signal SIGKILL" in str(failed.value), str(failed.value)

    def kept(attempt: int) -> str | None:
        text = job.logs(attempt=attempt)
        return text if "[rank 1] ddp-trainer: error (rank 1" in text else None

    for attempt in (0, 1):
        # The surviving rank 1 left its last words in each attempt's log; the failed rank 0 comes first.
        text = wait_until(lambda: kept(attempt), 30, f"rank 1's output of attempt {attempt}")
        assert isinstance(text, str) and "rank 1/2 joined" in text
        assert text.splitlines()[0].startswith("[rank 0] "), text
    cli = kubectl_ddp("logs", "crashing", "-n", jobs.namespace, "--attempt", "0", "--rank", "1").stdout
    assert "[rank 1] ddp-trainer: error (rank 1" in cli and "[rank 0]" not in cli
