"""What reading a rank's output for metric lines and progress bars costs: `make bench-printscan`.

A rank prints LINES_PER_SECOND lines a second for --seconds, a --metric-share of them metric lines
(Hugging Face's dict form, the slower to read) and the rest plain log lines, and redraws --bars tqdm
bars BAR_UPDATES_PER_SECOND times a second each (tqdm's default refresh), on stderr after carriage
returns as tqdm does. It runs as an entrypoint (`--via run`: the rank's own tee) or as a job's command
under the runtime (`--via exec`: the runtime's process tees the command's pipes); either way its output
is kept in S3 on a loopback server. The same rank runs with recognition on and off
($DDP_METRICS_FROM_OUTPUT), --runs times each, alternating; the figure is the difference of the CPU time
(user + system, the command's included) per second of printing, as a share of one core. The scanner
alone (LineScanner and what a recognised line or bar does) is timed too, per line.

    make bench-printscan BENCH_ARGS="--seconds 20 --metric-share 0.1,1.0 --bars 2 --via run,exec"
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RANK_PATH = [str(REPO / p) for p in ("contract", "images/trainer", "benchmarks")]  # what the rank imports
sys.path[:0] = [str(REPO / "localcluster"), *RANK_PATH]
import demo  # noqa: E402

LINES_PER_SECOND = 1000
BAR_UPDATES_PER_SECOND = 10
PLAIN = "2026-11-24 10:00:00 INFO trainer: batch 1234 read from shard-000017.tar in 0.8 ms, queue depth 4"
BUCKET = "bench"


def chatter(_ctx: object = None) -> None:
    """The rank: PRINT_SECONDS of LINES_PER_SECOND lines, PRINT_SHARE of them metric lines, and PRINT_BARS
    bars redrawn BAR_UPDATES_PER_SECOND times a second each, on schedule."""
    seconds, share, bars = float(os.environ["PRINT_SECONDS"]), float(os.environ["PRINT_SHARE"]), int(os.environ["PRINT_BARS"])
    every = round(1 / share) if share > 0 else 0
    redraw = LINES_PER_SECOND // BAR_UPDATES_PER_SECOND
    start = time.monotonic()
    for i in range(int(seconds * LINES_PER_SECOND)):
        if every and i % every == 0:
            print({"loss": 1 / (i + 1), "grad_norm": 0.5, "learning_rate": 5e-05, "epoch": i / 1000})
        else:
            print(PLAIN)
        if bars and i % redraw == 0:
            sys.stderr.write("".join(bar_drawing(b, i // redraw, int(seconds * BAR_UPDATES_PER_SECOND)) for b in range(bars)))
            sys.stderr.flush()
        if i % 100 == 99:
            time.sleep(max(0.0, start + (i + 1) / LINES_PER_SECOND - time.monotonic()))
    sys.stdout.flush()


def bar_drawing(bar: int, n: int, total: int) -> str:
    """One redrawing of tqdm's bar `bar` at n of total, as tqdm writes it (a carriage return first)."""
    done = int(10 * n / total)
    desc = "Epoch 3" if bar == 0 else f"batches {bar}"
    left = (total - n) // BAR_UPDATES_PER_SECOND
    return (f"\r{desc}: {100 * n // total:3d}%|{'#' * done}{' ' * (10 - done)}| {n}/{total} "
            f"[00:{n // BAR_UPDATES_PER_SECOND % 60:02d}<{left // 60:02d}:{left % 60:02d}, 10.00it/s, loss={1 / (n + 1):.3f}]")


def rank_cpu(scan: bool, seconds: float, share: float, endpoint: str, tmp: str, bars: int = 0,
             via: str = "run") -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one rank: its process (and, via exec, the command's under it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(RANK_PATH), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "DDP_BACKEND": "gloo", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "DDP_JOB_NAME": "bench",
           "DDP_RESULTS_URI": f"s3://{BUCKET}/runs", "DDP_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
           "DDP_PROGRESS_FILE": f"{tmp}/progress.json", "DDP_METRICS_FROM_OUTPUT": "true" if scan else "false",
           "PRINT_SECONDS": str(seconds), "PRINT_SHARE": str(share), "PRINT_BARS": str(bars),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    command = (["run", "bench_printscan:chatter"] if via == "run" else
               ["exec", "--", "python", "-c", "import bench_printscan; bench_printscan.chatter()"])
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ddp_trainer", *command], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    said = proc.stderr.read()  # (a rank that prints to stdout only writes little here: read to the end)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"the rank exited {proc.returncode}: {said.decode(errors='replace')[-2000:]}")
    return usage.ru_utime + usage.ru_stime, time.monotonic() - started


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scanner_per_line(share: float, bars: int, lines: int = 200_000) -> float:
    """Microseconds per line through LineScanner and PrintedMetrics (no status, no S3), with `bars` bars
    redrawn BAR_UPDATES_PER_SECOND times per LINES_PER_SECOND lines."""
    from ddp_contract.metriclines import LineScanner
    from ddp_trainer.runtime.printedmetrics import PrintedMetrics

    printed = PrintedMetrics(None, None)
    scanner = LineScanner(printed.record, printed.record_bar)
    every = round(1 / share) if share > 0 else 0
    redraw = LINES_PER_SECOND // BAR_UPDATES_PER_SECOND
    chunk = "".join((str({"loss": 0.5, "grad_norm": 0.5, "learning_rate": 5e-05, "epoch": 0.1}) + "\n"
                     if every and i % every == 0 else PLAIN + "\n")
                    + ("".join(bar_drawing(b, i // redraw, 100) for b in range(bars)) if i % redraw == 0 else "")
                    for i in range(1000)).encode()
    started = time.perf_counter()
    for _ in range(lines // 1000):
        scanner.feed(chunk)
    return (time.perf_counter() - started) / lines * 1e6


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the rank prints")
    parser.add_argument("--metric-share", default="0.1,1.0", help="shares of metric lines, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--bars", type=int, default=2, help=f"tqdm bars, each redrawn {BAR_UPDATES_PER_SECOND} times a second")
    parser.add_argument("--via", default="run,exec", help="run (an entrypoint), exec (a command under the runtime)")
    args = parser.parse_args(argv)
    print(f"[printscan] {LINES_PER_SECOND} lines/s and {args.bars} bars at {BAR_UPDATES_PER_SECOND}/s for "
          f"{args.seconds:g} s, {args.runs} runs each way, {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}", flush=True)
    print("| rank | metric lines | CPU s/s, scan off (median) | CPU s/s, scan on (median) | scan's share of one core | "
          "scanner alone, per line |\n|---|---|---|---|---|---|")
    with demo.s3_server(0, buckets=(BUCKET,)) as endpoint, tempfile.TemporaryDirectory() as tmp:
        for via in args.via.split(","):
            for share in (float(s) for s in args.metric_share.split(",")):
                rates: dict[bool, list[float]] = {True: [], False: []}
                for _ in range(args.runs):
                    for scan in (False, True):
                        cpu, _ = rank_cpu(scan, args.seconds, share, endpoint, tmp, args.bars, via)
                        rates[scan].append(cpu / args.seconds)
                off, on = statistics.median(rates[False]), statistics.median(rates[True])
                print(f"| {via} | {share:.0%} | {off:.3f} | {on:.3f} | {on - off:+.2%} | "
                      f"{scanner_per_line(share, args.bars):.2f} µs |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
