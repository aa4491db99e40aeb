"""What training code imports: every public name from `ddp_trainer`, the modules it is documented to
import by path, and `python -m ddp_trainer`."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib

from trainerhelp import ROOT, rank_env

import ddp_trainer


def test_every_public_name_is_importable_from_the_package() -> None:
    missing = [name for name in ddp_trainer.__all__ if getattr(ddp_trainer, name, None) is None]
    assert missing == []


def test_the_modules_the_examples_import_by_name_are_where_they_say() -> None:
    from ddp_trainer import urls
    from ddp_trainer.env import dataset_uri
    from ddp_trainer.errors import ObjectNotFoundError

    assert urls is importlib.import_module("ddp_trainer.storage.urls")
    assert callable(dataset_uri) and issubclass(ObjectNotFoundError, ddp_trainer.errors.StorageError)


def test_python_m_ddp_trainer_names_its_commands() -> None:
    result = subprocess.run([sys.executable, "-m", "ddp_trainer", "--help"], env=rank_env({}, 0, 1, 1), cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "python -m ddp_trainer run" in result.stdout and "make-shards" in result.stdout


def test_an_installed_runtime_has_every_room() -> None:
    """pyproject.toml lists its packages one by one: a subpackage it leaves out is missing from the wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    source = ROOT / setuptools["package-dir"]["ddp_trainer"]
    packages = {".".join(("ddp_trainer", *init.parent.relative_to(source).parts)) for init in source.rglob("__init__.py")}
    assert packages <= set(setuptools["packages"])
