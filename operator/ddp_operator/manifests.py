"""Pure builders for a DDPJob's children: one headless Service and one Pod per rank.

ownerReferences are added by the caller (kubeapi.adopt).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ddp_contract import api, commands, envnames, labels, s3options
from ddp_contract.exitcodes import ExitCode
from ddp_contract.failureline import format_line
from ddp_contract.jobspec import JobSpec
from ddp_operator import constants as c
from ddp_operator.dataworkers import (
    DATA_WORKER_COMMAND,
    TOKEN_KEY,
    data_worker_name,
    rank_data_env,
    token_env,
    token_secret_name,
)
from ddp_operator.kubelet import NODE_LOST_TAINTS
from ddp_operator.nodes import Taint, tolerates
from ddp_operator.podsecurity import with_restricted_defaults


def service_name(job_name: str) -> str:
    return job_name


def pod_name(job_name: str, index: int) -> str:
    return f"{job_name}-{index}"


def master_addr(job_name: str, namespace: str) -> str:
    """Rank 0's DNS name through the headless Service: '<job>-0.<job>.<ns>.svc'.

    It ends in '.svc', which the pod's resolv.conf search list completes with whatever the
    cluster's domain is, so the operator need not know it.
    """
    return f"{pod_name(job_name, 0)}.{service_name(job_name)}.{namespace}.svc"


def job_labels(job_name: str) -> dict[str, str]:
    """Labels on every child; the Service selects pods by these."""
    return {labels.LABEL_JOB_NAME: job_name, labels.LABEL_MANAGED_BY: labels.MANAGED_BY}


def pod_selector(job_name: str) -> str:
    """Label selector (string form) for listing all of a job's pods, all attempts."""
    return f"{labels.LABEL_JOB_NAME}={job_name}"


def build_service(job: Mapping[str, Any], spec: JobSpec) -> dict[str, Any]:
    """Headless Service giving every rank a stable DNS name, published before pods are ready."""
    meta = job["metadata"]
    port = spec.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": job_labels(meta["name"]),
        },
        "spec": {
            "clusterIP": "None",
            # Ranks resolve MASTER_ADDR while rank 0 is still starting; without this the name
            # does not exist until rank 0 is Ready.
            "publishNotReadyAddresses": True,
            "selector": {labels.LABEL_JOB_NAME: meta["name"]},
            "ports": [{"name": "master", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def build_pod(job: Mapping[str, Any], spec: JobSpec, index: int, attempt: int) -> dict[str, Any]:
    """Pod `index` of the gang (the rank's own when ranksPerPod is 1, else holding spec.pod_ranks(index))
    for one gang attempt; the pod template's fields are kept and merged."""
    if not 0 <= index < spec.all_pods:
        raise ValueError(f"pod index {index} is outside 0..{spec.all_pods - 1}")
    meta = job["metadata"]
    name = meta["name"]
    pod_spec = copy.deepcopy(dict(spec.pod_spec))
    sidecars = [x for x in pod_spec.get("containers") or [] if x.get("name") != labels.CONTAINER_NAME]
    env = rank_env(job, spec, index, attempt)
    pod_spec.update(
        hostname=pod_name(name, index),
        subdomain=service_name(name),
        # Restarts are the gang's (its pods recreated, or its ranks restarted in place by the
        # runtime): a container the kubelet restarted alone could not rejoin the gang.
        restartPolicy="Never",
        containers=[_trainer_container(spec, template_trainer(spec), env=env, index=index, meta=meta), *sidecars],
    )
    pod_spec["tolerations"] = [*(pod_spec.get("tolerations") or []), *node_lost_tolerations(spec)]
    _job_pod_defaults(pod_spec, spec, name)
    if spec.shm_size:
        pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), shm_volume(spec.shm_size)]
    add_s3_ca_bundle(pod_spec, pod_spec["containers"][0], spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(name, index),
            "namespace": meta["namespace"],
            "labels": {
                **spec.template_labels,
                **job_labels(name),
                labels.LABEL_RANK: str(index),
                labels.LABEL_ATTEMPT: str(attempt),
            },
            "annotations": {**spec.template_annotations, labels.ANNOTATION_WORLD_SIZE: str(spec.world_size)},
        },
        "spec": with_restricted_defaults(pod_spec),
    }


def node_lost_tolerations(spec: JobSpec) -> list[dict[str, Any]]:
    """NoExecute tolerations of a NotReady or unreachable node for spec.nodeLostGraceSeconds, so the
    taint eviction controller takes a lost node's ranks away after the job's grace rather than the
    cluster's default 300 s; none for a taint the template already tolerates (its own choice stands)."""
    own = spec.pod_spec.get("tolerations") or []
    return [{"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": spec.node_lost_grace_seconds}
            for key in NODE_LOST_TAINTS if not tolerates(own, Taint(key, effect="NoExecute"))]


def _job_pod_defaults(pod_spec: dict[str, Any], spec: JobSpec, job_name: str) -> None:
    """What every pod of the job gets, a rank's or a data worker's: the job's ServiceAccount unless the
    template names one, no Service links, the pull Secrets."""
    pod_spec.setdefault("serviceAccountName", progress_service_account(job_name))
    # Service links add env vars for every Service in the namespace (a Service named "master"
    # injects MASTER_PORT=tcp://...); the pods need none of them.
    pod_spec.setdefault("enableServiceLinks", False)
    pull_secrets = image_pull_secrets(spec)
    if pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets


def template_trainer(spec: JobSpec) -> Mapping[str, Any]:
    """The template's container named 'trainer' (merged into the generated one), or {}."""
    return next((x for x in spec.pod_spec.get("containers") or [] if x.get("name") == labels.CONTAINER_NAME), {})


def user_env(spec: JobSpec) -> list[dict[str, Any]]:
    """spec.env, copied."""
    return [dict(item) for item in copy.deepcopy(list(spec.env))]


def _add_env_from(container: dict[str, Any], spec: JobSpec) -> None:
    """spec.envFrom, then the template container's own."""
    env_from = [*copy.deepcopy(list(spec.env_from)), *(container.get("envFrom") or [])]
    if env_from:
        container["envFrom"] = env_from


def image_pull_secrets(spec: JobSpec) -> list[dict[str, Any]]:
    """The pod's imagePullSecrets: spec.imagePullSecrets, then the template's own that name another
    Secret (the kubelet tries each that matches the image's registry)."""
    secrets: list[dict[str, Any]] = [{"name": name} for name in spec.image_pull_secrets]
    for item in spec.pod_spec.get("imagePullSecrets") or []:
        if not any(item.get("name") == kept["name"] for kept in secrets):
            secrets.append(copy.deepcopy(dict(item)))
    return secrets


def progress_service_account(job_name: str) -> str:
    """The per-job identity ranks run as, unless the template names its own."""
    return f"{job_name}-trainer"


def build_progress_access(job: Mapping[str, Any], spec: JobSpec) -> list[dict[str, Any]]:
    """What lets rank 0 write progress into its own job's status and every rank read its job, nothing else.

    A Role limited to this one DDPJob (resourceNames), bound to the ranks' ServiceAccount:
    the per-job one (created here) or the one the template names.
    """
    meta = job["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    account = spec.pod_spec.get("serviceAccountName")
    objects: list[dict[str, Any]] = []
    if not account:
        account = progress_service_account(name)
        objects.append({"apiVersion": "v1", "kind": "ServiceAccount",
                        "metadata": {"name": account, "namespace": namespace, "labels": job_labels(name)}})
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": f"{name}-progress", "namespace": namespace, "labels": job_labels(name)},
        "rules": [{"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/status"], "resourceNames": [name],
                   "verbs": ["get", "patch"]},
                  # restartStrategy InPlace: each pod's runtime watches its job for the next attempt.
                  {"apiGroups": [api.GROUP], "resources": [api.PLURAL], "resourceNames": [name],
                   "verbs": ["get", "list", "watch"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{name}-progress", "namespace": namespace, "labels": job_labels(name)},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-progress"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    return [*objects, role, binding]


def rank_env(job: Mapping[str, Any], spec: JobSpec, index: int, attempt: int) -> list[dict[str, Any]]:
    """Env of the trainer container: operator-injected first, then S3, then the user's spec.env.

    WORLD_SIZE and DDP_TARGET_WORLD_SIZE are spec.worldSize; an elastic job's runtime gives the rank
    processes of each attempt its gang's size, and ranks by the pod's place in status.members.
    One rank per pod: RANK, LOCAL_RANK 0, LOCAL_WORLD_SIZE 1, NODE_RANK = RANK. Several (ranksPerPod):
    LOCAL_WORLD_SIZE and NODE_RANK/GROUP_RANK = the pod's index, no RANK or LOCAL_RANK: whoever starts
    the local ranks (the runtime, torchrun) gives each its own.
    """
    meta = job["metadata"]
    one = spec.ranks_per_pod == 1
    values = {
        envnames.MASTER_ADDR: master_addr(meta["name"], meta["namespace"]),
        envnames.MASTER_PORT: str(spec.master_port),
        **({envnames.RANK: str(index), envnames.LOCAL_RANK: "0"} if one else {envnames.GROUP_RANK: str(index)}),
        envnames.WORLD_SIZE: str(spec.world_size),
        envnames.LOCAL_WORLD_SIZE: str(spec.ranks_per_pod),
        envnames.NODE_RANK: str(index),
        envnames.JOB_NAME: meta["name"],
        envnames.JOB_NAMESPACE: meta["namespace"],
        envnames.JOB_UID: meta.get("uid", ""),
        envnames.ATTEMPT: str(attempt),
        envnames.BACKEND: spec.effective_backend,
        envnames.TARGET_WORLD_SIZE: str(spec.world_size),
        **pet_env(spec, index, master_addr(meta["name"], meta["namespace"])),
    }
    if spec.entrypoint:
        values[envnames.ENTRYPOINT] = spec.entrypoint
    if spec.in_place:
        values[envnames.RESTART_STRATEGY] = spec.restart_strategy
    if spec.launcher == api.LAUNCHER_COMMAND:
        values[envnames.LAUNCHER] = spec.launcher
    if spec.hang_timeout_seconds is not None:
        values[envnames.HANG_TIMEOUT_SECONDS] = str(spec.hang_timeout_seconds)
    if not spec.metrics_from_output:
        values[envnames.METRICS_FROM_OUTPUT] = "false"
    if spec.keep_folders:
        values[envnames.KEEP_FOLDERS] = json.dumps(list(spec.keep_folders))
    checkpoint = ((job.get("status") or {}).get("lastCheckpoint") or {}).get("uri")
    if checkpoint:
        values[envnames.RESUME_FROM] = str(checkpoint)
    env = [{"name": key, "value": value} for key, value in values.items()]
    if spec.in_place:  # a pod hands its memory snapshots to the peers that prove the job's token
        env += [token_env(meta["name"], envnames.JOB_TOKEN),
                {"name": envnames.POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    return [*env, *rank_data_env(meta["name"], meta["namespace"], spec), *s3_env(spec), *user_env(spec)]


def pet_env(spec: JobSpec, index: int, master: str) -> dict[str, str]:
    """torchrun's settings for pod `index`, as Kubeflow's operators set them: a launcher the command starts
    (torchrun, torch.distributed.launch, accelerate launch) forms the job's world from them."""
    return {envnames.PET_NNODES: str(spec.pods), envnames.PET_NPROC_PER_NODE: str(spec.ranks_per_pod),
            envnames.PET_NODE_RANK: str(index), envnames.PET_MASTER_ADDR: master,
            envnames.PET_MASTER_PORT: str(spec.master_port)}


def s3_env(spec: JobSpec) -> list[dict[str, Any]]:
    """S3 settings as env; credentials only as secretKeyRef, never as values."""
    s3 = spec.s3
    if s3 is None:
        return []
    plain = {
        envnames.S3_ENDPOINT: s3.endpoint,
        envnames.S3_REGION: s3.region,
        envnames.DATASET_URI: s3.dataset,
        envnames.RESULTS_URI: s3.results,
    }
    plain.update(s3.settings)
    env: list[dict[str, Any]] = [{"name": key, "value": value} for key, value in plain.items() if value]
    if s3.credentials_secret:
        for env_name, secret_key in (
            (envnames.AWS_ACCESS_KEY_ID, envnames.AWS_ACCESS_KEY_ID),
            (envnames.AWS_SECRET_ACCESS_KEY, envnames.AWS_SECRET_ACCESS_KEY),
        ):
            ref = {"name": s3.credentials_secret, "key": secret_key}
            env.append({"name": env_name, "valueFrom": {"secretKeyRef": ref}})
    return env


def add_s3_ca_bundle(pod_spec: dict[str, Any], container: dict[str, Any], spec: JobSpec) -> None:
    """spec.s3.caBundle's ConfigMap key, mounted read-only where DDP_S3_CA_BUNDLE says."""
    bundle = spec.s3.ca_bundle if spec.s3 is not None else None
    if bundle is None:
        return
    volume = {"name": c.S3_CA_VOLUME, "configMap": {"name": bundle.config_map,
                                                    "items": [{"key": bundle.key, "path": s3options.CA_BUNDLE_FILE}]}}
    pod_spec["volumes"] = [*(pod_spec.get("volumes") or []), volume]
    mount = {"name": c.S3_CA_VOLUME, "mountPath": s3options.CA_BUNDLE_DIR, "readOnly": True}
    container["volumeMounts"] = [*(container.get("volumeMounts") or []), mount]


def shm_volume(size: str) -> dict[str, Any]:
    return {"name": c.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def trainer_resources(spec: JobSpec) -> dict[str, Any]:
    """spec.resources (the pod's) with nvidia.com/gpu limits (and requests, if any are given) =
    gpusPerRank x ranksPerPod."""
    resources = copy.deepcopy(dict(spec.resources))
    if spec.gpus_per_pod > 0:
        resources["limits"] = {**(resources.get("limits") or {}), c.GPU_RESOURCE: spec.gpus_per_pod}
        if resources.get("requests"):
            resources["requests"] = {**resources["requests"], c.GPU_RESOURCE: spec.gpus_per_pod}
    return resources


def trainer_command(spec: JobSpec) -> list[str]:
    """The trainer container's command: the runtime for an entrypoint. A command runs under the trainer
    runtime where the image has it (trainerRuntime Auto: a shell line looks for the runtime's command),
    as it is otherwise, or always with trainerRuntime Off; a program that is one rank runs under
    `torchrun --no-python` then when the pod holds several (torchrun reads the pod's PET_* settings), a
    launcher never does, nor a command that starts them itself (spec.launcher Command). The container's
    args (spec.args) follow the command in each case."""
    if not spec.command:
        return list(c.TRAINER_COMMAND)
    kind = commands.command_kind(spec.command)
    one_process = spec.ranks_per_pod == 1 or spec.launcher == api.LAUNCHER_COMMAND
    prefix = TORCHRUN_PREFIX if kind == commands.PROGRAM and not one_process else ()
    if kind == commands.RUNTIME or spec.trainer_runtime == api.TRAINER_RUNTIME_OFF:
        return [*prefix, *spec.command]
    return ["/bin/sh", "-c", runtime_shim(prefix, runtime_needed_by(spec)), os.path.basename(commands.RUNTIME_BIN),
            *spec.command]


def runtime_needed_by(spec: JobSpec) -> str | None:
    """What of the spec only works under the trainer runtime (None: nothing)."""
    if spec.in_place:
        return "restartStrategy InPlace"
    return "spec.keepFolders" if spec.keep_folders else None


TORCHRUN_PREFIX: tuple[str, ...] = ("torchrun", "--no-python")


def runtime_shim(prefix: Sequence[str], needed_by: str | None) -> str:
    """The shell line a command job's container runs (its arguments: the command and spec.args): the
    command under the runtime where the image has it; else as it is, after `prefix`, or, for a job with
    something only the runtime does (`needed_by`: InPlace restarts, kept folders), a failure that says so."""
    supervised = f'if [ -x {commands.RUNTIME_BIN} ]; then exec {commands.RUNTIME_BIN} exec -- "$@"; fi'
    if needed_by is None:
        return f'{supervised}\nexec {shlex.join(prefix) + " " if prefix else ""}"$@"'
    instead = ", or use restartStrategy Recreate" if needed_by.startswith("restartStrategy") else ""
    line = format_line(None, None, int(ExitCode.CONFIG_ERROR), ExitCode.CONFIG_ERROR.name, False,
                       f"{needed_by} needs the trainer runtime ({commands.RUNTIME_BIN}), which the "
                       f"image does not have: build it FROM the trainer image{instead}")
    return f"{supervised}\necho {shlex.quote(line)} >&2\nexit {int(ExitCode.CONFIG_ERROR)}"


# Fields of the job's pod template a data worker does not take: where a rank runs (GPU nodes) and what
# else runs beside it there. A data worker's own placement comes from spec.dataWorkers.template.
RANK_ONLY_POD_FIELDS = frozenset({"containers", "initContainers", "nodeSelector", "affinity", "tolerations",
                                  "nodeName", "topologySpreadConstraints", "schedulingGates", "resourceClaims",
                                  "runtimeClassName", "schedulerName"})


def build_token_secret(job: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The job's data token (made once, by the caller), which its ranks and data workers prove to each
    other on every data connection; readable by whoever may read Secrets in the namespace."""
    meta = job["metadata"]
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": token_secret_name(meta["name"]), "namespace": meta["namespace"],
                         "labels": job_labels(meta["name"])},
            "stringData": {TOKEN_KEY: token}}


def build_data_worker_pod(job: Mapping[str, Any], spec: JobSpec, index: int) -> dict[str, Any]:
    """Data worker `index`: the job's image, code (the template's volumes and the trainer's mounts), S3
    settings and env, running the data worker; spec.dataWorkers' resources, and its template's pod
    fields (a CPU node pool's nodeSelector, tolerations, ...) over the job's. Restarted in place by its
    kubelet when it crashes; reachable as '<job>-data-<i>.<job>' through the job's headless Service."""
    workers = spec.data_workers
    if workers is None or not 0 <= index < workers.replicas:
        raise ValueError(f"data worker {index} is outside spec.dataWorkers.replicas")
    meta = job["metadata"]
    name = meta["name"]
    pod_spec = {key: copy.deepcopy(value) for key, value in spec.pod_spec.items() if key not in RANK_ONLY_POD_FIELDS}
    pod_spec.update(copy.deepcopy(dict(workers.pod_spec)))
    container = copy.deepcopy(dict(template_trainer(spec)))
    for probe in ("livenessProbe", "readinessProbe", "startupProbe", "ports"):
        container.pop(probe, None)
    env = [{"name": envnames.JOB_NAME, "value": name}, {"name": envnames.JOB_NAMESPACE, "value": meta["namespace"]},
           {"name": envnames.POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": envnames.DATA_WORKER_PORT, "value": str(envnames.DEFAULT_DATA_WORKER_PORT)},
           token_env(name), *s3_env(spec), *user_env(spec)]
    container.update(
        name=labels.DATA_WORKER_CONTAINER_NAME,
        image=spec.image,
        command=list(DATA_WORKER_COMMAND),
        env=[*env, *(container.get("env") or [])],
        ports=[{"name": "data", "containerPort": envnames.DEFAULT_DATA_WORKER_PORT, "protocol": "TCP"}],
    )
    container.pop("args", None)
    _add_env_from(container, spec)
    if workers.resources:
        container["resources"] = copy.deepcopy(dict(workers.resources))
    pod_spec.update(hostname=data_worker_name(name, index), subdomain=service_name(name), restartPolicy="Always",
                    containers=[container])
    add_s3_ca_bundle(pod_spec, container, spec)
    pod_spec.setdefault("automountServiceAccountToken", False)  # it calls no API
    _job_pod_defaults(pod_spec, spec, name)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": data_worker_name(name, index),
            "namespace": meta["namespace"],
            "labels": {**workers.template_labels, **job_labels(name), labels.LABEL_DATA_WORKER: str(index)},
            "annotations": dict(workers.template_annotations),
        },
        "spec": with_restricted_defaults(pod_spec),
    }


def _trainer_container(spec: JobSpec, template: Mapping[str, Any], *, env: list[dict[str, Any]],
                       index: int, meta: Mapping[str, Any]) -> dict[str, Any]:
    container = copy.deepcopy(dict(template))
    container.update(
        name=labels.CONTAINER_NAME,
        image=spec.image,
        command=trainer_command(spec),
        env=[*env, *(container.get("env") or [])],
    )
    if spec.args:
        container["args"] = list(spec.args)
    # A failed rank's last lines reach the job's status: the runtime's own summary if it wrote one
    # to /dev/termination-log, else the end of the container's log.
    container.setdefault("terminationMessagePolicy", "FallbackToLogsOnError")
    _add_env_from(container, spec)
    resources = trainer_resources(spec)
    if resources:
        container["resources"] = resources
    if spec.shm_size:
        mount = {"name": c.SHM_VOLUME, "mountPath": c.SHM_PATH}
        container["volumeMounts"] = [*(container.get("volumeMounts") or []), mount]
    return container
