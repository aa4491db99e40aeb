"""The faulted half of `make bench-goodput`: what faults cost a job on the local cluster's real node.

A 2-rank DDPJob (restartStrategy InPlace, ddp_workloads.train in containers of the trainer image, a
asynchronous checkpoint to S3 every --every steps) runs, for each state size, these ways one after another:

  fault-free   no fault
  S3 only      a fault every 30-60 s (the same seeded times and kinds for both faulted ways), alternately
               rank 1's rank process SIGKILLed and rank 1's pod deleted; resumes from S3 checkpoints
  memory       the same faults, with memory snapshots every step (CheckpointManager memory_every=1)
  memory + spare  the same, with a spare pod (spec.sparePods 1) that takes the place of rank 1's deleted pod
  S3 outage    memory snapshots and no fault; the ranks' S3 (a proxy on the pod bridge in front of the
               server) refuses every connection for --outage seconds, from --outage-at seconds in
  fault-free again, last: this machine's speed drifts, and goodput is taken against the two runs' mean

Each rank records, before each step, the step and the time (WL_INDICES, a host folder). From rank 0's
records: the seconds from the first step to the last; goodput, the fault-free way's seconds over this
way's; for each fault, the steps trained again (the step under way at the fault less the step the next
attempt resumed from) and the seconds from the fault to the next attempt's first step; restarts.

States: `small` (ddp_workloads' model, steps paced to --pace s) and `1GB` (two 8192x8192 hidden layers:
0.54 GB of parameters and as much of momentum, unpaced).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / p) for p in ("benchmarks", "tests", "contract", "localcluster")]
import demo  # noqa: E402
from bench_elastic import wait  # noqa: E402
from bench_operator import run, start_operator, stop_operator  # noqa: E402
from ddp_contract import api, kubeclient, labels  # noqa: E402
from linkproxy import LinkProxy  # noqa: E402
from procs import rank_pid  # noqa: E402
from realnode import WORKLOADS, WORKLOADS_TEMPLATE, trainer_image  # noqa: E402

CLUSTER = REPO / "localcluster" / "cluster.sh"
BUCKET = "ddp-goodput"
WAYS = ("fault-free", "S3 only", "memory", "memory + spare", "S3 outage", "fault-free again")
FAULTED = ("S3 only", "memory", "memory + spare")
SNAPSHOTS = ("memory", "memory + spare", "S3 outage")


@dataclass(frozen=True)
class State:
    name: str
    env: dict[str, str]
    epochs: int
    memory: str  # the container's memory limit
    shm: str


STATES = {
    "small": State("small", {}, epochs=60, memory="1536Mi", shm="256Mi"),
    "1GB": State("1GB", {"WL_WIDTH": "8192", "WL_LAYERS": "2"}, epochs=8, memory="8Gi", shm="3Gi"),
}


@dataclass
class Way:
    """One job's run: its faults' wall times and kinds, what the bench saw of its status."""

    name: str
    faults: list[tuple[float, str]] = field(default_factory=list)
    behind_seen: bool = False
    restarts: int = 0
    recoveries: list[dict[str, Any]] = field(default_factory=list)


class Cluster:
    """The namespace, the operator and the S3 server on the pod bridge of one benchmark run."""

    def __init__(self, namespace: str, folder: Path) -> None:
        self.namespace, self.folder = namespace, folder
        run(["bash", str(CLUSTER), "up"], {}, capture_output=True)
        run(["bash", str(REPO / "images" / "build.sh"), "build"], {}, capture_output=True)
        env = run(["bash", str(CLUSTER), "env"], {}, capture_output=True, text=True).stdout.splitlines()
        kubeconfig = next(x.split("=", 1)[1] for x in env if x.startswith("export KUBECONFIG="))
        run(["bash", str(CLUSTER), "kubectl", "apply", "-f", str(REPO / "crds" / "ddpjob.yaml")], {},
            capture_output=True)
        api_client = kubeclient.api_client(kubeconfig)
        self.core, self.custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        node = next(n for n in self.core.list_node().items if not (n.spec.taints or []))
        self.host = next(a.address for a in node.status.addresses if a.type == "InternalIP")
        self.core.create_namespace({"metadata": {"name": namespace}})
        wait(lambda: self.core.list_namespaced_service_account(namespace).items, 30, "the default ServiceAccount")
        self.core.create_namespaced_config_map(namespace, {"metadata": {"name": "workloads"},
                                                           "data": {WORKLOADS.name: WORKLOADS.read_text()}})
        self.core.create_namespaced_secret(namespace, {"metadata": {"name": "s3-credentials"}, "stringData": {
            "AWS_ACCESS_KEY_ID": demo.ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": demo.SECRET_KEY}})
        self.operator = start_operator(kubeconfig, folder / "operator.log", DDP_OPERATOR_NAMESPACES=namespace)

    def close(self) -> None:
        stop_operator(self.operator)
        try:
            self.core.delete_namespace(self.namespace)
        except ApiException as error:
            print(f"clean-up of {self.namespace}: {error.status} {error.reason}", file=sys.stderr)

    def status(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object_status(
            api.GROUP, api.VERSION, self.namespace, api.PLURAL, name).get("status") or {}

    def create(self, name: str, state: State, endpoint: str, indices: Path, every: int, pace: float,
               memory: bool, spares: int = 0) -> None:
        settings = {"WL_BATCH": "4", "WL_EPOCHS": str(state.epochs), "WL_CKPT_EVERY": str(every),
                    "WL_STEP_SECONDS": str(pace), "WL_INDICES": "/indices", "OMP_NUM_THREADS": "1",
                    "WL_ASYNC": "1", "DDP_S3_OUTAGE_SECONDS": "120", **state.env, **({"WL_MEMORY_EVERY": "1"} if memory else {})}
        template = json.loads(json.dumps(WORKLOADS_TEMPLATE))
        template["spec"]["volumes"].append({"name": "indices", "hostPath": {"path": str(indices), "type": "Directory"}})
        template["spec"]["containers"][0]["volumeMounts"].append({"name": "indices", "mountPath": "/indices"})
        body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": {
            "worldSize": 2, "gpusPerRank": 0, "image": trainer_image(), "entrypoint": "ddp_workloads:train",
            "masterPort": 29500, "restartStrategy": "InPlace", "backoffLimit": 50, "infrastructureBackoffLimit": 50,
            "sparePods": spares,
            "env": [{"name": k, "value": v} for k, v in settings.items()],
            "resources": {"limits": {"memory": state.memory}}, "shmSize": state.shm, "template": template,
            "s3": {"endpoint": endpoint, "region": "us-east-1", "credentialsSecret": "s3-credentials",
                   "results": f"s3://{BUCKET}/results"}}}
        self.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, body)

    def keep_logs(self, name: str, into: Path) -> None:
        """The job's pods' output (every attempt of an InPlace job's container, with the kubelet's times)
        and the operator's log so far, into `into`."""
        into.mkdir(parents=True, exist_ok=True)
        for pod in self.core.list_namespaced_pod(self.namespace, label_selector=f"{labels.LABEL_JOB_NAME}={name}").items:
            response = self.core.read_namespaced_pod_log(pod.metadata.name, self.namespace, timestamps=True,
                                                         _preload_content=False)
            (into / f"{pod.metadata.name}.log").write_bytes(response.data)
        shutil.copy(self.folder / "operator.log", into / "operator.log")

    def fault(self, name: str, kind: str) -> None:
        """Rank 1's process killed, or its pod deleted: the pod status.members places at rank 1 (a spare
        may hold it). A process forked by a zygote shows its pod's environment, where RANK is the pod's index."""
        members = self.status(name).get("members") or [0, 1]
        if kind == "process":
            pid = wait(lambda: rank_pid(self.namespace, name, members[1], supervised=True)
                       or rank_pid(self.namespace, name, 1, supervised=True), 60, "rank 1's process")
            os.kill(pid, signal.SIGKILL)
        else:
            self.core.delete_namespaced_pod(f"{name}-{members[1]}", self.namespace)


def records(indices: Path) -> dict[int, list[dict[str, Any]]]:
    """Rank 0's records by attempt: {step, time} before each step."""
    found: dict[int, list[dict[str, Any]]] = {}
    for path in indices.glob("*-0.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        found[int(path.name.split("-")[0])] = [{"step": r["step"], "time": r["time"]} for r in lines]
    return found


def figures(way: Way, found: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """Seconds of training, and per fault the steps trained again and the seconds to training again."""
    attempts = sorted(a for a in found if found[a])
    first, last = found[attempts[0]][0]["time"], found[attempts[-1]][-1]["time"]
    faults = []
    for (at, kind), before, after in zip(way.faults, attempts, attempts[1:], strict=False):
        under_way = max(r["step"] for r in found[before])
        resumed = min(r["step"] for r in found[after]) - 1
        faults.append({"kind": kind, "redone": under_way - resumed, "to training": round(found[after][0]["time"] - at, 1)})
    return {"seconds": round(last - first, 1), "faults": faults, "restarts": way.restarts,
            "behind seen": way.behind_seen, "steps": found[attempts[-1]][-1]["step"]}


def run_way(cluster: Cluster, state: State, way_name: str, schedule: list[tuple[float, str]], s3: str,
            every: int, pace: float, outage: tuple[float, float], timeout: float,
            logs: Path | None = None) -> dict[str, Any]:
    name = re.sub(r"[^a-z0-9]+", "-", f"goodput-{state.name}-{way_name}".lower())  # a DNS-1035 label: a letter first
    indices = Path(tempfile.mkdtemp(prefix=f"ddp-goodput-{name}-"))
    os.chmod(indices, 0o777)  # the ranks run as a user of their own
    proxy = LinkProxy(s3, host=cluster.host) if way_name == "S3 outage" else None
    way = Way(way_name)
    try:
        cluster.create(name, state, proxy.url if proxy else s3, indices, every, pace,
                       memory=way_name in SNAPSHOTS, spares=1 if way_name == "memory + spare" else 0)
        wait(lambda: records(indices).get(0), timeout, f"{name}'s first step")
        started = time.monotonic()
        pending = list(schedule) if way_name in FAULTED else []
        watching = threading.Event()

        def watch() -> None:
            while not watching.wait(0.5):
                way.behind_seen |= bool(cluster.status(name).get("checkpointsBehind"))

        threading.Thread(target=watch, daemon=True).start()
        if proxy is not None:
            time.sleep(outage[0])
            print(f"  {name}: S3 out for {outage[1]:.0f} s", flush=True)
            proxy.down()
            time.sleep(outage[1])
            proxy.refusing = False
        for delay, kind in pending:
            time.sleep(max(0.0, started + delay - time.monotonic()))
            if cluster.status(name).get("phase") != "Running":
                break
            attempt = int(cluster.status(name).get("attempt") or 0)
            way.faults.append((time.time(), kind))
            cluster.fault(name, kind)
            print(f"  {name}: {kind} fault at attempt {attempt}", flush=True)
            wait(lambda a=attempt: records(indices).get(a + 1), timeout, f"{name}'s attempt {attempt + 1} training")
            started = time.monotonic()
        done = wait(lambda: cluster.status(name).get("phase") in ("Succeeded", "Failed") and cluster.status(name),
                    timeout * 4, f"{name} to end")
        watching.set()
        if logs is not None:
            cluster.keep_logs(name, logs / name)
        way.restarts = int(done.get("restarts") or 0)
        if done["phase"] != "Succeeded":
            raise RuntimeError(f"{name} ended {done['phase']}: {done.get('reason')} {done.get('message')}")
        return figures(way, records(indices))
    finally:
        if proxy is not None:
            proxy.close()
        shutil.rmtree(indices, ignore_errors=True)


def schedule_of(seed: int, count: int, low: float, high: float) -> list[tuple[float, str]]:
    """(seconds after the previous fault's attempt trains, kind) for `count` faults, kinds alternating."""
    rng = random.Random(seed)
    return [(rng.uniform(low, high), ("process", "pod")[i % 2]) for i in range(count)]


def measure(states: list[str], faults: int, every: int, pace: float, outage: tuple[float, float],
            timeout: float, logs: Path | None = None, ways: tuple[str, ...] = WAYS) -> dict[str, dict[str, Any]]:
    folder = Path(tempfile.mkdtemp(prefix="ddp-goodput-"))
    namespace = f"goodput-{os.getpid()}"
    cluster = Cluster(namespace, folder)
    out: dict[str, dict[str, Any]] = {}
    try:
        with demo.s3_server(0, buckets=(BUCKET,), host=cluster.host) as s3:
            for state_name in states:
                state = STATES[state_name]
                schedule = schedule_of(7, faults, 30, 60)
                out[state_name] = {}
                for way in ways:
                    out[state_name][way] = run_way(cluster, state, way, schedule, s3, every, pace if state_name == "small"
                                                   else 0.0, outage, timeout, logs)
                    print(f"{state_name} {way}: {out[state_name][way]}", flush=True)
    finally:
        cluster.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def print_table(out: dict[str, dict[str, Any]]) -> None:
    print()
    print("Faults on the real node (2 ranks, InPlace): seconds from the first step to the last, goodput (the"
          " fault-free runs' mean seconds / these), restarts, and per fault: kind, steps trained again, seconds from"
          " the fault to training again")
    for state, ways in out.items():
        frees = [ways[w]["seconds"] for w in ("fault-free", "fault-free again") if w in ways]
        free = sum(frees) / len(frees) if frees else None
        for way, row in ways.items():
            faults = "; ".join(f"{f['kind']} {f['redone']} / {f['to training']} s" for f in row["faults"])
            behind = ", checkpointsBehind said" if row["behind seen"] else ""
            goodput = f"{free / row['seconds']:.3f}" if free else "-"  # no fault-free way run
            print(f"{state:<6} {way:<14} {row['seconds']:>7.1f} s  goodput {goodput}  restarts "
                  f"{row['restarts']}{behind}  {faults}")
