"""Kept folders (spec.keepFolders) against a real S3 server: how fast a folder goes up and comes back, next
to the server's raw PUT and GET rate, and what keeping it does to a training step (not a test;
`make bench-kept`).

The folder is a Hugging Face-like checkpoint: checkpoint-1/ with model.safetensors (--size-mb),
optimizer.pt (twice that) and small files, on disk. Rows, each round running every row once (--repeat
rounds, a row's best wall time shown):
- ceiling: the large files as objects through the AWS CRT from memory (parts in parallel; the runtime's
  put_large) and through boto3's upload_file (8 threads) from the file; back through parallel ranged GETs
  (the runtime's ReadAhead) to a file;
- ours: the keeper's last pass of the whole folder (FolderKeeper.finish), and a new pod's restore of it.
Then the training step: a CPU loop (matmuls on one thread) in a child process, timed alone and while the
keeper uploads the folder, as in a pod, where the keeper is the process that started the rank's.

S3 is SeaweedFS on loopback (localcluster/s3server.py), or DDP_S3_ENDPOINT with AWS_* credentials; on one
machine the server's own CPU and disk count against both.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / p) for p in ("localcluster", "contract", "images/trainer", "benchmarks")]
from bench_checkpoint import Row, new_bucket, s3_endpoint, timed  # noqa: E402

STEP_LOOP = """
import sys, time, torch
torch.set_num_threads(1)
a = torch.randn(384, 384)
steps, times = int(sys.argv[1]), []
for _ in range(steps):
    started = time.perf_counter()
    for _ in range(8):
        a = torch.tanh(a @ a)
    times.append(time.perf_counter() - started)
times.sort()
print(sum(times) / len(times), times[len(times) // 2])
"""


def make_folder(root: Path, size_mb: int) -> int:
    """A checkpoint folder like Trainer's; returns its bytes."""
    folder = root / "checkpoint-1"
    folder.mkdir(parents=True)
    block = os.urandom(1 << 20)
    for name, mb in (("model.safetensors", size_mb), ("optimizer.pt", 2 * size_mb)):
        with open(folder / name, "wb") as out:
            for _ in range(mb):
                out.write(block)
    for i in range(8):
        (folder / f"rng_state_{i}.pth").write_bytes(os.urandom(16 * 1024))
    (folder / "trainer_state.json").write_text('{"global_step": 1}')
    return sum(p.stat().st_size for p in folder.iterdir())


def step_times(steps: int) -> tuple[float, float]:
    """(mean, median) seconds per step of STEP_LOOP in a child process."""
    done = subprocess.run([sys.executable, "-c", STEP_LOOP, str(steps)], capture_output=True, text=True, check=True)
    mean, median = done.stdout.split()
    return float(mean), float(median)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=512, help="model.safetensors; optimizer.pt is twice it")
    parser.add_argument("--repeat", type=int, default=2, help="rounds; each row's best is shown")
    parser.add_argument("--steps", type=int, default=300, help="training steps timed, with and without keeping")
    args = parser.parse_args()

    from ddp_trainer.runtime.folderkeeper import FolderKeeper, KeptFolder
    from ddp_trainer.storage import crtupload, readahead, s3
    from ddp_trainer.storage.keptstore import KeptStore

    work = Path(tempfile.mkdtemp(prefix="bench-kept-", dir=os.environ.get("BENCH_DIR")))
    try:
        source = work / "out"
        size = make_folder(source, args.size_mb)
        big = [source / "checkpoint-1" / name for name in ("model.safetensors", "optimizer.pt")]
        big_bytes = sum(p.stat().st_size for p in big)
        with s3_endpoint() as endpoint:
            bucket = new_bucket("bench-kept")
            print(f"== a {size / 1e6:.0f} MB checkpoint folder ({', '.join(p.name for p in big)} and 9 small files); "
                  f"endpoint {endpoint}, bucket {bucket}; best of {args.repeat} rounds", flush=True)
            counter = iter(range(1_000_000))

            def keeper(local: Path, key: str) -> FolderKeeper:
                store = KeptStore(s3.S3Url(bucket, key), "bench")
                return FolderKeeper([KeptFolder("out", str(local), store)], interval_s=3600)

            def keep_folder() -> None:
                keeper(source, f"keep-{next(counter)}/out").finish(ended_cleanly=True, upload_s=3600)

            keeper(source, "restore/out").finish(ended_cleanly=True, upload_s=3600)

            def restore_folder() -> None:
                target = work / f"restored-{next(counter)}"
                keeper(target, "restore/out").restore()
                shutil.rmtree(target)

            in_memory = {path.name: path.read_bytes() for path in big}

            def put_files(how: str) -> None:
                for path in big:
                    url = s3.S3Url(bucket, f"raw-{how}/{path.name}")
                    if how == "crt":
                        s3.put_large(url, in_memory[path.name])
                    else:
                        s3.client().upload_file(str(path), url.bucket, url.key)

            put_files("get")

            def get_files() -> None:
                for path in big:
                    readahead.download(s3.S3Url(bucket, f"raw-get/{path.name}"), str(work / "got"))
                    os.unlink(work / "got")

            rows = [Row("ceiling: PUT from memory, AWS CRT", timed(lambda: put_files("crt"))),
                    Row("ceiling: PUT from file, boto3", timed(lambda: put_files("boto3"))),
                    Row("ceiling: ranged GETs to file", timed(get_files)),
                    Row("ours: keep the folder (last pass)", timed(keep_folder)),
                    Row("ours: restore it in a new pod", timed(restore_folder))]
            if not crtupload.available():
                rows = rows[1:]
            for round_ in range(args.repeat):
                for row in rows:
                    row.measure()
                print(f"round {round_ + 1}: " + ", ".join(f"{row.name} {row.walls[-1]:.2f} s" for row in rows), flush=True)

            alone = step_times(args.steps)
            uploading = threading.Thread(target=lambda: [keep_folder() for _ in range(3)], daemon=True)
            uploading.start()
            busy = step_times(args.steps)
            uploading.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{'path':<38} {'MB/s':>7} {'s':>6} {'client CPU-s/GB':>16}")
    for row in rows:
        moved = big_bytes if row.name.startswith("ceiling") else size
        wall = min(row.walls)
        print(f"{row.name:<38} {moved / 1e6 / wall:>7.1f} {wall:>6.2f} {min(row.cpus) / (moved / 1e9):>16.2f}")
    rate = {row.name: (big_bytes if row.name.startswith("ceiling") else size) / min(row.walls) for row in rows}
    put = max(v for k, v in rate.items() if k.startswith("ceiling: PUT"))
    print(f"keep: {rate['ours: keep the folder (last pass)'] / put:.2f}x the raw PUT; "
          f"restore: {rate['ours: restore it in a new pod'] / rate['ceiling: ranged GETs to file']:.2f}x the raw GET")
    print(f"training step (one thread): {alone[0] * 1000:.1f} ms mean, {alone[1] * 1000:.1f} ms median alone; "
          f"{busy[0] * 1000:.1f} ms mean, {busy[1] * 1000:.1f} ms median while the folder was kept "
          f"({busy[0] / alone[0]:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
