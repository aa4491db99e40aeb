"""A rank's watch of its own DDPJob against the API server (no operator acts in the namespace)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ddp_contract import api
from ddp_contract.jobstatus import STATUS_CHECKPOINT_REQUESTED, STATUS_MEMBERS
from ddp_trainer.jobwatch import JobView, JobWatch


@pytest.mark.parametrize(("members", "seen"), [
    ([2, 0, 3], (2, 0, 3)),
    (None, None),
    ([], None),
    ("0,1", None),
    ([0, "1"], None),
    ([0, -1], None),
    ([0, True], None),
    ([1, 1], None),
])
def test_the_view_holds_the_attempts_members_where_they_are_pod_indices(members: Any, seen: tuple[int, ...] | None) -> None:
    status: dict[str, Any] = {"attempt": 2, "phase": "Running"}
    if members is not None:
        status[STATUS_MEMBERS] = members
    assert JobView.of({"status": status}) == JobView(2, None, "Running", seen)


def test_the_view_follows_the_jobs_status_and_waits_for_what_is_asked(kube_api, own_namespace: str, crd) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(kube_api)
    job = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": "watched"},
           "spec": {"worldSize": 2, "image": "trainer:1", "entrypoint": "train:main"}}
    custom.create_namespaced_custom_object(api.GROUP, api.VERSION, own_namespace, api.PLURAL, job)
    watch = JobWatch(own_namespace, "watched", api_client=kube_api).start()
    try:
        assert watch.wait(lambda v: True, 30) == JobView(0, None, None)
        started = time.monotonic()
        assert watch.wait(lambda v: v.attempt > 0, 0.5) is None and time.monotonic() - started >= 0.5
        status = {"attempt": 3, "lastCheckpoint": {"step": 8, "uri": "s3://b/ck/step-8", "time": "2026-01-01T00:00:00Z"},
                  "phase": "Restarting"}
        custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, own_namespace, api.PLURAL, "watched",
                                                     {"status": status})
        assert watch.wait(lambda v: v.attempt > 0, 30) == JobView(3, "s3://b/ck/step-8", "Restarting")
        assert watch.view == JobView(3, "s3://b/ck/step-8", "Restarting")
        assert watch.wait(lambda v: v.attempt > 3, 30, also=lambda: True) is None  # `also` ends the wait
    finally:
        watch.stop()
    assert watch.wait(lambda v: v.attempt > 3) is None  # a stopped watch answers at once


def test_the_view_holds_a_checkpoint_request_where_the_job_has_one() -> None:
    asked = {"attempt": 2, STATUS_CHECKPOINT_REQUESTED: {"since": "2026-11-24T23:00:00Z", "afterStep": 40}}
    assert JobView.of({"status": asked}).checkpoint_requested == "2026-11-24T23:00:00Z"
    assert JobView.of({"status": {"attempt": 2}}).checkpoint_requested is None
    assert JobView.of({"status": {**asked, STATUS_CHECKPOINT_REQUESTED: {"since": 7}}}).checkpoint_requested is None
    assert JobView.of({"status": {**asked, STATUS_CHECKPOINT_REQUESTED: "x"}}).checkpoint_requested is None
