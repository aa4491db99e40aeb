"""submit() against a recording API: where a whole DDPJob goes, and what name, namespace and spec override."""

from __future__ import annotations

from typing import Any

import pytest

from ddp_contract import api


def test_a_whole_job_goes_in_its_own_namespace_and_name_and_spec_override_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/user-guide.md: submit takes a whole DDPJob; spec={...} adds or overrides spec fields; name and
    namespace as expected."""
    import importlib

    from kubernetes import client

    from ddp_client.job import Job

    submitting = importlib.import_module("ddp_client.submit")  # the package's `submit` is the function

    created: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                            body: dict[str, Any]) -> dict[str, Any]:
            created.append((namespace, body))
            return body

    class NewJob(Job):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.custom = Recorder()

        def get(self) -> dict[str, Any]:
            raise LookupError("not there yet")

    monkeypatch.setattr(submitting, "Job", NewJob)
    monkeypatch.setattr(submitting, "default_namespace", lambda kubeconfig=None: "context-ns")
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "j", "namespace": "team-a"},
            "spec": {"worldSize": 2, "image": "img:1", "entrypoint": "a:b"}}
    job = submitting.submit(body, api_client=client.ApiClient())
    assert (job.namespace, created[-1][0], created[-1][1]["metadata"]) == ("team-a", "team-a", body["metadata"])
    job = submitting.submit(body, name="k", namespace="team-b", spec={"worldSize": 4}, api_client=client.ApiClient())
    namespace, sent = created[-1]
    assert (job.name, job.namespace, namespace) == ("k", "team-b", "team-b")
    assert sent["metadata"] == {"name": "k", "namespace": "team-b"}
    assert sent["spec"] == {"worldSize": 4, "image": "img:1", "entrypoint": "a:b"}
    assert body["metadata"]["name"] == "j"  # the caller's dict is left alone
    del body["metadata"]["namespace"]
    assert submitting.submit(body, api_client=client.ApiClient()).namespace == "context-ns"
