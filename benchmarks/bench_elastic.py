"""Elastic world size (`make bench-elastic`): how soon a job that loses a node trains again.

On the local control plane (started if it is not up, never taken down) with two pod runners as two
nodes of two pods each, the ranks run as processes of this machine (as in the e2e tests: no
containers, so the figures are the operator's, the scheduler's and the trainer runtime's). A 4-rank
job (restartStrategy InPlace, 2 ranks a node, a checkpoint every 4 steps) trains; the runner of the
node without rank 0's pod (--lose rank-0: with it) is stopped for good (its processes killed, its
node deleted). From that stop, by this
script's monotonic clock, polling the job's status:

  restart    the gang restart decided (status.attempt past the one that was running)
  shrunk     minWorldSize 2: the gang resized to 2 (status.worldSize 2)
  training   the gang of that size formed (status.rendezvous for its attempt: every rank back in the
             process group, training again from the checkpoint)

and, for the same job without minWorldSize (today's behaviour, and the default), what it says the
same number of seconds after the stop, and after --wait seconds: waiting for ranks 2 and 3, which no
node can hold, until capacity returns or startupDeadlineSeconds (900 s) fails it. Then the node
comes back, and from its runner's start: the elastic job grown to 4 (status.worldSize 4) and its
gang of 4 formed; the other job's gang of 4 formed.

Prints a table; --json writes the figures too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / p) for p in ("contract", "localcluster")]
import demo  # noqa: E402
from ddp_contract import api, kubeclient, labels  # noqa: E402
from ddp_contract.jobstatus import STATUS_WORLD_SIZE  # noqa: E402

NAMESPACE = "bench-elastic"
BUCKET = "ddp-bench-elastic"
POOL = "ddpoperator.io/bench-elastic"


def wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class Runner:
    """A pod runner whose node holds two pods."""

    def __init__(self, node: str, log_dir: Path) -> None:
        self.node, self.log_dir = node, log_dir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, str(REPO / "localcluster" / "podrunner.py"), "--kubeconfig", demo.kubeconfig(),
                "--log-dir", str(self.log_dir / "pods"), "--node", self.node, "--pods", "2", "--label", f"{POOL}=1"]
        self.process = subprocess.Popen(argv, stdout=(self.log_dir / f"{self.node}.log").open("ab"),
                                        stderr=subprocess.STDOUT)
        demo.wait_for_node(self.node)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self.process = None


def job(name: str, endpoint: str, elastic: bool) -> dict:
    path = os.pathsep.join(str(REPO / p) for p in ("contract", "images/trainer", "tests/trainer"))
    env = {"PYTHONPATH": path, "WL_BATCH": "4", "WL_EPOCHS": "1000", "WL_CKPT_EVERY": "4",
           "WL_STEP_SECONDS": "0.1", "OMP_NUM_THREADS": "1"}
    spec: dict[str, Any] = {
        "worldSize": 4, "image": "trainer:unused", "entrypoint": "ddp_workloads:train", "gpusPerRank": 0,
        "restartStrategy": api.RESTART_IN_PLACE, "env": [{"name": k, "value": v} for k, v in env.items()],
        "s3": {"endpoint": endpoint, "credentialsSecret": "s3-credentials", "results": f"s3://{BUCKET}/results"},
        "template": {"spec": {"nodeSelector": {POOL: "1"}}},
    }
    if elastic:
        spec["minWorldSize"] = 2
    return demo.on_local_runner({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
                                 "spec": spec})


class Job:
    def __init__(self, custom: client.CustomObjectsApi, name: str) -> None:
        self.custom, self.name = custom, name

    def status(self) -> dict[str, Any]:
        found = self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, self.name)
        return found.get("status") or {}

    def formed(self, attempt: int) -> bool:
        return int((self.status().get("rendezvous") or {}).get("attempt", -1)) >= attempt

    def delete(self) -> None:
        try:
            self.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, self.name)
        except ApiException as error:
            if error.status != 404:
                raise


def one_loss(custom: client.CustomObjectsApi, endpoint: str, runners: tuple[Runner, Runner], name: str,
             elastic: bool, wait_s: float, timeout: float, window: float | None, rank_0: bool) -> dict[str, Any]:
    """A job of 4 loses the node of two of its ranks (rank_0: the node of rank 0's pod, else the other)
    and gets it back; the times, from the stop and from the return."""
    for runner in runners:
        if runner.process is None:
            runner.start()
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, job(name, endpoint, elastic))
    watched = Job(custom, name)
    try:
        wait(lambda: (watched.status().get("lastCheckpoint") or {}).get("step", 0) >= 8, timeout, f"{name} training")
        running = int(watched.status().get("attempt", 0))
        placed = {p.metadata.name: p.spec.node_name for p in client.CoreV1Api(custom.api_client).list_namespaced_pod(
            NAMESPACE, label_selector=f"{labels.LABEL_JOB_NAME}={name}").items}
        lose = next(r for r in runners if (r.node == placed[f"{name}-0"]) == rank_0)
        figures: dict[str, Any] = {"lost": sorted(int(p.rsplit("-", 1)[1]) for p, n in placed.items() if n == lose.node)}
        stopped = time.monotonic()
        lose.stop()
        figures["restart"] = wait(lambda: int(watched.status().get("attempt", 0)) > running and time.monotonic(),
                                  timeout, "the restart") - stopped
        if elastic:
            shrunk = wait(lambda: (s := watched.status()).get(STATUS_WORLD_SIZE) == 2 and s, timeout, "the shrink")
            figures["shrunk"] = time.monotonic() - stopped
            wait(lambda: watched.formed(int(shrunk["attempt"])), timeout, "the gang of 2")
            figures["training"] = time.monotonic() - stopped
        else:
            time.sleep(max(0.0, (window or 0) - (time.monotonic() - stopped)))
            status = watched.status()
            figures["at the same time"] = f"{status.get('phase')}, {status.get('reason')}"
            time.sleep(max(0.0, wait_s - (time.monotonic() - stopped)))
            status = watched.status()
            figures[f"after {wait_s:.0f} s"] = f"{status.get('phase')}, {status.get('reason')}: {status.get('message')}"
        back = time.monotonic()
        lose.start()
        if elastic:
            grown = wait(lambda: (s := watched.status()).get(STATUS_WORLD_SIZE) == 4 and s, timeout, "the grow")
            figures["grown"] = time.monotonic() - back
            attempt = int(grown["attempt"])
        else:
            attempt = int(watched.status().get("attempt", 0))
        wait(lambda: watched.formed(attempt) and watched.status().get("readyRanks") == 4, timeout, "the gang of 4")
        figures["training at 4"] = time.monotonic() - back
        figures["restarts"] = watched.status().get("restarts")
        return figures
    finally:
        watched.delete()
        wait(lambda: not client.CoreV1Api(custom.api_client).list_namespaced_pod(NAMESPACE).items, timeout,
             "the job's pods gone")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="losses of the elastic job")
    parser.add_argument("--wait", type=float, default=60, help="seconds the other job is watched waiting")
    parser.add_argument("--timeout", type=float, default=300, help="seconds each wait may take")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    parser.add_argument("--lose", choices=("others", "rank-0"), default="others",
                        help="the node lost: the one without rank 0's pod, or the one with it")
    args = parser.parse_args()

    demo.start_control_plane()
    demo.fresh_namespace(NAMESPACE)
    api_client = kubeclient.api_client(demo.kubeconfig())
    custom = client.CustomObjectsApi(api_client)
    log_dir = Path(tempfile.mkdtemp(prefix="ddp-bench-elastic-"))
    (log_dir / "pods").mkdir()
    env = {"KUBECONFIG": demo.kubeconfig(), "DDP_OPERATOR_METRICS_PORT": "0", "DDP_OPERATOR_NAMESPACES": NAMESPACE,
           "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("contract", "operator"))}
    operator = demo.Background("operator", [sys.executable, "-m", "ddp_operator"], log_dir, env)
    runners = (Runner("bench-elastic-a", log_dir), Runner("bench-elastic-b", log_dir))
    figures: dict[str, Any] = {"elastic": [], "plain": None}
    try:
        with demo.s3_server(0, buckets=(BUCKET,)) as endpoint:
            for i in range(args.repeats):
                figures["elastic"].append(one_loss(custom, endpoint, runners, f"elastic-{i}", True, args.wait,
                                                   args.timeout, None, args.lose == "rank-0"))
                print(f"minWorldSize 2: {figures['elastic'][-1]}", flush=True)
            window = statistics.median(f["training"] for f in figures["elastic"])
            figures["plain"] = one_loss(custom, endpoint, runners, "plain", False, args.wait, args.timeout, window,
                                        args.lose == "rank-0")
            print(f"no minWorldSize: {figures['plain']}", flush=True)
    finally:
        for runner in runners:
            runner.stop()
        operator.stop()
        demo.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=false")
    print_table(figures)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


def print_table(figures: dict[str, Any]) -> None:
    runs = figures["elastic"]

    def cell(key: str) -> str:
        values = [f[key] for f in runs]
        return f"{statistics.median(values):.2f} s (runs: {', '.join(f'{v:.2f}' for v in values)})"

    plain = figures["plain"]
    lost = sorted({tuple(f["lost"]) for f in [*runs, plain]})
    print(f"\nA 4-rank job loses the node of two ranks (pods lost: {lost}; 2 pod-runner nodes of 2 pods; median of runs)")
    print(f"  minWorldSize 2   restart decided  {cell('restart')}")
    print(f"                   shrunk to 2      {cell('shrunk')}")
    print(f"                   training at 2    {cell('training')}")
    print(f"                   node back -> grown to 4 {cell('grown')}, training at 4 {cell('training at 4')}")
    waited = [k for k in plain if k.startswith("after ")][0]
    print(f"  no minWorldSize  restart decided  {plain['restart']:.2f} s; at the elastic job's 'training at 2': "
          f"{plain['at the same time']}; {waited}: {plain[waited]}")
    print(f"                   node back -> training at 4 {plain['training at 4']:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
