"""images/build.sh refuses what it cannot push before it builds or starts anything."""

from __future__ import annotations

import os
import subprocess

import pytest

from kube import REPO


def push(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "images/build.sh", "push", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=30)


@pytest.mark.parametrize("compression", ["xz", "GZIP", "zstd,gzip"])
def test_a_compression_other_than_zstd_or_gzip_is_refused_by_name(compression: str) -> None:
    result = push("registry.example.com/ml", PUSH_COMPRESSION=compression)
    assert result.returncode != 0
    assert f"PUSH_COMPRESSION must be zstd or gzip, got '{compression}'" in result.stderr, result.stderr


def test_a_registry_with_a_scheme_is_refused_by_name() -> None:
    result = push("https://registry.example.com/ml")
    assert result.returncode != 0
    assert "REGISTRY must look like host[:port][/path] (no scheme), got 'https://registry.example.com/ml'" \
        in result.stderr, result.stderr
