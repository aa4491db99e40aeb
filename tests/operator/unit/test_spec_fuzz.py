"""Seeded random specs (specfuzz) through the operator's pure functions, without an API server: each is
refused by parse_spec (InvalidSpec, naming the field) or held all the way, from the pods it makes to the
status it writes, raising nothing else. The specs are raw, as an object stored under an older CRD may be:
the API server's own run (tests/operator/cluster/test_spec_fuzz.py) sees those it lets through.

DDP_FUZZ_SEED chooses the seed, DDP_FUZZ_COUNT how many specs (here 2000 by default, about a second on the EPYC VM).
"""

from __future__ import annotations

import traceback
from datetime import timedelta
from typing import Any

from ddp_contract import api
from ddp_contract.resource import JobStatus
from ddp_contract.timestamps import rfc3339
from ddp_operator import constants as c
from ddp_operator.capacity import gang_too_large
from ddp_operator.dataworkers import data_worker_status, summarize_data_workers
from ddp_operator.deadlines import requeue_after
from ddp_operator.decision import decide
from ddp_operator.manifests import (
    build_data_worker_pod,
    build_pod,
    build_progress_access,
    build_service,
    build_token_secret,
)
from ddp_operator.nodes import node_info
from ddp_operator.podsummary import summarize_pods
from ddp_operator.quota import gang_shortfall
from ddp_operator.spec import InvalidSpec, parse_spec, validate_job_name
from ddp_operator.statuspatch import compute_status, events_for
from podfixtures import NOW, api_node
from specfuzz import fuzzed, settings

COUNT = 2000
QUOTA = {"metadata": {"name": "team"},
         "spec": {"hard": {"pods": "100", "requests.cpu": "64", "limits.memory": "1Ti", "requests.nvidia.com/gpu": "8"}},
         "status": {"hard": {"pods": "100", "requests.cpu": "64", "limits.memory": "1Ti",
                             "requests.nvidia.com/gpu": "8"}, "used": {"pods": "1"}}}
STATUSES: tuple[dict[str, Any], ...] = (
    {},
    {"phase": c.PHASE_RUNNING, "attempt": 0, "startTime": rfc3339(NOW - timedelta(days=3)), "conditions": [
        {"type": c.COND_RANKS_BLOCKED, "status": "True", "reason": c.REASON_UNSCHEDULABLE,
         "lastTransitionTime": rfc3339(NOW - timedelta(days=3))}]},
    {"phase": c.PHASE_FAILED, "completionTime": rfc3339(NOW - timedelta(days=3))},
)


def through_the_operator(raw: dict[str, Any]) -> None:
    """What the operator does with a spec, pod by pod and pass by pass, short of the API calls."""
    job = {"apiVersion": api.API_VERSION, "kind": api.KIND,
           "metadata": {"name": "fz", "namespace": "team", "uid": "uid-1", "generation": 1}, "spec": raw}
    try:
        spec = parse_spec(raw)
        validate_job_name("fz", spec.world_size, spec.data_worker_replicas)
    except InvalidSpec as refused:
        assert str(refused).startswith(("spec.", "metadata.")) and refused.message, refused
        return
    build_service(job, spec)
    build_progress_access(job, spec)
    build_token_secret(job, "token")
    pods = [build_pod(job, spec, index, 0) for index in range(spec.pods)]
    workers = [build_data_worker_pod(job, spec, index) for index in range(spec.data_worker_replicas)]
    gang_too_large(spec, [node_info(api_node("gpu-0")), node_info(api_node("cpu-0", gpus=0))])
    gang_shortfall(pods, [QUOTA])
    gang_shortfall(workers, [QUOTA])
    summary = summarize_pods([], 0, job_name="fz")
    for status in STATUSES:
        decision = decide(spec, status=status, summary=summary, now=NOW)
        patch = compute_status(spec, status=status, summary=summary, decision=decision, now=NOW, generation=1)
        events_for(status, patch)
        requeue_after(JobStatus.of({**status, **patch}), spec, NOW)
        if spec.data_workers is not None:
            data_worker_status("fz", summarize_data_workers([], spec.data_worker_replicas), phase=patch["phase"],
                               kept=True, refused=None, conditions=patch["conditions"], now=NOW, generation=1)


def test_every_fuzzed_spec_is_refused_naming_its_field_or_held_all_the_way() -> None:
    seed, count = settings()
    failures: list[str] = []
    for case in fuzzed(seed, count or COUNT):
        try:
            through_the_operator(case.spec)
        except Exception:  # noqa: BLE001 - every other exception is a finding, said with its spec
            failures.append(f"{case.describe(seed)}\n{traceback.format_exc(limit=-3)}")
    assert not failures, f"{len(failures)} specs broke the operator's pure functions; the first:\n{failures[0]}"


def test_the_same_seed_makes_the_same_specs() -> None:
    assert [case.spec for case in fuzzed(7, 50)] == [case.spec for case in fuzzed(7, 50)]
    assert [case.spec for case in fuzzed(7, 50)] != [case.spec for case in fuzzed(8, 50)]
