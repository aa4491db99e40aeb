"""The images' Dockerfiles: what they copy suffices, and they pin what the tests run."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from kube import REPO


def test_operator_image_needs_only_what_its_dockerfile_copies(tmp_path: Path) -> None:
    """The Dockerfile copies the operator and the contract, no part of the runtime; that must suffice."""
    dockerfile = (REPO / "images" / "operator" / "Dockerfile").read_text().replace("\\\n", " ")
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            *sources, destination = line.split()[1:]
            target = tmp_path / destination.removeprefix("/app/").rstrip("/")
            for source in sources:
                path = REPO / source
                if path.is_dir():
                    shutil.copytree(path, target)
                else:
                    target.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, target / path.name)
    probe = ("import sys, ddp_operator.handlers; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'boto3', 'ddp_trainer')))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def requirements(text: str) -> dict[str, str]:
    """Requirement lines (comments dropped), by lower-case package name."""
    found = (Requirement(line.split("#")[0]) for line in text.splitlines() if line.split("#")[0].strip())
    return {requirement.name.lower(): str(requirement) for requirement in found}


def pip_installs(dockerfile: str) -> dict[str, str]:
    """What the Dockerfile's RUN steps pip-install, by lower-case package name: the arguments of
    `pip install`, or of `set --` when the step installs "$@"."""
    words = []
    for line in (REPO / dockerfile).read_text().replace("\\\n", " ").splitlines():
        if line.startswith("RUN ") and " pip install " in line:
            listed = line.split(" set -- ", 1)[1].split("&&")[0] if '"$@"' in line else line.split(" pip install ", 1)[1]
            words += [word for word in shlex.split(listed) if not word.startswith("-")]
    return requirements("\n".join(words))


@pytest.mark.parametrize(("dockerfile", "needed"), [
    ("images/operator/Dockerfile", {"kopf", "kubernetes", "pyyaml", "prometheus-client"}),
    ("images/trainer/Dockerfile", {"torch", "torchvision", "boto3", "kubernetes", "pyyaml"}),
    ("examples/frameworks/Dockerfile", {"transformers", "accelerate", "lightning"}),
])
def test_images_pin_the_versions_the_tests_run(dockerfile: str, needed: set[str]) -> None:
    """Every package an image installs is pinned exactly as requirements/test.txt pins it."""
    pins = requirements((REPO / "requirements" / "test.txt").read_text())
    installs = pip_installs(dockerfile)
    assert needed <= installs.keys(), f"{dockerfile} does not install {sorted(needed - installs.keys())}"
    for name, requirement in installs.items():
        assert requirement == pins.get(name), f"{dockerfile} installs {requirement}, requirements/test.txt has {pins.get(name)}"


def test_the_trainer_image_makes_the_runtime_s_command_where_the_operator_looks_for_it(tmp_path: Path) -> None:
    """The RUN step that writes ddp_contract.commands.RUNTIME_BIN, run here with its paths moved (the
    runtime's folder, /opt/ddp, is this checkout's): the script it writes runs the Python the build
    found, with the runtime first on PYTHONPATH whatever a job set there, and whatever comes first on
    PATH when a job runs."""
    from ddp_contract.commands import RUNTIME_BIN

    dockerfile = (REPO / "images" / "trainer" / "Dockerfile").read_text().replace("\\\n", " ")
    step = next(line.removeprefix("RUN ") for line in dockerfile.splitlines() if line.startswith("RUN ") and RUNTIME_BIN in line)
    assert "PYTHONPATH=/opt/ddp$" in step
    written = tmp_path / "ddp-trainer"
    here = f"{REPO / 'images' / 'trainer'}:{REPO / 'contract'}"
    step = step.replace("mkdir -p /opt/ddp/bin && ", "").replace(RUNTIME_BIN, str(written)).replace("/opt/ddp$", f"{here}$")
    subprocess.run(["sh", "-c", step], check=True, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    done = subprocess.run([str(written), "--help"], capture_output=True, text=True,
                          env={"PYTHONPATH": "/elsewhere", "PATH": "/nowhere"})
    assert done.returncode == 0 and "python -m ddp_trainer exec -- CMD" in done.stdout, done.stderr


def test_torch_and_torchvision_are_pinned_to_one_release() -> None:
    """A range (2.14.*) lets the image and the test environment resolve different releases when they are
    built on different days, and their kernels round differently."""
    pins = requirements((REPO / "requirements" / "test.txt").read_text())
    for name in ("torch", "torchvision"):
        version = pins[name].removeprefix(f"{name}==")
        assert pins[name].startswith(f"{name}==") and re.fullmatch(r"\d+\.\d+\.\d+", version), pins[name]


def test_trainer_cuda_base_is_the_torch_the_tests_run() -> None:
    torch = requirements((REPO / "requirements" / "test.txt").read_text())["torch"].removeprefix("torch==").removesuffix(".*")
    trainer = (REPO / "images" / "trainer" / "Dockerfile").read_text()
    assert f"pytorch/pytorch:{torch}" in trainer, f"the trainer's base image is not torch {torch}"
