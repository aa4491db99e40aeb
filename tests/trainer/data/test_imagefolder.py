"""S3ImageFolder against torchvision's ImageFolder on the same files, served by a real S3 server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torchvision import transforms
from torchvision.datasets import ImageFolder
from trainerhelp import FILES, upload_tree, write_tree

from ddp_trainer.data.imagefolder import S3ImageFolder
from ddp_trainer.errors import ConfigError, CorruptDataError, ExitCode, ObjectNotFoundError, StorageError, StorageUnavailableError
from ddp_trainer.runtime.rankexit import classify
from ddp_trainer.storage import s3
from ports import free_port


@pytest.fixture
def image_tree(tmp_path: Path, bucket: str) -> tuple[Path, str]:
    root = tmp_path / "images"
    write_tree(root)
    upload_tree(root, bucket, "data/train")
    return root, bucket


def test_matches_torchvision_imagefolder(image_tree: tuple[Path, str]) -> None:
    root, bucket = image_tree
    local = ImageFolder(str(root), transform=transforms.ToTensor())
    remote = S3ImageFolder(bucket, "data/train", transform=transforms.ToTensor())
    assert remote.classes == local.classes == ["cat", "dog", "emu"]
    assert remote.class_to_idx == local.class_to_idx
    assert [(k.removeprefix("data/train/"), t) for k, t in remote.samples] == [
        (Path(p).relative_to(root).as_posix(), t) for p, t in local.samples
    ]
    assert remote.targets == local.targets
    assert len(remote) == len(local) == 8
    for i in range(len(local)):
        (a, ta), (b, tb) = remote[i], local[i]
        assert ta == tb and torch.equal(a, b), remote.samples[i]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers(image_tree: tuple[Path, str], context: str) -> None:
    root, bucket = image_tree
    resize = transforms.Compose([transforms.Resize((4, 4)), transforms.ToTensor()])
    dataset = S3ImageFolder.from_uri(f"s3://{bucket}/data/train", transform=resize)
    # Workers use the constructor's listing; they do not list again (and see no new objects).
    s3.put_bytes(s3.S3Url(bucket, "data/train/zebra/new.png"), (root / FILES[0]).read_bytes())
    loader = DataLoader(dataset, batch_size=3, num_workers=2, multiprocessing_context=context)
    images, targets = zip(*loader, strict=True)
    assert torch.cat(targets).tolist() == dataset.targets and len(dataset) == 8
    expected = torch.stack([dataset[i][0] for i in range(len(dataset))])
    assert torch.equal(torch.cat(images), expected)


def test_missing_bucket_is_named(s3_env: dict[str, str]) -> None:
    with pytest.raises(ObjectNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        S3ImageFolder("no-such-bucket", "train")


def test_empty_prefix_is_named(bucket: str) -> None:
    with pytest.raises(ConfigError, match=f"no class folders found under s3://{bucket}/nothing/here"):
        S3ImageFolder(bucket, "nothing/here")


def test_corrupt_image_names_its_key(bucket: str) -> None:
    s3.put_bytes(s3.S3Url(bucket, "d/cls/bad.jpg"), b"not a jpeg")
    dataset = S3ImageFolder(bucket, "d")
    with pytest.raises(CorruptDataError, match=f"s3://{bucket}/d/cls/bad.jpg"):
        dataset[0]


def test_deleted_object_names_its_key(image_tree: tuple[Path, str]) -> None:
    _, bucket = image_tree
    dataset = S3ImageFolder(bucket, "data/train")
    key = dataset.samples[2][0]
    s3.client().delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ObjectNotFoundError, match=f"reading s3://{bucket}/{key}: object does not exist"):
        dataset[2]


def test_unreachable_endpoint_is_retryable_infrastructure(monkeypatch: pytest.MonkeyPatch, s3_env) -> None:
    monkeypatch.setenv("DDP_S3_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("DDP_S3_MAX_ATTEMPTS", "2")
    s3.reset_clients()
    with pytest.raises(StorageUnavailableError, match="unreachable") as caught:
        S3ImageFolder("any-bucket", "train")
    assert classify(caught.value) == ExitCode.STORAGE_UNAVAILABLE


def test_bad_credentials_are_named(s3_env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key")  # the test server checks every request's signature
    s3.reset_clients()
    with pytest.raises(StorageError, match="listing s3://train-data/images/: access denied \\(InvalidAccessKeyId\\)") as caught:
        S3ImageFolder("train-data", "images")
    assert "AWS_ACCESS_KEY_ID" in str(caught.value)
    assert classify(caught.value) == ExitCode.USER_ERROR


def test_dask_pytorch_ddp_keywords_and_unsigned_access_to_a_public_bucket(
        image_tree: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _, bucket = image_tree
    ours = S3ImageFolder(bucket, "data/train", transform=transforms.ToTensor())
    expected = ours[3][0]
    public = {"Version": "2012-10-17", "Statement": [  # a public bucket, as AWS makes one (its ACLs are off)
        {"Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject"], "Resource": [f"arn:aws:s3:::{bucket}/*"]},
        {"Effect": "Allow", "Principal": "*", "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"]}]}
    s3.client().put_bucket_policy(Bucket=bucket, Policy=json.dumps(public))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    s3.reset_clients()
    with pytest.raises(StorageError, match="no S3 credentials"):  # signed requests need credentials ...
        S3ImageFolder(s3_bucket=bucket, s3_prefix="data/train")
    theirs = S3ImageFolder(s3_bucket=bucket, s3_prefix="data/train", transform=transforms.ToTensor(), anon=True)
    assert theirs.samples == ours.samples and theirs.classes == ours.classes  # ... anonymous ones none
    image, target = theirs[3]
    assert target == ours.targets[3] and torch.equal(image, expected)
    assert (theirs.s3_bucket, theirs.s3_prefix) == (bucket, "data/train")
    assert theirs.all_files == [key for key, _ in ours.samples]
    both = theirs + ours  # a torch Dataset: concatenation as with any other
    assert isinstance(theirs, torch.utils.data.Dataset) and len(both) == 2 * len(ours)


def test_the_bucket_is_named_once() -> None:
    with pytest.raises(TypeError, match="needs bucket \\(or dask-pytorch-ddp's s3_bucket\\), exactly once"):
        S3ImageFolder("a", "p", s3_bucket="b")
