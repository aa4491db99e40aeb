"""The images' Dockerfiles: what they copy suffices, and they pin what the tests run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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


def test_images_pin_the_versions_the_tests_run() -> None:
    pins = {name: version.split("#")[0].strip() for name, version in (
        line.split("==", 1) for line in (REPO / "requirements" / "test.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#"))}
    operator = (REPO / "images" / "operator" / "Dockerfile").read_text()
    trainer = (REPO / "images" / "trainer" / "Dockerfile").read_text()
    for package in ("kopf", "kubernetes", "PyYAML", "prometheus-client"):
        assert f"{package}=={pins[package]}" in operator, package
    for package in ("kubernetes", "PyYAML"):
        assert f"{package}=={pins[package]}" in trainer, package
    torch = pins["torch"].removesuffix(".*")
    assert f"pytorch/pytorch:{torch}" in trainer, f"the trainer's base image is not torch {torch}"
