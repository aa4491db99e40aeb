"""The chart's operator pod killed mid-job on the local cluster's real node: the Deployment's next pod
takes over the job it left, creates no pod twice and deletes none it should keep.
Select with `pytest -m node`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ddp_operator import constants as c
from e2e.test_quickstart import quick_start_commands, user_shell
from helmchart import ready_operators
from kube import REPO, Cluster, Jobs, PodLives, wait_until
from realnode import create_job

pytestmark = [pytest.mark.node, pytest.mark.images, pytest.mark.timeout(600)]

# A rank waits for the test: /tmp/done ends it, /tmp/fail fails it.
WAIT_FOR_THE_TEST = "while [ ! -f /tmp/done ]; do [ -f /tmp/fail ] && exit 3; sleep 0.2; done"


def test_killing_the_operator_pod_mid_job_creates_no_duplicate_pods(
        cluster: Cluster, kube_api, images_on_the_node: None, busybox_image: str, own_namespace: str,
        kubectl, tmp_path: Path) -> None:
    install = quick_start_commands()[0]
    env = user_shell(cluster, own_namespace, tmp_path)
    ns = own_namespace

    def helm(command: str) -> None:
        result = subprocess.run(command, shell=True, cwd=REPO, env=env, capture_output=True, text=True)
        assert result.returncode == 0, f"{command}\n{result.stdout}\n{result.stderr}"

    def in_every_rank(*command: str) -> None:
        for rank in range(3):
            try:
                kubectl("exec", f"steadfast-{rank}", "-n", ns, "--", *command)
            except subprocess.CalledProcessError as error:
                # The rank's loop can see the file and end its container before the exec reports, which is
                # then killed (137); the job's end, asserted below, says whether the rank got it.
                if error.returncode != 137:
                    raise

    jobs = Jobs(kube_api, ns)
    helm(f"{install} -n {ns} --set 'watchNamespaces={{{ns}}}'")
    try:
        first = wait_until(lambda: ready_operators(jobs), 180, "the operator's pod to be Ready")[0]  # type: ignore[index]
        with PodLives(jobs, "steadfast") as lives:
            create_job(jobs, "steadfast", worldSize=3, image=busybox_image, command=["sh", "-c", WAIT_FOR_THE_TEST],
                       backoffLimit=1)
            jobs.wait_phase("steadfast", c.PHASE_RUNNING, timeout=120)
            jobs.core.delete_namespaced_pod(first.metadata.name, ns, grace_period_seconds=0)
            wait_until(lambda: [p for p in ready_operators(jobs) if p.metadata.name != first.metadata.name], 180,
                       "the Deployment's next operator pod to be Ready")

            # The next operator acts on the job: a failed rank restarts the gang once, then it finishes.
            kubectl("exec", "steadfast-1", "-n", ns, "--", "touch", "/tmp/fail")
            jobs.wait_pods("steadfast", 3, attempt=1, timeout=120)
            wait_until(lambda: jobs.status("steadfast").get("phase") == c.PHASE_RUNNING
                       and jobs.status("steadfast").get("attempt") == 1, 120, "the gang Running again (attempt 1)")
            in_every_rank("touch", "/tmp/done")
            status = jobs.wait_phase("steadfast", c.PHASE_SUCCEEDED, timeout=120)
            assert status["restarts"] == 1 and status["failedRank"]["exitCode"] == 3, status
            assert lives.created() == {"0": 3, "1": 3}, "each rank's pod created once per attempt"
            assert lives.deleted_of(1) == 0, "the operator deleted pods of the gang that finished"
    finally:
        helm(f"helm uninstall ddp-operator -n {ns}")
