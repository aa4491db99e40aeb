"""Where each rank's output is read from: its pod's log (the kubelet's) while the pod exists and the
API can serve it, else the parts the rank kept in S3 (`logs/attempt-<n>/rank-<r>/part-<k>.log` under
the job's results prefix); the kept copy where it holds more (the kubelet rotates long logs away).
Merging the ranks' texts into one is `logs`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddp_contract import labels, layout

from .store import ResultsPrefix

Parts = list[tuple[str, int]]  # one rank's kept log parts, in order: (key, size)


class KeptLogs:
    """The log parts the ranks kept under a job's results prefix. A part is downloaded again only when
    it grew (following reads every part each poll)."""

    def __init__(self, prefix: ResultsPrefix) -> None:
        self.prefix = prefix
        self._texts: dict[str, tuple[int, str]] = {}  # parts read so far: key -> (size, text)

    def parts(self) -> dict[int, dict[int, Parts]]:
        """attempt -> rank -> its parts."""
        attempts: dict[int, dict[int, Parts]] = {}
        for key, size in self.prefix.list(layout.LOGS):
            part = layout.parse_log_part(key)
            if part is not None:
                attempts.setdefault(part.attempt, {}).setdefault(part.rank, []).append((key, size))
        return attempts

    def of(self, attempt: int | None) -> tuple[int, dict[int, Parts]] | None:
        """(attempt, rank -> its parts) for `attempt`, or the newest kept where None; None where none are kept."""
        attempts = self.parts()
        if attempt is None:
            return (max(attempts), attempts[max(attempts)]) if attempts else None
        return (attempt, attempts[attempt]) if attempt in attempts else None

    def text(self, parts: Parts) -> str:
        return "".join(self._part_text(key, size) for key, size in parts)

    def _part_text(self, key: str, size: int) -> str:
        cached = self._texts.get(key)
        if cached is None or cached[0] != size:
            cached = self._texts[key] = (size, self.prefix.get(key).decode(errors="replace"))
        return cached[1]


def pod_log(core: Any, namespace: str, pod: str) -> str | None:
    """A pod's trainer log, or None where the API cannot serve it (no kubelet to ask, container gone)."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError

    try:
        # The raw body, decoded here: kubernetes 36's client returns str(bytes), "b'...'", for a log
        # (kubernetes-client/python#2596).
        response = core.read_namespaced_pod_log(pod, namespace, container=labels.CONTAINER_NAME,
                                                _preload_content=False)
        return bytes(response.data).decode("utf-8", errors="replace")
    except (ApiException, HTTPError):
        return None


def rank_texts(pods: list[dict[str, Any]], read_pod_log: Callable[[str], str | None], kept: KeptLogs | None,
               attempt: int | None = None, rank: int | None = None) -> tuple[int | None, dict[int, str]]:
    """(attempt, rank -> output) of the job's `pods` (as the API serializes them) and what its ranks
    kept (None: it keeps nothing in S3), for `rank` or every rank. Default attempt: the pods' (else
    the newest kept)."""
    pods = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    pod_attempts = {int(p["metadata"]["labels"][labels.LABEL_ATTEMPT]) for p in pods}
    if attempt is None and pod_attempts:
        attempt = max(pod_attempts)
    texts: dict[int, str] = {}
    for pod in pods:
        meta = pod["metadata"]
        pod_rank = int(meta["labels"][labels.LABEL_RANK])
        if int(meta["labels"][labels.LABEL_ATTEMPT]) == attempt and rank in (None, pod_rank):
            text = read_pod_log(meta["name"])
            if text is not None:
                texts[pod_rank] = text
    if kept is not None and (found := kept.of(attempt)) is not None:
        attempt, by_rank = found
        for kept_rank, parts in by_rank.items():
            live = texts.get(kept_rank)
            if rank in (None, kept_rank) and (live is None or sum(size for _, size in parts) > len(live.encode())):
                texts[kept_rank] = kept.text(parts)
    return attempt, texts
