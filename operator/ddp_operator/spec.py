"""DDPJob spec -> JobSpec with defaults applied.

The CRD schema and its CEL rules reject most bad specs at admission. parse_spec repeats the cheap
checks (the operator may run against an older CRD, or objects stored before a rule existed) and adds
what the schema cannot see: conflicts between the generated pod and the user's pod template,
reserved env names and labels, and absurd totals.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from ddp_contract import api, envnames, labels, layout, s3options
from ddp_contract.backend import BACKENDS, NCCL
from ddp_contract.jobspec import (
    DEFAULT_BACKEND,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_DATA_WORKER_REPLICAS,
    DEFAULT_ELASTIC_SETTLE_SECONDS,
    DEFAULT_GPUS_PER_RANK,
    DEFAULT_IN_PLACE_DEADLINE_SECONDS,
    DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT,
    DEFAULT_MASTER_PORT,
    DEFAULT_NODE_LOST_GRACE_SECONDS,
    DEFAULT_RESTART_POLICY,
    DEFAULT_STARTUP_DEADLINE_SECONDS,
    RESTART_POLICIES,
    CABundle,
    DataWorkersSpec,
    JobSpec,
    S3Spec,
    TopologySpec,
)
from ddp_contract.targets import ENTRYPOINT_RE
from ddp_operator import constants as c

# --- the spec's limits (the CRD's own: tests/operator/unit/test_crd_schema.py holds them and ddp_contract.jobspec's
# defaults equal) ---
MAX_WORLD_SIZE: Final = 65536
MAX_GPUS_PER_RANK: Final = 16
MAX_RANKS_PER_POD: Final = 64
# worldSize * gpusPerRank above this is almost certainly a typo, not a job.
MAX_TOTAL_GPUS: Final = 262144
MAX_DATA_WORKERS: Final = 256
MAX_SPARE_PODS: Final = 64
# Every *Seconds field's ceiling (about 68 years): the bound Kubernetes gives a pod's activeDeadlineSeconds
# (math.MaxInt32) so that it times as a duration. It keeps a deadline inside the calendar (Python's dates
# end at the year 9999) and nodeLostGraceSeconds inside a toleration's tolerationSeconds.
MAX_SECONDS: Final = 2**31 - 1
# backoffLimit and infrastructureBackoffLimit: int32, as a batch Job's backoffLimit.
MAX_BACKOFF_LIMIT: Final = 2**31 - 1
# What the operator sets on ranks and data workers when the job has spec.dataWorkers.
DATA_WORKER_ENV: Final = frozenset({envnames.DATA_WORKERS, envnames.DATA_WORKER_TOKEN, envnames.DATA_WORKER_PORT})

# A Kubernetes resource quantity (k8s.io/apimachinery resource.Quantity) of 0 or more, as the CRD's pattern
# takes it: an exponent of at most two digits (the API server caps a quantity at 2**63 - 1 anyway, and
# its CEL quantity() spends minutes on 1e999999999).
QUANTITY_RE = re.compile(r"^\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]{1,2})?$")
# DNS-1035 label: what a Service name must be.
DNS1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
# A Secret's name (a DNS-1123 subdomain).
SECRET_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# A qualified label key: an optional DNS subdomain prefix and '/', then a name of at most 63 characters.
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
SECRET_NAME_MAX = 253
# spec.managedBy: a domain-prefixed path, as a batch Job's.
MANAGED_BY = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[-A-Za-z0-9_./~]+$")
S3_SCHEME = "s3://"

# Fields of the generated trainer container that come from the DDPJob spec, not the template.
TRAINER_OWNED_FIELDS = ("image", "command", "args", "resources")
# Pod spec fields the operator owns.
POD_OWNED_FIELDS = ("hostname", "subdomain", "activeDeadlineSeconds")
# Pod spec fields that are lists of objects, which the operator reads or extends.
POD_LISTS = ("containers", "initContainers", "tolerations", "imagePullSecrets", "volumes")
# Pod spec fields a data worker template may not set: its one container is made from the job's trainer.
DATA_WORKER_OWNED_FIELDS = ("hostname", "subdomain", "restartPolicy", "containers", "initContainers")


class InvalidSpec(Exception):
    """A DDPJob spec the operator cannot run. str() names the field: 'spec.<field>: <message>'."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"spec.{field}: {message}" if not field.startswith("metadata.") else f"{field}: {message}")
        self.field = field
        self.message = message


def parse_spec(spec: Mapping[str, Any]) -> JobSpec:
    """Validates a DDPJob .spec and returns it with defaults applied; raises InvalidSpec."""
    world_size = _int(spec, "worldSize", low=1, high=MAX_WORLD_SIZE)
    gpus = _int(spec, "gpusPerRank", default=DEFAULT_GPUS_PER_RANK, low=0, high=MAX_GPUS_PER_RANK)
    if world_size * gpus > MAX_TOTAL_GPUS:
        raise InvalidSpec(
            "gpusPerRank", f"worldSize * gpusPerRank = {world_size * gpus} exceeds {MAX_TOTAL_GPUS} GPUs"
        )
    backend = _enum(spec, "backend", DEFAULT_BACKEND, BACKENDS)
    if backend == NCCL and gpus == 0:
        raise InvalidSpec("backend", "nccl requires gpusPerRank > 0; use gloo or auto for CPU jobs")
    entrypoint, command, args = _program(spec)
    template = _template(spec.get("template") or {})
    shm_size = _shm_size(spec.get("shmSize"), template)
    env = _env(spec.get("env") or [], "env")
    s3 = _s3(spec.get("s3"))
    hang_timeout = _optional_int(spec, "hangTimeoutSeconds", low=0, high=MAX_SECONDS)
    if hang_timeout is not None:
        _check_env_names(env, "env", {envnames.HANG_TIMEOUT_SECONDS}, "is set from spec.hangTimeoutSeconds")
    if s3 and s3.credentials_secret:
        _check_env_names(
            env, "env", {envnames.AWS_ACCESS_KEY_ID, envnames.AWS_SECRET_ACCESS_KEY}, "is set from s3.credentialsSecret"
        )
    if spec.get("keepFolders"):
        _check_env_names(env, "env", {envnames.KEEP_FOLDERS}, "is set from spec.keepFolders")
    data_workers = _data_workers(spec.get("dataWorkers"))
    if data_workers is not None:
        _check_env_names(env, "env", DATA_WORKER_ENV, "is set from spec.dataWorkers")
    parsed = JobSpec(
        world_size=world_size,
        image=_image(spec),
        entrypoint=entrypoint,
        command=command,
        args=args,
        resources=_resources(spec.get("resources") or {}),
        gpus_per_rank=gpus,
        ranks_per_pod=_ranks_per_pod(spec, world_size),
        env=env,
        env_from=tuple(_list(spec.get("envFrom") or [], "envFrom")),
        image_pull_secrets=_image_pull_secrets(spec.get("imagePullSecrets") or []),
        master_port=_int(spec, "masterPort", default=DEFAULT_MASTER_PORT, low=1, high=65535),
        backend=backend,
        shm_size=shm_size,
        template=template,
        s3=s3,
        restart_policy=_enum(spec, "restartPolicy", DEFAULT_RESTART_POLICY, RESTART_POLICIES),
        restart_strategy=_restart_strategy(spec),
        trainer_runtime=_trainer_runtime(spec),
        launcher=_launcher(spec),
        in_place_deadline_seconds=_int(spec, "inPlaceDeadlineSeconds", default=DEFAULT_IN_PLACE_DEADLINE_SECONDS, low=1,
                                       high=MAX_SECONDS),
        min_world_size=_min_world_size(spec, world_size),
        spare_pods=_spare_pods(spec, world_size),
        elastic_settle_seconds=_int(spec, "elasticSettleSeconds", default=DEFAULT_ELASTIC_SETTLE_SECONDS, low=0,
                                    high=MAX_SECONDS),
        backoff_limit=_int(spec, "backoffLimit", default=DEFAULT_BACKOFF_LIMIT, low=0, high=MAX_BACKOFF_LIMIT),
        infrastructure_backoff_limit=_int(
            spec, "infrastructureBackoffLimit", default=DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT, low=0,
            high=MAX_BACKOFF_LIMIT),
        hang_timeout_seconds=hang_timeout,
        active_deadline_seconds=_optional_int(spec, "activeDeadlineSeconds", low=1, high=MAX_SECONDS),
        startup_deadline_seconds=_int(spec, "startupDeadlineSeconds", default=DEFAULT_STARTUP_DEADLINE_SECONDS, low=1,
                                      high=MAX_SECONDS),
        node_lost_grace_seconds=_int(spec, "nodeLostGraceSeconds", default=DEFAULT_NODE_LOST_GRACE_SECONDS, low=0,
                                     high=MAX_SECONDS),
        ttl_seconds_after_finished=_optional_int(spec, "ttlSecondsAfterFinished", low=0, high=MAX_SECONDS),
        suspend=_bool(spec, "suspend", False),
        metrics_from_output=_bool(spec, "metricsFromOutput", True),
        data_workers=data_workers,
        keep_folders=_keep_folders(spec.get("keepFolders") or [], s3),
        topology=_topology(spec.get("topology")),
        managed_by=_managed_by(spec.get("managedBy")),
    )
    _check_keep_folders_runtime(parsed)
    return parsed


def _topology(value: Any) -> TopologySpec | None:
    """spec.topology: exactly one of required and preferred, a node label key."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidSpec("topology", "must be an object with required or preferred")
    given = [name for name in ("required", "preferred") if value.get(name)]
    if len(given) != 1:
        raise InvalidSpec("topology", "set exactly one of required and preferred: a node label naming the domain")
    key = _string(value[given[0]], f"topology.{given[0]}")
    if len(key) > 317 or not LABEL_KEY.match(key):
        raise InvalidSpec(f"topology.{given[0]}", f"{key!r} is not a node label key (such as "
                          "topology.kubernetes.io/zone)")
    return TopologySpec(key=key, required=given[0] == "required")


def _managed_by(value: Any) -> str:
    if value is None:
        return api.MANAGED_BY_OPERATOR
    name = _string(value, "managedBy")
    if len(name) > api.MAX_MANAGED_BY or not MANAGED_BY.match(name):
        raise InvalidSpec("managedBy", f"{name!r} is not a controller's name: a domain-prefixed path of at most "
                          f"{api.MAX_MANAGED_BY} characters, such as {api.MANAGED_BY_MULTIKUEUE}")
    return name


def _keep_folders(value: Any, s3: S3Spec | None) -> tuple[str, ...]:
    """spec.keepFolders: folders, none inside another (each would be kept twice), and a results prefix."""
    folders = [_string(path, f"keepFolders[{i}]") for i, path in enumerate(_list(value, "keepFolders"))]
    keys: dict[str, int] = {}
    for i, path in enumerate(folders):
        try:
            key = layout.kept_folder_key(path)
        except ValueError as error:
            raise InvalidSpec(f"keepFolders[{i}]", str(error)) from None
        for other, j in keys.items():
            if key == other or key.startswith(other + "/") or other.startswith(key + "/"):
                raise InvalidSpec(f"keepFolders[{i}]", f"{path!r} and keepFolders[{j}] {folders[j]!r} name the same "
                                  "files: keep the outer folder only")
        keys[key] = i
    if folders and (s3 is None or not s3.results):
        raise InvalidSpec("keepFolders", "needs spec.s3.results: the folders are kept under the job's results prefix")
    return tuple(folders)


def _check_keep_folders_runtime(spec: JobSpec) -> None:
    if spec.keep_folders and spec.command and spec.trainer_runtime == api.TRAINER_RUNTIME_OFF:
        raise InvalidSpec("keepFolders", "needs the trainer runtime, which trainerRuntime Off turns off: "
                          "the runtime keeps the folders")


def _ranks_per_pod(spec: Mapping[str, Any], world_size: int) -> int:
    per_pod = _int(spec, "ranksPerPod", default=1, low=1, high=MAX_RANKS_PER_POD)
    if world_size % per_pod:
        raise InvalidSpec("ranksPerPod", f"worldSize {world_size} is not a multiple of ranksPerPod {per_pod}")
    return per_pod


def _min_world_size(spec: Mapping[str, Any], world_size: int) -> int | None:
    minimum = _optional_int(spec, "minWorldSize", low=1, high=world_size)
    if minimum is None:
        return None
    per_pod = _int(spec, "ranksPerPod", default=1, low=1, high=MAX_RANKS_PER_POD)
    if minimum % per_pod:
        raise InvalidSpec("minWorldSize", f"{minimum} is not a multiple of ranksPerPod {per_pod}: an elastic job "
                          "gains and loses whole pods")
    if minimum < world_size and _restart_strategy(spec) != api.RESTART_IN_PLACE:
        raise InvalidSpec("minWorldSize", f"{minimum} is below worldSize {world_size}, which needs restartStrategy "
                          "InPlace: a resize restarts the rank processes inside the pods that go on")
    return minimum


def _spare_pods(spec: Mapping[str, Any], world_size: int) -> int:
    spares = _int(spec, "sparePods", default=0, low=0, high=MAX_SPARE_PODS)
    if not spares:
        return 0
    if _restart_strategy(spec) != api.RESTART_IN_PLACE:
        raise InvalidSpec("sparePods", f"{spares} needs restartStrategy InPlace: a spare takes a lost pod's place in a "
                          "restart that keeps the other pods")
    minimum = _optional_int(spec, "minWorldSize", low=1, high=world_size)
    if minimum is not None and minimum < world_size:
        raise InvalidSpec("sparePods", f"{spares} is for a job of a fixed size: an elastic job (minWorldSize {minimum} "
                          f"below worldSize {world_size}) grows back with its own waiting pods")
    return spares


def validate_job_name(name: str, world_size: int, data_workers: int = 0) -> None:
    """The job name is the Service name and the prefix of every pod hostname '<name>-<rank>' (and
    '<name>-data-<i>' of its data workers)."""
    if not DNS1035_RE.match(name):
        raise InvalidSpec(
            "metadata.name", "must be a DNS-1035 label (lowercase letters, digits, '-'; starts with a letter)"
        )
    longest = max(f"{name}-{world_size - 1}", f"{name}-data-{data_workers - 1}" if data_workers else "", key=len)
    if len(longest) > DNS_LABEL_MAX:
        raise InvalidSpec("metadata.name", f"pod hostname {longest!r} would exceed {DNS_LABEL_MAX} characters")


# --- scalar fields -------------------------------------------------------------


def _int(
    spec: Mapping[str, Any], key: str, *, default: int | None = None, low: int, high: int | None = None,
    field: str | None = None,
) -> int:
    """spec[key] (else `default`; required without one), from `low` to `high`; `field` names it in
    errors where it is not spec.<key>."""
    value = spec.get(key, default)
    where = field or key
    if value is None:
        raise InvalidSpec(where, "is required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(where, f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise InvalidSpec(where, f"must be {bounds}, got {value}")
    return value


def _optional_int(spec: Mapping[str, Any], key: str, *, low: int, high: int | None = None) -> int | None:
    """spec[key] as `_int` takes it, or None when it is unset."""
    return None if spec.get(key) is None else _int(spec, key, low=low, high=high)


def _restart_strategy(spec: Mapping[str, Any]) -> str:
    strategy = _enum(spec, "restartStrategy", api.RESTART_RECREATE, api.RESTART_STRATEGIES)
    if strategy == api.RESTART_IN_PLACE and spec.get("trainerRuntime") == api.TRAINER_RUNTIME_OFF:
        raise InvalidSpec("restartStrategy", "InPlace restarts rank processes inside their pods, which only the "
                          "trainer runtime can do: set trainerRuntime Auto (the image must have the runtime), or "
                          "restartStrategy Recreate")
    return strategy


def _launcher(spec: Mapping[str, Any]) -> str:
    value = _enum(spec, "launcher", api.LAUNCHER_AUTO, api.LAUNCHERS)
    if value == api.LAUNCHER_COMMAND and spec.get("entrypoint") is not None:
        raise InvalidSpec("launcher", "Command is for a command that starts the pod's ranks itself: an entrypoint's "
                          "ranks are started by the trainer runtime")
    return value


def _trainer_runtime(spec: Mapping[str, Any]) -> str:
    value = _enum(spec, "trainerRuntime", api.TRAINER_RUNTIME_AUTO, api.TRAINER_RUNTIMES)
    if value == api.TRAINER_RUNTIME_OFF and spec.get("entrypoint") is not None:
        raise InvalidSpec("trainerRuntime", "Off is for a command: an entrypoint always runs in the trainer runtime")
    return value


def _enum(spec: Mapping[str, Any], key: str, default: str, allowed: Sequence[str]) -> str:
    value = spec.get(key, default)
    if value not in allowed:
        raise InvalidSpec(key, f"must be one of {', '.join(allowed)}; got {value!r}")
    return str(value)


def _bool(spec: Mapping[str, Any], key: str, default: bool) -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise InvalidSpec(key, f"must be a boolean, got {value!r}")
    return value


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidSpec(key, "must be a non-empty string")
    return value


def _list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidSpec(key, "must be a list")
    return copy.deepcopy(value)


def _image(spec: Mapping[str, Any]) -> str:
    if "image" not in spec:
        raise InvalidSpec("image", "is required")
    return _string(spec["image"], "image")


# --- what to run -----------------------------------------------------------------


def _program(spec: Mapping[str, Any]) -> tuple[str | None, tuple[str, ...] | None, tuple[str, ...]]:
    entrypoint = spec.get("entrypoint")
    command = spec.get("command")
    if (entrypoint is None) == (command is None):
        raise InvalidSpec("entrypoint", "exactly one of entrypoint (module:function) or command must be set")
    args = tuple(_strings(spec.get("args") or [], "args"))
    if entrypoint is not None:
        if not isinstance(entrypoint, str) or not ENTRYPOINT_RE.match(entrypoint):
            raise InvalidSpec("entrypoint", f"must look like package.module:function, got {entrypoint!r}")
        return entrypoint, None, args
    strings = _strings(command, "command")
    if not strings:
        raise InvalidSpec("command", "must not be empty")
    return None, tuple(strings), args


def _strings(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidSpec(key, "must be a list of strings")
    return list(value)


# --- resources, env, s3 ----------------------------------------------------------------


def _resources(resources: Any, key: str = "resources", gpus: str = "use gpusPerRank") -> dict[str, Any]:
    if not isinstance(resources, Mapping):
        raise InvalidSpec(key, "must be an object with limits and/or requests")
    for part in ("limits", "requests"):
        values = resources.get(part) or {}
        if not isinstance(values, Mapping):
            raise InvalidSpec(f"{key}.{part}", "must map resource names to quantities")
        if c.GPU_RESOURCE in values:
            raise InvalidSpec(f"{key}.{part}", f"must not set {c.GPU_RESOURCE}: {gpus}")
        for name, value in values.items():
            if not _is_quantity(value):
                raise InvalidSpec(f"{key}.{part}.{name}", f"must be a quantity of 0 or more such as 500m or 4Gi, "
                                  f"got {value!r}")
    return copy.deepcopy(dict(resources))


def _is_quantity(value: Any) -> bool:
    """A resource quantity a container may ask for: an integer or a string such as 500m, 4Gi or 1e3, not
    below 0 (a pod's are refused below it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value >= 0
    return isinstance(value, str) and bool(QUANTITY_RE.match(value))



def _data_workers(value: Any) -> DataWorkersSpec | None:
    """spec.dataWorkers: replicas, resources (CPU and memory: a data worker needs no GPU), template
    (labels, annotations and pod fields such as nodeSelector and tolerations, for a CPU node pool)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidSpec("dataWorkers", "must be an object with replicas, resources and template")
    template = value.get("template") or {}
    if not isinstance(template, Mapping):
        raise InvalidSpec("dataWorkers.template", "must be an object with metadata and spec")
    template = copy.deepcopy(dict(template))
    _check_template_metadata(template.get("metadata") or {}, "dataWorkers.template")
    pod = template.get("spec") or {}
    if not isinstance(pod, Mapping):
        raise InvalidSpec("dataWorkers.template.spec", "must be an object (PodSpec fields)")
    _check_pod_shape(pod, "dataWorkers.template.spec")
    for key in DATA_WORKER_OWNED_FIELDS:
        if key in pod:
            raise InvalidSpec(f"dataWorkers.template.spec.{key}",
                              "is set by the operator (a data worker's container is the job's trainer, "
                              "running the data worker; set its resources in dataWorkers.resources)")
    return DataWorkersSpec(
        replicas=_int(value, "replicas", default=DEFAULT_DATA_WORKER_REPLICAS, low=0, high=MAX_DATA_WORKERS,
                      field="dataWorkers.replicas"),
        resources=_resources(value.get("resources") or {}, "dataWorkers.resources",
                             "data workers preprocess on CPUs"),
        template=template,
    )


def _env(env: Any, key: str) -> tuple[Mapping[str, Any], ...]:
    items = _list(env, key)
    for index, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str) or not item["name"]:
            raise InvalidSpec(f"{key}[{index}].name", "is required")
    env_tuple = tuple(items)
    _check_env_names(env_tuple, key, envnames.RESERVED, "is set by the operator")
    return env_tuple


def _check_env_names(env: Sequence[Mapping[str, Any]], key: str, reserved: frozenset[str] | set[str], why: str) -> None:
    for index, item in enumerate(env):
        if item.get("name") in reserved:
            raise InvalidSpec(f"{key}[{index}].name", f"{item['name']} {why} and cannot be overridden")


def _s3(s3: Any) -> S3Spec | None:
    if s3 is None:
        return None
    if not isinstance(s3, Mapping):
        raise InvalidSpec("s3", "must be an object")
    for key in ("dataset", "results"):
        uri = s3.get(key)
        if uri is not None and (
            not isinstance(uri, str) or not uri.startswith(S3_SCHEME) or len(uri) <= len(S3_SCHEME)
        ):
            raise InvalidSpec(f"s3.{key}", f"must be an s3://bucket/prefix URI, got {uri!r}")
    endpoint = s3.get("endpoint")
    if endpoint is not None and not re.match(r"^https?://\S+$", str(endpoint)):
        raise InvalidSpec("s3.endpoint", f"must be an http(s) URL, got {endpoint!r}")
    secret = s3.get("credentialsSecret")
    if secret is not None and not _is_secret_name(secret):
        raise InvalidSpec("s3.credentialsSecret", f"must be a Secret name, got {secret!r}")
    return S3Spec(
        endpoint=endpoint,
        region=s3.get("region"),
        credentials_secret=secret,
        dataset=s3.get("dataset"),
        results=s3.get("results"),
        checksums=_choice(s3, "checksums", (s3options.AUTO, *s3options.SPEC_CHECKSUMS)),
        addressing_style=_choice(s3, "addressingStyle", (s3options.AUTO, *s3options.SPEC_ADDRESSING_STYLES)),
        ca_bundle=_ca_bundle(s3.get("caBundle")),
    )


def _choice(s3: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = s3.get(key, allowed[0])
    if value not in allowed:
        raise InvalidSpec(f"s3.{key}", f"must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def _ca_bundle(value: Any) -> CABundle | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not _is_secret_name(value.get("configMap")):
        raise InvalidSpec("s3.caBundle", f"must be {{configMap: <name>, key: <key>}}, got {value!r}")
    key = value.get("key", s3options.DEFAULT_CA_BUNDLE_KEY)
    if not isinstance(key, str) or not re.match(r"^[-._a-zA-Z0-9]+$", key):
        raise InvalidSpec("s3.caBundle.key", f"must be a ConfigMap key, got {key!r}")
    return CABundle(config_map=value["configMap"], key=key)


def _is_secret_name(name: Any) -> bool:
    return isinstance(name, str) and len(name) <= SECRET_NAME_MAX and bool(SECRET_NAME_RE.match(name))


def _image_pull_secrets(value: Any) -> tuple[str, ...]:
    """spec.imagePullSecrets ([{name: ...}], as a pod's) -> the Secret names; each named once."""
    names: list[str] = []
    for index, item in enumerate(_list(value, "imagePullSecrets")):
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(name, str) or not _is_secret_name(name):
            raise InvalidSpec(f"imagePullSecrets[{index}].name", f"must be a Secret name, got {name!r}")
        if name in names:
            raise InvalidSpec(f"imagePullSecrets[{index}].name", f"{name!r} is listed twice")
        names.append(name)
    return tuple(names)


# --- shm and template ------------------------------------------------------------


def _shm_size(value: Any, template: Mapping[str, Any]) -> str | None:
    if value is None:
        return None
    text = str(value)
    if (
        isinstance(value, bool)
        or not QUANTITY_RE.match(text)
        or not re.search(r"[1-9]", text.split("e")[0].split("E")[0])
    ):
        raise InvalidSpec("shmSize", f"must be a positive quantity such as 8Gi, got {value!r}")
    pod = template.get("spec") or {}
    if any(volume.get("name") == c.SHM_VOLUME for volume in pod.get("volumes") or []):
        raise InvalidSpec("template.spec.volumes", f"volume name {c.SHM_VOLUME!r} is reserved for shmSize")
    for container in pod.get("containers") or []:
        if container.get("name") == labels.CONTAINER_NAME and any(
            mount.get("mountPath") == c.SHM_PATH for mount in container.get("volumeMounts") or []
        ):
            raise InvalidSpec("template.spec.containers", f"{c.SHM_PATH} is mounted by shmSize; remove one of them")
    return text


def _template(template: Any) -> dict[str, Any]:
    if not isinstance(template, Mapping):
        raise InvalidSpec("template", "must be an object with metadata and spec")
    copied: dict[str, Any] = copy.deepcopy(dict(template))
    _check_template_metadata(copied.get("metadata") or {})
    _check_pod_spec(copied.get("spec") or {})
    return copied


def _check_pod_shape(pod: Mapping[str, Any], where: str) -> None:
    """The pod template's fields the operator reads (to merge, to judge a quota or the nodes) are of
    their kinds; their values are the API server's to judge when it gets the pod."""
    for key in POD_LISTS:
        items = pod.get(key) or []
        if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
            raise InvalidSpec(f"{where}.{key}", "must be a list of objects")
    for key in ("securityContext", "affinity", "nodeSelector"):
        if not isinstance(pod.get(key) or {}, Mapping):
            raise InvalidSpec(f"{where}.{key}", "must be an object")
    if not all(isinstance(value, str) for value in (pod.get("nodeSelector") or {}).values()):
        raise InvalidSpec(f"{where}.nodeSelector", "must map label names to strings")
    for index, item in enumerate(pod.get("imagePullSecrets") or []):
        if not isinstance(item.get("name", ""), str):
            raise InvalidSpec(f"{where}.imagePullSecrets[{index}].name", "must be a string")
    for index, item in enumerate(pod.get("volumes") or []):
        if not isinstance(item.get("name"), str) or not item["name"]:
            raise InvalidSpec(f"{where}.volumes[{index}].name", "must be a non-empty string")
    for key in ("initContainers", "containers"):
        for index, container in enumerate(pod.get(key) or []):
            _check_container_shape(container, f"{where}.{key}[{index}]")
    for path, value in _template_quantities(pod, where):
        if not _is_quantity(value):
            raise InvalidSpec(path, f"must be a quantity of 0 or more such as 500m or 4Gi (an exponent of at most two "
                              f"digits), got {value!r}")


def _template_quantities(pod: Mapping[str, Any], where: str) -> Iterator[tuple[str, Any]]:
    """The quantities a pod template holds, by field: its containers' resources, the pod's own resources
    and overhead, emptyDir size limits. The API server spends minutes on one such as 1e999999999 and
    answers the pod's creation with a timeout, so the operator judges them before it makes the pods."""
    groups: list[tuple[str, Any]] = [(f"{where}.overhead", pod.get("overhead"))]
    groups += [(f"{where}.resources.{part}", (pod.get("resources") or {}).get(part)) for part in ("limits", "requests")
               if isinstance(pod.get("resources"), Mapping)]
    for key in ("initContainers", "containers"):
        for index, container in enumerate(pod.get(key) or []):
            resources = container.get("resources") or {}
            groups += [(f"{where}.{key}[{index}].resources.{part}", resources.get(part)) for part in ("limits", "requests")]
    for where_group, values in groups:
        if isinstance(values, Mapping):
            yield from ((f"{where_group}.{name}", value) for name, value in values.items())
    for index, volume in enumerate(pod.get("volumes") or []):
        empty_dir = volume.get("emptyDir")
        if isinstance(empty_dir, Mapping) and "sizeLimit" in empty_dir:
            yield f"{where}.volumes[{index}].emptyDir.sizeLimit", empty_dir["sizeLimit"]


def _check_container_shape(container: Mapping[str, Any], where: str) -> None:
    if not isinstance(container.get("name"), str) or not container["name"]:
        raise InvalidSpec(f"{where}.name", "is required")
    for key in ("env", "envFrom", "volumeMounts"):
        items = container.get(key) or []
        if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
            raise InvalidSpec(f"{where}.{key}", "must be a list of objects")
    if not isinstance(container.get("securityContext") or {}, Mapping):
        raise InvalidSpec(f"{where}.securityContext", "must be an object")
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping) or not all(
            isinstance(resources.get(part) or {}, Mapping) for part in ("limits", "requests")):
        raise InvalidSpec(f"{where}.resources", "must be an object with limits and/or requests")


def _check_template_metadata(metadata: Any, where: str = "template") -> None:
    if not isinstance(metadata, Mapping):
        raise InvalidSpec(f"{where}.metadata", "must be an object with labels and annotations")
    for key in ("labels", "annotations"):
        values = metadata.get(key) or {}
        if not isinstance(values, Mapping) or not all(isinstance(v, str) for v in values.values()):
            raise InvalidSpec(f"{where}.metadata.{key}", "must map strings to strings")
    reserved = sorted(labels.RESERVED_LABELS & set(metadata.get("labels") or {}))
    if reserved:
        raise InvalidSpec(f"{where}.metadata.labels", f"{', '.join(reserved)} is set by the operator")


def _check_pod_spec(pod: Mapping[str, Any]) -> None:
    if not isinstance(pod, Mapping):
        raise InvalidSpec("template.spec", "must be an object (a PodSpec)")
    _check_pod_shape(pod, "template.spec")
    restart = pod.get("restartPolicy")
    if restart not in (None, "Never"):
        raise InvalidSpec(
            "template.spec.restartPolicy",
            "must be Never or unset: failed ranks are handled by spec.restartPolicy, which restarts the whole gang",
        )
    for key in POD_OWNED_FIELDS:
        if key in pod:
            raise InvalidSpec(f"template.spec.{key}", "is set by the operator")
    names: set[str] = set()
    for index, container in enumerate(pod.get("containers") or []):
        _check_template_container(container, index, names)


def _check_template_container(container: Any, index: int, seen: set[str]) -> None:
    where = f"template.spec.containers[{index}]"
    if not isinstance(container, Mapping) or not container.get("name"):
        raise InvalidSpec(f"{where}.name", "is required")
    name = container["name"]
    if name in seen:
        raise InvalidSpec(f"{where}.name", f"duplicate container name {name!r}")
    seen.add(name)
    if name != labels.CONTAINER_NAME:
        if not container.get("image"):
            raise InvalidSpec(f"{where}.image", f"is required for the sidecar {name!r}")
        return
    owned = [key for key in TRAINER_OWNED_FIELDS if key in container]
    if owned:
        raise InvalidSpec(f"{where}.{owned[0]}", f"of the {labels.CONTAINER_NAME!r} container comes from spec.{owned[0]}")
    _env(container.get("env") or [], f"{where}.env")
