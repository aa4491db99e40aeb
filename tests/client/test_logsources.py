"""Where Job.log_texts reads each rank's output: its pod while the log can be read, else what it kept in S3."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kubernetes.client.rest import ApiException

from ddp_client.job import Job
from ddp_client.logsources import rank_texts
from ddp_client.store import ResultsPrefix, S3Access
from ddp_contract import labels, layout


class FakeStore:
    def __init__(self, objects: dict[str, str]) -> None:
        self.objects = objects

    def list(self, under: str = "") -> list[tuple[str, int]]:
        return sorted((k, len(v)) for k, v in self.objects.items() if k.startswith(under + "/"))

    def get(self, relative: str) -> bytes:
        self.gets = getattr(self, "gets", 0) + 1
        return self.objects[relative].encode()


class FakeCore:
    """The pods' logs the API can serve; any other pod's, it cannot (no kubelet to ask, container gone)."""

    def __init__(self, pod_logs: dict[str, str]) -> None:
        self.pod_logs = pod_logs

    def read_namespaced_pod_log(self, pod: str, namespace: str, container: str, _preload_content: bool = True) -> Any:
        """As the API client answers: the raw response (`.data`, the body's bytes) without preloading."""
        if pod not in self.pod_logs:
            raise ApiException(status=400, reason="container not found")
        body = self.pod_logs[pod]
        return body if _preload_content else SimpleNamespace(data=body.encode())


class OfflineJob(Job):
    """A Job whose API answers are given: its pods, which pod logs the API can serve, the job itself; and
    whose results prefix is `kept`, the log parts its ranks kept."""

    def __init__(self, pods: list[dict[str, Any]], pod_logs: dict[str, str], kept: dict[str, str]) -> None:
        from kubernetes import client

        super().__init__("j", "ns", client.ApiClient(), s3_access=S3Access())
        self._given_pods, self.core = pods, FakeCore(pod_logs)
        self.kept = FakeStore(kept)

    def get(self) -> dict[str, Any]:
        return {"spec": {"s3": {"results": "s3://b/r"}}, "status": {"failedRank": {"rank": 1, "attempt": 1}}}

    def pods(self) -> list[dict[str, Any]]:
        return self._given_pods

    def store(self) -> ResultsPrefix:
        return self.kept  # type: ignore[return-value]


def pod(rank: int, attempt: int) -> dict[str, Any]:
    return {"metadata": {"name": f"j-{rank}", "labels": {labels.LABEL_RANK: str(rank), labels.LABEL_ATTEMPT: str(attempt)}}}


KEPT = {layout.log_part(0, 0, 0): "old 0\n", layout.log_part(0, 1, 0): "old 1\n",
        layout.log_part(1, 0, 0): "kept 0 a\n", layout.log_part(1, 0, 1): "kept 0 b\n", layout.log_part(1, 1, 0): "kept 1\n"}


def test_a_readable_pod_log_wins_and_the_others_come_from_s3_in_part_order() -> None:
    live = "kept 0 a\nkept 0 b\nlive 0\n"  # the pod's log runs ahead of the parts kept so far
    job = OfflineJob([pod(0, 1), pod(1, 1)], {"j-0": live}, KEPT)
    assert job.log_texts() == (1, {0: live, 1: "kept 1\n"})
    assert job.logs() == "[rank 1] kept 1\n" + "".join(f"[rank 0] {line}\n" for line in live.splitlines())


def test_a_kept_part_is_downloaded_again_only_when_it_grew() -> None:
    job = OfflineJob([], {}, dict(KEPT))
    store = job.kept
    job.log_texts()
    first = store.gets
    assert job.log_texts() == (1, {0: "kept 0 a\nkept 0 b\n", 1: "kept 1\n"}) and store.gets == first
    store.objects[layout.log_part(1, 1, 0)] = "kept 1\nmore\n"
    assert job.log_texts()[1][1] == "kept 1\nmore\n" and store.gets == first + 1


def test_the_kept_copy_wins_where_it_holds_more_than_a_rotated_pod_log() -> None:
    job = OfflineJob([pod(0, 1), pod(1, 1)], {"j-0": "kept 0 b\n", "j-1": "kept 1\n"}, KEPT)
    assert job.log_texts() == (1, {0: "kept 0 a\nkept 0 b\n", 1: "kept 1\n"})


def test_without_pods_the_newest_kept_attempt_or_the_one_asked_for() -> None:
    job = OfflineJob([], {}, KEPT)
    assert job.log_texts() == (1, {0: "kept 0 a\nkept 0 b\n", 1: "kept 1\n"})
    assert job.log_texts(attempt=0, rank=1) == (0, {1: "old 1\n"})
    assert job.log_texts(attempt=7) == (7, {})
    assert job.kept_attempts() == {0: {0: [layout.log_part(0, 0, 0)], 1: [layout.log_part(0, 1, 0)]},
                                   1: {0: [layout.log_part(1, 0, 0), layout.log_part(1, 0, 1)], 1: [layout.log_part(1, 1, 0)]}}
    assert job.logs(attempt=0) == "[rank 0] old 0\n[rank 1] old 1\n"  # rank 1 failed attempt 1, not 0


def test_a_pod_being_deleted_is_not_read_nor_its_attempt_the_default() -> None:
    going = pod(0, 2)
    going["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    logs = {"j-0": "going away\n", "j-1": "rank 1\n"}
    assert rank_texts([going, pod(1, 1)], logs.get, None) == (1, {1: "rank 1\n"})
