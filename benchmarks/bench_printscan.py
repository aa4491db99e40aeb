"""What reading a rank's output for metric lines costs: `make bench-printscan`.

A rank (the runtime, one gloo process) prints LINES_PER_SECOND lines a second for --seconds, a
--metric-share of them metric lines (Hugging Face's dict form, the slower to read) and the rest plain
log lines; its output goes through the runtime's tee (kept in S3 on a loopback server in both runs).
The same rank runs with recognition on and off ($DDP_METRICS_FROM_OUTPUT), --runs times each,
alternating; the figure is the difference of the process's CPU time (user + system) per second of
printing, as a share of one core. The scanner alone (LineScanner and what a recognised line does)
is timed too, per line.

    make bench-printscan BENCH_ARGS="--seconds 20 --metric-share 0.1,1.0"
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
PLAIN = "2026-11-24 10:00:00 INFO trainer: batch 1234 read from shard-000017.tar in 0.8 ms, queue depth 4"
BUCKET = "bench"


def chatter(_ctx: object) -> None:
    """The rank: PRINT_SECONDS of LINES_PER_SECOND lines, PRINT_SHARE of them metric lines, on schedule."""
    seconds, share = float(os.environ["PRINT_SECONDS"]), float(os.environ["PRINT_SHARE"])
    every = round(1 / share) if share > 0 else 0
    start = time.monotonic()
    for i in range(int(seconds * LINES_PER_SECOND)):
        if every and i % every == 0:
            print({"loss": 1 / (i + 1), "grad_norm": 0.5, "learning_rate": 5e-05, "epoch": i / 1000})
        else:
            print(PLAIN)
        if i % 100 == 99:
            time.sleep(max(0.0, start + (i + 1) / LINES_PER_SECOND - time.monotonic()))
    sys.stdout.flush()


def rank_cpu(scan: bool, seconds: float, share: float, endpoint: str, tmp: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one rank process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(RANK_PATH), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
           "DDP_BACKEND": "gloo", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "DDP_JOB_NAME": "bench",
           "DDP_RESULTS_URI": f"s3://{BUCKET}/runs", "DDP_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY,
           "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1",
           "DDP_PROGRESS_FILE": f"{tmp}/progress.json", "DDP_METRICS_FROM_OUTPUT": "true" if scan else "false",
           "PRINT_SECONDS": str(seconds), "PRINT_SHARE": str(share)}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ddp_trainer", "run", "bench_printscan:chatter"], env=env,
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


def scanner_per_line(share: float, lines: int = 200_000) -> float:
    """Microseconds per line through LineScanner and PrintedMetrics.record (no status, no S3)."""
    from ddp_contract.metriclines import LineScanner
    from ddp_trainer.runtime.printedmetrics import PrintedMetrics

    printed = PrintedMetrics(None, None)
    scanner = LineScanner(printed.record)
    every = round(1 / share) if share > 0 else 0
    chunk = "".join(str({"loss": 0.5, "grad_norm": 0.5, "learning_rate": 5e-05, "epoch": 0.1}) + "\n"
                    if every and i % every == 0 else PLAIN + "\n" for i in range(1000)).encode()
    started = time.perf_counter()
    for _ in range(lines // 1000):
        scanner.feed(chunk)
    return (time.perf_counter() - started) / lines * 1e6


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the rank prints")
    parser.add_argument("--metric-share", default="0.1,1.0", help="shares of metric lines, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"[printscan] {LINES_PER_SECOND} lines/s for {args.seconds:g} s, {args.runs} runs each way, "
          f"{os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}", flush=True)
    print("| metric lines | CPU s/s, scan off (median) | CPU s/s, scan on (median) | scan's share of one core | "
          "scanner alone, per line |\n|---|---|---|---|---|")
    with demo.s3_server(0, buckets=(BUCKET,)) as endpoint, tempfile.TemporaryDirectory() as tmp:
        for share in (float(s) for s in args.metric_share.split(",")):
            rates: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.runs):
                for scan in (False, True):
                    cpu, _ = rank_cpu(scan, args.seconds, share, endpoint, tmp)
                    rates[scan].append(cpu / args.seconds)
            off, on = statistics.median(rates[False]), statistics.median(rates[True])
            print(f"| {share:.0%} | {off:.3f} | {on:.3f} | {on - off:+.2%} | {scanner_per_line(share):.2f} µs |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
