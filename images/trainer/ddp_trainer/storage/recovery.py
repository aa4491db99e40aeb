"""Which state a restarted gang resumes from, and getting it to every rank.

Every rank offers what its pod holds in memory (podsnapshots.py: the steps, where the pod serves them);
rank 0 adds the job's last S3 checkpoint. From the same offers every rank makes the same plans (`plans`):
the newest step some pod holds, when it is no older than the S3 checkpoint, then the older ones. A rank
whose pod holds the step reads its own memory; another fetches it from a pod that holds it (spread over
them by rank). The gang takes a plan only when every rank got its state (a checksum that does not match,
a peer that cannot be reached: the next plan); when none works, the S3 checkpoint, as without snapshots.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .podsnapshots import Held, PodSnapshots, state_of
from .snapshotpeers import SnapshotServer, fetch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Offer:
    """What one rank's pod holds."""

    rank: int
    pod: str
    host: str
    port: int | None  # where the pod serves its snapshots; None: it does not (its other ranks may)
    steps: tuple[int, ...] = ()
    reached: int | None = None  # the newest step the pod's training loop got to
    s3_step: int | None = None  # rank 0's: the step of the job's last S3 checkpoint


@dataclass(frozen=True)
class Source:
    pod: str
    host: str
    port: int | None  # None: the rank's own pod


@dataclass(frozen=True)
class Plan:
    step: int
    holders: tuple[str, ...]  # the pods that hold it
    sources: Mapping[int, Source] = field(default_factory=dict)  # by rank


def plans(offers: Sequence[Offer], s3_step: int | None) -> list[Plan]:
    """The gang's choices, best first: each step some pod holds, newest first, no older than `s3_step`,
    for which every rank's pod holds it or some pod that holds it serves."""
    held: dict[str, set[int]] = {}
    serving: dict[str, tuple[str, int]] = {}
    for offer in offers:
        held.setdefault(offer.pod, set()).update(offer.steps)
        if offer.port is not None:
            serving.setdefault(offer.pod, (offer.host, offer.port))
    candidates = sorted({step for steps in held.values() for step in steps if s3_step is None or step >= s3_step},
                        reverse=True)
    chosen = []
    for step in candidates:
        holders = tuple(sorted(pod for pod, steps in held.items() if step in steps))
        servers = [pod for pod in holders if pod in serving]
        sources: dict[int, Source] = {}
        for offer in sorted(offers, key=lambda o: o.rank):
            if offer.pod in holders:
                sources[offer.rank] = Source(offer.pod, offer.host, None)
            elif servers:
                pod = servers[offer.rank % len(servers)]
                sources[offer.rank] = Source(pod, *serving[pod])
            else:
                break
        else:
            chosen.append(Plan(step, holders, sources))
    return chosen


def newest_reached(offers: Sequence[Offer]) -> int | None:
    return max((o.reached for o in offers if o.reached is not None), default=None)


def job_s3_step(offers: Sequence[Offer]) -> int | None:
    """Rank 0's step of the job's newest S3 checkpoint: the one the whole gang loads."""
    return next((o.s3_step for o in offers if o.rank == 0), None)


@dataclass(frozen=True)
class Recovered:
    step: int
    state: Any
    pods: tuple[str, ...]  # the pods whose memory it came from


@dataclass(frozen=True)
class Gang:
    """The collectives recovery needs (the default process group's, or a lone rank's)."""

    gather: Callable[[Offer], list[Offer]]
    all_true: Callable[[bool], bool]

    @classmethod
    def of_process_group(cls) -> Gang:
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return cls(gather=lambda offer: [offer], all_true=lambda ok: ok)

        def gather(offer: Offer) -> list[Offer]:
            out: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(out, offer)
            return out

        def all_true(ok: bool) -> bool:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
            flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            return bool(flag.item())

        return cls(gather=gather, all_true=all_true)


@dataclass(frozen=True)
class Peer:
    """This rank, as recovery sees it."""

    rank: int
    pod: str
    host: str
    token: bytes | None  # the job's: without it the pod neither serves nor fetches
    serves: bool  # the pod's first rank process serves its snapshots


def from_gang_memory(snapshots: PodSnapshots, me: Peer, gang: Gang,
                     s3_step: int | None = None) -> tuple[Recovered | None, list[Offer]]:
    """The state the gang resumes from out of its pods' memory, or None (then the S3 checkpoint), with every
    rank's offer. Every rank of the gang calls it at once. s3_step: rank 0's, None elsewhere."""
    held = snapshots.held()
    server = None
    if me.serves and me.token and held:
        try:
            server = SnapshotServer(snapshots, me.host, me.token)
        except OSError as error:
            log.warning("this pod's snapshots cannot be served to its peers: %s", error)
    try:
        offers = gang.gather(Offer(rank=me.rank, pod=me.pod, host=me.host, port=server.port if server else None,
                                   steps=tuple(h.step for h in held), reached=snapshots.reached(), s3_step=s3_step))
        for plan in plans(offers, job_s3_step(offers)):
            state = _state(snapshots, held, me, plan)
            if gang.all_true(state is not None):
                assert state is not None
                return Recovered(plan.step, state, plan.holders), offers
            log.warning("not every rank could take the snapshot of step %d; trying an older one", plan.step)
        return None, offers
    finally:
        if server is not None:  # every rank has passed the last collective: no fetch is under way
            server.close()


def _state(snapshots: PodSnapshots, held: Sequence[Held], me: Peer, plan: Plan) -> Any:
    source = plan.sources[me.rank]
    try:
        if source.port is None:
            return snapshots.load(next(h for h in held if h.step == plan.step))
        if me.token is None:
            return None
        fetched = fetch(source.host, source.port, me.token, plan.step)
        return state_of(fetched.held, fetched.data)
    except Exception as error:  # noqa: BLE001 - whatever keeps this rank from a snapshot, the gang takes another
        where = "this pod's memory" if source.port is None else f"pod {source.pod}"
        log.warning("the snapshot of step %d from %s cannot be used: %s", plan.step, where, error)
        return None
