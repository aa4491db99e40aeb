"""`submit(...)`: create a DDPJob (and the ConfigMap carrying a local script) and return its handle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ddp_contract import api, kubeclient

from .job import Job
from .jobspec import (
    S3,
    build_job,
    is_script,
    job_name_for,
    load_job,
    place_job,
    script_configmap,
    script_configmap_name,
    script_of,
)
from .store import S3Access

DEFAULT_NAMESPACE = "default"


def default_namespace(kubeconfig: str | None = None) -> str:
    """The kubeconfig's current context's namespace, else `default`."""
    from kubernetes import config

    try:
        _, current = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, FileNotFoundError, TypeError):
        return DEFAULT_NAMESPACE
    return str((current or {}).get("context", {}).get("namespace") or DEFAULT_NAMESPACE)


def attach(name: str, namespace: str | None = None, kubeconfig: str | None = None, api_client: Any = None,
           s3_access: S3Access | None = None, results_uri: str | None = None) -> Job:
    """A handle on a DDPJob; `results_uri` (its spec.s3.results) reads the logs, results and
    metrics of one already deleted."""
    return Job(name, namespace or default_namespace(kubeconfig), api_client or kubeclient.api_client(kubeconfig),
               s3_access, results_uri)


def submit(
    target: str | Path | Mapping[str, Any],
    *,
    image: str | None = None,
    world_size: int = 1,
    gpus: int = 1,
    s3: S3 | None = None,
    env: Mapping[str, str] | Sequence[Mapping[str, Any]] | None = None,
    args: Sequence[str] = (),
    files: Sequence[str | Path] = (),
    name: str | None = None,
    namespace: str | None = None,
    spec: Mapping[str, Any] | None = None,
    kubeconfig: str | None = None,
    api_client: Any = None,
    s3_access: S3Access | None = None,
) -> Job:
    """Run `target` as a DDPJob and return its handle.

    `target`: `module:function` (in the image), a local script or `script.py:function` (sent to
    every rank in a ConfigMap with `files`, your modules it imports, beside it: no image to build;
    the function may take the RankContext), or a whole DDPJob (a dict, YAML text or a .yaml path; `name`, `namespace`
    and `spec` then override its own, the other arguments are ignored, and without `namespace` it
    goes in its own metadata.namespace, else the kubeconfig context's). `spec` adds or overrides
    spec fields (template, resources, backoffLimit, ...).
    """
    whole = isinstance(target, Mapping) or str(target).endswith((".yaml", ".yml")) or "\n" in str(target)
    loaded = load_job(target if isinstance(target, Mapping) else str(target)) if whole else None
    own_namespace = (loaded or {}).get("metadata", {}).get("namespace")
    job = Job("", namespace or own_namespace or default_namespace(kubeconfig),
              api_client or kubeclient.api_client(kubeconfig), s3_access)
    script: Path | None = None
    extra_files = [Path(f) for f in files]
    if loaded is not None:
        body = place_job(loaded, name=name, namespace=job.namespace, spec=spec)
    else:
        if image is None:
            raise ValueError("submit needs image= (the trainer image the ranks run) for a script or module:function")
        text = str(target)
        if is_script(text):
            script = Path(script_of(text))
            for path in (script, *extra_files):
                if not path.is_file():
                    raise FileNotFoundError(f"the file {path} does not exist")
        elif extra_files:
            raise ValueError("files= go beside a local script; module:function comes from the image")
        body = build_job(text, name=name or job_name_for(text), image=image, world_size=world_size, gpus=gpus,
                         s3=s3, env=env, args=args, spec=spec)
    job.name = body["metadata"]["name"]
    if _exists(job):
        raise ValueError(f"{api.KIND} {job.namespace}/{job.name} already exists: delete it (job.delete(), "
                         f"kubectl delete {api.SINGULAR} {job.name}) or submit with another name=")
    if script is not None:
        _create_script_configmap(job, script, extra_files)
    created = job.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, job.namespace, api.PLURAL, body)
    if script is not None:
        _owned_by(job, created)
    return job


def _exists(job: Job) -> bool:
    try:
        job.get()
    except LookupError:
        return False
    return True


def _create_script_configmap(job: Job, script: Path, files: Sequence[Path]) -> None:
    from kubernetes.client.rest import ApiException

    configmap = script_configmap(job.name, script, files)
    try:
        job.core.create_namespaced_config_map(job.namespace, configmap)
    except ApiException as error:
        if error.status != 409:
            raise
        job.core.replace_namespaced_config_map(configmap["metadata"]["name"], job.namespace, configmap)


def _owned_by(job: Job, created: Mapping[str, Any]) -> None:
    """The script's ConfigMap goes when the job is deleted."""
    meta = created["metadata"]
    owner = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": meta["name"], "uid": meta["uid"],
             "blockOwnerDeletion": False}
    patch = {"metadata": {"ownerReferences": [owner]}}
    job.core.patch_namespaced_config_map(script_configmap_name(job.name), job.namespace, patch)
