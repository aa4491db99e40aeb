"""The Job handle's S3 settings: the environment's or those given win over the job's own."""

from __future__ import annotations

from typing import Any

from ddp_client.job import Job


class SpecOnlyJob(Job):
    """A Job whose spec is given and whose credentials Secret must not be needed."""

    def get(self) -> dict[str, Any]:
        return {"spec": {"s3": {"results": "s3://b/r", "endpoint": "http://job-s3:9000", "credentialsSecret": "creds"}}}

    def _credentials_secret(self, name: str) -> dict[str, Any]:
        raise AssertionError(f"read the Secret {name} although the environment gives credentials")


def test_from_python_the_environment_s_s3_settings_win_over_the_job_s(monkeypatch: Any) -> None:
    """docs/user-guide.md: the job's S3 settings unless given as s3_access= or in DDP_S3_ENDPOINT, AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY (as `kubectl ddp` does), without a Secret read."""
    from kubernetes import client

    from ddp_client.store import S3Access

    for name, value in {"DDP_S3_ENDPOINT": "http://env-s3:9000", "AWS_ACCESS_KEY_ID": "i",
                        "AWS_SECRET_ACCESS_KEY": "k"}.items():
        monkeypatch.setenv(name, value)
    job = SpecOnlyJob("j", "ns", client.ApiClient())
    store = job.store()
    assert (store.access.endpoint, store.access.access_key_id, store.access.secret_access_key) == (
        "http://env-s3:9000", "i", "k")
    given = SpecOnlyJob("j", "ns", client.ApiClient(), s3_access=S3Access(access_key_id="a", secret_access_key="b"))
    assert given.store().access.endpoint == "http://job-s3:9000"
