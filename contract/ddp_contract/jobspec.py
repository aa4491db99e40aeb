"""The DDPJob spec's types and defaults: what the operator parses a spec into (`ddp_operator.spec`
checks it) and what the client builds a spec from (`ddp_client.S3` is `S3Spec`). Field names are the
spec's, in snake case; the limits the operator enforces stay with its checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ddp_contract import api, backend, s3options
from ddp_contract.backend import resolve_backend

POLICY_ON_FAILURE: Final = "OnFailure"
POLICY_NEVER: Final = "Never"
POLICY_EXIT_CODE: Final = "ExitCode"
RESTART_POLICIES: Final = (POLICY_ON_FAILURE, POLICY_NEVER, POLICY_EXIT_CODE)
DEFAULT_MASTER_PORT: Final = 29500
DEFAULT_BACKOFF_LIMIT: Final = 3
DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT: Final = 10
DEFAULT_STARTUP_DEADLINE_SECONDS: Final = 900
DEFAULT_IN_PLACE_DEADLINE_SECONDS: Final = 180
DEFAULT_ELASTIC_SETTLE_SECONDS: Final = 60
DEFAULT_NODE_LOST_GRACE_SECONDS: Final = 60
DEFAULT_GPUS_PER_RANK: Final = 1
DEFAULT_BACKEND: Final = backend.AUTO
DEFAULT_RESTART_POLICY: Final = POLICY_ON_FAILURE
DEFAULT_DATA_WORKER_REPLICAS: Final = 1


@dataclass(frozen=True)
class CABundle:
    """spec.s3.caBundle: the ConfigMap (and its key) holding the CA certificates the ranks trust for S3."""

    config_map: str
    key: str = s3options.DEFAULT_CA_BUNDLE_KEY


@dataclass(frozen=True)
class S3Spec:
    """spec.s3: where the ranks read data and write results, the Secret with their credentials, and how
    they talk to the store."""

    endpoint: str | None = None
    region: str | None = None
    credentials_secret: str | None = None
    dataset: str | None = None
    results: str | None = None
    checksums: str = s3options.AUTO
    addressing_style: str = s3options.AUTO
    ca_bundle: CABundle | None = None

    @classmethod
    def from_spec(cls, s3: Mapping[str, Any] | None) -> S3Spec:
        """What a job's spec.s3 says, read as written (the operator's `parse_spec` is what checks it)."""
        s3 = s3 or {}
        bundle = s3.get("caBundle")
        return cls(endpoint=s3.get("endpoint") or None, region=s3.get("region") or None,
                   credentials_secret=s3.get("credentialsSecret") or None, dataset=s3.get("dataset") or None,
                   results=s3.get("results") or None, checksums=s3.get("checksums") or s3options.AUTO,
                   addressing_style=s3.get("addressingStyle") or s3options.AUTO,
                   ca_bundle=CABundle(bundle["configMap"], bundle.get("key") or s3options.DEFAULT_CA_BUNDLE_KEY)
                   if isinstance(bundle, Mapping) and bundle.get("configMap") else None)

    def to_spec(self) -> dict[str, Any]:
        """spec.s3 as a manifest writes it: the fields set, defaults left out."""
        fields: dict[str, Any] = {"endpoint": self.endpoint, "region": self.region,
                                  "credentialsSecret": self.credentials_secret, "dataset": self.dataset,
                                  "results": self.results}
        if self.checksums != s3options.AUTO:
            fields["checksums"] = self.checksums
        if self.addressing_style != s3options.AUTO:
            fields["addressingStyle"] = self.addressing_style
        if self.ca_bundle is not None:
            fields["caBundle"] = {"configMap": self.ca_bundle.config_map, "key": self.ca_bundle.key}
        return {key: value for key, value in fields.items() if value}

    @property
    def settings(self) -> dict[str, str]:
        """The DDP_S3_* settings for checksums, addressing and the CA bundle (none where Auto)."""
        return s3options.spec_settings({"checksums": self.checksums, "addressingStyle": self.addressing_style,
                                        "caBundle": self.ca_bundle is not None})


class Templated:
    """A pod template's parts, for a spec holding one as `template`."""

    template: Mapping[str, Any]

    @property
    def template_labels(self) -> Mapping[str, str]:
        return (self.template.get("metadata") or {}).get("labels") or {}

    @property
    def template_annotations(self) -> Mapping[str, str]:
        return (self.template.get("metadata") or {}).get("annotations") or {}

    @property
    def pod_spec(self) -> Mapping[str, Any]:
        return self.template.get("spec") or {}


@dataclass(frozen=True)
class TopologySpec:
    """spec.topology: the ranks' pods within one domain of a node label (a rack, a block, a zone); required,
    or preferred (as many as fit there, the rest in the next domains, ranks in order)."""

    key: str
    required: bool = True


@dataclass(frozen=True)
class DataWorkersSpec(Templated):
    """spec.dataWorkers: pods that run the ranks' DataLoader workers (`<job>-data-<i>`)."""

    replicas: int = DEFAULT_DATA_WORKER_REPLICAS
    resources: Mapping[str, Any] = field(default_factory=dict)
    template: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobSpec(Templated):
    world_size: int
    image: str
    entrypoint: str | None = None
    command: tuple[str, ...] | None = None
    args: tuple[str, ...] = ()
    resources: Mapping[str, Any] = field(default_factory=dict)
    gpus_per_rank: int = DEFAULT_GPUS_PER_RANK
    ranks_per_pod: int = 1
    env: tuple[Mapping[str, Any], ...] = ()
    env_from: tuple[Mapping[str, Any], ...] = ()
    image_pull_secrets: tuple[str, ...] = ()  # Secret names, in the order given
    master_port: int = DEFAULT_MASTER_PORT
    backend: str = DEFAULT_BACKEND
    shm_size: str | None = None
    template: Mapping[str, Any] = field(default_factory=dict)
    s3: S3Spec | None = None
    restart_policy: str = DEFAULT_RESTART_POLICY
    restart_strategy: str = api.RESTART_RECREATE
    trainer_runtime: str = api.TRAINER_RUNTIME_AUTO
    launcher: str = api.LAUNCHER_AUTO
    in_place_deadline_seconds: int = DEFAULT_IN_PLACE_DEADLINE_SECONDS
    min_world_size: int | None = None  # None: worldSize (not elastic)
    spare_pods: int = 0  # warm pods beyond the gang's, '<job>-<pods>' onward (restartStrategy InPlace)
    elastic_settle_seconds: int = DEFAULT_ELASTIC_SETTLE_SECONDS
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    infrastructure_backoff_limit: int = DEFAULT_INFRASTRUCTURE_BACKOFF_LIMIT
    hang_timeout_seconds: int | None = None
    active_deadline_seconds: int | None = None
    startup_deadline_seconds: int = DEFAULT_STARTUP_DEADLINE_SECONDS
    node_lost_grace_seconds: int = DEFAULT_NODE_LOST_GRACE_SECONDS
    ttl_seconds_after_finished: int | None = None
    suspend: bool = False
    metrics_from_output: bool = True
    data_workers: DataWorkersSpec | None = None
    keep_folders: tuple[str, ...] = ()  # as written; kept under <results>/<ns>/<job>/kept/<layout.kept_folder_key>
    topology: TopologySpec | None = None
    managed_by: str = api.MANAGED_BY_OPERATOR

    @property
    def data_worker_replicas(self) -> int:
        return self.data_workers.replicas if self.data_workers is not None else 0

    @property
    def in_place(self) -> bool:
        """Whether a failure restarts rank processes in the pods that can go on (restartStrategy InPlace)."""
        return self.restart_strategy == api.RESTART_IN_PLACE

    @property
    def elastic(self) -> bool:
        """Whether the job may train with fewer ranks than worldSize (spec.minWorldSize below it)."""
        return self.min_world_size is not None and self.min_world_size < self.world_size

    @property
    def min_pods(self) -> int:
        """The fewest pods an elastic job's gang may have (all of them when it is not elastic)."""
        return (self.min_world_size or self.world_size) // self.ranks_per_pod

    @property
    def pods(self) -> int:
        """Pods of the gang, '<job>-0' .. '<job>-<pods-1>'; each holds ranks_per_pod ranks."""
        return self.world_size // self.ranks_per_pod

    @property
    def all_pods(self) -> int:
        """Every rank pod the job keeps: the gang's and its spares ('<job>-0' .. '<job>-<all_pods-1>')."""
        return self.pods + self.spare_pods

    @property
    def gpus_per_pod(self) -> int:
        return self.gpus_per_rank * self.ranks_per_pod

    def pod_ranks(self, index: int) -> range:
        """The global ranks pod `index` holds."""
        return range(index * self.ranks_per_pod, (index + 1) * self.ranks_per_pod)

    @property
    def effective_backend(self) -> str:
        """The torch.distributed backend the ranks use: 'auto' is nccl with GPUs, gloo without."""
        return resolve_backend(self.backend, self.gpus_per_rank > 0)
