"""The images as `make images` builds them (images/build.sh: BuildKit, no Docker) run what they must.

Each test builds a small Dockerfile FROM the built image whose `probe` stage runs inside it (with
runc, as a pod would, as the image's own user) and exports what it found; `probe` never comes from
BuildKit's cache. The first run builds the images (up to 15 minutes with nothing cached, see
DEVELOPMENT.md); later runs reuse them. Run them alone with `pytest -m images`.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from kube import REPO

pytestmark = [
    pytest.mark.alone("builds with BuildKit what the other tests' images come from"),
    pytest.mark.images, pytest.mark.timeout(3600),
]

BUILD = REPO / "images" / "build.sh"
TEST_REQUIREMENTS = REPO / "requirements" / "test.txt"
TAG = re.search(r'^appVersion: *"?([^"\s]+)', (REPO / "charts" / "Chart.yaml").read_text(), re.M).group(1)  # type: ignore[union-attr]
# The operator image runs as this user (images/operator/Dockerfile, the chart's securityContext).
OPERATOR_UID = 65532
# And the trainer image's ranks as this one (images/trainer/Dockerfile), with a home of its own.
TRAINER_UID = 1000

# Runs in the probe stage and writes what it finds to /tmp/probe/result.json.
OPERATOR_PROBE = """
import importlib.metadata, importlib.util, json, os, sys
import ddp_operator.handlers as handlers
writable = os.access("/app", os.W_OK)
result = {
    "uid": os.getuid(), "gid": os.getgid(), "app_writable": writable,
    "foreign": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "boto3", "ddp_trainer")),
    "compiled": os.path.exists(importlib.util.cache_from_source(handlers.__file__)),
    "versions": {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()},
}
os.makedirs("/tmp/probe", exist_ok=True)
json.dump(result, open("/tmp/probe/result.json", "w"))
"""

# Runs the quick-start job (examples/trainer/quickstart.py, which the image ships) as two gloo ranks
# over loopback, each with the image's entrypoint, then records the versions installed.
TRAINER_PROBE = """
import importlib.metadata, json, os, subprocess, sys
os.makedirs("/tmp/probe", exist_ok=True)
env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", WORLD_SIZE="2",
           DDP_PROGRESS_FILE="/tmp/progress.json")
ranks = [subprocess.Popen(["python", "-m", "ddp_trainer", "run", "quickstart:main", "--", "--epochs", "3"],
                          env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
         for r in range(2)]
outputs = [rank.communicate(timeout=600)[0] for rank in ranks]
import getpass, pathlib, torch, torchvision, ddp_trainer.runtime.entrypoint
cache = pathlib.Path.home() / ".cache" / "probe"
cache.mkdir(parents=True)
cache.joinpath("written").write_text("ok")
result = {
    "exit_codes": [rank.returncode for rank in ranks], "outputs": outputs,
    "uid": os.getuid(), "gid": os.getgid(), "user": getpass.getuser(), "home": str(pathlib.Path.home()),
    "home_writable": cache.joinpath("written").read_text() == "ok", "cwd": os.getcwd(),
    "torch_cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
    "versions": {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()},
}
json.dump(result, open("/tmp/probe/result.json", "w"))
"""


def probe(image: str, script: str, tmp_path: Path, run_flags: str = "") -> dict[str, Any]:
    """Runs SCRIPT with python inside IMAGE (as the image's user) and returns what it wrote."""
    (tmp_path / "probe.py").write_text(script)
    (tmp_path / "Dockerfile").write_text(
        f"FROM ddp-operator/{image}:{TAG} AS probe\n"
        "COPY probe.py /tmp/probe.py\n"
        f"RUN {run_flags} python /tmp/probe.py\n"
        "FROM scratch\n"
        "COPY --from=probe /tmp/probe/ /\n"
    )
    done = subprocess.run([BUILD, "probe", image, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp_path / "out" / "result.json").read_text())


def image_config(image: str) -> dict[str, Any]:
    """The image's OCI/docker config, read from the tarball images/build.sh made."""
    done = subprocess.run([BUILD, "tarball", image], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    with tarfile.open(done.stdout.strip()) as tar:
        (manifest,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest["RepoTags"] == [f"ddp-operator/{image}:{TAG}"]
        return json.load(tar.extractfile(manifest["Config"]))["config"]  # type: ignore[arg-type]


def pinned() -> list[Requirement]:
    """The requirements the tests run with (requirements/test.txt)."""
    lines = (line.split("#")[0].strip() for line in TEST_REQUIREMENTS.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def assert_versions_as_pinned(versions: dict[str, str], packages: tuple[str, ...]) -> None:
    """Each of PACKAGES is installed in the image in a version requirements/test.txt allows."""
    wanted = {requirement.name.lower(): requirement for requirement in pinned()}
    for package in packages:
        assert package.lower() in versions, f"{package} is not installed in the image"
        version = versions[package.lower()]
        assert wanted[package.lower()].specifier.contains(version, prereleases=True), (
            f"{package} {version} in the image, requirements/test.txt says {wanted[package.lower()]}")


def test_operator_image_runs_the_operator_as_its_user(tmp_path: Path) -> None:
    config = image_config("operator")
    assert config["Entrypoint"] == ["python", "-m", "ddp_operator"]
    assert config["User"] == f"{OPERATOR_UID}:{OPERATOR_UID}"
    found = probe("operator", OPERATOR_PROBE, tmp_path)
    assert (found["uid"], found["gid"]) == (OPERATOR_UID, OPERATOR_UID)
    assert found["app_writable"] is False
    assert found["foreign"] == [], "the operator image imports part of the trainer side"
    assert found["compiled"], "the operator's modules were not compiled at build time (the root filesystem is read-only)"
    assert_versions_as_pinned(found["versions"], ("kopf", "kubernetes", "PyYAML"))


def test_trainer_image_trains_the_quickstart_job_with_two_ranks(tmp_path: Path) -> None:
    config = image_config("trainer")
    assert config["Entrypoint"] == ["python", "-m", "ddp_trainer"]
    # Numeric, so that the kubelet can check runAsNonRoot (rank pods ask for it by default).
    assert config["User"] == f"{TRAINER_UID}:{TRAINER_UID}"
    # Its own network namespace: the ranks rendezvous on the probe's loopback, not the host's.
    found = probe("trainer", TRAINER_PROBE, tmp_path, run_flags="--network=none")
    assert found["exit_codes"] == [0, 0], "\n".join(found["outputs"])
    accuracy = re.search(r"rank 0/2: accuracy after training ([0-9.]+)", found["outputs"][0])
    assert accuracy, found["outputs"][0]
    assert float(accuracy.group(1)) > 0.5, found["outputs"][0]  # chance is 1/8
    assert found["cuda_available"] is False
    assert (found["uid"], found["gid"], found["user"]) == (TRAINER_UID, TRAINER_UID, "ddp")
    assert found["home"] == found["cwd"] == "/home/ddp" and found["home_writable"] is True
    assert_versions_as_pinned(found["versions"], ("torch", "torchvision", "kubernetes", "PyYAML", "boto3"))
    # The very torch the tests run, not merely one the pin allows.
    assert found["versions"]["torch"] == metadata.version("torch")
    assert found["versions"]["torchvision"] == metadata.version("torchvision")
