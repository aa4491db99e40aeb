"""The runtime around real Hugging Face Trainer and Lightning scripts (examples/frameworks/, the packages
pinned in requirements/test.txt), as a job's command and as its entrypoint, one rank a run: when the run
succeeds, rank 0's progress says its last step of the run's 64, complete. These runs are fast (64 steps
in about a second), so the trainers' last steps come within the rate limits of their messages and of
the reporter: their last state must still reach the status."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from trainerhelp import ROOT, rank_env

from ports import free_port

FRAMEWORKS = ROOT / "examples" / "frameworks"
STEPS = 64
# 2048 points in batches of 32, one epoch; 256 sequences in batches of 8, two epochs: 64 steps each.
LIGHTNING = ["--epochs", "1"]
HUGGING_FACE = ["--samples", "256", "--epochs", "2"]
LOGGED_LOSS = re.compile(r"'loss': '([-0-9.e]+)'")  # transformers 5's log dicts: numbers as strings


def run_rank(how: list[str], tmp_path: Path) -> tuple[dict, str]:
    """`python -m ddp_trainer <how>` as one rank, in the frameworks' folder: its last progress record, its output."""
    progress = tmp_path / "progress.json"
    env = rank_env({"DDP_JOB_NAME": "frameworks", "DDP_PROGRESS_FILE": str(progress),
                    "DDP_PROGRESS_INTERVAL_SECONDS": "1", "NODE_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, 0, 1, free_port())
    env["PYTHONPATH"] = f"{FRAMEWORKS}:{env['PYTHONPATH']}"
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    done = subprocess.run([sys.executable, "-m", "ddp_trainer", *how], env=env, cwd=FRAMEWORKS, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f'"global_step": {STEPS}' in done.stdout, done.stdout[-2000:]  # the script's own word: 64 steps run
    return json.loads(progress.read_text()), done.stdout


@pytest.mark.parametrize(("how", "epochs"), [
    pytest.param(["exec", "--", "python", "lightning_train.py", *LIGHTNING], 1, id="lightning-command"),
    pytest.param(["exec", "--", "python", "lightning_train.py", *LIGHTNING, "--no-bar"], 1, id="lightning-command-no-bar"),
    pytest.param(["run", "lightning_train:main", "--", *LIGHTNING], 1, id="lightning-entrypoint"),
    pytest.param(["exec", "--", "python", "hf_trainer.py", *HUGGING_FACE], 2, id="hf-command"),
    pytest.param(["run", "hf_trainer:main", "--", *HUGGING_FACE, "--no-bar"], 2, id="hf-entrypoint-no-bar"),
])
def test_a_trainer_that_ran_to_its_end_shows_its_last_step_complete(how: list[str], epochs: int, tmp_path: Path) -> None:
    hugging_face = any("hf_trainer" in part for part in how)
    if hugging_face:
        how = [*how, "--output-dir", str(tmp_path / "out")]
    last, out = run_rank(how, tmp_path)
    # The epochs done, the last step, all of the run, no time left.
    assert (last["epoch"], last["step"], last["percent"], last["remainingSeconds"], last["remaining"]) == \
        (epochs, STEPS, 100.0, 0, "0s"), last
    if hugging_face:  # the loss of the last log dict, which the Trainer prints after its last step's
        assert last["loss"] == float(LOGGED_LOSS.findall(out)[-1]), (last, out[-2000:])
    else:
        assert last["loss"] is not None, last
