"""The four examples (examples/<name>/) end to end, as `make example NAME=<name>` runs them: the data
step into S3 (on the real node's bridge), the DDPJob as written (the S3 endpoint aside) with its ranks
in trainer-image containers on the local cluster's real node, and proof that the model learned: the
loss clearly lower at the end than at the start (every rank's metrics in S3), the names generated,
the held-out accuracy well above chance.

Select them with `-m examples`; each takes about a minute on two busy cores.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from kubernetes.client.rest import ApiException

import demo
import example
from ddp_contract import api, layout
from ddp_operator import constants as c
from kube import Jobs, wait_until
from realnode import node_address

pytestmark = [pytest.mark.examples, pytest.mark.node, pytest.mark.images, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def examples_s3(real_node, images_on_the_node: None) -> Iterator[str]:
    """The examples' buckets on the real node's bridge, where their ranks' containers reach them."""
    with demo.s3_server(0, buckets=("ddp-examples",), host=node_address(real_node)) as endpoint:
        yield endpoint


def run_example(jobs: Jobs, name: str, endpoint: str) -> tuple[dict[str, Any], Any, str, str]:
    """Data step, then the example's DDPJob to Succeeded; (status, S3 client, bucket, job prefix)."""
    job = example.load_job(name, endpoint)
    example.run_data_step(name, job, endpoint)
    jobs.core.create_namespaced_secret(jobs.namespace, {
        "metadata": {"name": job["spec"]["s3"]["credentialsSecret"]},
        "stringData": {"AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY},
    })
    jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, job)
    status = jobs.wait_phase(job["metadata"]["name"], c.PHASE_SUCCEEDED, timeout=420)
    bucket, prefix = example.job_prefix(job, jobs.namespace)
    return status, demo.s3_client(endpoint), bucket, prefix


def assert_learned(s3: Any, bucket: str, prefix: str, name: str) -> tuple[float, float]:
    start, end = example.loss_ends(example.metrics(s3, bucket, prefix))
    print(f"{name}: loss {start:.3f} at the start, {end:.3f} at the end")
    assert end < example.LEARNED_LOSS_RATIO * start, f"{name} did not learn: loss {start:.3f} at the start, {end:.3f} at the end"
    return start, end


def assert_above_chance(s3: Any, bucket: str, prefix: str, name: str) -> dict[str, Any]:
    evaluation = example.result_json(s3, bucket, prefix, "eval.json")
    print(f"{name}: held-out accuracy {evaluation['accuracy']:.3f} on {evaluation['samples']} samples "
          f"(chance {evaluation['chance']:.3f})")
    assert evaluation["accuracy"] > example.ABOVE_CHANCE * evaluation["chance"], evaluation
    return evaluation


def test_petnames_learns_and_stores_generated_names(jobs, examples_s3) -> None:
    status, s3, bucket, prefix = run_example(jobs, "petnames", examples_s3)
    assert status["restarts"] == 0 and status["progress"]["loss"] is not None
    assert_learned(s3, bucket, prefix, "petnames")
    names = example.result_json(s3, bucket, prefix, "names.json")["names"]
    print(f"petnames: {', '.join(names)}")
    assert len(names) == 50 and all(name.strip() for name in names), names


def test_transfer_trains_resnet18_from_scratch_with_checkpoints(jobs, examples_s3) -> None:
    status, s3, bucket, prefix = run_example(jobs, "transfer", examples_s3)
    assert_learned(s3, bucket, prefix, "transfer")
    evaluation = assert_above_chance(s3, bucket, prefix, "transfer")
    assert evaluation["initial_weights"] is False  # nothing at <dataset>/weights/resnet18.pth
    assert status["lastCheckpoint"]["uri"].startswith(f"s3://{bucket}/{prefix}{layout.CHECKPOINTS}/step-"), status


def test_shards_trains_a_small_resnet_on_make_shards_output(jobs, examples_s3) -> None:
    _, s3, bucket, prefix = run_example(jobs, "shards", examples_s3)
    assert_learned(s3, bucket, prefix, "shards")
    assert assert_above_chance(s3, bucket, prefix, "shards")["dataset"] == "map"


def served(jobs: Jobs, pod: str) -> bool:
    """Whether data worker `pod` has served a rank's logical worker."""
    try:
        return "serving logical worker" in jobs.log(pod)
    except ApiException:
        return False


def uid(jobs: Jobs, pod: str) -> str | None:
    try:
        return str(jobs.core.read_namespaced_pod(pod, jobs.namespace).metadata.uid)
    except ApiException:
        return None


def step_losses(s3: Any, bucket: str, prefix: str) -> dict[tuple[int, int], float]:
    return {(r["rank"], r["step"]): r["loss"] for r in example.metrics(s3, bucket, prefix) if r.get("loss") is not None}


def model_state(s3: Any, bucket: str, prefix: str) -> dict[str, torch.Tensor]:
    """The trained model rank 0 stored (`results/model.pt`)."""
    body = s3.get_object(Bucket=bucket, Key=f"{prefix}results/model.pt")["Body"].read()
    state: dict[str, torch.Tensor] = torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    return state


def test_fashion_learns_and_takes_the_very_steps_with_data_workers_it_takes_without(jobs, examples_s3) -> None:
    """The Dpex example learns with DataLoader workers preprocessing in its ranks' pods; with spec.dataWorkers
    (two data worker pods the operator makes) its ranks' DataLoader workers run there, and one deleted mid-run
    is made again without a gang restart, yet every rank's loss at every step equals the run with local
    workers to the bit (the same batches, augmentation included, in the same order, none lost or repeated;
    gloo's CPU arithmetic the same), and so do the held-out accuracy and every trained parameter."""
    _, s3, bucket, prefix = run_example(jobs, "fashion", examples_s3)
    assert_learned(s3, bucket, prefix, "fashion")
    assert assert_above_chance(s3, bucket, prefix, "fashion")["workers"] == 2
    local = step_losses(s3, bucket, prefix)
    evaluation = example.result_json(s3, bucket, prefix, "eval.json")
    trained = model_state(s3, bucket, prefix)

    job = example.load_job("fashion", examples_s3)
    job["metadata"]["name"] = "fashion-remote"
    job["spec"]["dataWorkers"] = {"replicas": 2, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}}
    jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, job)
    workers = ["fashion-remote-data-0", "fashion-remote-data-1"]
    wait_until(lambda: all(served(jobs, pod) for pod in workers), 600, "both data workers to serve the ranks")
    first = uid(jobs, workers[0])
    jobs.core.delete_namespaced_pod(workers[0], jobs.namespace, grace_period_seconds=0)
    wait_until(lambda: uid(jobs, workers[0]) not in (None, first), 60, "the operator to make the data worker again")
    status = jobs.wait_phase("fashion-remote", c.PHASE_SUCCEEDED, timeout=420)
    bucket, prefix = example.job_prefix(job, jobs.namespace)
    remote = step_losses(s3, bucket, prefix)

    assert status["restarts"] == 0, status
    assert len(local) > 20 and remote == local
    assert example.result_json(s3, bucket, prefix, "eval.json")["accuracy"] == evaluation["accuracy"]
    remote_trained = model_state(s3, bucket, prefix)
    assert trained.keys() == remote_trained.keys() and len(trained) > 4
    assert all(torch.equal(trained[name], remote_trained[name]) for name in trained), "the trained parameters differ"
    wait_until(lambda: all(uid(jobs, pod) is None for pod in workers), 60, "the data workers to go with the job's end")
