"""Operator benchmark (`make bench-operator`): how fast DDPJobs become pods and phase Running.

Starts a separate local control plane (own state dir and ports; kwok plays the kubelet for
fake nodes) and the operator as a subprocess, then for each world size and for many concurrent
small jobs measures, from the create call:

  created   all pods seen by a watch (the operator's work)
  running   all pods Running (kwok and the scheduler's work, on the same 2 cores)
  phase     status.phase Running seen by a watch
  lag       phase - running: how long after the last pod ran the job said so (target < 1 s)

and the operator's peak RSS (VmHWM). Targets: 64 ranks created < 2 s, 1024 < 20 s, lag < 1 s,
RSS < 250 MB with 100 jobs x 8 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config, watch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator"), str(REPO / "images" / "trainer")]
from ddp_operator import constants as c  # noqa: E402

BENCH_CLUSTER = {
    "DDP_CLUSTER_DIR": "/tmp/ddp-bench-cluster",
    "DDP_NODES": "8",
    "DDP_API_PORT": "18443",
    "DDP_ETCD_PORT": "14379",
    "DDP_ETCD_PEER_PORT": "14380",
    "DDP_KCM_PORT": "22257",
    "DDP_SCHED_PORT": "22259",
    "DDP_KWOK_PORT": "22247",
}
NAMESPACE = "bench"


@dataclass
class Tracker:
    """What the watches saw, with local monotonic times."""

    pods_added: dict[str, float] = field(default_factory=dict)
    pods_running: dict[str, float] = field(default_factory=dict)
    jobs_running: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.pods_added.clear()
            self.pods_running.clear()
            self.jobs_running.clear()


def stream(list_fn, stop: threading.Event, *args, **kwargs):
    """Events of a watch that resumes from where it was across the server's timeouts."""
    watcher, version = watch.Watch(), None
    while not stop.is_set():
        for event in watcher.stream(list_fn, *args, timeout_seconds=5, resource_version=version, **kwargs):
            yield event
        version = watcher.resource_version


def watch_pods(core: client.CoreV1Api, tracker: Tracker, stop: threading.Event) -> None:
    for event in stream(core.list_namespaced_pod, stop, NAMESPACE, label_selector=c.LABEL_JOB_NAME):
        pod, now = event["raw_object"], time.monotonic()
        name = pod["metadata"]["name"]
        with tracker.lock:
            if event["type"] == "DELETED":
                continue
            tracker.pods_added.setdefault(name, now)
            if pod.get("status", {}).get("phase") == "Running":
                tracker.pods_running.setdefault(name, now)


def watch_jobs(custom: client.CustomObjectsApi, tracker: Tracker, stop: threading.Event) -> None:
    for event in stream(custom.list_namespaced_custom_object, stop, c.GROUP, c.VERSION, NAMESPACE, c.PLURAL):
        job, now = event["object"], time.monotonic()
        if (job.get("status") or {}).get("phase") == c.PHASE_RUNNING:
            with tracker.lock:
                tracker.jobs_running.setdefault(job["metadata"]["name"], now)


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.stop = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                self.peak_kb = max(self.peak_kb, status_kb(self.pid, "VmRSS"))
            except FileNotFoundError:  # the operator has exited
                return


def status_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def job_body(name: str, world_size: int) -> dict:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name},
            "spec": {"worldSize": world_size, "gpusPerRank": 0, "image": "trainer:bench",
                     "command": ["python", "train.py"]}}


def wait(predicate, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def scenario(custom, tracker: Tracker, label: str, jobs: int, ranks: int, timeout: float) -> dict:
    tracker.reset()
    names = [f"{label}-{i}" for i in range(jobs)]
    total = jobs * ranks
    started = time.monotonic()
    for name in names:
        custom.create_namespaced_custom_object(c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, job_body(name, ranks))
    created = wait(lambda: len(tracker.pods_added) >= total, timeout, f"{total} pods created")
    running = wait(lambda: len(tracker.pods_running) >= total, timeout, f"{total} pods Running")
    wait(lambda: len(tracker.jobs_running) >= jobs, timeout, f"{jobs} jobs Running")
    with tracker.lock:
        last_pod_running = max(tracker.pods_running.values())
        last_job_running = max(tracker.jobs_running.values())
        lags = [tracker.jobs_running[n] - max(t for p, t in tracker.pods_running.items() if p.rsplit("-", 1)[0] == n)
                for n in names]
    result = {
        "scenario": label, "jobs": jobs, "ranks_per_job": ranks, "pods": total,
        "created_s": round(created - started, 3), "pods_running_s": round(running - started, 3),
        "phase_running_s": round(last_job_running - started, 3),
        "lag_max_s": round(max(lags), 3), "lag_last_s": round(last_job_running - last_pod_running, 3),
    }
    for name in names:
        custom.delete_namespaced_custom_object(c.GROUP, c.VERSION, NAMESPACE, c.PLURAL, name)
    core = client.CoreV1Api(custom.api_client)
    wait(lambda: not core.list_namespaced_pod(NAMESPACE, label_selector=c.LABEL_JOB_NAME, limit=1).items, timeout,
         "the pods to be deleted")
    return result


def start_cluster(env: dict[str, str]) -> str:
    script = str(REPO / "localcluster" / "cluster.sh")
    subprocess.run(["bash", script, "up"], env={**os.environ, **env}, check=True)
    kubeconfig = str(Path(env["DDP_CLUSTER_DIR"]) / "kubeconfig")
    subprocess.run(["bash", script, "kubectl", "apply", "-f", str(REPO / "crds" / "ddpjob.yaml")],
                   env={**os.environ, **env}, check=True, capture_output=True)
    subprocess.run(["bash", script, "kubectl", "wait", "--for=condition=Established", f"crd/{c.CRD_NAME}"],
                   env={**os.environ, **env}, check=True, capture_output=True)
    return kubeconfig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256,1024")
    parser.add_argument("--concurrent-jobs", type=int, default=100)
    parser.add_argument("--ranks-per-concurrent-job", type=int, default=8)
    parser.add_argument("--kubeconfig", help="use this cluster instead of starting a separate local one")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()

    own_cluster = args.kubeconfig is None
    kubeconfig = args.kubeconfig or start_cluster(BENCH_CLUSTER)
    api = config.new_client_from_config(config_file=kubeconfig)
    api.configuration.connection_pool_maxsize = 8
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except client.ApiException as error:
        if error.status != 409:
            raise
    wait(lambda: core.list_namespaced_service_account(NAMESPACE).items, 30, "the default ServiceAccount")

    log = Path(os.environ.get("TMPDIR", "/tmp")) / "ddp-bench-operator.log"
    env = {**os.environ, "KUBECONFIG": kubeconfig,
           "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("operator", "images/trainer"))}
    operator = subprocess.Popen([sys.executable, "-m", "ddp_operator"], env=env, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
    tracker, stop = Tracker(), threading.Event()
    results: list[dict] = []
    try:
        wait(lambda: "ddp-operator started" in log.read_text(), 60, "the operator to start")
        sampler = RssSampler(operator.pid)
        sampler.start()
        for target in (watch_pods, watch_jobs):
            threading.Thread(target=target, args=(core if target is watch_pods else custom, tracker, stop),
                             daemon=True).start()
        time.sleep(1)
        for size in (int(s) for s in args.sizes.split(",") if s):
            results.append(scenario(custom, tracker, f"w{size}", 1, size, args.timeout))
            print(json.dumps(results[-1]), flush=True)
        if args.concurrent_jobs:
            results.append(scenario(custom, tracker, "many", args.concurrent_jobs, args.ranks_per_concurrent_job,
                                    args.timeout))
            print(json.dumps(results[-1]), flush=True)
        peak = {"rss_peak_sampled_mb": round(sampler.peak_kb / 1024, 1),
                "vm_hwm_mb": round(status_kb(operator.pid, "VmHWM") / 1024, 1)}
    finally:
        stop.set()
        operator.terminate()
        operator.wait(20)
        if own_cluster:
            subprocess.run(["bash", str(REPO / "localcluster" / "cluster.sh"), "down"],
                           env={**os.environ, **BENCH_CLUSTER}, check=False)

    print()
    print(f"{'scenario':<10} {'pods':>5} {'created s':>10} {'pods Running s':>15} {'phase Running s':>16} "
          f"{'lag max s':>10}")
    for r in results:
        print(f"{r['scenario']:<10} {r['pods']:>5} {r['created_s']:>10.2f} {r['pods_running_s']:>15.2f} "
              f"{r['phase_running_s']:>16.2f} {r['lag_max_s']:>10.2f}")
    print(f"operator peak RSS: {peak['vm_hwm_mb']} MB (VmHWM), {peak['rss_peak_sampled_mb']} MB sampled")
    if args.json:
        args.json.write_text(json.dumps({"results": results, **peak}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
