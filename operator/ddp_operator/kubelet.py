"""What the kubelet and the node lifecycle controller say of a pod and a node, by what a user acts on:
a trainer container's waiting reasons, the reasons a pod was taken away rather than failed, and the
taints of a node that stopped answering.
"""

from __future__ import annotations

from typing import Final

# The trainer container's waiting reasons, as the kubelet gives them, by the cause a user acts on.
WAITING_REASONS: Final = {
    "ErrImagePull": "ImagePullError",
    "ImagePullBackOff": "ImagePullError",
    "InvalidImageName": "ImagePullError",
    "ErrImageNeverPull": "ImagePullError",
    "CreateContainerConfigError": "ContainerConfigError",  # a missing Secret, ConfigMap or key
    "CreateContainerError": "ContainerConfigError",
    "RunContainerError": "ContainerConfigError",
    "CrashLoopBackOff": "CrashLoop",
}
# Waiting reasons of a pull that reached the registry: the pod's imagePullSecrets are worth naming.
PULL_FAILED_REASONS: Final = frozenset({"ErrImagePull", "ImagePullBackOff"})
# Waiting that is just the way to Running.
WAITING_NORMALLY: Final = frozenset({"ContainerCreating", "PodInitializing"})
# pod.status.reason values (and DisruptionTarget reasons) that mean the node or the
# scheduler took the pod away, not the training code.
EVICTION_REASONS: Final = frozenset(
    {
        "Evicted",
        "NodeLost",
        "Preempted",
        "Preempting",
        "DeletionByTaintManager",
        "DeletionByPodGC",
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "TerminationByKubelet",
        "NodeShutdown",
        "Shutdown",
        "Terminated",
        "UnexpectedAdmissionError",
    }
)
# kubelet admission rejections look like "OutOfcpu", "OutOfnvidia.com/gpu".
EVICTION_REASON_PREFIX: Final = "OutOf"
# The NoExecute taints the node lifecycle controller puts on a node that is NotReady (Ready False)
# or unreachable (Ready Unknown); rank pods tolerate them for spec.nodeLostGraceSeconds.
TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
NODE_LOST_TAINTS: Final = (TAINT_NOT_READY, TAINT_UNREACHABLE)
