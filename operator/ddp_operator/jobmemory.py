"""What the operator keeps of one job between passes: none of it is status, and an operator that starts
again rebuilds it in its first passes. The creation pass writes what it could not create; the status
pass says it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ddp_operator.admission import Refusal, Refused
from ddp_operator.capacity import InTheWay
from ddp_operator.nodes import NodeInfo


class Fit(NamedTuple):
    """capacity.gang_too_large's verdict, for the nodes and the job's generation it was judged on."""

    nodes: Mapping[str, NodeInfo]
    generation: int | None
    verdict: str | None


@dataclass
class JobMemory:
    patched_at: float = float("-inf")  # monotonic time of the job's last status patch
    in_the_way: InTheWay = InTheWay()  # what the last creation pass found holding the job's names
    fit: Fit | None = None  # whether the gang can fit the nodes at all, judged last
    refused: Refused | None = None  # what the API server (or a quota) refused the last creation pass
    data_refused: Refusal | None = None  # what it refused of the job's data workers, last time
