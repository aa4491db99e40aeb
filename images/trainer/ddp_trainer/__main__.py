"""`python -m ddp_trainer run TARGET [ARGS...]` | `python -m ddp_trainer make-shards ...`."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

USAGE = """usage:
  python -m ddp_trainer run [TARGET] [ARGS...]   run TARGET (module:function, module or script.py;
                                                 default $DDP_ENTRYPOINT) in this rank
  python -m ddp_trainer exec -- CMD [ARGS...]     run a job's command in this pod under the runtime
  python -m ddp_trainer make-shards --help       convert an image folder into indexed tar shards
  python -m ddp_trainer data-worker [--port P]   serve the job's ranks' DataLoader workers here
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        return 2 if not args else 0
    command, rest = args[0], args[1:]
    if command == "run":
        from .runtime.entrypoint import run

        target = rest[0] if rest and not rest[0].startswith("-") else None
        if target is not None:
            rest = rest[1:]
        if rest and rest[0] == "--":
            rest = rest[1:]
        return run(target, rest)
    if command == "exec":
        from .runtime.entrypoint import run_command

        return run_command(rest[1:] if rest[:1] == ["--"] else rest)
    if command == "zygote":  # started by an InPlace pod's supervisor (runtime/zygote.py)
        from .runtime.entrypoint import run as run_rank
        from .runtime.zygote import serve

        return serve(int(rest[0]), run_rank)
    if command == "data-worker":
        from .data.dataworker import main as data_worker_main

        return data_worker_main(rest)
    if command == "make-shards":
        from .data.convert import main as convert_main

        return convert_main(rest)
    print(f"ddp-trainer: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


def cli() -> None:
    """The `ddp-trainer` console script and `python -m ddp_trainer`: main() with the exit-code guard."""
    from .runtime.process_exit import exit_process

    exit_process(main())


if __name__ == "__main__":
    cli()
