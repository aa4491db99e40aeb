"""What a rank runs: $DDP_ENTRYPOINT or a target, its arguments, a script's function and the context."""

from __future__ import annotations

from pathlib import Path

from trainerhelp import describe as _describe
from trainerhelp import launch

from ddp_trainer.errors import ExitCode


def test_operator_command_form_runs_ddp_entrypoint_with_args(tmp_path: Path) -> None:
    # `python -m ddp_trainer run -- ARGS`, target from DDP_ENTRYPOINT: here a script that checks
    # its argv and the process group, then exits with its own code.
    script = tmp_path / "job.py"
    script.write_text(
        "import sys, torch.distributed as dist\n"
        "import ddp_trainer\n"
        "assert dist.is_initialized() and dist.get_world_size() == 1, 'no process group'\n"
        "assert ddp_trainer.context().rank == 0\n"
        "print('argv', sys.argv[1:])\n"
        "sys.exit(int(sys.argv[-1]))\n"
    )
    (result,) = launch(None, 1, {"DDP_ENTRYPOINT": str(script)}, args=["--lr", "0.1", "3"])
    assert result.returncode == 3, result.stderr
    assert "argv ['--lr', '0.1', '3']" in result.stdout
    (missing,) = launch(None, 1, {})
    assert missing.returncode == ExitCode.CONFIG_ERROR
    assert "set DDP_ENTRYPOINT" in missing.stderr


def test_a_script_s_function_runs_with_the_modules_beside_it_and_the_context(tmp_path: Path) -> None:
    """`script.py:function` (what ddp_client.submit("train.py:train") ships): the script is imported,
    not run as __main__, the modules beside it import, and a one-argument function gets the context."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (code / "train.py").write_text(
        "import torch.distributed as dist\nimport helpers\n\n"
        "print('imported as', __name__)\n\n"
        "def train(ctx):\n"
        "    t = __import__('torch').tensor([float(helpers.double(ctx.rank + 1))])\n"
        "    dist.all_reduce(t)\n"
        "    print('sum', int(t.item()), 'rank', ctx.rank, flush=True)\n")
    results = launch(f"{code}/train.py:train", 2)
    assert [r.returncode for r in results] == [0, 0], _describe(results)
    for result in results:
        assert "imported as train" in result.stdout and f"sum 6 rank {result.rank}" in result.stdout
    (missing,) = launch(f"{code}/train.py:nope", 1)
    assert missing.returncode == ExitCode.CONFIG_ERROR
    assert f"script '{code}/train.py' has no function 'nope'" in missing.stderr
