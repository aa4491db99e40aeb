"""scripts/venv.sh: one virtualenv per requirements, made once even when callers start together."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from kube import REPO


def test_callers_starting_together_share_one_creation(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "requirements").mkdir()
    shutil.copy(REPO / "scripts" / "venv.sh", clone / "scripts" / "venv.sh")
    (clone / "requirements" / "test.txt").write_text("# nothing to install\n")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "DDP_CACHE": str(tmp_path / "cache"),
           "PYTHON": shutil.which("python3") or "python3"}
    callers = [subprocess.Popen(["bash", str(clone / "scripts" / "venv.sh")], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(3)]
    answers = [caller.communicate(timeout=120) for caller in callers]
    assert [caller.returncode for caller in callers] == [0, 0, 0], answers
    paths = {out.strip() for out, _ in answers}
    assert len(paths) == 1 and (Path(paths.pop()) / ".complete").exists(), answers
    assert sum(err.count("[venv] creating") for _, err in answers) == 1, answers
