"""Operator benchmark (`make bench-operator`): how fast DDPJobs become pods and phase Running.

Starts a separate local control plane (own state dir and ports; kwok plays the kubelet for
fake nodes) and the operator as a subprocess, then for each world size and for many concurrent
small jobs measures, with local monotonic clocks, from the create call *returning*:

  first     the first of the job's pods seen by a watch (the operator's reaction)
  created   all pods seen by a watch (the operator's work, bounded by the API server)
  bound     all pods bound to a node (the scheduler's work)
  running   all pods Running (kwok's work; on the same 2 cores as everything else)
  phase     status.phase Running seen by a watch
  lag       phase - last pod Running of that job: how long the job took to say so (target < 1 s)

and the operator's RSS (sampled VmRSS and VmHWM; and once each scenario's jobs and pods are deleted, after
SETTLE_S seconds). A baseline scenario creates the same number of
bare pods straight from this script with as many calls in flight as the operator uses, so the
control plane's own limits (API server, scheduler, kwok) read apart from the operator's.

Gang restarts (`--restart-sizes`, `--restart-repeats`): a job's rank 1 is marked Failed with exit
code 137 through the pod status subresource, as a kubelet reports an OOM kill, and the time until
the job says Running again at the next attempt, with every new pod Ready, is measured next to the
control plane alone deleting and recreating as many bare pods (delete all, recreate each name once
it is free, until all are Ready). Pods are followed by uid, so a pod of the new attempt deleted
after all (a restart that thrashes) is counted.

Faults (`--fault-sizes`): each fault injected as a kubelet would report it into a Running job's rank
1: an OOM kill (137, OOMKilled), a hung rank (the runtime's exit code 204 and its failure line), an
eviction, then rank 1's node deleted (the job runs on two fake nodes of its own for this); and a job
whose ranks cannot be scheduled at all. Measured: from the injection (or the
create call) to the job's status saying why (status.reason, and failedRank naming rank 1), and to
the gang Running again at the next attempt.

restartStrategy (`--strategy-sizes`, `--restart-repeats`): the same failure under Recreate and under
InPlace, per restart: the API writes it takes (pods created, pods deleted, job status patches, from
the watches) and the operator's CPU seconds, until the job is Running again. The kwok pods run no
runtime, so under InPlace this script records the new gang formed (status.rendezvous) once every pod
is Ready, as rank 0 would.

Targets: 64 ranks created < 2 s, 1024 < 20 s, lag < 1 s, RSS < 250 MB with 100 jobs x 8 ranks;
each gang restart within 2x the bare pods' delete-and-recreate, with no pod of a new attempt deleted;
every fault said on the job within 2 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

REPO = Path(__file__).resolve().parent.parent
# The benchmark runs from the source tree, like the tests; these imports need the paths first.
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator"), str(REPO / "localcluster")]
from ddp_contract import api, kubeclient, labels  # noqa: E402
from ddp_contract.api import RESTART_IN_PLACE, RESTART_RECREATE  # noqa: E402
from ddp_operator import constants as c  # noqa: E402
from ddp_operator.kubeapi import CONCURRENCY, discard_answer  # noqa: E402
from fakenodes import FAKE_NODE_TOLERATION, on_fake_nodes  # noqa: E402
from podstatus import evicted_status, hung_status, pod_status  # noqa: E402

BENCH_CLUSTER = {
    "DDP_CLUSTER_DIR": "/tmp/ddp-bench-cluster",
    "DDP_NODES": "8",
    "DDP_API_PORT": "18443",
    "DDP_ETCD_PORT": "14379",
    "DDP_ETCD_PEER_PORT": "14380",
    "DDP_KCM_PORT": "22257",
    "DDP_SCHED_PORT": "22259",
    "DDP_KWOK_PORT": "22247",
    "DDP_REAL_NODE": "0",  # the operator is measured on kwok's fake nodes
}
NAMESPACE = "bench"
BASELINE_LABEL = "ddp-bench/baseline"
BENCH_NODE_PREFIX = "bench-node-"
BENCH_NODE_PODS = 512
FAULT_POOL_LABEL = "ddp-bench/pool"  # the fault scenario's own nodes
OPERATOR: subprocess.Popen | None = None  # checked by every wait: a dead operator fails fast
SETTLE_S = 15.0  # after a scenario's pods are gone, before the operator's RSS is read again
POLL_SHARE = 10  # a wait sleeps at least this many times as long as its predicate took
TARGETS = {"created_64_s": 2.0, "created_1024_s": 20.0, "lag_s": 1.0, "rss_many_mb": 250.0, "restart_vs_bare": 2.0,
           "why_s": 2.0}


@dataclass
class PodTimes:
    added: float
    bound: float | None = None
    running: float | None = None
    ready: float | None = None  # Ready condition True: what the operator counts as a ready rank


@dataclass
class PodLife:
    """One pod object (by uid: a gang restart reuses the names), as the watch saw it."""

    name: str
    attempt: str | None
    added: float
    ready: float | None = None
    deleting: float | None = None  # deletionTimestamp first seen
    gone: float | None = None  # DELETED seen


@dataclass
class Tracker:
    """What the watches saw, with local monotonic times."""

    pods: dict[str, PodTimes] = field(default_factory=dict)
    live: set[str] = field(default_factory=set)  # pods that exist now (for the clean-up waits)
    jobs_running: dict[str, float] = field(default_factory=dict)
    job_updates: dict[str, int] = field(default_factory=dict)  # watch events per job: ~ status patches
    lives: dict[str, PodLife] = field(default_factory=dict)  # uid -> life
    job_states: dict[str, tuple[str | None, int, float]] = field(default_factory=dict)  # phase, attempt, since
    # (reason, attempt, failedRank.attempt, first seen) per job, each time the reason or attempt changed
    job_reasons: dict[str, list[tuple[str, int, int | None, float]]] = field(default_factory=dict)
    # pods with a time for each PodTimes field, kept as the watch sets them: the waits read these many
    # times a second, and a walk over 10,000 pods there holds the GIL from the watches' threads
    reached: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.pods.clear()
            self.reached.clear()
            self.jobs_running.clear()
            self.job_updates.clear()
            self.lives.clear()
            self.job_states.clear()
            self.job_reasons.clear()

    def count(self, attr: str) -> int:
        return self.reached.get(attr, 0)

    def saw(self, times: PodTimes, attr: str, now: float) -> None:
        """Sets `attr` of a pod's times to `now` unless set; counts it."""
        if getattr(times, attr) is None:
            setattr(times, attr, now)
            self.reached[attr] = self.reached.get(attr, 0) + 1


def stream(list_fn, stop: threading.Event, *args, **kwargs):
    """Raw watch events (dicts), resumed across the server's timeouts and relisted on 410 Gone.

    Raw JSON, not the client's models: deserializing every pod into V1Pod would take CPU from
    the operator on the same 2 cores.
    """
    version = None
    while not stop.is_set():
        try:
            if version is None:
                listing = json.loads(list_fn(*args, _preload_content=False, **kwargs).data)
                version = listing["metadata"]["resourceVersion"]
                for item in listing.get("items", []):
                    yield {"type": "ADDED", "object": item}
            response = list_fn(*args, watch=True, resource_version=version, timeout_seconds=30,
                               allow_watch_bookmarks=True, _preload_content=False, **kwargs)
            try:
                for line in iter_resp_lines(response):
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        raise ApiException(status=event["object"].get("code", 500),
                                           reason=event["object"].get("message"))
                    version = event["object"].get("metadata", {}).get("resourceVersion", version)
                    if event["type"] != "BOOKMARK":
                        yield event
                    if stop.is_set():
                        return
            finally:
                response.release_conn()
        except ApiException as error:
            if error.status == 410:
                version = None
            else:
                print(f"watch error: {error.status} {error.reason}", file=sys.stderr)
                stop.wait(0.5)
        except Exception as error:  # noqa: BLE001 - a dropped connection: resume
            print(f"watch broke: {error!r}", file=sys.stderr)
            stop.wait(0.5)


def watch_pods(core: client.CoreV1Api, tracker: Tracker, stop: threading.Event) -> None:
    # Every pod in the namespace: the operator's and the baseline's.
    for event in stream(core.list_namespaced_pod, stop, NAMESPACE):
        pod, now = event["object"], time.monotonic()
        name = pod["metadata"]["name"]
        with tracker.lock:
            track_life(tracker.lives, event["type"], pod, now)
            if event["type"] == "DELETED":
                tracker.live.discard(name)
                continue
            tracker.live.add(name)
            if pod["metadata"].get("deletionTimestamp"):
                continue
            times = tracker.pods.setdefault(name, PodTimes(now))
            if pod.get("spec", {}).get("nodeName"):
                tracker.saw(times, "bound", now)
            if pod.get("status", {}).get("phase") == "Running":
                tracker.saw(times, "running", now)
                tracker.saw(times, "bound", now)
            if any(x.get("type") == "Ready" and x.get("status") == "True"
                   for x in pod.get("status", {}).get("conditions") or []):
                tracker.saw(times, "ready", now)


def track_life(lives: dict[str, PodLife], kind: str, pod: dict, now: float) -> None:
    """The pod's life by uid in `lives` (a new PodLife unless there is one) after a watch event."""
    meta = pod["metadata"]
    life = lives.setdefault(meta["uid"], PodLife(meta["name"], (meta.get("labels") or {}).get(labels.LABEL_ATTEMPT),
                                                         now))
    if kind == "DELETED":
        life.gone = life.gone or now
    if meta.get("deletionTimestamp") or kind == "DELETED":
        life.deleting = life.deleting or now
    elif life.ready is None and any(x.get("type") == "Ready" and x.get("status") == "True"
                                    for x in pod.get("status", {}).get("conditions") or []):
        life.ready = now


def watch_jobs(custom: client.CustomObjectsApi, tracker: Tracker, stop: threading.Event) -> None:
    for event in stream(custom.list_namespaced_custom_object, stop, api.GROUP, api.VERSION, NAMESPACE, api.PLURAL):
        job, now = event["object"], time.monotonic()
        name = job["metadata"]["name"]
        with tracker.lock:
            status = job.get("status") or {}
            state = (status.get("phase"), int(status.get("attempt") or 0))
            if tracker.job_states.get(name, (None, -1, 0.0))[:2] != state:
                tracker.job_states[name] = (*state, now)
            said = (str(status.get("reason") or ""), state[1], (status.get("failedRank") or {}).get("attempt"))
            seen = tracker.job_reasons.setdefault(name, [])
            if not seen or seen[-1][:3] != said:
                seen.append((*said, now))
            if event["type"] == "MODIFIED":
                tracker.job_updates[name] = tracker.job_updates.get(name, 0) + 1
            if (job.get("status") or {}).get("phase") == c.PHASE_RUNNING:
                tracker.jobs_running.setdefault(name, now)


class RssSampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.window_peak_kb, self.stop = pid, 0, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                rss = status_kb(self.pid, "VmRSS")
            except FileNotFoundError:  # the operator has exited
                return
            self.peak_kb = max(self.peak_kb, rss)
            self.window_peak_kb = max(self.window_peak_kb, rss)

    def window(self) -> float:
        """Peak MB since the last call."""
        peak, self.window_peak_kb = self.window_peak_kb, 0
        return round(peak / 1024, 1)

    def settled(self, seconds: float = SETTLE_S) -> float:
        """MB held once the operator has had `seconds` to let go of what it no longer needs (its jobs and pods
        deleted): a memory that stays up after a large job is a cost every later job pays."""
        time.sleep(seconds)
        return round(status_kb(self.pid, "VmRSS") / 1024, 1)


def status_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    return 0


def job_body(name: str, world_size: int) -> dict:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"worldSize": world_size, "gpusPerRank": 0, "image": "trainer:bench",
                     "command": ["python", "train.py"], "template": {"spec": on_fake_nodes({})}}}


def bare_pod(name: str) -> dict:
    """A pod like a rank's (same image, command, restart policy), without the operator's labels."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {BASELINE_LABEL: "1"}},
            "spec": on_fake_nodes({"restartPolicy": "Never", "enableServiceLinks": False,
                                   "containers": [{"name": "trainer", "image": "trainer:bench",
                                                   "command": ["python", "train.py"],
                                                   "env": [{"name": "RANK", "value": "0"}]}]})}


def wait(predicate, timeout: float, what: str, interval: float = 0.02, needs_operator: bool = True) -> float:
    """The time `predicate` first held, asked every `interval` seconds, or less often where asking takes long:
    a predicate that walks 20,000 pods' lives would otherwise hold the GIL from the watches' threads, whose
    lag would count against the operator."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        asked = time.monotonic()
        if predicate():
            return time.monotonic()
        took = time.monotonic() - asked
        if needs_operator and OPERATOR is not None and OPERATOR.poll() is not None:
            raise RuntimeError(f"the operator exited (status {OPERATOR.returncode}; negative: killed by that "
                               f"signal) while waiting for {what}")
        time.sleep(max(interval, POLL_SHARE * took))
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def job_of(pod_name: str) -> str:
    return pod_name.rsplit("-", 1)[0]


def figures(tracker: Tracker, start: dict[str, float], t0: float, jobs_phase: bool) -> dict:
    """Times in seconds from t0 (the first create returned), and per-job figures from each job's own."""
    with tracker.lock:
        pods = dict(tracker.pods)
        running = dict(tracker.jobs_running)
        updates = dict(tracker.job_updates)

    def r(x: float) -> float:
        return round(x, 3)

    last_added = max(p.added for p in pods.values())
    last_bound = max(p.bound for p in pods.values())
    last_running = max(p.running for p in pods.values())
    out = {
        "first_pod_s": r(min(p.added for p in pods.values()) - t0),
        "created_s": r(last_added - t0),
        "bound_s": r(last_bound - t0),
        "pods_running_s": r(last_running - t0),
        # The control plane's share: after the last pod exists, how long scheduling and kwok took.
        "bind_after_created_s": r(last_bound - last_added),
        "kwok_after_bound_s": r(last_running - last_bound),
        "bind_latency_max_s": r(max(p.bound - p.added for p in pods.values())),
        "kwok_latency_max_s": r(max(p.running - p.bound for p in pods.values())),
    }
    if not jobs_phase:
        return out
    per_job_created = [max(p.added for n, p in pods.items() if job_of(n) == j) - start[j] for j in start]
    # lag: from the job's last pod Ready (the operator counts Ready ranks) to phase Running seen;
    # lag_from_phase: from its last pod's phase Running (kwok may set Ready in a later update).
    lags = {j: running[j] - max(p.ready or p.running for n, p in pods.items() if job_of(n) == j) for j in start}
    phase_lags = {j: running[j] - max(p.running for n, p in pods.items() if job_of(n) == j) for j in start}
    out.update({
        "phase_running_s": r(max(running.values()) - t0),
        "lag_max_s": r(max(lags.values())),
        "lag_median_s": r(statistics.median(lags.values())),
        "lag_from_pod_phase_max_s": r(max(phase_lags.values())),
        "ready_after_running_max_s": r(max((p.ready or p.running) - p.running for p in pods.values())),
        "lag_worst_job": max(lags, key=lags.get),
        "lag_last_s": r(max(running.values()) - last_running),
        "job_created_median_s": r(statistics.median(per_job_created)),
        "job_created_max_s": r(max(per_job_created)),
        "status_updates_per_job_max": max(updates.values(), default=0),
        "status_updates_total": sum(updates.values()),
    })
    return out


def run_jobs(custom, tracker: Tracker, label: str, jobs: int, ranks: int, timeout: float) -> dict:
    tracker.reset()
    names = [f"{label}-{i}" for i in range(jobs)]
    total = jobs * ranks
    start: dict[str, float] = {}

    def create(name: str) -> None:
        custom.create_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, job_body(name, ranks))
        start[name] = time.monotonic()

    try:
        called = time.monotonic()
        with ThreadPoolExecutor(min(16, jobs)) as pool:  # "concurrent" jobs: created concurrently
            list(pool.map(create, names))
        t0 = min(start.values())
        wait(lambda: len(tracker.pods) >= total, timeout, f"{total} pods created")
        wait(lambda: tracker.count("running") >= total, timeout, f"{total} pods Running")
        wait(lambda: tracker.count("ready") >= total, timeout, f"{total} pods Ready")
        wait(lambda: len(tracker.jobs_running) >= jobs, timeout, f"{jobs} jobs Running")
        time.sleep(0.5)  # let trailing status updates arrive for the count
        return {"scenario": label, "jobs": jobs, "ranks_per_job": ranks, "pods": total,
                "create_calls_s": round(max(start.values()) - called, 3), **figures(tracker, start, t0, True)}
    finally:
        delete_jobs(custom, names, timeout)
        wait_pods_gone(tracker, timeout)


def run_baseline(core, tracker: Tracker, count: int, timeout: float) -> dict:
    """count bare pods created from here, CONCURRENCY calls in flight: the control plane alone."""
    tracker.reset()
    names = [f"baseline-{i}" for i in range(count)]
    try:
        called = time.monotonic()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(lambda n: discard_answer(core.create_namespaced_pod, NAMESPACE, bare_pod(n)), names))
        returned = time.monotonic()
        wait(lambda: len(tracker.pods) >= count, timeout, f"{count} baseline pods created")
        wait(lambda: tracker.count("running") >= count, timeout, f"{count} baseline pods Running")
        return {"scenario": f"baseline{count}", "jobs": 0, "ranks_per_job": 0, "pods": count,
                "create_calls_s": round(returned - called, 3), **figures(tracker, {}, called, False)}
    finally:
        delete_pods(core, BASELINE_LABEL)
        wait_pods_gone(tracker, timeout)


def delete_pods(core, selector: str | None = None) -> None:
    """Deletes the labelled pods (every pod of the namespace) at once; asked again while the API server
    answers 504 (its minute for one call runs out at about 10,000 pods), each call deleting more of them."""
    while True:
        try:
            core.delete_collection_namespaced_pod(NAMESPACE, label_selector=selector, grace_period_seconds=0)
            return
        except ApiException as error:
            if error.status != 504:
                raise


def run_restarts(core, custom, tracker: Tracker, ranks: int, repeats: int, timeout: float) -> dict:
    """Gang restarts: rank 1 fails with exit code 137 (as a kubelet reports an OOM kill), `repeats`
    times; each settles when the job says Running again with every pod of the new attempt Ready."""
    tracker.reset()
    name = f"restart{ranks}"
    body = job_body(name, ranks)
    body["spec"]["backoffLimit"] = repeats + 1
    settle, pods_ready, steps = [], [], []
    try:
        custom.create_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, body)
        wait(lambda: gang_settled(tracker, name, ranks, 0), timeout, f"{name} Running")
        for attempt in range(1, repeats + 1):
            oom_killed = pod_status(labels.CONTAINER_NAME, "trainer:bench", 137, "OOMKilled")
            core.patch_namespaced_pod_status(f"{name}-1", NAMESPACE, {"status": oom_killed})
            t0 = time.monotonic()
            wait(lambda a=attempt: gang_settled(tracker, name, ranks, a), timeout, f"{name} Running at attempt {attempt}")
            with tracker.lock:
                lives = [x for x in tracker.lives.values() if x.attempt == str(attempt) and x.deleting is None]
                old = [x for x in tracker.lives.values() if x.attempt == str(attempt - 1)]
                states = tracker.job_states[name]
            settle.append(states[2] - t0)
            pods_ready.append(max(x.ready for x in lives) - t0)
            steps.append({k: round(v - t0, 2) for k, v in (
                ("old_deleting_first", min(x.deleting for x in old)), ("old_deleting_all", max(x.deleting for x in old)),
                ("old_gone_all", max(x.gone for x in old if x.gone) if all(x.gone for x in old) else float("nan")),
                ("new_first", min(x.added for x in lives)), ("new_all", max(x.added for x in lives)),
                ("new_ready_all", max(x.ready for x in lives)), ("phase", states[2]))})
        time.sleep(1.0)  # a late delete of a new pod would show now
        with tracker.lock:
            killed = sum(1 for x in tracker.lives.values() if x.deleting is not None and x.attempt == str(repeats))
            recreated = sum(1 for x in tracker.lives.values() if x.attempt not in (None, "0")) - repeats * ranks
        return {"scenario": f"restart{ranks}", "jobs": 1, "ranks_per_job": ranks, "pods": ranks,
                "restarts": repeats, "restart_settle_s": [round(x, 3) for x in settle],
                "restart_pods_ready_s": [round(x, 3) for x in pods_ready],
                "restart_settle_max_s": round(max(settle), 3), "restart_steps_s": steps,
                "new_attempt_pods_deleted": killed, "extra_pods_created": recreated}
    finally:
        delete_jobs(custom, [name], timeout)
        wait_pods_gone(tracker, timeout)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def strategy_settled(tracker: Tracker, name: str, ranks: int, attempt: int) -> bool:
    """Running at `attempt` with `ranks` live pods Ready, whichever attempts created them."""
    with tracker.lock:
        phase, seen_attempt, _ = tracker.job_states.get(name, (None, -1, 0.0))
        ready = {x.name for x in tracker.lives.values()
                 if x.name.startswith(f"{name}-") and x.ready is not None and x.deleting is None}
    return phase == c.PHASE_RUNNING and seen_attempt == attempt and len(ready) == ranks


def run_strategy_restarts(core, custom, tracker: Tracker, ranks: int, repeats: int, timeout: float,
                          strategy: str) -> dict:
    """Rank 1's container fails (exit 137, OOMKilled) `repeats` times under `strategy`: the API writes
    each restart takes (pods created, pods deleted, job status patches) and the operator's CPU time,
    until the job is Running again. InPlace: the kwok pods run no runtime, so this script records the
    new gang formed (status.rendezvous) once every pod is Ready, as rank 0 would."""
    tracker.reset()
    name = f"{strategy.lower()}{ranks}"
    body = job_body(name, ranks)
    body["spec"].pop("command")
    body["spec"].update(entrypoint="train:main", restartStrategy=strategy, backoffLimit=repeats + 1)
    in_place = strategy == api.RESTART_IN_PLACE
    rows = []
    try:
        custom.create_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, body)
        wait(lambda: strategy_settled(tracker, name, ranks, 0), timeout, f"{name} Running")
        for attempt in range(1, repeats + 1):
            with tracker.lock:
                before, updates = set(tracker.lives), tracker.job_updates.get(name, 0)
            assert OPERATOR is not None
            cpu = cpu_seconds(OPERATOR.pid)
            t0 = time.monotonic()
            core.patch_namespaced_pod_status(f"{name}-1", NAMESPACE,
                                             {"status": pod_status(labels.CONTAINER_NAME, "trainer:bench", 137, "OOMKilled")})
            if in_place:
                wait(lambda a=attempt: tracker.job_states.get(name, (None, -1))[1] == a, timeout, f"{name} attempt {attempt}")
                wait(lambda: len([x for x in tracker.lives.values() if x.name.startswith(f"{name}-") and x.ready
                                  and x.deleting is None]) == ranks, timeout, f"{name}'s pods Ready")
                custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, name, {
                    "status": {"rendezvous": {"attempt": attempt, "formedSeconds": 0.0, "allReduceMillis": 0.0}}})
            wait(lambda a=attempt: strategy_settled(tracker, name, ranks, a), timeout, f"{name} Running at {attempt}")
            used = cpu_seconds(OPERATOR.pid) - cpu
            with tracker.lock:
                settled = tracker.job_states[name][2] - t0
                created = len(set(tracker.lives) - before)
                deleted = sum(1 for uid in before if (tracker.lives[uid].deleting or 0) >= t0)
                patches = tracker.job_updates.get(name, 0) - updates - (1 if in_place else 0)
            rows.append({"settle_s": round(settled, 2), "pods_created": created, "pods_deleted": deleted,
                         "status_patches": patches, "writes": created + deleted + patches,
                         "operator_cpu_s": round(used, 2)})
            print(f"{name} restart {attempt}: {rows[-1]}", flush=True)
    finally:
        delete_jobs(custom, [name], timeout)
        wait_pods_gone(tracker, timeout)
    return {"scenario": name, "strategy": strategy, "ranks": ranks, "restarts": rows}


# A fault, how to inject it into rank 1 (a pod status as the kubelet reports it) and the reason
# the job must then give.
FAULTS = {
    "oom": (lambda: pod_status(labels.CONTAINER_NAME, "trainer:bench", 137, "OOMKilled"), c.REASON_RANK_FAILED),
    "hung": (lambda: hung_status(labels.CONTAINER_NAME, "trainer:bench", 1, 40, "s3://b/hangs/rank-1.txt"), c.REASON_HUNG),
    "evicted": (evicted_status, c.REASON_RANK_EVICTED),
}


def said_why(tracker: Tracker, name: str, reasons: set[str], attempt: int, failed_attempt: int | None) -> float | None:
    """When the job first gave one of `reasons` at `attempt`, for a failure of `failed_attempt`."""
    with tracker.lock:
        for reason, seen_attempt, failed, at in tracker.job_reasons.get(name, []):
            if reason in reasons and seen_attempt == attempt and failed == failed_attempt:
                return at
    return None


def run_faults(core, custom, tracker: Tracker, ranks: int, timeout: float) -> dict:
    """Each fault in turn into one Running job of `ranks` ranks, the last one deleting rank 1's node;
    then a job that cannot be scheduled. The job runs on two nodes of its own, each able to take the
    whole gang: the one deleted is never a node the cluster had."""
    tracker.reset()
    name = f"faults{ranks}"
    pool = {FAULT_POOL_LABEL: name}
    own_nodes = [f"{BENCH_NODE_PREFIX}{name}-{side}" for side in "ab"]
    body = job_body(name, ranks)
    body["spec"]["template"]["spec"]["nodeSelector"].update(pool)
    body["spec"].update(backoffLimit=len(FAULTS), infrastructureBackoffLimit=len(FAULTS) + 1)
    out: dict = {"scenario": name, "jobs": 1, "ranks_per_job": ranks, "pods": ranks, "faults": {}}

    def inject(attempt: int, fault: str, reason: str, act) -> None:
        act()
        t0 = time.monotonic()
        why = wait(lambda: said_why(tracker, name, {reason}, attempt, attempt - 1) is not None, timeout,
                   f"{name} saying {reason}")
        wait(lambda: gang_settled(tracker, name, ranks, attempt), timeout, f"{name} Running after {fault}")
        with tracker.lock:
            running = tracker.job_states[name][2]
        said = said_why(tracker, name, {reason}, attempt, attempt - 1)
        out["faults"][fault] = {"why_s": round((said or why) - t0, 3), "running_again_s": round(running - t0, 3)}

    try:
        make_nodes(core, own_nodes, ranks + 8, pool)
        custom.create_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, body)
        wait(lambda: gang_settled(tracker, name, ranks, 0), timeout, f"{name} Running")
        for attempt, (fault, (status, reason)) in enumerate(FAULTS.items(), start=1):
            inject(attempt, fault, reason,
                   lambda s=status: core.patch_namespaced_pod_status(f"{name}-1", NAMESPACE, {"status": s()}))
        node = core.read_namespaced_pod(f"{name}-1", NAMESPACE).spec.node_name
        inject(len(FAULTS) + 1, "node-deleted", c.REASON_NODE_LOST, lambda: core.delete_node(node))
        unfit = f"unfit{ranks}"
        big = job_body(unfit, ranks)
        big["spec"]["gpusPerRank"] = 16  # more than any node has
        t0 = time.monotonic()
        custom.create_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, big)
        reasons = {c.REASON_UNSCHEDULABLE, "GangTooLarge"}
        wait(lambda: said_why(tracker, unfit, reasons, 0, None) is not None, timeout, f"{unfit} saying why")
        out["faults"]["unschedulable"] = {"why_s": round(said_why(tracker, unfit, reasons, 0, None) - t0, 3)}
        return out
    finally:
        delete_jobs(custom, [name, f"unfit{ranks}"], timeout)
        wait_pods_gone(tracker, timeout)
        delete_nodes(core, own_nodes)


def gang_settled(tracker: Tracker, name: str, ranks: int, attempt: int) -> bool:
    with tracker.lock:
        phase, seen_attempt, _ = tracker.job_states.get(name, (None, -1, 0.0))
        ready = {x.name for x in tracker.lives.values()
                 if x.attempt == str(attempt) and x.ready is not None and x.deleting is None}
    return phase == c.PHASE_RUNNING and seen_attempt == attempt and len(ready) == ranks


def run_baseline_restart(core, tracker: Tracker, count: int, repeats: int, timeout: float) -> dict:
    """What a gang restart costs the control plane alone: delete `count` running bare pods (default
    grace, as the operator deletes), and once each name is free create it again, until all Running."""
    tracker.reset()
    names = [f"bare-{i}" for i in range(count)]
    times = []

    def ready_pods() -> int:
        with tracker.lock:
            return sum(1 for x in tracker.lives.values() if x.ready is not None and x.deleting is None)

    def gone(uids: set[str]) -> bool:
        with tracker.lock:
            return all(tracker.lives[u].gone is not None for u in uids)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        def create(name: str) -> None:
            discard_answer(core.create_namespaced_pod, NAMESPACE, bare_pod(name))

        try:
            list(pool.map(create, names))
            wait(lambda: ready_pods() >= count, timeout, f"{count} bare pods Ready")
            for _ in range(repeats):
                with tracker.lock:
                    old = {u for u, x in tracker.lives.items() if x.deleting is None}
                t0 = time.monotonic()
                list(pool.map(lambda n: discard_answer(core.delete_namespaced_pod, n, NAMESPACE), names))
                wait(lambda o=old: gone(o), timeout, f"{count} bare pods deleted")
                list(pool.map(create, names))
                wait(lambda: ready_pods() >= count, timeout, f"{count} bare pods Ready again")
                times.append(time.monotonic() - t0)
        finally:
            delete_pods(core, BASELINE_LABEL)
            wait_pods_gone(tracker, timeout)
    return {"scenario": f"bare-restart{count}", "jobs": 0, "ranks_per_job": 0, "pods": count,
            "restart_settle_s": [round(x, 3) for x in times], "restart_settle_max_s": round(max(times), 3)}


def delete_jobs(custom, names: list[str], timeout: float) -> None:
    for name in names:
        try:
            custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, name,
                                                   propagation_policy="Background")
        except ApiException as error:
            if error.status != 404:
                raise


def wait_pods_gone(tracker: Tracker, timeout: float) -> None:
    def gone() -> bool:
        with tracker.lock:
            return not tracker.live
    wait(gone, timeout, "the pods to be deleted", interval=0.2, needs_operator=False)  # the GC deletes them


def run(cmd: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env={**os.environ, **env}, check=True, **kwargs)


def start_operator(kubeconfig: str, log: Path, **settings: str) -> subprocess.Popen:
    """The operator from the source tree, its output in `log`, once it says it started; `settings`
    are its environment variables (e.g. DDP_OPERATOR_NAMESPACES)."""
    env = {**os.environ, "KUBECONFIG": kubeconfig, "DDP_OPERATOR_METRICS_PORT": "0",  # any free port
           "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("contract", "operator")), **settings}
    operator = subprocess.Popen([sys.executable, "-m", "ddp_operator"], env=env, stdout=log.open("w"),
                                stderr=subprocess.STDOUT)
    try:
        wait(lambda: "ddp-operator started" in log.read_text() or operator.poll() is not None, 60,
             "the operator to start", interval=0.1, needs_operator=False)
    except TimeoutError:
        operator.kill()
        raise
    if operator.poll() is not None:
        raise RuntimeError(f"the operator exited ({operator.returncode}); its log: {log}")
    return operator


def stop_operator(operator: subprocess.Popen | None) -> None:
    """SIGTERM, and SIGKILL if it has not exited 20 s later."""
    if operator is not None:
        operator.terminate()
        try:
            operator.wait(20)
        except subprocess.TimeoutExpired:
            operator.kill()
            operator.wait()


def start_cluster(env: dict[str, str]) -> str:
    script = str(REPO / "localcluster" / "cluster.sh")
    run(["bash", script, "up"], env)
    run(["bash", script, "kubectl", "apply", "-f", str(REPO / "crds" / "ddpjob.yaml")], env, capture_output=True)
    run(["bash", script, "kubectl", "wait", "--for=condition=Established", "--timeout=120s", f"crd/{api.CRD_NAME}"], env,
        capture_output=True)
    return str(Path(env["DDP_CLUSTER_DIR"]) / "kubeconfig")


def add_capacity(core: client.CoreV1Api, needed: int) -> list[str]:
    """Adds kwok fake nodes named bench-node-N until `needed` more pods fit; returns their names."""
    free = 0
    for node in core.list_node(label_selector="type=kwok").items:
        if node.metadata.name.startswith(BENCH_NODE_PREFIX) or node.spec.unschedulable:
            continue
        ready = any(x.type == "Ready" and x.status == "True" for x in node.status.conditions or [])
        if ready:
            used = len(core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.metadata.name}").items)
            free += int(node.status.allocatable.get("pods", "0")) - used
    names = [f"{BENCH_NODE_PREFIX}{i}" for i in range(math.ceil(max(0, needed - free) / BENCH_NODE_PODS))]
    make_nodes(core, names, BENCH_NODE_PODS)
    return names


def make_nodes(core: client.CoreV1Api, names: list[str], pods: int, extra_labels: dict[str, str] | None = None) -> None:
    """kwok fake nodes that take `pods` pods each, waited for until Ready."""
    for name in names:
        capacity = {"cpu": "1000", "memory": "4Ti", "pods": str(pods)}
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake",
                                                           "node.alpha.kubernetes.io/ttl": "0"},
                             "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                        "kubernetes.io/arch": "amd64", "type": "kwok", **(extra_labels or {})}},
                "spec": {"taints": [{k: v for k, v in FAKE_NODE_TOLERATION.items() if k != "operator"}]},
                "status": {"capacity": capacity, "allocatable": capacity}}
        try:
            core.create_node(body)
        except ApiException as error:
            if error.status != 409:
                raise
    if names:
        wait(lambda: all(any(x.type == "Ready" and x.status == "True" for x in core.read_node(n).status.conditions or [])
                         for n in names), 60, "the bench nodes to be Ready", interval=0.5)


def delete_nodes(core: client.CoreV1Api, names: list[str]) -> None:
    for name in names:
        try:
            core.delete_node(name)
        except ApiException as error:
            if error.status != 404:
                print(f"clean-up of node {name}: {error.status} {error.reason}", file=sys.stderr)


def ensure_namespace(core: client.CoreV1Api) -> None:
    def exists_and_active() -> bool:
        try:
            return core.read_namespace(NAMESPACE).status.phase == "Active"
        except ApiException as error:
            if error.status != 404:
                raise
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        except ApiException as error:
            if error.status != 409:  # 409: still terminating from an earlier run
                raise
        return False
    wait(exists_and_active, 120, f"namespace {NAMESPACE}", interval=0.5)
    wait(lambda: core.list_namespaced_service_account(NAMESPACE).items, 30, "the default ServiceAccount", 0.2)


def verdicts(results: list[dict], rss_mb: float | None) -> list[tuple[str, str, bool | None]]:
    by = {r["scenario"]: r for r in results}
    out: list[tuple[str, str, bool | None]] = []
    for size, key in ((64, "created_64_s"), (1024, "created_1024_s")):
        if f"w{size}" in by:
            value = by[f"w{size}"]["created_s"]
            out.append((f"{size} ranks created < {TARGETS[key]:g} s", f"{value:.2f} s", value < TARGETS[key]))
    lags = [r["lag_max_s"] for r in results if "lag_max_s" in r]
    if lags:
        out.append((f"phase Running within {TARGETS['lag_s']:g} s of last pod Running (all jobs)",
                    f"max {max(lags):.2f} s", max(lags) < TARGETS["lag_s"]))
    for r in results:
        bare = by.get(f"bare-{r['scenario']}")
        if r["scenario"].startswith("restart") and bare:
            limit = TARGETS["restart_vs_bare"] * statistics.median(bare["restart_settle_s"])
            out.append((f"{r['pods']} ranks: each gang restart Running again within {TARGETS['restart_vs_bare']:g}x "
                        f"bare pods deleted and recreated ({limit:.2f} s)",
                        f"max {r['restart_settle_max_s']:.2f} s", r["restart_settle_max_s"] <= limit))
            out.append((f"{r['pods']} ranks: no pod of a new attempt deleted", str(r["new_attempt_pods_deleted"]),
                        r["new_attempt_pods_deleted"] == 0))
    for r in results:
        for fault, times in r.get("faults", {}).items():
            out.append((f"{r['pods']} ranks, {fault}: the job says why within {TARGETS['why_s']:g} s",
                        f"{times['why_s']:.2f} s", times["why_s"] <= TARGETS["why_s"]))
    if rss_mb is not None:
        out.append((f"operator peak RSS < {TARGETS['rss_many_mb']:g} MB", f"{rss_mb:.1f} MB",
                    rss_mb < TARGETS["rss_many_mb"]))
    return out


def print_table(results: list[dict], peak: dict, checks: list) -> None:
    cols = [("scenario", "scenario", 12, "s"), ("pods", "pods", 5, "d"), ("first", "first_pod_s", 6, ".2f"),
            ("created", "created_s", 8, ".2f"), ("bound", "bound_s", 7, ".2f"),
            ("running", "pods_running_s", 8, ".2f"), ("phase", "phase_running_s", 7, ".2f"),
            ("lag max", "lag_max_s", 8, ".3f"), ("job crt max", "job_created_max_s", 11, ".2f"),
            ("status upd", "status_updates_total", 10, "d"), ("RSS MB", "rss_peak_mb", 7, ".1f"),
            ("RSS after", "rss_after_delete_mb", 9, ".1f")]
    restarts = [r for r in results if "restart_settle_s" in r]
    faults = [r for r in results if "faults" in r]
    results = [r for r in results if "restart_settle_s" not in r and "faults" not in r]
    print()
    print("Seconds from the (first) create call returning, as seen by this script's watches:")
    print(" ".join(f"{h:>{w}}" if i else f"{h:<{w}}" for i, (h, _, w, _) in enumerate(cols)))
    for r in results:
        cells = []
        for i, (_, key, width, fmt) in enumerate(cols):
            value = r.get(key)
            text = "-" if value is None else format(value, fmt)
            cells.append(f"{text:>{width}}" if i else f"{text:<{width}}")
        print(" ".join(cells))
    print()
    print("Control plane's share (after the last pod existed): bind = scheduler, kwok = fake kubelet:")
    for r in results:
        print(f"  {r['scenario']:<12} bind +{r['bind_after_created_s']:.2f} s (max per pod {r['bind_latency_max_s']:.2f})"
              f"  kwok +{r['kwok_after_bound_s']:.2f} s (max per pod {r['kwok_latency_max_s']:.2f})")
    if restarts:
        print()
        print("Gang restarts: seconds from rank 1's failure (or the bare pods' delete call) to Running again:")
        for r in restarts:
            extra = "" if r["jobs"] == 0 else (f"  new-attempt pods deleted {r['new_attempt_pods_deleted']},"
                                               f" extra pods created {r['extra_pods_created']}")
            print(f"  {r['scenario']:<16} {' '.join(f'{x:6.2f}' for x in r['restart_settle_s'])}{extra}")
    if faults:
        print()
        print("Faults: seconds from injection (unschedulable: from the create call) to the job saying why,"
              " and to the gang Running again:")
        for r in faults:
            for fault, times in r["faults"].items():
                again = times.get("running_again_s")
                print(f"  {r['pods']:>5} ranks  {fault:<14} why {times['why_s']:6.2f}"
                      f"{'' if again is None else f'   Running again {again:6.2f}'}")
    print()
    print(f"operator RSS: started, no job {peak['rss_idle_mb']} MB; peak sampled {peak['rss_peak_sampled_mb']} MB, "
          f"VmHWM {peak['vm_hwm_mb']} MB")
    print()
    for what, value, ok in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {what}: {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,64,256,1024", help="world sizes, one job each")
    parser.add_argument("--concurrent-jobs", type=int, default=100, help="0 skips the concurrent scenario")
    parser.add_argument("--ranks-per-concurrent-job", type=int, default=8)
    parser.add_argument("--baseline", type=int, default=None,
                        help="bare pods for the control-plane baseline (default: the largest size; 0 skips)")
    parser.add_argument("--restart-sizes", default="8,64,256,1024",
                        help="world sizes for the gang-restart scenario, each next to bare pods deleted and recreated")
    parser.add_argument("--restart-repeats", type=int, default=3, help="gang restarts per size")
    parser.add_argument("--fault-sizes", default="8,256",
                        help="world sizes for the fault scenario: OOM kill, hang, eviction, node deleted, unschedulable")
    parser.add_argument("--strategy-sizes", default="1024",
                        help="world sizes for restartStrategy Recreate next to InPlace: API writes and operator CPU "
                             "per restart")
    parser.add_argument("--kubeconfig", help="use this cluster instead of starting a separate local one")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--timeout", type=float, default=300, help="seconds each wait may take")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    restart_sizes = [int(s) for s in args.restart_sizes.split(",") if s]
    fault_sizes = [int(s) for s in args.fault_sizes.split(",") if s]
    baseline = max(sizes, default=0) if args.baseline is None else args.baseline

    global OPERATOR
    own_cluster = args.kubeconfig is None
    kubeconfig = args.kubeconfig
    bench_nodes: list[str] = []
    operator = None
    tracker, stop = Tracker(), threading.Event()
    results: list[dict] = []
    strategies: list[dict] = []
    peak = {"rss_peak_sampled_mb": None, "vm_hwm_mb": None, "rss_idle_mb": None}
    try:
        kubeconfig = args.kubeconfig or start_cluster(BENCH_CLUSTER)
        api = kubeclient.api_client(kubeconfig, pool_size=CONCURRENCY + 4)
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        ensure_namespace(core)
        needed = max([*sizes, *restart_sizes, *fault_sizes, args.concurrent_jobs * args.ranks_per_concurrent_job, baseline])
        bench_nodes = add_capacity(core, needed + 16)
        if bench_nodes:
            print(f"added fake nodes for capacity: {', '.join(bench_nodes)}", flush=True)

        log = Path(os.environ.get("TMPDIR", "/tmp")) / "ddp-bench-operator.log"
        operator = OPERATOR = start_operator(kubeconfig, log)
        print(f"operator pid {operator.pid}, log {log}", flush=True)
        sampler = RssSampler(operator.pid)
        sampler.start()
        for target, api_obj in ((watch_pods, core), (watch_jobs, custom)):
            threading.Thread(target=target, args=(api_obj, tracker, stop), daemon=True).start()
        time.sleep(1)
        sampler.window()
        idle = round(status_kb(operator.pid, "VmRSS") / 1024, 1)  # started, no job yet: what RSS after compares to
        scenarios = [(f"w{size}", 1, size) for size in sizes]
        if args.concurrent_jobs:
            scenarios.append((f"many{args.concurrent_jobs}x{args.ranks_per_concurrent_job}", args.concurrent_jobs,
                              args.ranks_per_concurrent_job))
        for label, jobs, ranks in scenarios:
            result = run_jobs(custom, tracker, label, jobs, ranks, args.timeout)
            result["rss_peak_mb"] = sampler.window()
            result["rss_after_delete_mb"] = sampler.settled()
            results.append(result)
            print(json.dumps(result), flush=True)
        if baseline:
            result = run_baseline(core, tracker, baseline, args.timeout)
            results.append(result)
            print(json.dumps(result), flush=True)
        for size in restart_sizes:
            for result in (run_baseline_restart(core, tracker, size, args.restart_repeats, args.timeout),
                           run_restarts(core, custom, tracker, size, args.restart_repeats, args.timeout)):
                results.append(result)
                print(json.dumps(result), flush=True)
        for size in fault_sizes:
            result = run_faults(core, custom, tracker, size, args.timeout)
            results.append(result)
            print(json.dumps(result), flush=True)
        for size in [int(x) for x in args.strategy_sizes.split(",") if x]:
            for strategy in (RESTART_RECREATE, RESTART_IN_PLACE):
                strategies.append(run_strategy_restarts(core, custom, tracker, size, args.restart_repeats,
                                                        args.timeout, strategy))
        peak = {"rss_peak_sampled_mb": round(sampler.peak_kb / 1024, 1),
                "vm_hwm_mb": round(status_kb(operator.pid, "VmHWM") / 1024, 1), "rss_idle_mb": idle}
    finally:
        stop.set()
        OPERATOR = None
        stop_operator(operator)
        if own_cluster:
            run(["bash", str(REPO / "localcluster" / "cluster.sh"), "down"], BENCH_CLUSTER)
        elif kubeconfig:
            cleanup_shared(kubeconfig, bench_nodes)

    many = [r for r in results if r["jobs"] > 1]
    checks = verdicts(results, peak["vm_hwm_mb"] if many else None)
    print_table(results, peak, checks)
    print_strategies(strategies)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "strategies": strategies, **peak, "targets": TARGETS,
                                         "checks": [{"target": t, "value": v, "pass": ok} for t, v, ok in checks]},
                                        indent=2))
    return 0 if all(ok for _, _, ok in checks) else 1


def print_strategies(strategies: list[dict]) -> None:
    if not strategies:
        return
    print()
    print("restartStrategy, per restart of rank 1's failed container: seconds to Running again, API writes (pods"
          " created + pods deleted + job status patches) and the operator's CPU seconds:")
    for run_of in strategies:
        for row in run_of["restarts"]:
            print(f"{run_of['strategy']:<9} {run_of['ranks']:>5} ranks: {row['settle_s']:6.2f} s, {row['writes']:5d} writes "
                  f"({row['pods_created']} + {row['pods_deleted']} + {row['status_patches']}), "
                  f"{row['operator_cpu_s']:.2f} s CPU")


def cleanup_shared(kubeconfig: str, bench_nodes: list[str]) -> None:
    """On a cluster we did not start: remove our namespace (jobs, pods) and our fake nodes."""
    api_client = kubeclient.api_client(kubeconfig)
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    try:
        for job in custom.list_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL)["items"]:
            delete_jobs(custom, [job["metadata"]["name"]], 0)
        delete_pods(core)
        core.delete_namespace(NAMESPACE)
    except ApiException as error:
        if error.status != 404:
            print(f"clean-up: {error.status} {error.reason}", file=sys.stderr)
    delete_nodes(core, bench_nodes)


if __name__ == "__main__":
    sys.exit(main())
