"""spec.dataWorkers against a real API server (kwok plays the kubelet): the operator makes the data
worker pods and their token, says how many are ready and why not, replaces one that is deleted or
evicted without touching the gang, keeps them through gang restarts, and removes them with the end."""

from __future__ import annotations

import base64
import re
from typing import Any

from ddp_contract import envnames, labels
from ddp_operator import constants as c
from ddp_operator.conditions import get_condition
from fakenodes import on_fake_nodes
from kube import Jobs, env_of, wait_until


def workers(replicas: int = 2, **placement: Any) -> dict[str, Any]:
    return {"replicas": replicas, "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "template": {"spec": on_fake_nodes(placement)}}


def uids(jobs: Jobs, name: str) -> dict[str, str]:
    """The job's data worker pods (not being deleted): name -> uid."""
    return {p.metadata.name: p.metadata.uid for p in jobs.pods(name) if labels.LABEL_DATA_WORKER in p.metadata.labels}


def ready_condition(jobs: Jobs, name: str) -> dict[str, Any]:
    return dict(get_condition(jobs.status(name).get("conditions") or [], c.COND_DATA_WORKERS_READY) or {})


def test_data_workers_are_made_wired_replaced_alone_and_removed_with_the_end(jobs: Jobs, kubectl) -> None:
    job = jobs.create("prep", worldSize=2, dataWorkers=workers(), backoffLimit=2)
    jobs.wait_phase("prep", c.PHASE_RUNNING)
    status = jobs.wait_condition("prep", c.COND_DATA_WORKERS_READY, "True")
    assert status["dataWorkers"] == {"desired": 2, "ready": 2, "summary": "2/2", "problems": []}
    wide = kubectl("get", "ddpjob", "prep", "-n", jobs.namespace, "-o", "wide").stdout
    assert re.search(r"DATAWORKERS", wide) and re.search(r"\b2/2\s*$", wide.splitlines()[1]), wide

    secret = jobs.core.read_namespaced_secret("prep-data-token", jobs.namespace)
    assert secret.metadata.owner_references[0].uid == job["metadata"]["uid"]
    assert re.fullmatch(r"[0-9a-f]{64}", base64.b64decode(secret.data["token"]).decode())
    rank = jobs.core.read_namespaced_pod("prep-0", jobs.namespace)
    assert env_of(rank)[envnames.DATA_WORKERS] == ",".join(
        f"prep-data-{i}.prep.{jobs.namespace}.svc:29600" for i in range(2))
    first = uids(jobs, "prep")
    assert sorted(first) == ["prep-data-0", "prep-data-1"]
    ranks = {p.metadata.uid for p in jobs.pods("prep") if labels.LABEL_RANK in p.metadata.labels}

    jobs.core.delete_namespaced_pod("prep-data-0", jobs.namespace, grace_period_seconds=0)
    jobs.evict("prep-data-1")
    wait_until(lambda: len(uids(jobs, "prep")) == 2 and set(uids(jobs, "prep").values()).isdisjoint(first.values()),
               30, "both data workers made again")
    jobs.wait_condition("prep", c.COND_DATA_WORKERS_READY, "True")
    warnings = [(e.reason, e.message) for e in jobs.events("prep") if e.type == "Warning"]
    assert any(reason == "Evicted" and "prep-data-1" in message for reason, message in warnings), warnings
    status = jobs.status("prep")
    assert (status["phase"], status["restarts"], status["attempt"]) == (c.PHASE_RUNNING, 0, 0)
    assert {p.metadata.uid for p in jobs.pods("prep") if labels.LABEL_RANK in p.metadata.labels} == ranks

    kept = uids(jobs, "prep")
    jobs.finish("prep-1", 1)  # a gang restart: the data workers stay
    jobs.wait_pods("prep", 4, attempt=None)
    wait_until(lambda: jobs.status("prep").get("attempt") == 1 and jobs.status("prep").get("phase") == c.PHASE_RUNNING,
               30, "the gang Running again")
    assert uids(jobs, "prep") == kept

    for r in range(2):
        jobs.finish(f"prep-{r}", 0)
    jobs.wait_phase("prep", c.PHASE_SUCCEEDED)
    wait_until(lambda: not uids(jobs, "prep"), 30, "the data workers removed with the job's end")
    assert ready_condition(jobs, "prep")["reason"] == c.REASON_DATA_WORKERS_NOT_KEPT


def test_data_workers_that_cannot_be_placed_are_said_and_the_ranks_run_on(jobs: Jobs) -> None:
    jobs.create("nowhere", worldSize=2, dataWorkers=workers(1, nodeSelector={"pool": "no-such-pool"}))
    jobs.wait_phase("nowhere", c.PHASE_RUNNING)
    status = jobs.wait_condition("nowhere", c.COND_DATA_WORKERS_READY, "False")

    def said() -> dict[str, Any] | None:
        cond = ready_condition(jobs, "nowhere")
        return cond if cond.get("reason") == c.REASON_UNSCHEDULABLE else None
    cond = wait_until(said, 30, "the scheduler's word on the data worker")
    assert isinstance(cond, dict) and "nowhere-data-0: Unschedulable" in cond["message"]
    assert "the ranks' DataLoader workers run on the ranks' own pods" in cond["message"]
    status = jobs.status("nowhere")
    assert status["dataWorkers"]["summary"] == "0/1" and status["dataWorkers"]["problems"][0]["pod"] == "nowhere-data-0"
    assert status["phase"] == c.PHASE_RUNNING and status["restarts"] == 0


def test_a_quota_that_refuses_a_data_worker_is_said_and_tried_again(jobs: Jobs) -> None:
    jobs.quota("pods", {"pods": "2"})
    jobs.create("tight", worldSize=2, dataWorkers=workers(1),
                resources={"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}})
    jobs.wait_phase("tight", c.PHASE_RUNNING, timeout=60)

    def refused() -> dict[str, Any] | None:
        cond = ready_condition(jobs, "tight")
        return cond if cond.get("reason") == c.REASON_QUOTA_EXCEEDED else None
    cond = wait_until(refused, 30, "the quota's refusal said")
    assert isinstance(cond, dict) and "exceeded quota" in cond["message"] and "data worker pod" in cond["message"]
    jobs.core.patch_namespaced_resource_quota("pods", jobs.namespace, {"spec": {"hard": {"pods": "3"}}})
    jobs.wait_condition("tight", c.COND_DATA_WORKERS_READY, "True", timeout=45)
