"""DDPJobs whose ranks run in containers on the local cluster's real node: the faults only a container
runtime produces (an image that cannot be pulled, a missing Secret, an OOM kill by the memory limit),
each said on the job in the kubelet's words. Select with `pytest -m node`."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ddp_contract import api
from ddp_operator import constants as c
from kube import Jobs
from realnode import IMAGE

pytestmark = pytest.mark.node


def create(jobs: Jobs, name: str, image: str, script: str, **spec: Any) -> None:
    """A job of `sh -c script` ranks as a user would write it: no node steering, so its pods go to the
    real node (kwok's fake nodes are tainted)."""
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name},
            "spec": {"worldSize": 2, "gpusPerRank": 0, "image": image, "command": ["sh", "-c", script], **spec}}
    jobs.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, body)


def test_an_image_that_cannot_be_pulled_is_said_by_rank_and_fails_the_job_at_the_startup_deadline(
        jobs: Jobs, busybox_image: str) -> None:
    create(jobs, "nopull", "registry.invalid/ddp/missing:1", "sleep 60", startupDeadlineSeconds=30)
    jobs.wait_condition("nopull", c.COND_RANKS_BLOCKED, "True", timeout=120)
    status = jobs.status("nopull")
    assert status["reason"] == "ImagePullError", status
    assert re.search(r"ranks? [01](-1)? \(ImagePullError\): .*registry.invalid/ddp/missing:1", status["message"]), status
    failed = jobs.wait_phase("nopull", c.PHASE_FAILED, timeout=120)
    assert failed["reason"] == "ImagePullError" and "startupDeadlineSeconds=30" in failed["message"]


def test_a_missing_secret_holds_the_ranks_with_the_kubelets_words(jobs: Jobs, busybox_image: str) -> None:
    create(jobs, "nosecret", IMAGE, "sleep 60", envFrom=[{"secretRef": {"name": "no-such-secret"}}])
    jobs.wait_condition("nosecret", c.COND_RANKS_BLOCKED, "True", timeout=120)
    status = jobs.status("nosecret")
    assert status["reason"] == "ContainerConfigError", status
    assert 'secret "no-such-secret" not found' in status["message"], status["message"]
    assert status["phase"] == c.PHASE_PENDING


def test_a_rank_over_its_memory_limit_is_oom_killed_and_the_gang_restarts_on_the_program_budget(
        jobs: Jobs, busybox_image: str, real_node) -> None:
    # Rank 1 fills a 64 MiB buffer in a 32 MiB container; rank 0 waits for it.
    script = 'if [ "$RANK" = 1 ]; then exec dd if=/dev/zero of=/dev/null bs=64M count=1; fi; exec sleep 60'
    create(jobs, "greedy", IMAGE, script, backoffLimit=1, resources={"limits": {"memory": "32Mi"}})
    status = jobs.wait_phase("greedy", c.PHASE_FAILED, timeout=180)
    failed = status["failedRank"]
    assert (failed["rank"], failed["exitCode"], failed["signal"], failed["oomKilled"]) == (1, 137, "SIGKILL", True)
    assert failed["reason"] == "OOMKilled" and failed["kind"] == c.KIND_PROGRAM and failed["node"] == real_node.metadata.name
    assert status["reason"] == c.REASON_BACKOFF_LIMIT and status["programRestarts"] == 1
