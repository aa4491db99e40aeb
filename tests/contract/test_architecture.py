"""ARCHITECTURE.md names what exists: every path and module it names is in the tree, and its layout table has
a row for every top-level folder, naming every script and benchmark."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEXT = (REPO / "ARCHITECTURE.md").read_text()
# Backticked words of the layout's package rows that name no module: a spec field the row speaks of.
NOT_MODULES = {"entrypoint"}


def layout_rows() -> dict[str, str]:
    """The layout table: path -> what it holds."""
    return dict(re.findall(r"^\| `([\w./-]+/)` \| (.*) \|$", TEXT, re.M))


def tracked_top_level() -> set[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {line.split("/")[0] for line in listed.splitlines() if "/" in line}


def test_every_path_named_exists() -> None:
    """A backticked path (`runtime/rankexit`, `tests/fakekube.py`, `go/kwok/*.patch`): the file or folder, found
    from the repository's root or below it, with or without `.py`."""
    paths = {t for t in re.findall(r"`([^`\s]+)`", TEXT)
             if "/" in t and not t.startswith(("/", "http")) and "<" not in t and re.fullmatch(r"[\w.*-]+(/[\w.*-]*)+", t)}
    missing = [path for path in sorted(paths)
               if not any(REPO.glob(pattern) for pattern in (path.rstrip("/"), f"**/{path.rstrip('/')}",
                                                                  f"**/{path.rstrip('/')}.py"))]
    assert paths and missing == []


@pytest.mark.parametrize("package", ["contract/ddp_contract/", "operator/ddp_operator/", "client/ddp_client/"])
def test_every_module_a_package_s_row_names_exists(package: str) -> None:
    names = set(re.findall(r"`([a-z_]+)/?`", layout_rows()[package])) - NOT_MODULES
    base = REPO / package
    missing = [n for n in sorted(names) if not any(base.rglob(f"{n}.py")) and not any(p.is_dir() for p in base.rglob(n))]
    assert names and missing == []


def test_the_layout_has_a_row_for_every_top_level_folder() -> None:
    rows = {path.split("/")[0] for path in layout_rows()}
    assert sorted(tracked_top_level() - rows) == []


@pytest.mark.parametrize("folder", ["scripts", "benchmarks"])
def test_the_layout_names_every_script_and_benchmark(folder: str) -> None:
    row = layout_rows()[f"{folder}/"]
    assert sorted(p.name for p in (REPO / folder).iterdir() if p.is_file() and f"`{p.name}`" not in row) == []
