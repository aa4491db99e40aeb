"""The examples' pieces without a cluster: names encoding and generation, initial weights for
transfer learning, FashionMNIST's file format both ways, the data steps' generated images, the shards
trainer's two readers over make-shards output."""

from __future__ import annotations

import io
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import datagen
import fashion
import petnames
import shards
import transfer
from kube import REPO

pytestmark = pytest.mark.examples


def test_partial_names_are_the_last_characters_and_the_next_one_at_each_place() -> None:
    inputs, targets = petnames.encode(["bo"]).tensors
    assert len(inputs) == 3  # "b", "bo", "bo+"
    decoded = ["".join(petnames.CHARACTERS[i] for i in row.argmax(dim=1)) for row in inputs]
    assert decoded == ["*" * 8, "*" * 7 + "b", "*" * 6 + "bo"]
    assert ["".join(petnames.CHARACTERS[i] for i in row) for row in targets] == ["*" * 7 + "b", "*" * 6 + "bo",
                                                                                "*" * 5 + "bo+"]


def test_generated_names_are_never_empty_even_from_an_untrained_model() -> None:
    torch.manual_seed(0)
    model = petnames.Model(hidden=16, layers=1).eval()
    generator = torch.Generator().manual_seed(0)
    names = [petnames.generate_name(model, generator) for _ in range(20)]
    assert all(name and len(name) <= petnames.MAX_NAME for name in names), names


def test_the_names_file_is_accepted(tmp_path: Path) -> None:
    names = petnames.read_names(str(REPO / "examples" / "petnames" / "names.txt"))
    assert len(names) >= 250 and len(set(names)) == len(names)
    (tmp_path / "bad.txt").write_text("rex\nfido!\n")
    with pytest.raises(ValueError, match="'fido!' has characters outside"):
        petnames.read_names(str(tmp_path / "bad.txt"))


def test_initial_weights_load_every_layer_but_the_classifier(tmp_path: Path) -> None:
    assert transfer.initial_weights(str(tmp_path / "resnet18.pth")) is None  # nothing there: from scratch
    pretrained = transfer.build_model(1000, None).state_dict()
    torch.save(pretrained, tmp_path / "resnet18.pth")
    model = transfer.build_model(4, transfer.initial_weights(str(tmp_path / "resnet18.pth")))
    assert torch.equal(model.state_dict()["conv1.weight"], pretrained["conv1.weight"])
    assert model.fc.out_features == 4
    with pytest.raises(ValueError, match="not a resnet18 state dict"):
        transfer.build_model(4, {"conv1.weight": pretrained["conv1.weight"]})


def test_fashion_data_step_writes_files_the_trainer_reads(tmp_path: Path) -> None:
    env = {"PYTHONPATH": f"{REPO / 'contract'}:{REPO / 'images' / 'trainer'}", "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(REPO / "examples" / "fashion" / "data.py"), str(tmp_path), "--per-class", "5"],
                   env=env, check=True, capture_output=True)
    train = fashion.IdxImages(str(tmp_path), "train", fashion.TEST_TRANSFORM)
    assert train.images.shape == (50, 28, 28) and sorted(train.labels.tolist()) == sorted(list(range(10)) * 5)
    image, label = train[0]
    assert image.shape == (1, 28, 28) and 0 <= label < 10
    assert fashion.IdxImages(str(tmp_path), "t10k", fashion.TEST_TRANSFORM).images.shape == (10, 28, 28)


def test_every_shape_draws_a_distinct_32x32_image() -> None:
    from PIL import Image

    images = {shape: datagen.draw(shape, random.Random(0)) for shape in datagen.SHAPES}
    assert len(set(images.values())) == len(datagen.SHAPES)
    assert all(Image.open(io.BytesIO(png)).size == (32, 32) for png in images.values())
    with pytest.raises(ValueError, match="unknown shape 'hexagon'"):
        datagen.draw("hexagon", random.Random(0))


@pytest.mark.parametrize("stream", [False, True], ids=["map", "stream"])
def test_shards_trainer_reads_make_shards_output_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          stream: bool) -> None:
    from ddp_trainer import make_shards

    monkeypatch.setenv("DDP_SHARD_CACHE_DIR", str(tmp_path / "cache"))
    datagen.write_image_folder(str(tmp_path / "images"), datagen.SHAPES[:3], per_class=8)
    index = make_shards(str(tmp_path / "images"), str(tmp_path / "shards"), samples_per_shard=10, progress=io.StringIO())
    args = shards.parse_args(["--batch-size", "6"] + (["--stream"] if stream else []))
    loader, epochs = shards.training_data(index, args)
    epochs.set_epoch(0)
    batches = list(loader)
    assert len(batches) == len(loader) == 4  # 24 samples, one rank, batches of 6
    images, labels = batches[0]
    assert images.shape == (6, 3, 32, 32) and set(labels.tolist()) <= {0, 1, 2}
    assert shards.SmallResNet(3)(images).shape == (6, 3)
