"""The DDPJob (and the ConfigMap carrying a local script) that `submit` creates: pure functions."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ddp_contract import api, labels
from ddp_contract.jobspec import S3Spec
from ddp_contract.targets import ENTRYPOINT_RE, SCRIPT_FUNCTION_RE

# Where a submitted script is mounted in every rank, and the volume's name.
SCRIPT_DIR = "/opt/ddp-client/code"
SCRIPT_VOLUME = "ddp-client-code"
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CONFIGMAP_LIMIT = 1024 * 1024  # the API server refuses larger objects (etcd's value limit is about this)


# spec.s3, as the client builds it (`ddp_client.S3`): the spec's own type.
S3 = S3Spec


def load_job(job: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    """A DDPJob given as a dict, YAML text or a YAML file's path; checked to be one."""
    if isinstance(job, Path) or (isinstance(job, str) and "\n" not in job and job.endswith((".yaml", ".yml"))):
        body = yaml.safe_load(Path(job).read_text())
    elif isinstance(job, str):
        body = yaml.safe_load(job)
    else:
        body = dict(job)
    if not isinstance(body, dict) or body.get("kind") != api.KIND or not str(body.get("apiVersion", "")).startswith(api.GROUP):
        raise ValueError(f"not a {api.KIND} ({api.API_VERSION}): kind {body.get('kind') if isinstance(body, dict) else body!r}")
    if not (body.get("metadata") or {}).get("name"):
        raise ValueError(f"the {api.KIND} has no metadata.name")
    return body


def place_job(body: Mapping[str, Any], *, name: str | None = None, namespace: str | None = None,
              spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A whole DDPJob as `submit` creates it: `name` and `spec` fields override its own, and it goes in
    `namespace` (its metadata.namespace follows)."""
    placed = copy.deepcopy(dict(body))
    meta = placed["metadata"] = dict(placed.get("metadata") or {})
    if name:
        meta["name"] = name
    if namespace:
        meta["namespace"] = namespace
    if spec:
        placed["spec"] = {**(placed.get("spec") or {}), **copy.deepcopy(dict(spec))}
    return placed


def job_name_for(target: str) -> str:
    """A job name from a script or module name: `train_resnet.py` -> `train-resnet`."""
    stem = Path(script_of(target)).stem if is_script(target) else target.partition(":")[0].rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40].strip("-")
    return name or "ddpjob"


def script_configmap_name(job: str) -> str:
    return f"{job}-code"


def _env(env: Mapping[str, str] | Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    if env is None:
        return []
    if isinstance(env, Mapping):
        return [{"name": str(k), "value": str(v)} for k, v in env.items()]
    return [dict(item) for item in env]


def is_script(target: str) -> bool:
    """A local script (`train.py`, `dir/train`) or a function in one (`train.py:train`)."""
    return bool(SCRIPT_FUNCTION_RE.match(target)) or target.endswith(".py") or "/" in target


def script_of(target: str) -> str:
    """The script's path in a script target (without `:function`)."""
    match = SCRIPT_FUNCTION_RE.match(target)
    return match["script"] if match else target


def _script_target(target: str) -> str:
    """How the ranks name a script target: its file in SCRIPT_DIR, with `:function` where given."""
    match = SCRIPT_FUNCTION_RE.match(target)
    name = Path(match["script"] if match else target).name
    return f"{SCRIPT_DIR}/{name}" + (f":{match['function']}" if match else "")


def build_job(
    target: str,
    *,
    name: str,
    image: str,
    world_size: int = 1,
    gpus: int = 1,
    s3: S3Spec | None = None,
    env: Mapping[str, str] | Sequence[Mapping[str, Any]] | None = None,
    args: Sequence[str] = (),
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The DDPJob for `module:function`, a local script or a function in one (mounted with the files
    beside it from the ConfigMap `<name>-code` and run as `python -m ddp_trainer run
    <mount>/<script>[:function] -- ARGS`); `spec` adds or overrides fields."""
    if not NAME_RE.match(name) or len(name) > 52:
        raise ValueError(f"job name {name!r} must be a DNS label (a-z, 0-9, '-') of at most 52 characters")
    body: dict[str, Any] = {"worldSize": int(world_size), "gpusPerRank": int(gpus), "image": image}
    extra = dict(spec or {})
    if is_script(target):
        body["command"] = ["python", "-m", "ddp_trainer", "run", _script_target(target), "--"]
        body["template"] = with_script_volume(extra.pop("template", None) or {}, script_configmap_name(name))
    elif ENTRYPOINT_RE.match(target):
        body["entrypoint"] = target
    else:
        raise ValueError(f"{target!r} is neither module:function nor a local script (a path ending in .py, "
                         "or script.py:function)")
    if args:
        body["args"] = [str(a) for a in args]
    if s3 is not None and s3.to_spec():
        body["s3"] = s3.to_spec()
    if env:
        body["env"] = _env(env)
    body.update(extra)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}, "spec": body}


def with_script_volume(template: Mapping[str, Any], configmap: str) -> dict[str, Any]:
    """The pod template with the script's ConfigMap as a volume, mounted in the trainer container
    at SCRIPT_DIR; the template's own volumes, containers and other fields are kept."""
    merged = copy.deepcopy(dict(template))
    pod = merged.setdefault("spec", {})
    pod["volumes"] = [*(pod.get("volumes") or []), {"name": SCRIPT_VOLUME, "configMap": {"name": configmap}}]
    containers = pod.setdefault("containers", [])
    trainer = next((c for c in containers if c.get("name") == labels.CONTAINER_NAME), None)
    if trainer is None:
        trainer = {"name": labels.CONTAINER_NAME}
        containers.insert(0, trainer)
    mount = {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_DIR, "readOnly": True}
    trainer["volumeMounts"] = [*(trainer.get("volumeMounts") or []), mount]
    return merged


def script_configmap(job: str, script: Path, files: Sequence[Path] = ()) -> dict[str, Any]:
    """The ConfigMap carrying a local script, and the files that go beside it (its own modules), to
    the ranks: one key per file, its name."""
    data: dict[str, str] = {}
    for path in (script, *files):
        if path.name in data:
            raise ValueError(f"two files named {path.name} to send beside {script.name}: names must differ")
        data[path.name] = path.read_text()
    size = sum(len(text.encode()) for text in data.values())
    if size > CONFIGMAP_LIMIT - 4096:
        raise ValueError(f"{', '.join(data)}: {size} bytes, too large for a ConfigMap (about 1 MiB); "
                         "put them in the image or in S3")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": script_configmap_name(job), "labels": {labels.LABEL_JOB_NAME: job}},
            "data": data}
