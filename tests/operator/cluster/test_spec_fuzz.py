"""Seeded random specs (specfuzz) against the API server and the operator. Each is refused by the API server
with a message, or the operator says on the job where it is: a phase it settles in (Running, Succeeded,
Suspended, Failed with a reason and a message) or what holds its ranks up (condition RanksBlocked), never
ReconcileError (a case it does not handle); and the operator logs no traceback meanwhile.

DDP_FUZZ_SEED chooses the seed and DDP_FUZZ_COUNT how many specs (here 40 by default, about a minute on the
EPYC VM); a failure names the seed and each spec, which specfuzz makes again from them.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from ddp_contract import api
from ddp_operator import constants as c
from fakenodes import FAKE_NODE_NAMESPACE_ANNOTATIONS
from kube import Jobs, OperatorProcess
from specfuzz import COUNT_ENV, SEED_ENV, Fuzzed, fuzzed, settings
from waiting import poll_until

pytestmark = pytest.mark.cluster

COUNT = 40
SETTLE_S = 90.0  # for the last of them to settle, all created at once on 2 busy cores
SETTLED_PHASES = frozenset({c.PHASE_RUNNING, c.PHASE_SUCCEEDED, c.PHASE_SUSPENDED, c.PHASE_FAILED})


def verdict(status: dict[str, Any]) -> str | None:
    """Where the job settled, in a word; None while it has not (yet) said."""
    if c.REASON_RECONCILE_ERROR in (status.get("reason"), *(x.get("reason") for x in status.get("conditions") or [])):
        return "ReconcileError"
    blocked = [x for x in status.get("conditions") or [] if x.get("type") == c.COND_RANKS_BLOCKED]
    if blocked and blocked[0].get("status") == "True" and blocked[0].get("reason") and blocked[0].get("message"):
        return f"held up: {blocked[0]['reason']}"
    phase = status.get("phase")
    if phase == c.PHASE_FAILED:
        return f"Failed: {status['reason']}" if status.get("reason") and status.get("message") else None
    return phase if phase in SETTLED_PHASES else None


def create(jobs: Jobs, name: str, case: Fuzzed) -> str | None:
    """Creates the job; the API server's refusal (None when it took it)."""
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": case.spec}
    try:
        jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, body)
    except ApiException as error:
        try:
            said = json.loads(error.body or "{}").get("message") or ""
        except ValueError:
            said = error.body or ""
        return f"{error.status}: {said}"
    return None


@dataclass
class Run:
    """One run's tally: what each job came to, and what is wrong (each with the spec and its seed)."""

    seed: int
    outcomes: Counter[str] = field(default_factory=Counter)
    findings: list[str] = field(default_factory=list)


def test_fuzzed_specs_are_refused_with_a_message_or_said_on_the_job(jobs: Jobs, operator: OperatorProcess) -> None:
    seed, count = settings()
    count = count or COUNT
    print(f"spec fuzz: {SEED_ENV}={seed} {COUNT_ENV}={count}")
    prepare(jobs)
    log_from = len(operator.log_path.read_bytes())
    run = Run(seed)
    waiting = create_all(jobs, fuzzed(seed, count), run)
    settle(jobs, waiting, run)
    log = operator.log_path.read_bytes()[log_from:].decode(errors="replace")
    if "Traceback (most recent call last):" in log:
        run.findings.append(f"the operator logged {log.count('Traceback (most recent call last):')} tracebacks; the "
                            f"first:\n{log[log.index('Traceback'):][:3000]}")
    print(f"spec fuzz outcomes: {dict(sorted(run.outcomes.items()))}")
    assert not run.findings, (f"{SEED_ENV}={seed} {COUNT_ENV}={count}: {len(run.findings)} findings:\n\n"
                              + "\n\n".join(run.findings))


def prepare(jobs: Jobs) -> None:
    """Every pod of the namespace goes to kwok's fake nodes, whatever the fuzzed template says; the
    template's ServiceAccount exists; a quota and a LimitRange have the operator judge each gang by them."""
    jobs.core.patch_namespace(jobs.namespace, {"metadata": {"annotations": FAKE_NODE_NAMESPACE_ANNOTATIONS}})
    jobs.core.create_namespaced_service_account(jobs.namespace, {"metadata": {"name": "trainer"}})
    jobs.core.create_namespaced_limit_range(jobs.namespace, {"metadata": {"name": "defaults"}, "spec": {"limits": [
        {"type": "Container", "defaultRequest": {"memory": "64Mi"}}]}})
    jobs.quota("room", {"pods": "1000", "requests.nvidia.com/gpu": "1000"})


def create_all(jobs: Jobs, cases: Iterable[Fuzzed], run: Run) -> dict[str, Fuzzed]:
    """Creates a job of each spec; those the API server took, by name."""
    waiting: dict[str, Fuzzed] = {}
    for case in cases:
        name = f"fz-{case.index}"
        refused = create(jobs, name, case)
        if refused is None:
            waiting[name] = case
        elif re.match(r"^(400|422): \S", refused):  # a refusal that says why
            run.outcomes["refused"] += 1
        else:
            run.findings.append(f"the API server answered {refused[:500]!r} to {case.describe(run.seed)}")
    return waiting


def settle(jobs: Jobs, waiting: dict[str, Fuzzed], run: Run) -> None:
    """Waits for each job to say where it is (`verdict`), deleting each once it has: its pods go with it,
    and the other tests on the cluster need the fake nodes' GPUs."""
    def all_settled() -> bool:
        listed = jobs.custom.list_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL)
        for job in listed["items"]:
            name, status = job["metadata"]["name"], job.get("status") or {}
            said = verdict(status) if name in waiting else None
            if said is None:
                continue
            case = waiting.pop(name)
            run.outcomes[said] += 1
            if said.startswith("Failed") or said == "ReconcileError":
                print(f"{name} {said}: {status.get('message', '')[:300]} | {'; '.join(case.mutations)[:300]}")
            if said == "ReconcileError":
                run.findings.append(f"{name} says {status.get('message')!r}: {case.describe(run.seed)}")
            jobs.delete(name)
        return not waiting

    poll_until(all_settled, SETTLE_S, interval=0.5)
    for name, case in waiting.items():
        pods = [f"{p.metadata.name} {p.status.phase}" for p in jobs.pods(name, include_deleting=True)]
        run.findings.append(f"{name} said nothing within {SETTLE_S:.0f}s (status {jobs.status(name)}; pods {pods}): "
                            f"{case.describe(run.seed)}")
