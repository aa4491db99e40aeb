"""The generic reading of a job's pods (gangpods.py, through summarize_pods): counts, failures and stale pods
of its current attempt, and what one pod says (podstate.py)."""

from __future__ import annotations

import pytest

from ddp_contract import labels
from ddp_operator import constants as c
from ddp_operator.failures import PodProblem, RankFailure
from ddp_operator.podsummary import summarize_pods
from podfixtures import JOB, pod, summary_of


def test_summary_counts_current_attempt_only() -> None:
    summary = summary_of(
        pod(0, "running"),
        pod(1, "running", ready=False),
        pod(2, "pending"),
        pod(3, "succeeded"),
        pod(4, "failed", exit_code=3),
        pod(5, "running", attempt=1),
        pod(6, "running", deleting=True),
    )
    assert (summary.pending, summary.running, summary.ready, summary.succeeded, summary.failed) == (1, 2, 1, 1, 1)
    assert summary.live_indices == {0, 1, 2, 3, 4}
    assert summary.taken_indices == {0, 1, 2, 3, 4, 5, 6}
    assert summary.active_pods == ("mnist-0", "mnist-1", "mnist-2")
    assert summary.finished_pods == ("mnist-3", "mnist-4")
    assert summary.stale_pods == ("mnist-5",)
    assert summary.job_name == JOB


def test_summary_knows_each_pod_by_uid_so_a_delete_cannot_hit_its_successor() -> None:
    summary = summary_of(pod(0, attempt=1), pod(1, "running", attempt=0), attempt=1)
    assert summary.stale_pods == ("mnist-1",)
    assert summary.uids == {"mnist-0": "uid-0-1", "mnist-1": "uid-1-0"}


@pytest.mark.parametrize(("code", "signal"), [(137, "SIGKILL"), (143, "SIGTERM"), (139, "SIGSEGV"), (134, "SIGABRT"),
                                            (1, None), (128, None), (255, None)])
def test_a_failure_names_the_signal_that_killed_the_rank(code: int, signal: str | None) -> None:
    failure = summary_of(pod(0), pod(1, "failed", exit_code=code)).failure
    assert failure is not None and failure.signal == signal
    assert (signal or "") in failure.describe()


def test_a_failure_keeps_only_the_last_lines_of_the_output() -> None:
    output = "\n".join(f"line {i}" for i in range(100))
    failure = summary_of(pod(1, "failed", exit_code=1, output=output, node="n1")).failure
    assert failure is not None and failure.node == "n1"
    assert failure.output == "\n".join(f"line {i}" for i in range(80, 100))
    huge = summary_of(pod(1, "failed", exit_code=1, output="x" * 10_000)).failure
    assert huge is not None and huge.output is not None and len(huge.output) == 2000 and huge.output.startswith("...")


def test_summary_failure_carries_pod_exit_code_and_reason() -> None:
    failure = summary_of(pod(0), pod(1, "failed", exit_code=137, reason="OOMKilled")).failure
    assert failure == RankFailure(1, "mnist-1", 137, "OOMKilled", False, "2025-01-02T03:00:00Z", attempt=0)
    assert failure.as_status() == {"rank": 1, "pod": "mnist-1", "node": None, "exitCode": 137, "signal": "SIGKILL",
                                   "oomKilled": True, "reason": "OOMKilled", "message": None, "kind": "Program",
                                   "attempt": 0, "step": None}
    assert "rank 1 (pod mnist-1) exited with code 137" in failure.describe()


def test_earliest_failure_is_reported_not_the_lowest_rank() -> None:
    summary = summary_of(
        pod(0, "failed", exit_code=1, finished_at="2025-01-02T03:02:00Z"),
        pod(1, "failed", exit_code=2, finished_at="2025-01-02T03:01:00Z"),
    )
    assert summary.failure is not None and summary.failure.pod_index == 1


@pytest.mark.parametrize(
    ("reason", "evicted"),
    [
        ("Evicted", True),
        ("NodeLost", True),
        ("Preempted", True),
        ("DeletionByTaintManager", True),
        ("OutOfnvidia.com/gpu", True),
        ("Something", False),
    ],
)
def test_evictions_are_recognised_by_pod_reason(reason: str, evicted: bool) -> None:
    failure = summary_of(pod(0, "evicted", reason=reason)).failure
    assert failure is not None and failure.evicted is evicted and failure.reason == reason
    assert failure.exit_code is None


def test_disruption_target_condition_marks_an_eviction() -> None:
    raw = pod(0, "failed", exit_code=143)
    raw["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    failure = summary_of(raw).failure
    assert failure is not None and failure.evicted and failure.exit_code == 143


def test_trainer_exit_decides_even_when_a_sidecar_keeps_the_pod_running() -> None:
    raw = pod(0, "running")
    raw["status"]["containerStatuses"] = [
        {"name": "logger", "state": {"running": {}}},
        {"name": labels.CONTAINER_NAME, "state": {"terminated": {"exitCode": 0}}},
    ]
    summary = summary_of(raw)
    assert summary.succeeded == 1 and summary.running == 0 and summary.finished_pods == ("mnist-0",)


NO_GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: not helpful for scheduling."


def test_why_pending_ranks_are_held_up_by_rank() -> None:
    summary = summary_of(
        pod(0, "pending", waiting="ImagePullBackOff", waiting_message='Back-off pulling image "trainer:typo"'),
        pod(1, "pending"),  # ContainerCreating: on its way, no problem
        pod(2, "pending", unschedulable=NO_GPU),
        pod(3, "pending", waiting="CreateContainerConfigError", waiting_message='secret "s3" not found'),
        pod(4, "pending", waiting="SomethingNew"),
    )
    assert summary.problems == (
        PodProblem(0, "ImagePullError", 'Back-off pulling image "trainer:typo"'),
        PodProblem(2, "Unschedulable", NO_GPU),
        PodProblem(3, "ContainerConfigError", 'secret "s3" not found'),
        PodProblem(4, "SomethingNew", "SomethingNew"),
    )


# What the kubelet (v1.34, containerd 2.4) said for a pull the registry refused without credentials.
NO_CREDENTIALS = ('Back-off pulling image "10.244.200.1:5000/ddp/trainer:1": ErrImagePull: failed to pull and unpack '
                  'image "10.244.200.1:5000/ddp/trainer:1": failed to resolve image: pull access denied, repository '
                  'does not exist or may require authorization: authorization failed: no basic auth credentials')


def test_a_failed_pull_names_the_pull_secrets_it_was_tried_with() -> None:
    with_secrets = pod(0, "pending", waiting="ImagePullBackOff", waiting_message=NO_CREDENTIALS)
    with_secrets["spec"] = {"imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}]}
    bad_name = pod(1, "pending", waiting="InvalidImageName", waiting_message='invalid image name "Trainer"')
    bad_name["spec"] = with_secrets["spec"]
    summary = summary_of(with_secrets, bad_name, pod(2, "pending", waiting="ErrImagePull", waiting_message="401"))
    assert summary.problems == (
        PodProblem(0, "ImagePullError", NO_CREDENTIALS + " (imagePullSecrets: regcred, mirror; the kubelet pulls "
                    "without any that does not exist, saying so in the pod's events)"),
        PodProblem(1, "ImagePullError", 'invalid image name "Trainer"'),  # never reached a registry
        PodProblem(2, "ImagePullError", "401"),  # no secrets: nothing to name
    )


def test_pods_without_rank_labels_are_stale() -> None:
    stray = {"metadata": {"name": "mnist-x", "labels": {labels.LABEL_JOB_NAME: JOB}}, "status": {"phase": "Running"}}
    summary = summary_of(stray)
    assert summary.stale_pods == ("mnist-x",) and summary.total == 0


LOST = {"gpu-2": "node gpu-2 NotReady since 2025-01-02T03:00:00Z (Ready Unknown: NodeStatusUnknown)"}


def test_a_rank_on_a_lost_node_is_a_node_lost_failure_naming_the_node() -> None:
    summary = summarize_pods([pod(0, node="gpu-1"), pod(1, node="gpu-2"), pod(2, "failed", exit_code=1, node="gpu-1")],
                             0, job_name=JOB, lost_nodes=LOST)
    failure = summary.failure
    assert failure is not None and (failure.pod_index, failure.node, failure.reason) == (1, "gpu-2", "NodeLost")
    assert failure.evicted and failure.exit_code is None, "an infrastructure failure, not the program's"
    assert failure.kind == c.KIND_INFRASTRUCTURE and failure.attempt == 0
    assert failure.describe() == f"rank 1 (pod mnist-1 on node gpu-2) was lost: NodeLost ({LOST['gpu-2']})"
    assert failure.as_status()["message"] == LOST["gpu-2"]
    assert summary.nodes == {"gpu-1", "gpu-2"}


def test_a_rank_taken_away_from_a_lost_node_is_still_node_lost() -> None:
    """The taint eviction controller deletes it: Terminating there for good, and lost all the same."""
    summary = summarize_pods([pod(0, node="gpu-1"), pod(1, node="gpu-2", deleting=True)], 0, job_name=JOB, lost_nodes=LOST)
    assert summary.failure is not None and summary.failure.reason == "NodeLost"
    assert summary.lost_pods == ("mnist-1",)


def test_pods_terminating_on_a_lost_node_are_to_be_forced_whatever_their_attempt() -> None:
    summary = summarize_pods([pod(0, attempt=0, node="gpu-2", deleting=True), pod(1, attempt=0, node="gpu-2"),
                              pod(2, attempt=0, node="gpu-1", deleting=True), pod(0, "pending", attempt=1)], 1,
                             job_name=JOB, lost_nodes=LOST)
    assert summary.lost_pods == ("mnist-0",), "only those being deleted, and only on the lost node"
    assert summary.failure is None, "an old attempt's pod is no failure of this one"


def test_a_finished_rank_on_a_lost_node_is_no_failure() -> None:
    summary = summarize_pods([pod(0, node="gpu-1"), pod(1, "succeeded", node="gpu-2")], 0, job_name=JOB, lost_nodes=LOST)
    assert summary.failure is None


def test_pending_ranks_bound_to_no_node_are_unscheduled() -> None:
    summary = summary_of(pod(0, node="gpu-1"), pod(1, "pending", unschedulable="0/4 nodes"),
                         pod(2, "pending", node="gpu-1"), pod(3, "pending", attempt=1))
    assert summary.unscheduled_indices == {1}


def test_new_problems_replace_what_was_said_of_the_same_rank() -> None:
    summary = summary_of(pod(0, "pending", unschedulable="0/4 nodes are available"), pod(1, "pending", waiting="ErrImagePull"))
    held = summary.with_problems([PodProblem(0, "GangTooLarge", "too big"), PodProblem(2, "NameInUse", "x")])
    assert held.problems == (PodProblem(0, "GangTooLarge", "too big"), PodProblem(1, "ImagePullError", "ErrImagePull"),
                             PodProblem(2, "NameInUse", "x"))
    assert summary.with_problems([]) is summary


def test_pods_of_several_ranks_are_named_by_their_ranks() -> None:
    from ddp_contract.failureline import format_line

    line = format_line(6, 12, 1, "USER_ERROR", False, "ValueError: x")
    failed = summarize_pods([pod(0), pod(1, "failed", exit_code=1, output=line)], 0, ranks_per_pod=4).failure
    assert failed is not None and failed.global_rank == 6 and failed.as_status()["rank"] == 6
    assert failed.describe().startswith("rank 6 (pod mnist-1)")
    killed = summarize_pods([pod(0), pod(1, "failed", exit_code=137)], 0, ranks_per_pod=4).failure
    assert killed is not None and killed.describe().startswith("ranks 4-7 (pod mnist-1)")
    held = summarize_pods([pod(0, "pending", unschedulable="0/4 nodes are available"), pod(1, "pending",
                           unschedulable="0/4 nodes are available")], 0, ranks_per_pod=4)
    assert held.held_up == (c.REASON_UNSCHEDULABLE, "pods 0-1 (Unschedulable): 0/4 nodes are available")


def test_a_root_image_under_run_as_non_root_is_said_with_what_to_do() -> None:
    said = 'container has runAsNonRoot and image will run as root (pod: "train-0_ns(uid)", container: trainer)'
    summary = summary_of(pod(0, "pending", waiting="CreateContainerConfigError", waiting_message=said))
    (problem,) = summary.problems
    assert problem.reason == c.REASON_IMAGE_RUNS_AS_ROOT and problem.reason in c.FAIL_AT_ONCE_REASONS
    assert problem.message.startswith("container has runAsNonRoot and image will run as root: rank pods run as")
    assert "train-0" not in problem.message and "runAsUser" in problem.message and "USER" in problem.message
