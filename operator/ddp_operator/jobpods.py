"""A job's rank pods as a pass reads them: their summary (podsummary.summarize_pods, with what the job's
restart mode adds: modes.of), and the ranks held up by what the job's memory keeps (names in the way,
what the last creation pass was refused) or by a gang too large for the nodes (capacity)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from ddp_contract.jobspec import JobSpec
from ddp_contract.resource import JobStatus
from ddp_operator import constants as c
from ddp_operator import modes
from ddp_operator.capacity import gang_too_large
from ddp_operator.failures import PodProblem
from ddp_operator.jobmemory import Fit, JobMemory
from ddp_operator.nodes import Nodes, lost_nodes
from ddp_operator.podstate import SCHEDULER_ANSWER_SECONDS, PodView, unanswered_for, unanswered_problem
from ddp_operator.podsummary import PodSummary, summarize_pods
from ddp_operator.statuspatch import pod_attempt_floor


def read_pods(pods: Sequence[Mapping[str, Any]], *, spec: JobSpec, status: Mapping[str, Any], job_name: str,
              generation: int | None, nodes: Nodes, memory: JobMemory, deleting: Collection[str],
              now: datetime) -> PodSummary:
    """The summary of the job's rank `pods` (those it controls) for a pass. deleting: the uids of pods
    whose delete was issued. Keeps in `memory` where each pod is bound and the verdict on the gang's fit."""
    mode = modes.of(spec)
    bound = {pod["spec"]["nodeName"] for pod in pods if pod["spec"].get("nodeName")}
    lost = lost_nodes(bound, nodes, spec.node_lost_grace_seconds, now)
    read = JobStatus.of(status)
    summary = summarize_pods(pods, read.attempt, job_name=job_name, lost_nodes=lost, ranks_per_pod=spec.ranks_per_pod,
                             since=pod_attempt_floor(status), replaced=mode.left_out_of_window(deleting),
                             process_failures=read.process_failures, members=mode.members(read))
    memory.saw_nodes(pods)
    unanswered = [(pod, view.index, waited) for pod in pods if (view := PodView.of(pod)).index is not None
                  and not view.deleting and (waited := unanswered_for(pod, now)) is not None]
    held = tuple(unanswered_problem(pod, index, waited) for pod, index, waited in unanswered
                 if waited >= SCHEDULER_ANSWER_SECONDS)
    held += memory.in_the_way.problems(spec.all_pods, summary.live_indices)
    if memory.refused is not None:
        held += memory.refused.problems(summary.attempt, summary.live_indices)
    too_large = too_large_for(spec, nodes, memory, generation) if summary.unscheduled_indices else None
    if too_large:
        held += tuple(PodProblem(rank, c.REASON_GANG_TOO_LARGE, too_large) for rank in summary.unscheduled_indices)
    due = [SCHEDULER_ANSWER_SECONDS - waited for _, _, waited in unanswered if waited < SCHEDULER_ANSWER_SECONDS]
    return replace(summary.with_problems(held), nodes_seen=memory.nodes_seen, scheduler_due=min(due, default=None))


def too_large_for(spec: JobSpec, nodes: Nodes, memory: JobMemory, generation: int | None) -> str | None:
    """gang_too_large, judged again only when the nodes or the job's spec (its `generation`) changed: a
    gang coming up has unscheduled ranks for many passes, and a cluster may have thousands of nodes."""
    if not nodes.synced:
        return None
    if memory.fit is not None and memory.fit.nodes is nodes.known and memory.fit.generation == generation:
        return memory.fit.verdict
    verdict = gang_too_large(spec, nodes.known.values())
    memory.fit = Fit(nodes.known, generation, verdict)
    return verdict
