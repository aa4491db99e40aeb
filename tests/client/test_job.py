"""Where Job.log_texts reads each rank's output: its pod while the log can be read, else what it kept in S3."""

from __future__ import annotations

from typing import Any

from ddp_client.job import Job
from ddp_contract import labels, layout


class FakeStore:
    def __init__(self, objects: dict[str, str]) -> None:
        self.objects = objects

    def list(self, under: str = "") -> list[tuple[str, int]]:
        return sorted((k, len(v)) for k, v in self.objects.items() if k.startswith(under + "/"))

    def get(self, relative: str) -> bytes:
        return self.objects[relative].encode()


class OfflineJob(Job):
    """A Job whose API answers are given: its pods, which pod logs the API can serve, the job itself."""

    def __init__(self, pods: list[dict[str, Any]], pod_logs: dict[str, str], kept: dict[str, str]) -> None:
        self.name, self.namespace, self.results_uri = "j", "ns", None
        self._pods, self._pod_logs = pods, pod_logs
        self._store = FakeStore(kept)  # type: ignore[assignment]

    def get(self) -> dict[str, Any]:
        return {"spec": {"s3": {"results": "s3://b/r"}}, "status": {"failedRank": {"rank": 1, "attempt": 1}}}

    def pods(self) -> list[dict[str, Any]]:
        return self._pods

    def _pod_log(self, pod: str) -> str | None:
        return self._pod_logs.get(pod)


def pod(rank: int, attempt: int) -> dict[str, Any]:
    return {"metadata": {"name": f"j-{rank}", "labels": {labels.LABEL_RANK: str(rank), labels.LABEL_ATTEMPT: str(attempt)}}}


KEPT = {layout.log_part(0, 0, 0): "old 0\n", layout.log_part(0, 1, 0): "old 1\n",
        layout.log_part(1, 0, 0): "kept 0 a\n", layout.log_part(1, 0, 1): "kept 0 b\n", layout.log_part(1, 1, 0): "kept 1\n"}


def test_a_readable_pod_log_wins_and_the_others_come_from_s3_in_part_order() -> None:
    job = OfflineJob([pod(0, 1), pod(1, 1)], {"j-0": "live 0\n"}, KEPT)
    assert job.log_texts() == (1, {0: "live 0\n", 1: "kept 1\n"})
    assert job.logs() == "[rank 1] kept 1\n[rank 0] live 0\n"  # the failed rank first


def test_without_pods_the_newest_kept_attempt_or_the_one_asked_for() -> None:
    job = OfflineJob([], {}, KEPT)
    assert job.log_texts() == (1, {0: "kept 0 a\nkept 0 b\n", 1: "kept 1\n"})
    assert job.log_texts(attempt=0, rank=1) == (0, {1: "old 1\n"})
    assert job.log_texts(attempt=7) == (7, {})
    assert job.logs(attempt=0) == "[rank 0] old 0\n[rank 1] old 1\n"  # rank 1 failed attempt 1, not 0
