"""A Kubeflow PyTorchJob (kubeflow.org/v1) as a DDPJob: `kubectl ddp convert -f pytorchjob.yaml`.

The field-by-field mapping is the table in docs/bringing-code.md. What a DDPJob has no place for is left
out and said (`Conversion.notes`); what it cannot do without is an error (ConvertError) that names the
field. The DDPJob's pods get the same command and the same PET_* settings a PyTorchJob's get, so the
command runs unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddp_contract import api, labels

PYTORCHJOB_API = "kubeflow.org/v1"
PYTORCHJOB_KIND = "PyTorchJob"
CONTAINER = "pytorch"  # the training container of a PyTorchJob's replicas
PORT_NAME = "pytorchjob-port"
GPU = "nvidia.com/gpu"
# The container fields a DDPJob sets at its top; the rest stay on the template's trainer container.
TOP_LEVEL = ("name", "image", "command", "args", "resources", "env", "envFrom")
RESTART_POLICIES = {"OnFailure": "OnFailure", "ExitCode": "ExitCode", "Never": "Never", "Always": "OnFailure"}
RUN_POLICY_FIELDS = ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "suspend")
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # how a DDPJob names its Kueue queue (docs/operating.md)


class ConvertError(ValueError):
    """The manifest cannot become a DDPJob; the message names the field."""


@dataclass
class Conversion:
    job: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def from_pytorchjob(manifest: Mapping[str, Any]) -> Conversion:
    if manifest.get("kind") != PYTORCHJOB_KIND or manifest.get("apiVersion") != PYTORCHJOB_API:
        raise ConvertError(f"not a {PYTORCHJOB_KIND} ({PYTORCHJOB_API}): kind {manifest.get('kind')!r}, "
                           f"apiVersion {manifest.get('apiVersion')!r}")
    spec = manifest.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs") or {}
    unknown = sorted(set(replicas) - {"Master", "Worker"})
    if unknown:
        raise ConvertError(f"spec.pytorchReplicaSpecs: {', '.join(unknown)} replicas have no DDPJob counterpart")
    if not replicas:
        raise ConvertError("spec.pytorchReplicaSpecs: neither Master nor Worker replicas")
    notes: list[str] = []
    pods = sum(int((replicas[kind] or {}).get("replicas", 1)) for kind in replicas)
    chosen = "Worker" if "Worker" in replicas else "Master"
    template = copy.deepcopy((replicas[chosen] or {}).get("template") or {})
    if "Master" in replicas and "Worker" in replicas:
        _compare_templates(replicas, notes)
    pod = template.get("spec") or {}
    trainer = _trainer_container(pod, chosen)
    ranks_per_pod = _ranks_per_pod(spec, trainer, notes)
    out: dict[str, Any] = {"worldSize": pods * ranks_per_pod, "image": trainer.get("image")}
    if not trainer.get("command"):
        raise ConvertError(f"spec.pytorchReplicaSpecs.{chosen}: container {CONTAINER!r} has no command; the image's "
                           "ENTRYPOINT ran, and a DDPJob needs spec.command: write it out")
    out["command"] = list(trainer["command"])
    if trainer.get("args"):
        out["args"] = list(trainer["args"])
    if ranks_per_pod > 1:
        out["ranksPerPod"] = ranks_per_pod
    out.update(_resources(trainer, ranks_per_pod, notes))
    for key in ("env", "envFrom"):
        if trainer.get(key):
            out[key] = copy.deepcopy(trainer[key])
    port = _master_port(trainer)
    if port is not None:
        out["masterPort"] = port
    out.update(_restart_policy((replicas[chosen] or {}).get("restartPolicy"), notes))
    out.update(_run_policy(spec.get("runPolicy") or {}, pod, notes))
    out.update(_elastic(spec.get("elasticPolicy"), ranks_per_pod, out["worldSize"], notes))
    rest = _template(template, trainer)
    if rest:
        out["template"] = rest
    meta = manifest.get("metadata") or {}
    metadata: dict[str, Any] = {"name": meta.get("name")}
    for key in ("namespace", "labels"):
        if meta.get(key):
            metadata[key] = copy.deepcopy(meta[key])
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    if annotations:
        metadata["annotations"] = annotations
    return Conversion({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata, "spec": out}, notes)


def _trainer_container(pod: Mapping[str, Any], kind: str) -> dict[str, Any]:
    containers = pod.get("containers") or []
    found = next((c for c in containers if c.get("name") == CONTAINER), None)
    if found is None:
        raise ConvertError(f"spec.pytorchReplicaSpecs.{kind}.template.spec.containers: no container named {CONTAINER!r}")
    return copy.deepcopy(dict(found))


def _compare_templates(replicas: Mapping[str, Any], notes: list[str]) -> None:
    master, worker = (_trainer_container(((replicas[k] or {}).get("template") or {}).get("spec") or {}, k)
                      for k in ("Master", "Worker"))
    differ = [key for key in ("image", "command", "args", "resources", "env") if master.get(key) != worker.get(key)]
    if differ:
        notes.append(f"the Master's and the Workers' {CONTAINER!r} containers differ in {', '.join(differ)}: every "
                     "pod of the DDPJob runs the Workers' (rank 0 is pod 0, as the Master was)")


def _ranks_per_pod(spec: Mapping[str, Any], trainer: Mapping[str, Any], notes: list[str]) -> int:
    value = spec.get("nprocPerNode", (spec.get("elasticPolicy") or {}).get("nProcPerNode"))
    gpus = _gpus(trainer)
    if value is None:
        return 1
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return max(1, int(value))
    if value in ("auto", "gpu"):
        return max(1, gpus)
    if value == "cpu":
        notes.append("nprocPerNode 'cpu' (one process per CPU core) has no fixed count: ranksPerPod is 1; set it "
                     "to the cores each pod gets")
        return 1
    raise ConvertError(f"spec.nprocPerNode: {value!r} is not a number, auto, gpu or cpu")


def _gpus(trainer: Mapping[str, Any]) -> int:
    resources = trainer.get("resources") or {}
    value = (resources.get("limits") or {}).get(GPU, (resources.get("requests") or {}).get(GPU, 0))
    return int(value)


def _resources(trainer: Mapping[str, Any], ranks_per_pod: int, notes: list[str]) -> dict[str, Any]:
    resources = copy.deepcopy(trainer.get("resources") or {})
    gpus = _gpus(trainer)
    for part in ("limits", "requests"):
        if part in resources:
            resources[part].pop(GPU, None)
            if not resources[part]:
                del resources[part]
    if gpus % ranks_per_pod:
        notes.append(f"{gpus} GPUs a pod do not divide among {ranks_per_pod} ranks: gpusPerRank is {gpus // ranks_per_pod}")
    out: dict[str, Any] = {"gpusPerRank": gpus // ranks_per_pod}
    if resources:
        out["resources"] = resources
    return out


def _master_port(trainer: Mapping[str, Any]) -> int | None:
    port = next((p for p in trainer.get("ports") or [] if p.get("name") == PORT_NAME), None)
    return int(port["containerPort"]) if port and port.get("containerPort") else None


def _restart_policy(policy: str | None, notes: list[str]) -> dict[str, Any]:
    if policy is None:
        return {}
    if policy not in RESTART_POLICIES:
        raise ConvertError(f"restartPolicy {policy!r} is none of {', '.join(RESTART_POLICIES)}")
    if policy == "Always":
        notes.append("restartPolicy Always restarts a container in its pod, alone: a DDPJob restarts the gang, "
                     "restartPolicy OnFailure (restartStrategy InPlace keeps the pods)")
    return {"restartPolicy": RESTART_POLICIES[policy]}


def _run_policy(run: Mapping[str, Any], pod: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    out = {key: run[key] for key in RUN_POLICY_FIELDS if run.get(key) is not None}
    scheduling = run.get("schedulingPolicy") or {}
    if scheduling.get("priorityClass"):
        pod.setdefault("priorityClassName", scheduling["priorityClass"])
    if run.get("cleanPodPolicy") not in (None, "None"):
        notes.append(f"runPolicy.cleanPodPolicy {run['cleanPodPolicy']}: a DDPJob deletes the pods that still run "
                     "when it ends and keeps the finished ones until ttlSecondsAfterFinished")
    if scheduling.get("minAvailable") is not None or scheduling.get("queue"):
        notes.append("runPolicy.schedulingPolicy minAvailable and queue (Volcano's) are not carried over: a DDPJob's "
                     f"gang is created whole or not at all; for a queue, label the job {KUEUE_QUEUE_LABEL}: <queue>")
    return out


def _elastic(elastic: Mapping[str, Any] | None, ranks_per_pod: int, world: int, notes: list[str]) -> dict[str, Any]:
    if not elastic:
        return {}
    out: dict[str, Any] = {}
    high = elastic.get("maxReplicas")
    low = elastic.get("minReplicas")
    if high is not None:
        out["worldSize"] = int(high) * ranks_per_pod
    if low is not None and int(low) * ranks_per_pod < out.get("worldSize", world):
        out["minWorldSize"] = int(low) * ranks_per_pod
        out["restartStrategy"] = api.RESTART_IN_PLACE
    dropped = sorted(set(elastic) - {"minReplicas", "maxReplicas", "nProcPerNode"})
    if dropped:
        notes.append(f"elasticPolicy {', '.join(dropped)}: not needed, a DDPJob's pods rendezvous at rank 0's pod")
    return out


def _template(template: Mapping[str, Any], trainer: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template less what the DDPJob sets itself: its trainer container's other fields."""
    pod = {k: v for k, v in copy.deepcopy(dict(template.get("spec") or {})).items() if k != "restartPolicy"}
    rest = {k: v for k, v in trainer.items() if k not in TOP_LEVEL}
    ports = [p for p in rest.pop("ports", []) or [] if p.get("name") != PORT_NAME]
    if ports:
        rest["ports"] = ports
    sidecars = [c for c in pod.get("containers") or [] if c.get("name") != CONTAINER]
    containers = ([{"name": labels.CONTAINER_NAME, **rest}] if rest else []) + sidecars
    if containers:
        pod["containers"] = containers
    else:
        pod.pop("containers", None)
    out: dict[str, Any] = {}
    meta = {k: v for k, v in (template.get("metadata") or {}).items() if k in ("labels", "annotations") and v}
    if meta:
        out["metadata"] = meta
    if pod:
        out["spec"] = pod
    return out
