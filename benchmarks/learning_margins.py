"""How far every workload whose test checks that a model learned clears that test's bar, over seeds
and thread counts: `make bench-learning` (BENCH_ARGS="--seeds 5 --threads 1,2 --only shards").

A learning test holds on any machine only if no machine can move the outcome to its bar. Another
CPU, thread count or torch build changes training by rounding alone (a different summation order
in a kernel, a different vector width), and the trajectory that rounding steers stays inside the
spread of trajectories that other seeds give: a seed changes the initial weights and the data order
by far more than a rounding error does. So each workload runs here as the tests run it (two gloo
ranks on loopback, one thread a rank unless --threads says otherwise, S3 on a loopback moto server)
at every seed and thread count, and the table shows the worst outcome next to the bar.

Outcomes: `acc` the held-out accuracy (the bar: above it), `loss` the loss at the end over the loss
at the start (the bar: below it), each measured the way the workload's test measures it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / p) for p in ("localcluster", "tests/trainer", "contract", "images/trainer", "examples")]
from trainerhelp import RankResult, describe, launch  # noqa: E402

import datagen  # noqa: E402
import demo  # noqa: E402
import example  # noqa: E402

BUCKET = "ddp-examples"  # the examples' own bucket; the quick start and demo workloads use it too


@dataclass(frozen=True)
class Bar:
    """One assertion of a test: `outcome` (acc or loss) above or below `value`."""

    outcome: str
    value: float
    test: str

    def cleared(self, measured: float) -> bool:
        return measured > self.value if self.outcome == "acc" else measured < self.value

    def margin(self, measured: float) -> float:
        """How far past the bar, as a fraction of it (negative: short of it)."""
        return (measured - self.value) / self.value if self.outcome == "acc" else (self.value - measured) / self.value


@dataclass
class Workload:
    name: str
    target: str
    args: list[str]
    bars: list[Bar]
    measure: Callable[[list[RankResult], str], dict[str, float]]
    env: dict[str, str] = field(default_factory=dict)


def _stdout_accuracy(results: list[RankResult], pattern: str) -> float:
    found = re.search(pattern, results[0].stdout)
    if found is None:
        raise ValueError(f"no accuracy in rank 0's output:\n{describe(results)}")
    return float(found.group(1))


def _epoch_losses(said: str, field_index: int) -> list[float]:
    return [float(line.split()[field_index]) for line in said.splitlines() if line.startswith("epoch ")]


def quickstart_outcomes(results: list[RankResult], _: str) -> dict[str, float]:
    losses = _epoch_losses(results[0].stdout, -1)
    return {"acc": _stdout_accuracy(results, r"accuracy after training ([0-9.]+)"), "loss": losses[-1] / losses[0]}


def demo_outcomes(results: list[RankResult], _: str) -> dict[str, float]:
    losses = _epoch_losses(results[0].stdout, 3)
    return {"acc": _stdout_accuracy(results, r"held-out images after training: ([0-9.]+)"), "loss": losses[-1] / losses[0]}


def example_outcomes(endpoint: str, job: str) -> dict[str, float]:
    """As tests/e2e/test_examples.py measures an example: metrics and eval.json in S3."""
    s3 = demo.s3_client(endpoint)
    prefix = f"results/default/{job}/"
    start, end = example.loss_ends(example.metrics(s3, BUCKET, prefix))
    outcomes = {"loss": end / start}
    try:
        evaluation = example.result_json(s3, BUCKET, prefix, "eval.json")
    except s3.exceptions.NoSuchKey:
        return outcomes  # petnames: no classifier
    outcomes["acc"] = evaluation["accuracy"] / evaluation["chance"]
    return outcomes


def workloads() -> list[Workload]:
    learned = Bar("loss", example.LEARNED_LOSS_RATIO, "tests/e2e/test_examples.py")
    above_chance = Bar("acc", example.ABOVE_CHANCE, "tests/e2e/test_examples.py (x chance)")
    demo_spec = yaml.safe_load((REPO / "examples" / "ddpjob-demo.yaml").read_text())["spec"]
    found: list[Workload] = [
        Workload("quickstart, 3 epochs", "quickstart:main", ["--epochs", "3"],
                 [Bar("acc", 0.5, "tests/images/test_images.py")], quickstart_outcomes),
        Workload("quickstart, 4 epochs", "quickstart:main", ["--epochs", "4"],
                 [Bar("acc", 0.8, "tests/trainer/test_example.py"), Bar("loss", 0.5, "tests/trainer/test_example.py")],
                 quickstart_outcomes),
        Workload("quickstart (examples/ddpjob.yaml)", "quickstart:main", ["--epochs", "8"],
                 [Bar("acc", 0.9, "tests/e2e/test_containers.py")], quickstart_outcomes),
        Workload("demo (examples/ddpjob-demo.yaml)", demo_spec["entrypoint"], list(demo_spec["args"]),
                 [Bar("acc", 0.9, "tests/trainer/test_example.py"), Bar("loss", 0.25, "tests/trainer/test_example.py")],
                 demo_outcomes, {"DDP_DATASET_URI": f"s3://{BUCKET}/shapes"}),
    ]
    for name in example.NAMES:
        spec = example.load_job(name)["spec"]
        bars = [learned] if name == "petnames" else [learned, above_chance]
        extra = {e["name"]: e["value"] for e in spec.get("env", [])}
        found.append(Workload(f"examples/{name}", spec["entrypoint"], list(spec.get("args", [])), bars,
                              lambda _r, job: {}, {"DDP_DATASET_URI": spec["s3"]["dataset"], **extra}))
        if name == "shards":
            found.append(Workload("examples/shards --stream", spec["entrypoint"], [*spec["args"], "--stream"], bars,
                                  lambda _r, job: {}, {"DDP_DATASET_URI": spec["s3"]["dataset"], **extra}))
    return found


def prepare_data(endpoint: str, chosen: Sequence[Workload]) -> None:
    """Each example's data step, as its test runs it, and the demo's image folder."""
    env = example.data_step_env(endpoint)
    os.environ.update({k: env[k] for k in ("DDP_S3_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    for name in example.NAMES:
        if any(w.name.startswith(f"examples/{name}") for w in chosen):
            print(f"[learning] data step of examples/{name}", flush=True)
            example.run_data_step(name, example.load_job(name, endpoint), endpoint)
    if any(w.name.startswith("demo") for w in chosen):
        datagen.write_image_folder(f"s3://{BUCKET}/shapes", ("circle", "square", "cross"), per_class=96)


def run_one(work: Workload, seed: int, threads: int, endpoint: str, scratch: Path) -> dict[str, float]:
    job = f"{re.sub(r'[^a-z0-9]+', '-', work.name.lower()).strip('-')}-s{seed}-t{threads}"
    env = {"DDP_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY,
           "AWS_DEFAULT_REGION": "us-east-1", "DDP_RESULTS_URI": f"s3://{BUCKET}/results", "DDP_JOB_NAME": job,
           "DDP_SHARD_CACHE_DIR": str(scratch / job), **work.env, "OMP_NUM_THREADS": str(threads)}
    results = launch(work.target, 2, env, args=[*work.args, "--seed", str(seed)], timeout=900)
    if any(r.returncode != 0 for r in results):
        raise RuntimeError(f"{work.name} at seed {seed} failed:\n{describe(results)}")
    measured = work.measure(results, job)
    return measured or example_outcomes(endpoint, job)


def report(work: Workload, runs: Mapping[tuple[int, int], Mapping[str, float]]) -> list[str]:
    """One row per bar: the bar, the worst, median and best outcome, the worst's seed/threads."""
    rows, short = [], []
    for bar in work.bars:
        values = {key: outcome[bar.outcome] for key, outcome in runs.items()}
        worst_key = min(values, key=lambda k: bar.margin(values[k]))
        ordered = sorted(values.values(), reverse=bar.outcome == "acc")
        sign = ">" if bar.outcome == "acc" else "<"
        worst = values[worst_key]
        rows.append(f"| {work.name} | {bar.outcome} {sign} {bar.value:g} ({bar.test}) | {worst:.3f} "
                    f"(seed {worst_key[0]}, {worst_key[1]} thr) | {statistics.median(ordered):.3f} | {ordered[0]:.3f} | "
                    f"{bar.margin(worst):+.0%} | {len(values)} |")
        short += [f"{work.name} seed {k[0]} threads {k[1]}: {bar.outcome} {v:.3f}"
                  for k, v in values.items() if not bar.cleared(v)]
    print("\n".join(rows), flush=True)
    return short


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 at the first thread count")
    parser.add_argument("--threads", default="1,2", help="threads a rank; the counts after the first run seed 0 only")
    parser.add_argument("--only", default="", help="workloads whose name contains this")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    chosen = [w for w in workloads() if args.only in w.name]
    configs = [(s, threads[0]) for s in range(args.seeds)] + [(0, t) for t in threads[1:]]
    print(f"[learning] {len(chosen)} workloads x {len(configs)} runs (seed, threads): {configs}; "
          f"{os.cpu_count()} CPUs, {cpu_model()}", flush=True)
    short: list[str] = []
    with demo.s3_server(0, buckets=(BUCKET,)) as endpoint, tempfile.TemporaryDirectory(prefix="learning-") as scratch:
        prepare_data(endpoint, chosen)
        print("| workload | bar (test) | worst (seed, threads) | median | best | worst's margin | runs |")
        print("|---|---|---|---|---|---|---|")
        for work in chosen:
            started = time.monotonic()
            runs = {(seed, t): run_one(work, seed, t, endpoint, Path(scratch)) for seed, t in configs}
            short += report(work, runs)
            said = json.dumps({str(k): v for k, v in runs.items()})
            print(f"[learning] {work.name}: {time.monotonic() - started:.0f} s; {said}", file=sys.stderr, flush=True)
    print("every run cleared its bar" if not short else "short of the bar:\n  " + "\n  ".join(short))
    return 1 if short else 0


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
