"""Real-node figures (`make bench-real-node`): set-up, a DDPJob from its create call to its first
training step in containers, and gang restarts on the local cluster's real node.

Runs on the local cluster of `make cluster-up` (started if it is not up, never taken down: it may be
shared) and measures, with this script's clocks and watches:

  images      `images/build.sh build` with nothing changed (the warm set-up of the images; their
              cold build is DEVELOPMENT.md's figure: it needs BuildKit's cache dropped)
  node        with --node-setup: a second cluster of its own (state folder, ports, bridge, subnet and
              containerd store apart from the shared one's) up and down twice: cold (a fresh
              containerd store, so the pause image is imported) and warm (the store kept); both
              with the binaries cached (their cold build: `make cluster-build`, DEVELOPMENT.md's figure)
  first step  the quick-start DDPJob (examples/ddpjob.yaml: trainer image, 2 CPU ranks) in a
              namespace of its own, served by an operator this script starts; from the create call
              (what `kubectl apply` sends) to
                scheduled   every rank's pod bound to the node
                started     every rank's trainer container running (sandbox, CNI, container start)
                runtime     the trainer runtime started in rank 0 (Python and torch imported; the
                            rendezvous time in status.rendezvous less its formedSeconds)
                rendezvous  rank 0's gang formed (status.rendezvous: rank 0's name resolved through
                            the headless Service and cluster DNS, every rank connected, one all-reduce)
                first step  rank 0's first progress report (status.progress, step 1)
  restart     a running job of --restart-ranks ranks: rank 1's trainer gets SIGTERM (`kubectl exec`,
              as a crashing rank); from the failure seen (its container terminated) to every rank of
              the next attempt Running, Ready, and its gang formed again; next to deleting and
              recreating as many bare busybox pods on the same node (delete all, create each name
              again once it is free, until all are Running).

  strategies  restartStrategy Recreate next to InPlace, a job of each at --strategy-ranks ranks: rank 1's
              rank process SIGTERMed inside its container (a process failure), then rank 1's pod
              deleted, each --settle seconds after the gang formed (a fault lands on a job that has
              trained a while); each from the fault's call to the restart decided (status.attempt), to the
              new gang formed (status.rendezvous: every rank back in the process group, training
              again from the checkpoint), and how many rank pods were created anew for it. Then the
              memory of rank 0's pod (kept through those faults under InPlace, where its processes
              are the runtime, the zygote and the rank forked from it): its memory cgroup's figure
              and each process's resident, proportional and private memory.

Prints the figures as tables; --json writes them too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests")]  # bench_operator adds contract, operator, localcluster
import bench_operator  # noqa: E402
from bench_operator import PodLife, run, start_operator, stop_operator, stream, track_life  # noqa: E402
from ddp_contract import api, kubeclient, labels  # noqa: E402
from realnode import import_busybox  # noqa: E402

CLUSTER = REPO / "localcluster" / "cluster.sh"
NAMESPACE_PREFIX = "figures-"
QUICKSTART = REPO / "examples" / "ddpjob.yaml"
# --node-setup's second cluster: every port, the bridge, the subnet and the state apart from the
# shared cluster's and from the tests' second clusters (tests/localcluster/test_local_cluster.py).
SECOND_CLUSTER = {
    "DDP_NODES": "1",
    "DDP_API_PORT": "17543",
    "DDP_ETCD_PORT": "13479",
    "DDP_ETCD_PEER_PORT": "13480",
    "DDP_KCM_PORT": "21357",
    "DDP_SCHED_PORT": "21359",
    "DDP_KWOK_PORT": "21347",
    "DDP_BRIDGE": "ddpfigures0",
    "DDP_NODE_NAME": "figures-node",
    "DDP_NODE_SUBNET": "10.244.202.0/24",
    "DDP_KUBELET_PORT": "21350",
    "DDP_KUBELET_HEALTHZ_PORT": "21348",
    "DDP_DNS_HEALTH_PORT": "21353",
}


@dataclass
class Pod(PodLife):
    """A pod's life (bench_operator's) and when its container ran and ended."""

    scheduled: float | None = None
    running: float | None = None  # its container running
    terminated: float | None = None  # its container terminated


@dataclass
class Seen:
    pods: dict[str, Pod] = field(default_factory=dict)  # uid -> pod
    # (job, attempt) -> (seen, formedSeconds)
    rendezvous: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    progress: dict[str, float] = field(default_factory=dict)  # job -> first progress seen
    phases: dict[str, tuple[str | None, int, float]] = field(default_factory=dict)  # job -> phase, attempt, since
    attempts: dict[tuple[str, int], float] = field(default_factory=dict)  # (job, attempt) -> first seen
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, predicate: Callable[[Pod], bool]) -> list[Pod]:
        with self.lock:
            return [p for p in self.pods.values() if predicate(p)]


def condition(pod: dict, kind: str) -> bool:
    return any(x.get("type") == kind and x.get("status") == "True" for x in pod.get("status", {}).get("conditions") or [])


def watch_pods(core: client.CoreV1Api, namespace: str, seen: Seen, stop: threading.Event) -> None:
    for event in stream(core.list_namespaced_pod, stop, namespace):
        pod, now = event["object"], time.monotonic()
        meta = pod["metadata"]
        with seen.lock:
            life = seen.pods.setdefault(meta["uid"], Pod(meta["name"], (meta.get("labels") or {}).get(labels.LABEL_ATTEMPT),
                                                         now))
            track_life(seen.pods, event["type"], pod, now)  # deleting, gone, ready
            if life.scheduled is None and (condition(pod, "PodScheduled") or pod.get("spec", {}).get("nodeName")):
                life.scheduled = now
            states = [s.get("state") or {} for s in pod.get("status", {}).get("containerStatuses") or []]
            if life.running is None and any("running" in s for s in states):
                life.running = now
            if life.terminated is None and any("terminated" in s for s in states):
                life.terminated = now


def watch_jobs(custom: client.CustomObjectsApi, namespace: str, seen: Seen, stop: threading.Event) -> None:
    for event in stream(custom.list_namespaced_custom_object, stop, api.GROUP, api.VERSION, namespace, api.PLURAL):
        job, now = event["object"], time.monotonic()
        name, status = job["metadata"]["name"], job.get("status") or {}
        with seen.lock:
            state = (status.get("phase"), int(status.get("attempt") or 0))
            seen.attempts.setdefault((name, state[1]), now)
            if seen.phases.get(name, (None, -1, 0.0))[:2] != state:
                seen.phases[name] = (*state, now)
            rendezvous = status.get("rendezvous")
            if rendezvous and (name, rendezvous["attempt"]) not in seen.rendezvous:
                seen.rendezvous[(name, rendezvous["attempt"])] = (now, float(rendezvous["formedSeconds"]))
            if status.get("progress") and name not in seen.progress:
                seen.progress[name] = now


def wait(predicate: Callable[[], object], timeout: float, what: str) -> float:
    return bench_operator.wait(predicate, timeout, what, interval=0.05)


def kubectl(*args: str, env: dict[str, str] | None = None) -> str:
    return run(["bash", str(CLUSTER), "kubectl", *args], env or {}, capture_output=True, text=True).stdout


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    run(argv, env, capture_output=True, text=True)
    return time.monotonic() - started


def quickstart_job(name: str, args: list[str], world_size: int) -> dict:
    job = yaml.safe_load(QUICKSTART.read_text())
    job["metadata"]["name"] = name
    job["spec"].update(args=args, worldSize=world_size, backoffLimit=10)
    job["spec"].pop("activeDeadlineSeconds", None)
    return job


def first_step(custom, seen: Seen, namespace: str, name: str, timeout: float) -> dict:
    """The quick-start job from its create call to rank 0's first step; deleted afterwards."""
    t0 = time.monotonic()
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                           quickstart_job(name, ["--epochs", "1"], 2))
    try:
        wait(lambda: name in seen.progress, timeout, f"{name}'s first step")
        ranks = seen.of(lambda p: p.name.startswith(f"{name}-") and p.attempt == "0")
        formed, formed_s = seen.rendezvous[(name, 0)]
        steps = {"created": max(p.added for p in ranks), "scheduled": max(p.scheduled or t0 for p in ranks),
                 "started": max(p.running or t0 for p in ranks), "runtime": formed - formed_s,
                 "rendezvous": formed, "first step": seen.progress[name]}
        return {k: round(v - t0, 2) for k, v in steps.items()}
    finally:
        custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)


def all_up(seen: Seen, prefix: str, attempt: str | None, count: int, stage: str) -> bool:
    """`count` live pods named `prefix`* of `attempt` have reached `stage` (running or ready)."""
    return len(seen.of(lambda p: p.name.startswith(prefix) and p.attempt == attempt and p.deleting is None
                       and getattr(p, stage) is not None)) >= count


def gang_restarts(custom, seen: Seen, namespace: str, ranks: int, repeats: int, timeout: float) -> list[dict]:
    """Rank 1 of a running job SIGTERMed `repeats` times; each from the failure seen to the next attempt up."""
    name = "restart"
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL,
                                           quickstart_job(name, ["--epochs", "100000"], ranks))
    out = []
    try:
        wait(lambda: all_up(seen, f"{name}-", "0", ranks, "ready") and (name, 0) in seen.rendezvous, timeout,
             f"{name} running")
        for attempt in range(1, repeats + 1):
            previous = str(attempt - 1)
            t0 = time.monotonic()
            kubectl("exec", "-n", namespace, f"{name}-1", "--", "python", "-c", "import os, signal; os.kill(1, signal.SIGTERM)")
            wait(lambda p=previous: seen.of(lambda x: x.name == f"{name}-1" and x.attempt == p and x.terminated), timeout,
                 f"{name}-1 terminated")
            failed = next(x.terminated for x in seen.of(lambda x: x.name == f"{name}-1" and x.attempt == previous))
            assert failed is not None
            a = str(attempt)
            running = wait(lambda: all_up(seen, f"{name}-", a, ranks, "running"), timeout, f"attempt {a} running")
            ready = wait(lambda: all_up(seen, f"{name}-", a, ranks, "ready"), timeout, f"attempt {a} ready")
            wait(lambda: (name, attempt) in seen.rendezvous, timeout, f"attempt {a} formed")
            with seen.lock:
                formed, formed_s = seen.rendezvous[(name, attempt)]
            gone = max(x.gone or 0.0 for x in seen.of(lambda x, p=previous: x.name.startswith(f"{name}-") and x.attempt == p))
            created = max(x.added for x in seen.of(lambda x: x.name.startswith(f"{name}-") and x.attempt == a))
            out.append({"failure seen": round(failed - t0, 2), "old pods gone": round(gone - failed, 2),
                        "created": round(created - failed, 2), "running": round(running - failed, 2),
                        "ready": round(ready - failed, 2), "runtime": round(formed - formed_s - failed, 2),
                        "formed": round(formed - failed, 2)})
    finally:
        custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    return out


# Python run in a rank's container (kubectl exec) that names its processes' roles: role(pid) is
# "runtime" (PID 1 under InPlace), "rank" (PID 1 under Recreate, or a rank process the InPlace runtime
# started, DDP_SUPERVISED=1), "zygote" (DDP_ZYGOTE=1), "rank, forked" (a child of the zygote, which
# shows the zygote's environ), else None (this probe, a rank's own workers under the zygote).
PROCESS_ROLES = """
import os
def read(path):
    try:
        return open(path, "rb").read()
    except OSError:
        return b""
def environ(pid):
    return read(f"/proc/{pid}/environ").split(b"\\0")
def parent(pid):
    return (read(f"/proc/{pid}/stat").rsplit(b")", 1)[-1].split()[1:2] or [b""])[0].decode()
pids = [p for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())]
marked = {p for p in pids if b"DDP_ZYGOTE=1" in environ(p)}
zygotes = {p for p in marked if parent(p) not in marked}  # its children show its environ too
def role(pid):
    env = environ(pid)
    if parent(pid) in zygotes:
        return "rank, forked"
    if pid in marked:
        return "zygote" if pid in zygotes else None
    if b"DDP_SUPERVISED=1" in env or (pid == "1" and b"DDP_RESTART_STRATEGY=InPlace" not in env):
        return "rank"
    return "runtime" if pid == "1" else None
"""

# Run in rank 1's container: SIGTERM to the processes that run the rank, which exit as a failing rank does.
KILL_RANK_PROCESS = PROCESS_ROLES + """
import signal
for pid in pids:
    if role(pid) in ("rank", "rank, forked"):
        os.kill(int(pid), signal.SIGTERM)
"""


# Run in a rank's container: the memory of its processes (smaps_rollup: resident, proportional share,
# private to the process) by role, and the container's as its memory cgroup counts it, in MiB.
MEMORY_PROBE = PROCESS_ROLES + """
import json
out = []
for pid in pids:
    fields = dict(line.split(b":")[0:2] for line in read(f"/proc/{pid}/smaps_rollup").splitlines()[1:])
    if (kind := role(pid)) and fields:
        kib = {k.decode(): int(v.split()[0]) for k, v in fields.items()}
        out.append({"role": kind, "rss": kib["Rss"] // 1024, "pss": kib["Pss"] // 1024,
                    "private": (kib["Private_Clean"] + kib["Private_Dirty"]) // 1024})
v1 = "/sys/fs/cgroup/memory/"
stat = dict(line.split() for line in (read(v1 + "memory.stat") or read("/sys/fs/cgroup/memory.stat")).decode().splitlines())
current = read(v1 + "memory.usage_in_bytes") or read("/sys/fs/cgroup/memory.current")
print(json.dumps({"processes": sorted(out, key=lambda p: p["role"]), "container": int(current or 0) // 2**20,
                  "container anon": int(stat.get("total_rss", stat.get("anon", 0))) // 2**20}))
"""


def pod_memory(namespace: str, pod: str) -> dict:
    """MEMORY_PROBE's figures for `pod`'s trainer container."""
    return json.loads(kubectl("exec", "-n", namespace, pod, "--", "python", "-c", MEMORY_PROBE))


def pod_uids(seen: Seen, prefix: str) -> set[str]:
    with seen.lock:
        return {uid for uid, pod in seen.pods.items() if pod.name.startswith(prefix)}


def strategy_restarts(core, custom, seen: Seen, namespace: str, strategy: str, ranks: int, repeats: int,
                      timeout: float, settle: float) -> tuple[dict[str, list[dict]], dict]:
    """A job of `ranks` ranks under `strategy`: rank 1's rank process SIGTERMed, then its pod deleted,
    `repeats` times each; seconds from the fault's call to the restart decided and to the gang formed.
    Then the memory of rank 0's pod (MEMORY_PROBE), kept through them under InPlace."""
    name = f"{strategy.lower()}{ranks}"
    job = quickstart_job(name, ["--epochs", "100000"], ranks)
    job["spec"].update(restartStrategy=strategy, infrastructureBackoffLimit=100)
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, job)
    out: dict[str, list[dict]] = {"process": [], "pod": []}
    attempt = 0
    try:
        wait(lambda: (name, 0) in seen.rendezvous, timeout, f"{name} running")
        time.sleep(settle)
        for fault in out:
            for _ in range(repeats):
                before = pod_uids(seen, f"{name}-")
                t0 = time.monotonic()
                if fault == "process":
                    kubectl("exec", "-n", namespace, f"{name}-1", "--", "python", "-c", KILL_RANK_PROCESS)
                else:
                    core.delete_namespaced_pod(f"{name}-1", namespace)
                attempt += 1
                wait(lambda a=attempt: (name, a) in seen.rendezvous, timeout, f"{name} attempt {attempt} formed")
                time.sleep(settle)  # the next fault lands on a job that has trained a while, as most do
                with seen.lock:
                    decided, formed = seen.attempts[(name, attempt)], seen.rendezvous[(name, attempt)][0]
                created = pod_uids(seen, f"{name}-") - before
                out[fault].append({"decided": round(decided - t0, 2), "formed": round(formed - t0, 2),
                                   "pods created": len(created)})
                print(f"{name} {fault}: {out[fault][-1]}", flush=True)
        memory = pod_memory(namespace, f"{name}-0")
        print(f"{name} memory of rank 0's pod: {memory}", flush=True)
    finally:
        custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
    return out, memory


def bare_pod(name: str, image: str) -> dict:
    """A pod that runs until deleted and exits at once on SIGTERM, as a rank does."""
    return {"metadata": {"name": name, "labels": {"figures/bare": "1"}},
            "spec": {"restartPolicy": "Never", "enableServiceLinks": False,
                     "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}]}}


def bare_restarts(core, seen: Seen, namespace: str, image: str, count: int, repeats: int, timeout: float) -> list[dict]:
    names = [f"bare-{i}" for i in range(count)]
    for name in names:
        core.create_namespaced_pod(namespace, bare_pod(name, image))
    times = []
    try:
        wait(lambda: all_up(seen, "bare-", None, count, "running"), timeout, f"{count} bare pods running")
        for _ in range(repeats):
            old = {id(p) for p in seen.of(lambda p: p.name.startswith("bare-") and p.deleting is None)}
            t0 = time.monotonic()
            for name in names:
                core.delete_namespaced_pod(name, namespace)
            pending = set(names)
            while pending:  # each name again as soon as its old pod is gone
                for name in sorted(pending):
                    if all(p.gone for p in seen.of(lambda p, n=name: p.name == n and id(p) in old)):
                        core.create_namespaced_pod(namespace, bare_pod(name, image))
                        pending.discard(name)
                if time.monotonic() - t0 > timeout:
                    raise TimeoutError("the bare pods were not deleted")
                time.sleep(0.02)
            gone = time.monotonic()
            running = wait(lambda: all_up(seen, "bare-", None, count, "running"), timeout, "the bare pods running again")
            ended = [p.terminated for p in seen.of(lambda p: id(p) in old) if p.terminated is not None]
            times.append({"ended": round(max(ended) - t0, 2) if len(ended) == count else None,
                          "gone": round(gone - t0, 2), "running": round(running - t0, 2)})
    finally:
        core.delete_collection_namespaced_pod(namespace, label_selector="figures/bare=1", grace_period_seconds=0)
    return times


def free_ports(env: dict[str, str]) -> None:
    """Fails early if a port of the second cluster is taken (a test's second cluster, another run)."""
    for key, value in env.items():
        if key.endswith("_PORT"):
            with socket.socket() as probe:
                try:
                    probe.bind(("127.0.0.1", int(value)))
                except OSError as error:
                    raise SystemExit(f"{key}={value} is taken ({error}): is another second cluster up?") from error


def node_setup(folder: Path) -> dict:
    """A second cluster with its real node up and down twice: cold (fresh containerd store) and warm."""
    env = {**SECOND_CLUSTER, "DDP_CLUSTER_DIR": str(folder / "cluster"), "DDP_CONTAINERD_ROOT": str(folder / "containerd")}
    free_ports(env)
    out = {}
    try:
        for kind in ("cold", "warm"):
            out[f"{kind} up"] = round(timed(["bash", str(CLUSTER), "up"], env), 1)
            out[f"{kind} down"] = round(timed(["bash", str(CLUSTER), "down"], env), 1)
    finally:
        run(["bash", str(CLUSTER), "down"], env, capture_output=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-setup", action="store_true",
                        help="also time a second cluster's set-up with its real node, cold and warm (about 1 min)")
    parser.add_argument("--runs", type=int, default=2, help="quick-start jobs timed from create to first step")
    parser.add_argument("--restart-ranks", type=int, default=2)
    parser.add_argument("--restart-repeats", type=int, default=3)
    parser.add_argument("--strategy-ranks", default="2,4",
                        help="job sizes (comma-separated) for Recreate next to InPlace; empty: skip them")
    parser.add_argument("--strategy-repeats", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10,
                        help="seconds a job trains between its gang forming and the next fault")
    parser.add_argument("--timeout", type=float, default=300, help="seconds each wait may take")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()

    figures: dict = {}
    run(["bash", str(CLUSTER), "up"], {}, capture_output=True)
    figures["images, no change"] = round(timed(["bash", str(REPO / "images" / "build.sh"), "build"], {}), 1)
    print(f"images/build.sh build with nothing changed: {figures['images, no change']} s", flush=True)
    if args.node_setup:
        with tempfile.TemporaryDirectory(prefix="ddp-figures-") as folder:
            figures["node"] = node_setup(Path(folder))
        print(f"second cluster with its real node: {figures['node']}", flush=True)

    kubeconfig = next(x.split("=", 1)[1] for x in run(["bash", str(CLUSTER), "env"], {}, capture_output=True,
                                                      text=True).stdout.splitlines() if x.startswith("export KUBECONFIG="))
    kubectl("apply", "-f", str(REPO / "crds" / "ddpjob.yaml"))
    api_client = kubeclient.api_client(kubeconfig)
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    namespace = f"{NAMESPACE_PREFIX}{os.getpid()}"
    core.create_namespace({"metadata": {"name": namespace}})
    seen, stop = Seen(), threading.Event()
    operator = None
    try:
        bench_operator.wait(lambda: core.list_namespaced_service_account(namespace).items, 30, "the default ServiceAccount",
                            needs_operator=False)
        with tempfile.TemporaryDirectory(prefix="ddp-figures-busybox-") as root:
            busybox = import_busybox(Path(root))
        log = Path(tempfile.gettempdir()) / f"ddp-figures-operator-{os.getpid()}.log"
        operator = bench_operator.OPERATOR = start_operator(kubeconfig, log, DDP_OPERATOR_NAMESPACES=namespace)
        print(f"operator pid {operator.pid} serving {namespace}, log {log}", flush=True)
        for target, api_obj in ((watch_pods, core), (watch_jobs, custom)):
            threading.Thread(target=target, args=(api_obj, namespace, seen, stop), daemon=True).start()
        figures["first step"] = []
        for i in range(args.runs):
            figures["first step"].append(first_step(custom, seen, namespace, f"first{i}", args.timeout))
            print(f"create -> first step: {figures['first step'][-1]}", flush=True)
        figures["gang restart"] = gang_restarts(custom, seen, namespace, args.restart_ranks, args.restart_repeats,
                                                args.timeout)
        print(f"gang restarts of {args.restart_ranks} ranks: {figures['gang restart']}", flush=True)
        figures["bare pods"] = bare_restarts(core, seen, namespace, busybox, args.restart_ranks, args.restart_repeats,
                                             args.timeout)
        print(f"{args.restart_ranks} bare pods deleted and recreated: {figures['bare pods']}", flush=True)
        figures["strategies"], figures["memory"] = {}, {}
        for ranks in filter(None, args.strategy_ranks.split(",")):
            for strategy in api.RESTART_STRATEGIES[::-1]:
                job = f"{strategy} {ranks}"
                figures["strategies"][job], figures["memory"][job] = strategy_restarts(
                    core, custom, seen, namespace, strategy, int(ranks), args.strategy_repeats, args.timeout,
                    args.settle)
    finally:
        stop.set()
        bench_operator.OPERATOR = None
        stop_operator(operator)
        try:
            core.delete_namespace(namespace)
        except ApiException as error:
            print(f"clean-up of {namespace}: {error.status} {error.reason}", file=sys.stderr)
    print_tables(figures, args.restart_ranks)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


def print_tables(figures: dict, ranks: int) -> None:
    print()
    print(f"images/build.sh build, nothing changed: {figures['images, no change']} s")
    if "node" in figures:
        node = figures["node"]
        print(f"second cluster with its real node: cold up {node['cold up']} s, down {node['cold down']} s;"
              f" warm up {node['warm up']} s, down {node['warm down']} s")
    if figures["first step"]:
        print()
        print("Quick-start job (2 CPU ranks), seconds from the create call; each stage ends when the last rank reaches it:")
        stages = list(figures["first step"][0])
        print("run " + " ".join(f"{s:>11}" for s in stages))
        for i, row in enumerate(figures["first step"]):
            print(f"{i:<3} " + " ".join(f"{row[s]:>11.2f}" for s in stages))
    print()
    print(f"Gang restart of {ranks} ranks (rank 1 SIGTERMed), seconds from the failure seen (first column: from the"
          " exec call) to the old pods gone, the new ones created, all running, Ready, rank 0's runtime started and"
          " the gang formed:")
    print("   " + " ".join(f"{s:>13}" for s in figures["gang restart"][0]))
    for row in figures["gang restart"]:
        print("   " + " ".join(f"{v:>13.2f}" for v in row.values()))
    print(f"{ranks} bare busybox pods deleted and recreated, seconds from the delete calls to their containers ended (as"
          " the kubelet reports it), to the pods gone, and to all running again: " + ", ".join(
              f"{x['ended'] if x['ended'] is not None else '?'} / {x['gone']:.2f} / {x['running']:.2f}"
              for x in figures["bare pods"]))
    if figures.get("strategies"):
        print()
        print("restartStrategy, seconds from the fault's call to the restart decided / the gang formed again, and rank"
              " pods created anew (process: rank 1's rank process SIGTERMed; pod: rank 1's pod deleted):")
        for job, faults in figures["strategies"].items():
            for fault, rows in faults.items():
                print(f"{job:<12} {fault:<8} " + "  ".join(
                    f"{r['decided']:.2f} / {r['formed']:.2f} ({r['pods created']})" for r in rows))
        print()
        print("Memory of rank 0's pod after those faults, MiB: the container's (its memory cgroup: all / anonymous),"
              " and each process's resident / proportional share / private:")
        for job, memory in figures["memory"].items():
            print(f"{job:<12} container {memory['container']} / {memory['container anon']}; " + "; ".join(
                f"{p['role']} {p['rss']} / {p['pss']} / {p['private']}" for p in memory["processes"]))


if __name__ == "__main__":
    sys.exit(main())
