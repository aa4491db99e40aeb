"""What the operator keeps of one job between passes: none of it is status, and an operator that starts
again rebuilds it in its first passes. The creation pass writes what it could not create; the status
pass says it."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ddp_operator.admission import Refusal, Refused
from ddp_operator.capacity import InTheWay
from ddp_operator.nodes import NodeInfo


class Fit(NamedTuple):
    """capacity.gang_too_large's verdict, for the nodes and the job's generation it was judged on."""

    nodes: Mapping[str, NodeInfo]
    generation: int | None
    verdict: str | None


# How long a pod the creation pass made may be missing from the pod cache before the next pass stops
# waiting for it (deleted before its watch saw it, or the watch listing again).
UNSEEN_WAIT = 10.0


@dataclass
class JobMemory:
    patched_at: float = float("-inf")  # monotonic time of the job's last status patch
    # monotonic time of its last status patch that changed more than rank counts (None: not seen yet)
    changed_at: float | None = None
    in_the_way: InTheWay = InTheWay()  # what the last creation pass found holding the job's names
    fit: Fit | None = None  # whether the gang can fit the nodes at all, judged last
    refused: Refused | None = None  # what the API server (or a quota) refused the last creation pass
    data_refused: Refusal | None = None  # what it refused of the job's data workers, last time
    failures_said: set[str] = field(default_factory=set)  # why its passes raised, as logged (passerrors.py)
    nodes_seen: dict[str, str] = field(default_factory=dict)  # pod name -> the node it was last seen bound to
    # (pod name, attempt) -> monotonic time the creation pass made it, until the pod cache has it
    unseen: dict[tuple[str, int], float] = field(default_factory=dict)
    read_seconds: float = 0.0  # how long its last status pass took to read its pods and decide (Reconciler's pace)

    def awaited(self, cached: Collection[tuple[str, int | None]], now: float, attempt: int) -> float | None:
        """Seconds to wait for the pods of `attempt` that the creation pass made and the pod cache does not hold
        yet (`cached`: the (name, attempt) of the pods it holds), each waited for UNSEEN_WAIT at most; None:
        nothing to wait for. A pass that read the cache before its watch brought them would count their ranks
        as missing: it would create them again (refused as taken, then read) and judge a quota with them left
        out. Pods of other attempts are forgotten: a gang restart deletes them, seen or not."""
        self.unseen = {made: at for made, at in self.unseen.items()
                       if made[1] == attempt and made not in cached and now - at < UNSEEN_WAIT}
        return min(self.unseen.values()) + UNSEEN_WAIT - now if self.unseen else None

    def saw_nodes(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Keeps where each pod is bound, so that a pod that vanishes can still be placed (RankMissing)."""
        self.nodes_seen.update({pod["metadata"]["name"]: node for pod in pods if (node := pod["spec"].get("nodeName"))})
