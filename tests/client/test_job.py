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
        self.gets = getattr(self, "gets", 0) + 1
        return self.objects[relative].encode()


class OfflineJob(Job):
    """A Job whose API answers are given: its pods, which pod logs the API can serve, the job itself."""

    def __init__(self, pods: list[dict[str, Any]], pod_logs: dict[str, str], kept: dict[str, str]) -> None:
        self.name, self.namespace, self.results_uri = "j", "ns", None
        self._pods, self._pod_logs = pods, pod_logs
        self._store = FakeStore(kept)  # type: ignore[assignment]
        self._parts = {}

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
    live = "kept 0 a\nkept 0 b\nlive 0\n"  # the pod's log runs ahead of the parts kept so far
    job = OfflineJob([pod(0, 1), pod(1, 1)], {"j-0": live}, KEPT)
    assert job.log_texts() == (1, {0: live, 1: "kept 1\n"})
    assert job.logs() == "[rank 1] kept 1\n" + "".join(f"[rank 0] {line}\n" for line in live.splitlines())


def test_a_kept_part_is_downloaded_again_only_when_it_grew() -> None:
    job = OfflineJob([], {}, dict(KEPT))
    store = job._store
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
    assert job.logs(attempt=0) == "[rank 0] old 0\n[rank 1] old 1\n"  # rank 1 failed attempt 1, not 0


class SpecOnlyJob(Job):
    """A Job whose spec is given and whose credentials Secret must not be needed."""

    def get(self) -> dict[str, Any]:
        return {"spec": {"s3": {"results": "s3://b/r", "endpoint": "http://job-s3:9000", "credentialsSecret": "creds"}}}

    def _credentials_secret(self, name: str) -> dict[str, Any]:
        raise AssertionError(f"read the Secret {name} although the environment gives credentials")


def test_from_python_the_environment_s_s3_settings_win_over_the_job_s(monkeypatch: Any) -> None:
    """README: the job's S3 settings unless given as s3_access= or in DDP_S3_ENDPOINT, AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY (as `kubectl ddp` does), without a Secret read."""
    from kubernetes import client

    from ddp_client.store import S3Access

    for name, value in {"DDP_S3_ENDPOINT": "http://env-s3:9000", "AWS_ACCESS_KEY_ID": "i",
                        "AWS_SECRET_ACCESS_KEY": "k"}.items():
        monkeypatch.setenv(name, value)
    job = SpecOnlyJob("j", "ns", client.ApiClient())
    store = job.store()
    assert (store._access.endpoint, store._access.access_key_id, store._access.secret_access_key) == (
        "http://env-s3:9000", "i", "k")
    given = SpecOnlyJob("j", "ns", client.ApiClient(), s3_access=S3Access(access_key_id="a", secret_access_key="b"))
    assert given.store()._access.endpoint == "http://job-s3:9000"
