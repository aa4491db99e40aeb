"""The example entrypoint end to end: 2 gloo ranks, S3 image folder and shards, resume, and the demo job learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from trainerhelp import describe, launch, upload_tree, write_tree

import datagen
from ddp_contract import envnames
from ddp_trainer.data.convert import make_shards
from ddp_trainer.storage import s3
from ddp_trainer.storage.checkpoint import CheckpointManager
from ddp_trainer.storage.results import read_metrics
from kube import REPO
from strictstore import strict_store

ARGS = ["--batch-size", "2", "--workers", "1", "--checkpoint-every", "3"]


@pytest.mark.timeout(180)
def test_example_trains_resumes_and_reads_shards(tmp_path: Path, bucket: str, s3_env: dict[str, str]) -> None:
    train_resume_and_read_shards(tmp_path, bucket, s3_env)


@pytest.mark.timeout(180)
def test_the_same_through_a_store_that_refuses_boto3_s_new_checksums(
        tmp_path: Path, bucket: str, s3_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """strictstore.py: the ranks' images, shards, checkpoints (and their pruning), metrics, results and
    logs all go through a store that refuses flexible checksums and wants Content-MD5 on DeleteObjects."""
    with strict_store(s3_env[envnames.S3_ENDPOINT]) as (endpoint, store):
        monkeypatch.setenv(envnames.S3_ENDPOINT, endpoint)  # the test's own reads and make_shards too
        s3.reset_clients()
        train_resume_and_read_shards(tmp_path, bucket, {**s3_env, envnames.S3_ENDPOINT: endpoint})
    monkeypatch.setenv(envnames.S3_ENDPOINT, s3_env[envnames.S3_ENDPOINT])
    s3.reset_clients()
    assert store.refused == [] and store.forwarded > 50, (store.refused, store.forwarded)


def train_resume_and_read_shards(tmp_path: Path, bucket: str, s3_env: dict[str, str]) -> None:
    images = tmp_path / "images"
    write_tree(images)  # 8 images: 4 per rank, 2 steps per epoch
    upload_tree(images, bucket, "train")
    env = {
        **s3_env,
        "DDP_DATASET_URI": f"s3://{bucket}/train",
        "DDP_RESULTS_URI": f"s3://{bucket}/results",
        "DDP_JOB_NAME": "example",
        "DDP_PROGRESS_FILE": str(tmp_path / "progress.json"),
        "DDP_SHARD_CACHE_DIR": str(tmp_path / "shard-cache"),
    }
    prefix = s3.S3Url(bucket, "results/default/example")

    def run(epochs: int) -> None:
        results = launch("train_classifier:main", 2, env, args=["--epochs", str(epochs), *ARGS])
        assert [r.returncode for r in results] == [0, 0], [r.stderr[-3000:] for r in results]

    run(2)
    assert CheckpointManager(prefix, rank=0).committed_steps() == [3, 4]
    run(3)  # a later run of the same job resumes at the end of epoch 2 and trains one more
    assert CheckpointManager(prefix, rank=0).committed_steps() == [3, 4, 6]
    steps = sorted(m["step"] for m in read_metrics(prefix) if m["rank"] == 0)
    assert steps == [1, 2, 3, 4, 5, 6]
    assert len(s3.get_bytes(prefix.join("results", "model.pt"))) > 1000
    assert '"step": 6' in (tmp_path / "progress.json").read_text()

    index = make_shards(f"s3://{bucket}/train", f"s3://{bucket}/shards", samples_per_shard=3)
    env.update(DDP_DATASET_URI=index, DDP_JOB_NAME="example-shards")
    run(1)
    assert len(list((tmp_path / "shard-cache").glob("*.tar"))) == 3  # the shards went through the cache
    assert CheckpointManager(s3.S3Url(bucket, "results/default/example-shards"), rank=0).committed_steps() == [2]


def test_quickstart_learns_without_s3_or_gpu(tmp_path: Path) -> None:
    """examples/ddpjob.yaml's entrypoint: 2 gloo ranks on generated data, well above chance."""
    env = {"DDP_JOB_NAME": "quickstart", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    results = launch("quickstart:main", 2, env, args=["--epochs", "4"])
    assert [r.returncode for r in results] == [0, 0], describe(results)
    losses = [float(line.split()[-1]) for line in results[0].stdout.splitlines() if line.startswith("epoch ")]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    for result in results:
        before, after = (float(line.split()[-1]) for line in result.stdout.splitlines() if "accuracy" in line)
        assert before < 0.5 and after > 0.8, result.stdout
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["epoch"] == 3 and progress["step"] == 4 * 2048 // 64 and progress["loss"] < losses[0]


@pytest.mark.timeout(300)
def test_the_demo_job_learns_visibly(tmp_path: Path, bucket: str, s3_env: dict[str, str]) -> None:
    """examples/ddpjob-demo.yaml's arguments on `make demo`'s dataset: the loss per epoch falls by far
    and the held-out accuracy goes from chance to near 1."""
    spec = yaml.safe_load((REPO / "examples" / "ddpjob-demo.yaml").read_text())["spec"]
    datagen.write_image_folder(f"s3://{bucket}/shapes", ("circle", "square", "cross"), per_class=96)
    env = {**s3_env, "DDP_DATASET_URI": f"s3://{bucket}/shapes", "DDP_RESULTS_URI": f"s3://{bucket}/results",
           "DDP_JOB_NAME": "demo", "DDP_PROGRESS_FILE": str(tmp_path / "progress.json")}
    results = launch(spec["entrypoint"], spec["worldSize"], env, args=spec["args"], timeout=240)
    assert [r.returncode for r in results] == [0, 0], describe(results)
    said = results[0].stdout
    losses = [float(line.split()[3]) for line in said.splitlines() if line.startswith("epoch ")]
    assert len(losses) == 6 and losses[-1] < 0.25 * losses[0], said
    before, after = (float(line.split(":")[1].split()[0]) for line in said.splitlines() if line.startswith("accuracy"))
    assert before < 0.5 and after > 0.9, said
    assert "accuracy" not in results[1].stdout, "rank 0 alone prints"


def test_transfer_takes_its_initial_weights_from_s3_when_they_are_there(bucket: str) -> None:
    """The transfer example's `<dataset>/weights/resnet18.pth`: absent, it trains from scratch;
    present in S3, every layer but the classifier starts from it."""
    import io

    import torch

    import transfer

    uri = f"s3://{bucket}/shapes/weights/resnet18.pth"
    assert transfer.initial_weights(uri) is None
    pretrained = transfer.build_model(1000, None).state_dict()
    buffer = io.BytesIO()
    torch.save(pretrained, buffer)
    s3.put_bytes(s3.parse_uri(uri), buffer.getvalue())
    model = transfer.build_model(3, transfer.initial_weights(uri))
    assert torch.equal(model.state_dict()["layer4.1.conv2.weight"], pretrained["layer4.1.conv2.weight"])
    assert model.fc.out_features == 3
