"""`make example NAME=<name>`: one of examples/<name>/ end to end, in containers on the local
cluster's real node, as `make demo` runs the main job.

1. the local control plane and `make images` (the examples' trainers are in the trainer image);
2. a real S3 server (SeaweedFS, s3server.py) on the real node's bridge gateway with the buckets the example's
   `s3.dataset` and `s3.results` name;
3. the example's data step, as a user runs it: `python examples/<name>/data.py <s3.dataset>`;
4. `helm install` of charts/ into namespace ddp-example-<name>, serving it only, and
   examples/<name>/ddpjob.yaml applied there as written but for its S3 endpoint; its row shown
   until it ends, then rank 0's `kubectl logs`;
5. the outcome: the loss at the start and the end (the ranks' metrics in S3) and the small
   results (names.json, eval.json) printed; `helm uninstall`.

The S3 server stops when it ends; the control plane stays up (`make cluster-down`), and so does the
namespace with the finished job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean
from typing import Any
from urllib.parse import urlparse

import yaml

import demo

REPO = demo.REPO
EXAMPLES = REPO / "examples"
NAMES = ("petnames", "transfer", "shards", "fashion")
# What the ranks import, in the pod runner and in the trainer image alike (images/trainer/Dockerfile).
RUNTIME_PATH = ("contract", "images/trainer", "examples/trainer")
# What "it learned" means for every example (tests/e2e/test_examples.py): the loss over the last tenth
# of the steps below this fraction of the first tenth's, and the held-out accuracy above this many
# times chance. benchmarks/learning_margins.py shows how far every seed and thread count clears them.
LEARNED_LOSS_RATIO = 0.75
ABOVE_CHANCE = 2.0


def job_file(name: str) -> Path:
    if name not in NAMES:
        raise SystemExit(f"unknown example {name!r}; the examples are: {', '.join(NAMES)}")
    return EXAMPLES / name / "ddpjob.yaml"


def load_job(name: str, endpoint: str | None = None) -> dict[str, Any]:
    """The example's DDPJob as written, its S3 endpoint replaced when `endpoint` is given."""
    job = yaml.safe_load(job_file(name).read_text())
    if endpoint is not None:
        job["spec"]["s3"]["endpoint"] = endpoint
    return job


def bucket_of(uri: str) -> str:
    return urlparse(uri).netloc


def buckets(job: Mapping[str, Any]) -> tuple[str, ...]:
    s3 = job["spec"]["s3"]
    return tuple(sorted({bucket_of(s3["dataset"]), bucket_of(s3["results"])}))


def data_step_env(endpoint: str) -> dict[str, str]:
    """A user's shell for the data step: the S3 server and its keys, the trainer runtime importable."""
    path = os.pathsep.join(str(REPO / p) for p in RUNTIME_PATH)
    return {**os.environ, "DDP_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def run_data_step(name: str, job: Mapping[str, Any], endpoint: str, extra: Sequence[str] = ()) -> str:
    """`python examples/<name>/data.py <the job's s3.dataset>`; returns its output (failing loudly)."""
    argv = [sys.executable, str(EXAMPLES / name / "data.py"), job["spec"]["s3"]["dataset"], *extra]
    result = subprocess.run(argv, env=data_step_env(endpoint), capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        raise RuntimeError(f"data step {' '.join(argv[1:])} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def job_prefix(job: Mapping[str, Any], namespace: str) -> tuple[str, str]:
    """(bucket, key prefix) of the job's results: <results>/<namespace>/<job name>/."""
    results = urlparse(job["spec"]["s3"]["results"])
    prefix = "/".join(p for p in (results.path.strip("/"), namespace, job["metadata"]["name"]) if p)
    return results.netloc, prefix + "/"


def metrics(s3: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    """Every rank's metric records (the JSON lines under <prefix>metrics/)."""
    records: list[dict[str, Any]] = []
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "metrics/").get("Contents", []):
        body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read().decode()
        records.extend(json.loads(line) for line in body.splitlines() if line.strip())
    return records


def loss_ends(records: Sequence[Mapping[str, Any]], fraction: float = 0.1) -> tuple[float, float]:
    """The mean loss (all ranks) over the first and the last `fraction` of the steps."""
    steps = sorted({r["step"] for r in records if r.get("loss") is not None})
    if not steps:
        raise ValueError("no metric records with a loss")
    span = max(1, int(len(steps) * fraction))
    first, last = set(steps[:span]), set(steps[-span:])
    return (mean(r["loss"] for r in records if r["step"] in first and r.get("loss") is not None),
            mean(r["loss"] for r in records if r["step"] in last and r.get("loss") is not None))


def result_json(s3: Any, bucket: str, prefix: str, name: str) -> Any:
    return json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}results/{name}")["Body"].read())


def print_outcome(s3: Any, bucket: str, prefix: str) -> None:
    start, end = loss_ends(metrics(s3, bucket, prefix))
    print(f"[example] loss {start:.3f} at the start, {end:.3f} at the end (all ranks, first and last 10% of steps)")
    for item in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "results/").get("Contents", []):
        key = item["Key"]
        print(f"  s3://{bucket}/{key}  ({item['Size']} bytes)")
        if key.endswith(".json"):
            print("    " + json.dumps(result_json(s3, bucket, prefix, key.rsplit("/", 1)[1]))[:1000])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit(f"usage: make example NAME=<{'|'.join(NAMES)}>")
    name = argv[0]
    job = load_job(name)
    namespace = f"ddp-example-{name}"
    log_dir = demo.log_directory(f"example-{name}")
    print(f"[example] {name}: logs in {log_dir}")
    demo.start_control_plane()
    demo.build_images()
    _, gateway = demo.real_node()
    with demo.s3_server(0, buckets=buckets(job), host=gateway) as endpoint:
        started = time.monotonic()
        print(f"[example] data step: python examples/{name}/data.py {job['spec']['s3']['dataset']}")
        print(run_data_step(name, job, endpoint).rstrip())
        print(f"[example] data ready in {time.monotonic() - started:.0f}s")
        demo.fresh_namespace(namespace)
        try:
            demo.helm_install(namespace)
            started = time.monotonic()
            job_name = demo.apply_job_file(job_file(name), endpoint, namespace, log_dir)
            phase = demo.watch_job(job_name, namespace)
            print(f"[example] {name}: {phase} in {time.monotonic() - started:.0f}s")
            demo.show_rank_log(f"{job_name}-0", namespace, lines=8, tag="example")
            print_outcome(demo.s3_client(endpoint), *job_prefix(job, namespace))
        finally:
            demo.helm_uninstall(namespace)
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
