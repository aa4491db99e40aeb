"""What keeping the training state in the pod's memory costs a training step (not a test; `make
bench-goodput`).

For a small model (the examples' image classifier, batch 64) and for a state of 1 GB (five 4096x4096
layers and Adam's two moments), one process trains in blocks of --steps steps, alternating blocks without
snapshots and with `CheckpointManager(memory_every=1).snapshot()` after every step, --rounds rounds, and
prints the mean step time of each and the difference: the step-time cost of a snapshot every step. Beside
it, in the same run, the stall of what a user would do instead, per snapshot: torch.save of the state into
/dev/shm, the CPU copy the runtime's asynchronous S3 save makes before it returns, and the ceiling, a copy
of the same bytes into buffers already allocated.

Snapshots go to a directory of their own under /dev/shm (--dir), removed at the end. --no-snapshot-cost
skips this part.

Then (--faults; skip with --no-faults) what faults cost a job on the local cluster's real node, fault-free,
with S3 checkpoints only, with memory snapshots, and through an S3 outage: benchmarks/goodput_faults.py;
--ways runs only some of those ways (`--ways memory` to look at one way's restarts in its logs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / p) for p in ("contract", "images/trainer", "benchmarks")]


@dataclass
class Workload:
    name: str
    model: Any
    optimizer: Any
    batch: Callable[[], tuple[Any, Any]]
    loss: Callable[[Any, Any], Any]

    def step(self) -> None:
        self.optimizer.zero_grad()
        x, y = self.batch()
        self.loss(self.model(x), y).backward()
        self.optimizer.step()

    def state(self) -> dict[str, Any]:
        from ddp_trainer.storage.checkpoint import training_state

        return training_state(self.model, self.optimizer)


def small() -> Workload:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    return Workload("small (examples' classifier, batch 64)", model, torch.optim.Adam(model.parameters()),
                    lambda: (x, y), nn.CrossEntropyLoss())


def one_gb() -> Workload:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4096, 4096) for _ in range(5)])
    x = torch.randn(16, 4096)
    return Workload("1 GB state (5 x Linear(4096, 4096), Adam)", model, torch.optim.Adam(model.parameters()),
                    lambda: (x, x), nn.MSELoss())


def step_times(work: Workload, steps: int, snapshot: Callable[[int], object] | None, first: int) -> list[float]:
    times = []
    for i in range(steps):
        started = time.perf_counter()
        work.step()
        if snapshot is not None:
            snapshot(first + i)
        times.append(time.perf_counter() - started)
    return times


def stall(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def measure(work: Workload, steps: int, rounds: int, directory: Path) -> dict[str, float]:
    import torch

    from ddp_trainer.storage.checkpoint import CheckpointManager
    from ddp_trainer.storage.statebytes import copied_to_cpu, split

    manager = CheckpointManager("s3://unused/bench", rank=0, job_status=False, memory_every=1,
                                memory_dir=directory / "snapshots")
    work.step()  # Adam's state exists from the first step on
    state_bytes = split(work.state()).nbytes
    without: list[float] = []
    with_snapshots: list[float] = []
    step = 1
    for _ in range(rounds):
        without += step_times(work, steps, None, step)
        step += steps
        with_snapshots += step_times(work, steps, lambda s: manager.snapshot(s, work.state), step)
        step += steps
    manager.close()
    plain, snap = statistics.mean(without[1:]), statistics.mean(with_snapshots[1:])
    buffers = [torch.empty_like(t) for t in work.model.state_dict().values()]
    buffers += [torch.empty_like(v) for s in work.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    sources = [*work.model.state_dict().values(),
               *(v for s in work.optimizer.state.values() for v in s.values() if torch.is_tensor(v))]

    def ceiling() -> None:
        for out, source in zip(buffers, sources, strict=True):
            out.copy_(source)

    saved = directory / "torch-save.pt"
    return {
        "state_mb": state_bytes / 1e6,
        "step_s": plain,
        "step_with_snapshots_s": snap,
        "cost_per_snapshot_s": snap - plain,
        "cost_percent": 100 * (snap - plain) / plain,
        "peer_torch_save_to_shm_s": stall(lambda: torch.save(work.state(), saved), 3),
        "peer_async_s3_save_stall_s": stall(lambda: copied_to_cpu(work.state()), 3),
        "ceiling_copy_s": stall(ceiling, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps a block")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm", help="where the snapshots go (a directory of their own in it)")
    parser.add_argument("--only", choices=("small", "1gb"), default=None)
    parser.add_argument("--snapshot-cost", action=argparse.BooleanOptionalAction, default=True,
                        help="time the snapshots' cost in this process first")
    parser.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True,
                        help="also the faulted runs on the real node (about 10 minutes a state size)")
    parser.add_argument("--fault-states", default="small,1GB", help="state sizes of the faulted runs")
    parser.add_argument("--fault-count", type=int, default=3, help="faults a faulted run")
    parser.add_argument("--every", type=int, default=20, help="steps between S3 checkpoints in the faulted runs")
    parser.add_argument("--pace", type=float, default=0.25, help="seconds a step of the small state sleeps")
    parser.add_argument("--ways", default=None,
                        help="only these ways of the faulted runs, comma-separated (default: all; goodput needs a"
                             " fault-free one)")
    parser.add_argument("--outage", default="20,20", help="the S3 outage: seconds in, seconds long")
    parser.add_argument("--timeout", type=float, default=600, help="seconds each wait of the faulted runs may take")
    parser.add_argument("--logs", type=Path, default=None,
                        help="keep each faulted run's pod logs (with times) and the operator's log in this folder")
    args = parser.parse_args()
    if args.faults:
        import goodput_faults

        ways = tuple(w.strip() for w in args.ways.split(",")) if args.ways else goodput_faults.WAYS
        unknown = [w for w in ways if w not in goodput_faults.WAYS]
        if unknown:
            parser.error(f"--ways: no way {', '.join(map(repr, unknown))}; the ways: {', '.join(goodput_faults.WAYS)}")
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    directory = Path(tempfile.mkdtemp(prefix="ddp-bench-goodput-", dir=args.dir))
    try:
        print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {args.rounds} rounds of {args.steps} "
              "steps without and with a snapshot every step, alternating")
        for make in (small, one_gb) if args.snapshot_cost else ():
            if args.only and (args.only == "small") != (make is small):
                continue
            work = make()
            found = measure(work, args.steps, args.rounds, directory)
            print(f"\n{work.name}: state {found['state_mb']:.1f} MB")
            print(f"  step without snapshots        {found['step_s'] * 1000:9.2f} ms")
            print(f"  step with a snapshot each     {found['step_with_snapshots_s'] * 1000:9.2f} ms")
            print(f"  cost per snapshot             {found['cost_per_snapshot_s'] * 1000:9.2f} ms "
                  f"({found['cost_percent']:.1f}% of a step)")
            print(f"  peer: torch.save to /dev/shm  {found['peer_torch_save_to_shm_s'] * 1000:9.2f} ms stall")
            print(f"  peer: async S3 save's copy    {found['peer_async_s3_save_stall_s'] * 1000:9.2f} ms stall")
            print(f"  ceiling: copy into buffers    {found['ceiling_copy_s'] * 1000:9.2f} ms")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if args.faults:
        at, length = (float(x) for x in args.outage.split(","))
        found_faults = goodput_faults.measure(args.fault_states.split(","), args.fault_count, args.every, args.pace,
                                              (at, length), args.timeout, args.logs, ways)
        goodput_faults.print_table(found_faults)
    return 0


if __name__ == "__main__":
    sys.exit(main())
