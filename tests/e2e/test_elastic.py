"""Elastic world size end to end (operator, kube-scheduler, two pod runners as two nodes, trainer runtime,
S3): a 4-rank job with minimum 2 loses the node of two ranks, goes on at 2 at once from the state its
other pods hold in memory, grows back to 4 when the node returns (the new pods take the state from the
others' memory), and its samplers see every sample of each epoch exactly once."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddp_contract import api, labels
from ddp_contract.jobstatus import STATUS_MEMBERS, STATUS_WORLD_SIZE
from ddp_operator import constants as c
from e2ehelp import recoveries_kept, start_job, workload_job
from kube import REPO, Jobs, wait_until

sys.path[:0] = [str(REPO / "localcluster"), str(REPO / "tests" / "trainer")]
import ddp_workloads  # noqa: E402 - what the ranks run; it reads back the samples they record

import demo  # noqa: E402

POOL = "ddpoperator.io/elastic-test"
EPOCHS = 12


class Runner:
    """A pod runner whose node holds two pods and carries the test's pool label: a node that can go and come back."""

    def __init__(self, kubeconfig: str, node: str, pool: str, log_dir: Path) -> None:
        self.argv = [sys.executable, str(REPO / "localcluster" / "podrunner.py"), "--kubeconfig", kubeconfig,
                     "--log-dir", str(log_dir), "--node", node, "--pods", "2", "--label", f"{POOL}={pool}"]
        self.node, self.log_dir = node, log_dir
        self.process: demo.Background | None = None

    def start(self) -> None:
        self.process = demo.Background(f"runner-{self.node}", self.argv, self.log_dir)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@pytest.fixture
def nodes(cluster, operator, jobs: Jobs, tmp_path: Path) -> Iterator[tuple[Runner, Runner]]:
    pool = pool_of(jobs)
    runners = (Runner(cluster.kubeconfig, f"{pool}-a", pool, tmp_path), Runner(cluster.kubeconfig, f"{pool}-b", pool, tmp_path))
    for runner in runners:
        runner.start()
    try:
        yield runners
    finally:
        for runner in runners:
            runner.stop()


def pool_of(jobs: Jobs) -> str:
    return "p" + jobs.namespace[-20:]


def step(jobs: Jobs) -> int:
    return int((jobs.status("elastic").get("progress") or {}).get("step", 0))


def elastic_job(endpoint: str, name: str, pool: str, indices: Path) -> dict:
    job = workload_job(endpoint, name, "ddp_workloads:train", worldSize=4, minWorldSize=2,
                       restartStrategy=api.RESTART_IN_PLACE)
    # A checkpoint only when the job asks for one (every 1000 steps is never here): the grow needs one.
    env = {"WL_BATCH": "4", "WL_EPOCHS": str(EPOCHS), "WL_CKPT_EVERY": "1000", "WL_MEMORY_EVERY": "1", "WL_STEP_SECONDS": "0.3",
           "WL_INDICES": str(indices), "OMP_NUM_THREADS": "1", "DDP_PROGRESS_INTERVAL_SECONDS": "0.5"}
    job["spec"]["env"] += [{"name": k, "value": v} for k, v in env.items()]
    job["spec"]["template"]["spec"]["nodeSelector"][POOL] = pool
    return job


def test_a_job_that_loses_a_node_goes_on_smaller_and_grows_back_seeing_each_sample_once_an_epoch(
        jobs: Jobs, s3_endpoint: str, nodes: tuple[Runner, Runner], tmp_path: Path) -> None:
    a, b = nodes
    indices = tmp_path / "indices"
    indices.mkdir()
    start_job(jobs, s3_endpoint, "elastic", [], elastic_job(s3_endpoint, "elastic", pool_of(jobs), indices))
    wait_until(lambda: step(jobs) >= 4, 180, "step 4 at full size")
    on_b = {p.metadata.name for p in jobs.pods("elastic") if p.spec.node_name == b.node}
    assert len(on_b) == 2

    b.stop()  # the node and its two ranks go for good
    shrunk = jobs.wait_condition("elastic", c.COND_SHRUNK, "True", timeout=90)
    assert shrunk[STATUS_WORLD_SIZE] == 2 and len(shrunk[STATUS_MEMBERS]) == 2
    status = jobs.wait_phase("elastic", c.PHASE_RUNNING, timeout=90)
    assert status[STATUS_WORLD_SIZE] == 2 and status["ready"] == "2/2"
    waiting = {p.metadata.name: p.status.phase for p in jobs.pods("elastic") if p.metadata.name in on_b}
    assert waiting == dict.fromkeys(on_b, "Pending")  # waiting apart, Pending where there is no room
    at_two = step(jobs)
    wait_until(lambda: step(jobs) > at_two, 120, "training at the smaller size")
    assert "lastCheckpoint" not in jobs.status("elastic")  # none so far: the loop saves only when asked

    b.start()  # the node comes back
    grown = jobs.wait_condition("elastic", c.COND_SHRUNK, "False", timeout=120)
    assert grown[STATUS_WORLD_SIZE] == 4 and grown[STATUS_MEMBERS] == [0, 1, 2, 3]
    # Rank 0 saved the checkpoint the operator asked for at its next step, and the gang grew from it.
    asked = grown["lastCheckpoint"]["step"]
    assert asked % 1000 and f"the checkpoint at step {asked}" in grown["message"], grown
    status = jobs.wait_phase("elastic", c.PHASE_SUCCEEDED, timeout=300)
    # The node's loss restarted the gang (once, or twice where the broken collectives' echo was acted on
    # before the node's deletion was seen), on the infrastructure's budget; the two resizes spent nothing.
    assert status["restarts"] == shrunk["restarts"] == status["infrastructureRestarts"] >= 1, status
    # One shrink, then one grow (two where one pod ran before the other, the second while re-forming).
    resizes = [e.reason for e in sorted(jobs.events("elastic"), key=lambda e: e.metadata.creation_timestamp)
               if e.reason in (c.REASON_SHRUNK, c.REASON_GROWN)]
    assert resizes[0] == c.REASON_SHRUNK and set(resizes[1:]) == {c.REASON_GROWN} and len(resizes) <= 3, resizes
    assert status["attempt"] == status["restarts"] + len(resizes), status
    kept_on_a = [p for p in jobs.pods("elastic", include_deleting=True) if p.spec.node_name == a.node]
    assert all(p.metadata.labels[labels.LABEL_ATTEMPT] == "0" for p in kept_on_a)  # never rescheduled

    steps = ddp_workloads.kept_steps(str(indices))
    print(f"resizes {resizes}, restarts {status['restarts']}, steps kept at world size 4: "
          f"{sum(r['world'] == 4 for r in steps) // 4}, at 2: {sum(r['world'] == 2 for r in steps) // 2}")
    assert {r["world"] for r in steps} == {2, 4}
    assert ddp_workloads.not_seen_once(steps, EPOCHS) == {}
    # Every attempt whose gang formed resumed from memory (one that re-formed before its ranks resumed has
    # no record): the shrunk gang from its own pods' (nothing was in S3 yet), the grown one too, its pods
    # that came back getting the state from the others'.
    recovered = recoveries_kept(s3_endpoint, jobs.namespace, "elastic")
    assert len(recovered) >= 2 and max(recovered) == status["attempt"], recovered
    assert all(r["source"] == "Memory" and r["stepsLost"] <= 1 for r in recovered.values()), recovered
    shrunk_to = recovered[min(recovered)]
    assert shrunk_to["step"] >= 4 and set(shrunk_to["pods"]) <= {p.metadata.name for p in kept_on_a}, shrunk_to
