"""DDPJobs whose ranks run in containers on the local cluster's real node: the faults only a container
runtime produces (an image that cannot be pulled, a missing Secret, an OOM kill by the memory limit),
each said on the job in the kubelet's words; what only a kubelet applies (shmSize, the template's
securityContext, env from a Secret), seen from inside a rank with `kubectl logs` and `kubectl exec`.
Select with `pytest -m node`."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ddp_operator import constants as c
from kube import Jobs, wait_until
from realnode import IMAGE, ROOT_IMAGE, create_job, import_busybox

pytestmark = pytest.mark.node


def create(jobs: Jobs, name: str, image: str, script: str, **spec: Any) -> None:
    """A job of `sh -c script` ranks on the real node."""
    create_job(jobs, name, image=image, command=["sh", "-c", script], **spec)


def test_an_image_that_cannot_be_pulled_is_said_by_rank_and_fails_the_job_at_the_startup_deadline(
        jobs: Jobs, busybox_image: str) -> None:
    create(jobs, "nopull", "registry.invalid/ddp/missing:1", "sleep 60", startupDeadlineSeconds=30)
    jobs.wait_condition("nopull", c.COND_RANKS_BLOCKED, "True", timeout=120)
    status = jobs.status("nopull")
    assert status["reason"] == "ImagePullError", status
    assert re.search(r"ranks? [01](-1)? \(ImagePullError\): .*registry.invalid/ddp/missing:1", status["message"]), status
    failed = jobs.wait_phase("nopull", c.PHASE_FAILED, timeout=120)
    assert failed["reason"] == "ImagePullError" and "startupDeadlineSeconds=30" in failed["message"]


def test_a_root_image_fails_the_job_at_once_saying_what_to_change(jobs: Jobs, real_node, tmp_path) -> None:
    import_busybox(tmp_path, ROOT_IMAGE, uid=0)
    create(jobs, "rooted", ROOT_IMAGE, "sleep 60")
    failed = jobs.wait_phase("rooted", c.PHASE_FAILED, timeout=120)
    assert failed["reason"] == c.REASON_IMAGE_RUNS_AS_ROOT, failed
    # The first rank the kubelet refuses fails the job; its peer may have been refused by then too.
    assert re.match(r"ranks? [01](-1)? \(ImageRunsAsRoot\): container has runAsNonRoot and image will run as root: ",
                    failed["message"]), failed["message"]
    assert "runAsUser" in failed["message"] and "non-root USER" in failed["message"]
    # As root where the template asks for it (and the namespace allows it): the template wins.
    create(jobs, "asked", ROOT_IMAGE, "id -u; sleep 60", template={"spec": {"securityContext": {"runAsUser": 0}}})
    jobs.wait_phase("asked", c.PHASE_RUNNING, timeout=120)


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
    # Its last words reach failedRank through the container's log: busybox leaves no termination
    # message, and the trainer container falls back to its log on error.
    script = ('if [ "$RANK" = 1 ]; then echo "rank 1 fills 64 MiB now"; exec dd if=/dev/zero of=/dev/null bs=64M count=1; fi; '
              'exec sleep 60')
    create(jobs, "greedy", IMAGE, script, backoffLimit=1, resources={"limits": {"memory": "32Mi"}})
    status = jobs.wait_phase("greedy", c.PHASE_FAILED, timeout=180)
    failed = status["failedRank"]
    assert (failed["rank"], failed["exitCode"], failed["signal"], failed["oomKilled"]) == (1, 137, "SIGKILL", True)
    assert failed["reason"] == "OOMKilled" and failed["kind"] == c.KIND_PROGRAM and failed["node"] == real_node.metadata.name
    assert status["reason"] == c.REASON_BACKOFF_LIMIT and status["programRestarts"] == 1
    assert "rank 1 fills 64 MiB now" in failed["message"], failed


def test_shm_size_the_templates_security_context_and_secret_env_reach_the_ranks_with_logs_and_exec(
        jobs: Jobs, busybox_image: str, kubectl) -> None:
    jobs.core.create_namespaced_secret(jobs.namespace, {"metadata": {"name": "team-token"},
                                                        "stringData": {"token": "s3cr3t-42"}})
    # Each rank says what it runs as, then waits until the test has looked inside it.
    script = ('echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) token=$TEAM_TOKEN"; '
              'grep NoNewPrivs /proc/self/status; while [ ! -f /tmp/done ]; do sleep 0.2; done')
    template = {"spec": {
        "securityContext": {"runAsUser": 1234, "runAsGroup": 2345, "supplementalGroups": [3456]},
        "containers": [{"name": "trainer", "securityContext": {"allowPrivilegeEscalation": False}}],
    }}
    create(jobs, "inside", IMAGE, script, shmSize="96Mi", template=template,
           env=[{"name": "TEAM_TOKEN", "valueFrom": {"secretKeyRef": {"name": "team-token", "key": "token"}}}])
    jobs.wait_phase("inside", c.PHASE_RUNNING, timeout=120)
    for rank in (0, 1):
        pod = f"inside-{rank}"
        said = wait_until(lambda p=pod: "NoNewPrivs" in (out := kubectl("logs", p, "-n", jobs.namespace).stdout) and out,
                          60, f"{pod} to say what it runs as")
        assert "uid=1234 gid=2345 groups=2345 3456 token=s3cr3t-42" in said, said  # type: ignore[operator]
        assert re.search(r"NoNewPrivs:\s+1", said), said  # type: ignore[arg-type]
        # df -k: the memory-backed /dev/shm is shmSize (96 MiB = 98304 KiB), not the runtime's 64 MiB.
        shm = kubectl("exec", pod, "-n", jobs.namespace, "-c", "trainer", "--", "df", "-k", "/dev/shm").stdout
        assert re.search(r"^\S+\s+98304\s+\d+\s+\d+\s+\d+%\s+/dev/shm$", shm, re.MULTILINE), shm
        kubectl("exec", pod, "-n", jobs.namespace, "--", "touch", "/tmp/done")
    status = jobs.wait_phase("inside", c.PHASE_SUCCEEDED, timeout=60)
    assert status["restarts"] == 0
