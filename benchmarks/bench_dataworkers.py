"""Data workers against local DataLoader workers on the local cluster's real node (`make bench-dataworkers`).

A consumer pod limited to --cpu (a small GPU host's share of cores) takes batches as fast as they
come from an image pipeline heavy on CPU (dataworker_pipeline.py: JPEG decode, RandomResizedCrop to
224, flip, colour jitter, normalise); samples a second, after a warm-up:

  local     its DataLoader workers (2) inside its own CPU limit, at --cpu and at the larger --local-cpus
  remote k  its DataLoader workers (2 per data worker) on k data worker pods of --cpu each (the runtime's
            `python -m ddp_trainer data-worker`, reached through a headless Service, the job's token)

The figures to read: how samples/s grows with the CPU the data workers add (target: at least 0.8x
linear until the machine's cores are used), and remote against local at the same total CPU (target:
within 10%). Runs on the cluster of `make cluster-up` (started if it is not up, never taken down),
in a namespace of its own that it deletes at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "contract"), str(REPO / "tests"), str(REPO / "localcluster")]
from ddp_contract import kubeclient  # noqa: E402
from realnode import trainer_image  # noqa: E402

CLUSTER = REPO / "localcluster" / "cluster.sh"
PIPELINE = Path(__file__).resolve().parent / "dataworker_pipeline.py"
SERVICE = "dw"
PORT = 29600
LOCAL_WORKERS = 2
WORKERS_PER_DATA_WORKER = 2


def cluster_kubeconfig() -> str:
    subprocess.run(["bash", str(CLUSTER), "up"], check=True, capture_output=True)
    subprocess.run(["bash", str(REPO / "images" / "build.sh"), "build"], check=True)  # and onto the node
    said = subprocess.run(["bash", str(CLUSTER), "env"], check=True, capture_output=True, text=True).stdout
    return next(x.split("=", 1)[1] for x in said.splitlines() if x.startswith("export KUBECONFIG="))


def wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)
    return value


def container(name: str, cpu: str, env: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"name": name, "image": trainer_image(), "imagePullPolicy": "IfNotPresent",
            "env": [{"name": "PYTHONPATH", "value": "/opt/bench:/opt/ddp:/opt/ddp/examples"}, *env],
            "resources": {"requests": {"cpu": cpu, "memory": "512Mi"}, "limits": {"cpu": cpu, "memory": "2Gi"}},
            "volumeMounts": [{"name": "bench", "mountPath": "/opt/bench"}], **more}


def pod(name: str, spec: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {
        "restartPolicy": "Never", "enableServiceLinks": False,
        "volumes": [{"name": "bench", "configMap": {"name": "bench"}}], **spec}}


def token_env() -> dict[str, Any]:
    return {"name": "DDP_DATA_WORKER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "token"}}}


def start_data_workers(core: client.CoreV1Api, ns: str, count: int, cpu: str) -> list[str]:
    names = [f"{SERVICE}-{i}" for i in range(count)]
    for name in names:
        env = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}, token_env()]
        core.create_namespaced_pod(ns, pod(name, {"hostname": name, "subdomain": SERVICE,
                                                  "containers": [container("worker", cpu, env, args=["data-worker"])]},
                                           {"app": SERVICE}))
    wait(lambda: all(ready(core, ns, name) for name in names), 180, "the data workers to be Ready")
    return [f"{name}.{SERVICE}:{PORT}" for name in names]


def ready(core: client.CoreV1Api, ns: str, name: str) -> bool:
    conditions = core.read_namespaced_pod(name, ns).status.conditions or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def delete_all(core: client.CoreV1Api, ns: str) -> None:
    core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait(lambda: not core.list_namespaced_pod(ns).items, 120, "the pods to be gone")


def consume(core: client.CoreV1Api, ns: str, name: str, cpu: str, workers: int, seconds: float,
            data_workers: list[str]) -> float:
    env = [token_env()] + ([{"name": "DDP_DATA_WORKERS", "value": ",".join(data_workers)}] if data_workers else [])
    # Imported, not run as a script: the dataset's class must be dataworker_pipeline's for the data workers.
    command = ["python", "-c", f"import dataworker_pipeline; dataworker_pipeline.main({workers}, {seconds})"]
    core.create_namespaced_pod(ns, pod(name, {"containers": [container("consumer", cpu, env, command=command)]}))
    phase = wait(lambda: (p := core.read_namespaced_pod(name, ns).status.phase) in ("Succeeded", "Failed") and p,
                 seconds + 300, f"{name} to finish")
    log = core.read_namespaced_pod_log(name, ns, _preload_content=False).data.decode()  # raw: JSON is not parsed
    if phase != "Succeeded":
        raise RuntimeError(f"{name} failed:\n{log[-3000:]}")
    return float(json.loads(log.strip().splitlines()[-1])["samples_per_s"])


def millicores(cpu: str) -> int:
    return int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", default="250m", help="the consumer's and each data worker's CPU limit")
    parser.add_argument("--local-cpus", default="500m,1000m", help="more limits for the consumer alone")
    parser.add_argument("--data-workers", default="1,2,3,4,6", help="data worker pods, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds counted, after a 5 s warm-up")
    args = parser.parse_args(argv)
    api_client = kubeclient.api_client(cluster_kubeconfig())
    core = client.CoreV1Api(api_client)
    ns = f"figures-dw-{os.getpid()}"
    core.create_namespace({"metadata": {"name": ns}})
    rows: list[tuple[str, int, float]] = []  # (setting, total millicores, samples/s)
    try:
        wait(lambda: core.list_namespaced_service_account(ns).items, 30, "the default ServiceAccount")
        core.create_namespaced_config_map(ns, {"metadata": {"name": "bench"},
                                               "data": {PIPELINE.name: PIPELINE.read_text()}})
        core.create_namespaced_secret(ns, {"metadata": {"name": "token"}, "stringData": {"token": secrets.token_hex(16)}})
        core.create_namespaced_service(ns, {"metadata": {"name": SERVICE}, "spec": {
            "clusterIP": "None", "selector": {"app": SERVICE}, "publishNotReadyAddresses": True,
            "ports": [{"name": "data", "port": PORT}]}})
        for cpu in [args.cpu, *filter(None, args.local_cpus.split(","))]:
            rate = consume(core, ns, f"local-{len(rows)}", cpu, LOCAL_WORKERS, args.seconds, [])
            rows.append((f"local, {LOCAL_WORKERS} DataLoader workers, consumer {cpu}", millicores(cpu), rate))
            print(f"{rows[-1][0]}: {rate:.1f} samples/s", flush=True)
            delete_all(core, ns)
        for count in (int(x) for x in args.data_workers.split(",")):
            addresses = start_data_workers(core, ns, count, args.cpu)
            rate = consume(core, ns, f"remote-{len(rows)}", args.cpu, WORKERS_PER_DATA_WORKER * count, args.seconds,
                           addresses)
            rows.append((f"{count} data workers of {args.cpu}, consumer {args.cpu}",
                         millicores(args.cpu) * (count + 1), rate))
            print(f"{rows[-1][0]}: {rate:.1f} samples/s", flush=True)
            delete_all(core, ns)
    finally:
        try:
            core.delete_namespace(ns)
        except ApiException as error:
            print(f"clean-up of {ns}: {error.status} {error.reason}", file=sys.stderr)
    print_table(rows, millicores(args.cpu))
    return 0


def print_table(rows: list[tuple[str, int, float]], unit: int) -> None:
    print(f"\n[dataworkers] {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}\n")
    print("| setting | CPU in all | samples/s | per core of the pipeline's CPU |\n|---|---|---|---|")
    base = next((rate for name, _, rate in rows if name.startswith("1 data worker")), None)
    for name, total, rate in rows:
        pipeline = total - unit if not name.startswith("local") else total  # remote: the consumer's share aside
        print(f"| {name} | {total / 1000:g} | {rate:.1f} | {rate / (pipeline / 1000):.1f} |")
    if base:
        print("\nGrowth with data workers (samples/s over k x the 1-worker rate):")
        for name, _, rate in rows:
            if not name.startswith("local"):
                k = int(name.split()[0])
                print(f"  {k}: {rate / (k * base):.2f}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
