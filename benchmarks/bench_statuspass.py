"""Status pass benchmark (`make bench-statuspass`): how long the operator's pure work for one job takes
when the job has 10,000 ranks, in one process, no API server.

A status pass reads the job's pods from the pod cache (`jobpods.read_pods`), decides what to do
(`decision.decide`) and computes the status patch (`statuspatch.compute_status`); this is what every
change of any of the job's pods costs the operator. Measured for a gang in three states: every pod
Running and Ready; one rank failed (the pass that decides a gang restart); half the pods pending; each
twice: with one pod changed since the last pass (a watch event: the cache keeps each pod's reading until
the pod changes, podstate.CachedPod) and with every pod read afresh (after the pod cache relisted). Also
timed: building every pod's manifest (`manifests.build_pod`, a creation pass's own work) and
spec.topology's choice of domain over all of them (`topology`). Pods are the slim copies the pod cache
keeps (`podwatch.slim_pod`), on 40 nodes of 256 GPUs.

Target (issue 49): a status pass over 10,000 pods under 100 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "contract"), str(REPO / "operator")]
from ddp_contract import labels  # noqa: E402
from ddp_operator.decision import decide  # noqa: E402
from ddp_operator.jobmemory import JobMemory  # noqa: E402
from ddp_operator.jobpods import read_pods  # noqa: E402
from ddp_operator.manifests import build_pod  # noqa: E402
from ddp_operator.nodes import Nodes, node_info  # noqa: E402
from ddp_operator.podwatch import slim_pod  # noqa: E402
from ddp_operator.spec import parse_spec  # noqa: E402
from ddp_operator.statuspatch import compute_status  # noqa: E402
from ddp_operator.topology import choose_domains, room_by_domain, used_by_node  # noqa: E402

JOB = "big"
NAMESPACE = "bench"
GPUS_PER_NODE = 256
RACK = "example.com/rack"


def api_pod(index: int, node: str, state: str) -> dict[str, Any]:
    """Pod `index` as the API returns it, in state running | failed | pending."""
    container: dict[str, Any] = {"name": labels.CONTAINER_NAME, "state": {"running": {"startedAt": "2026-11-30T08:00:00Z"}}}
    status: dict[str, Any] = {"phase": "Running", "containerStatuses": [container],
                              "conditions": [{"type": "Ready", "status": "True"}], "startTime": "2026-11-30T08:00:00Z"}
    if state == "failed":
        container["state"] = {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                             "finishedAt": "2026-11-30T08:05:00Z"}}
        status.update(phase="Failed", conditions=[{"type": "Ready", "status": "False"}])
    elif state == "pending":
        container["state"] = {"waiting": {"reason": "ContainerCreating"}}
        status.update(phase="Pending", conditions=[{"type": "Ready", "status": "False"}])
    return {
        "metadata": {"name": f"{JOB}-{index}", "namespace": NAMESPACE, "uid": f"uid-{index}",
                     "labels": {labels.LABEL_JOB_NAME: JOB, labels.LABEL_RANK: str(index), labels.LABEL_ATTEMPT: "0"},
                     "ownerReferences": [{"uid": "job-uid", "controller": True}]},
        "spec": {"nodeName": node, "containers": [{"name": labels.CONTAINER_NAME,
                                                   "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        "status": status,
    }


def api_node(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"node-{i}", "labels": {RACK: f"rack-{i // 8}"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": "256", "memory": "2Ti", "pods": "512", "nvidia.com/gpu": str(GPUS_PER_NODE)}}}


def timed(fn: Callable[[], object], repeats: int, before: Callable[[], object] = lambda: None) -> tuple[float, float]:
    """Median and slowest of `repeats` calls, in ms; `before` runs untimed before each."""
    took = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        took.append((time.perf_counter() - start) * 1000)
    return statistics.median(took), max(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    ranks = args.ranks
    node_count = -(-ranks // GPUS_PER_NODE)
    nodes = Nodes(known={n.name: n for n in (node_info(api_node(i)) for i in range(node_count))}, synced=True)
    job = {"metadata": {"name": JOB, "namespace": NAMESPACE, "uid": "job-uid", "generation": 1},
           "spec": {"worldSize": ranks, "image": "trainer:1", "entrypoint": "train:main", "gpusPerRank": 1}}
    spec = parse_spec(job["spec"])
    status = {"phase": "Running", "attempt": 0, "startTime": "2026-11-30T08:00:00Z"}
    now = datetime.now(UTC)
    print(f"{ranks} ranks on {node_count} nodes of {GPUS_PER_NODE} GPUs; median and slowest of {args.repeats} runs")
    print(f"{'what':<72} {'median':>10} {'slowest':>10}")
    states = {"every pod Running": lambda i: "running",
              "rank 1 failed (a gang restart decided)": lambda i: "failed" if i == 1 else "running",
              "half the pods pending": lambda i: "pending" if i % 2 else "running"}
    for name, state in states.items():
        fresh = [api_pod(i, f"node-{i // GPUS_PER_NODE}", state(i)) for i in range(ranks)]
        pods = [slim_pod(pod) for pod in fresh]

        def status_pass() -> None:
            summary = read_pods(pods, spec=spec, status=status, job_name=JOB, generation=1, nodes=nodes,
                                memory=JobMemory(), deleting=set(), now=now)
            decision = decide(spec, status=status, summary=summary, now=now)
            compute_status(spec, status=status, summary=summary, decision=decision, now=now, generation=1)

        def one_changed(fresh: list[dict[str, Any]] = fresh, pods: list[dict[str, Any]] = pods) -> None:
            pods[0] = slim_pod(fresh[0])

        def relisted(fresh: list[dict[str, Any]] = fresh, pods: list[dict[str, Any]] = pods) -> None:
            pods[:] = [slim_pod(pod) for pod in fresh]

        status_pass()  # every reading made once, as the passes before this one did
        for how, before in (("one pod changed", one_changed), ("every pod read", relisted)):
            median, slowest = timed(status_pass, args.repeats, before)
            print(f"{'status pass, ' + name + ', ' + how:<72} {median:>8.1f} ms {slowest:>7.1f} ms")
    median, slowest = timed(lambda: [build_pod(job, spec, i, 0) for i in range(spec.pods)], max(1, args.repeats // 3))
    print(f"{'every pod manifest built':<72} {median:>8.1f} ms {slowest:>7.1f} ms")
    placed = parse_spec({**job["spec"], "topology": {"preferred": RACK}})
    running = [slim_pod(api_pod(i, f"node-{i // GPUS_PER_NODE}", "running")) for i in range(ranks)]

    def topology_choice() -> None:
        room = room_by_domain(placed, nodes.known.values(), used_by_node(running))
        choose_domains(placed, room)

    median, slowest = timed(topology_choice, args.repeats)
    print(f"{'spec.topology: room and domains, all pods held':<72} {median:>8.1f} ms {slowest:>7.1f} ms")


if __name__ == "__main__":
    main()
