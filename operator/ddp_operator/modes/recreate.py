"""restartStrategy Recreate: a failed attempt's gang goes whole, finished pods included, and the next
passes create every pod again, labelled with the next attempt, once their names are free. The gang of
an attempt is its own pods only (gangpods.AttemptWindow with `since` the attempt)."""

from __future__ import annotations

from ddp_operator.gangpods import GangPods


def every_pod(pods: GangPods, running: tuple[str, ...], anyway: tuple[str, ...]) -> tuple[str, ...]:
    """Every pod not already being deleted: `running` (the gang's and any waiting apart), the gang's
    finished ones and `anyway` (older ones)."""
    return tuple(sorted(set(running + pods.finished_pods + anyway)))


def replaced_by_restart(pods: GangPods, running: tuple[str, ...], anyway: tuple[str, ...]) -> tuple[str, ...]:
    """The pods a restart replaces: every one."""
    return every_pod(pods, running, anyway)
