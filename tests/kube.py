"""Access to the Kubernetes API the tests run against.

By default the local control plane (localcluster/cluster.sh) is used, started if needed; set
DDP_TEST_KUBECONFIG to a kubeconfig to run the same tests against another cluster (kind, a real one).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines
from prometheus_client.parser import text_string_to_metric_families

from ddp_contract import api, labels
from fakenodes import on_fake_nodes
from podstatus import evicted_status, hung_status, pod_status
from waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
CLUSTER_SCRIPT = REPO / "localcluster" / "cluster.sh"
KUBECONFIG_ENV = "DDP_TEST_KUBECONFIG"
CRD_FILE = REPO / "crds" / "ddpjob.yaml"
# What `python -m ddp_operator` imports: the operator and the contract, never the trainer runtime.
OPERATOR_PATH = ("contract", "operator")


@dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    kubectl: str
    local: bool  # the control plane of localcluster/cluster.sh, not one named by DDP_TEST_KUBECONFIG
    started_here: bool


class ScriptFailed(subprocess.CalledProcessError):
    """A failed localcluster script, said with the end of what it wrote to stderr (where it says why)."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '')[-3000:]}"


def cluster_script(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", str(CLUSTER_SCRIPT), *args], env={**os.environ, **(env or {})},
                            capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ScriptFailed(result.returncode, result.args, result.stdout, result.stderr)
    return result


def script_setting(name: str) -> str:
    """A pinned setting (e.g. ETCD_VERSION) as written at the top of cluster.sh."""
    for line in CLUSTER_SCRIPT.read_text().splitlines():
        if line.startswith(f"{name}="):
            return line.split("=", 1)[1]
    raise KeyError(f"{name} is not set in {CLUSTER_SCRIPT}")


def k8s_version() -> str:
    """The Kubernetes release the local cluster runs: the one DDP_K8S_VERSION picks, or the default."""
    return cluster_script("version").stdout.strip()


def local_kubeconfig(env: dict[str, str] | None = None) -> str:
    for line in cluster_script("env", env=env).stdout.splitlines():
        if line.startswith("export KUBECONFIG="):
            return line.split("=", 1)[1]
    raise RuntimeError("cluster.sh env printed no KUBECONFIG")


def open_cluster(owner_pid: str) -> Cluster:
    """The cluster, started if it is not up; one started here is taken down by its watchdog should process
    `owner_pid` die without taking it down."""
    external = os.environ.get(KUBECONFIG_ENV)
    if external:
        return Cluster(kubeconfig=external, kubectl="kubectl", local=False, started_here=False)
    was_up = cluster_script("status", check=False).returncode == 0
    # A cluster that was up already must be of the release DDP_K8S_VERSION picks, or `up` says which it is.
    owner = {} if was_up else {"DDP_CLUSTER_OWNER_PID": owner_pid}
    result = cluster_script("up", env=owner, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"local cluster failed to start:\n{result.stderr}")
    kubectl = cluster_script("bindir").stdout.strip().split(":")[0] + "/kubectl"
    return Cluster(kubeconfig=local_kubeconfig(), kubectl=kubectl, local=True, started_here=not was_up)


@contextmanager
def own_namespace_in(kube_api: Any) -> Iterator[str]:
    """A namespace `own-<id>` outside the test session's operator's (`t-<session>-*`), for an operator a
    test installs itself; deleted afterwards."""
    core = client.CoreV1Api(kube_api)
    name = f"own-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    wait_until(lambda: core.list_namespaced_service_account(name).items, 30, f"default ServiceAccount in {name}")
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


def install_crd(kube_api: Any) -> None:
    """Creates or updates the CRD from crds/ddpjob.yaml and waits until it is served."""
    crds = client.ApiextensionsV1Api(kube_api)
    body = yaml.safe_load(CRD_FILE.read_text())
    try:
        crds.create_custom_resource_definition(body)
    except ApiException as error:
        if error.status != 409:
            raise
        _replace_crd(crds, body)

    def established() -> bool:
        conditions = crds.read_custom_resource_definition(api.CRD_NAME).status.conditions or []
        return any(cond.type == "Established" and cond.status == "True" for cond in conditions)

    wait_until(established, 30, f"CRD {api.CRD_NAME} Established")
    custom = client.CustomObjectsApi(kube_api)
    wait_until(lambda: _served(custom), 30, f"{api.PLURAL} served")


def _replace_crd(crds: Any, body: dict[str, Any], attempts: int = 5) -> None:
    """Replaces the CRD with `body`, read again when the API server changed it meanwhile (its own
    controllers write its status after a create, a chart install writes it too)."""
    for attempt in range(attempts):
        current = crds.read_custom_resource_definition(api.CRD_NAME)
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        try:
            crds.replace_custom_resource_definition(api.CRD_NAME, body)
            return
        except ApiException as error:
            if error.status != 409 or attempt == attempts - 1:
                raise


def _served(custom: Any) -> bool:
    try:
        custom.list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL, limit=1)
        return True
    except ApiException:
        return False


class OperatorProcess:
    """`python -m ddp_operator`, started and stopped by the tests; its /metrics on a free loopback port."""

    STARTED = "ddp-operator started"
    STANDBY = "ddp-operator standby"

    def __init__(self, kubeconfig: str, log_path: Path, env: dict[str, str] | None = None) -> None:
        """env: the operator's own settings (DDP_OPERATOR_*), on top of the test process's environment."""
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.env = env or {}
        self.process: subprocess.Popen | None = None
        self.metrics_port: int | None = None

    def start(self, until: str = STARTED) -> None:
        """Starts it and waits for the log line `until` (STANDBY: for a replica that does not lead)."""
        pythonpath = os.pathsep.join(str(REPO / p) for p in OPERATOR_PATH)
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "PYTHONPATH": pythonpath,
               "DDP_OPERATOR_METRICS_ADDRESS": "127.0.0.1", "DDP_OPERATOR_METRICS_PORT": "0", **self.env}
        log = self.log_path.open("a")
        starts = self._count(until)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ddp_operator"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
        wait_until(lambda: self._count(until) > starts or self._died(), 60, f"the operator to log {until!r}")
        assert self.process.poll() is None, f"the operator exited:\n{self.log_path.read_text()[-3000:]}"
        ports = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", self.log_path.read_text())
        self.metrics_port = int(ports[-1])

    def _count(self, line: str) -> int:
        return self.log_path.read_text().count(line) if self.log_path.exists() else 0

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """One scrape of /metrics: each sample's value by (name, labels)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {(sample.name, frozenset(sample.labels.items())): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    def metric(self, name: str, /, **labels: str) -> float:
        """A sample's value in one scrape; 0 when the series does not exist (yet)."""
        return self.metrics().get((name, frozenset(labels.items())), 0.0)

    def kill(self) -> None:
        """SIGKILL: no cleanup, no lease released."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _died(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def restart(self, kubeconfig: str | None = None, env: dict[str, str] | None = None) -> None:
        """Stops and starts the operator, with another identity if a kubeconfig is given, other settings if env is."""
        self.stop()
        self.kubeconfig = kubeconfig or self.kubeconfig
        self.env = self.env if env is None else env
        self.log_path.write_text(self.log_path.read_text() + "\n--- restart ---\n")
        self.start()


class Jobs:
    """DDPJobs in one test namespace, and the kubelet's part for their pods."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def create(self, name: str, job_labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        """Creates a DDPJob whose ranks land on kwok's fake nodes (the tests play their kubelet)."""
        template = spec.get("template", {})
        spec["template"] = {**template, "spec": on_fake_nodes(template.get("spec", {}))}
        body = {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "metadata": {"name": name, **({"labels": job_labels} if job_labels else {})},
            "spec": {"image": "trainer:test", **({} if "entrypoint" in spec else {"command": ["python", "train.py"]}),
                     "gpusPerRank": 0, **spec},
        }
        return self.custom.create_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, body)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def log(self, pod: str, container: str | None = None) -> str:
        """The pod's log so far: "" while it has none (the client reads an empty body as None)."""
        kwargs = {"container": container} if container else {}
        return self.core.read_namespaced_pod_log(pod, self.namespace, **kwargs) or ""

    def status(self, name: str) -> dict[str, Any]:
        job = self.get(name)
        return (job or {}).get("status") or {}

    def patch_spec(self, name: str, **spec: Any) -> None:
        self.custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, name, {"spec": spec})

    def observed(self, name: str, timeout: float = 30) -> dict[str, Any]:
        """Changes the spec harmlessly (backoffLimit + 1) and waits for the operator to record that
        generation: from then on, a pass has run that saw everything that happened before the call."""
        job = self.get(name) or {}
        limit = int((job.get("spec") or {}).get("backoffLimit", 3))
        patched = self.custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, name,
                                                             {"spec": {"backoffLimit": limit + 1}})
        generation = patched["metadata"]["generation"]
        return wait_until(lambda: (s := self.status(name)).get("observedGeneration", 0) >= generation and s,
                          timeout, f"{name}: the operator to observe generation {generation}")  # type: ignore[return-value]

    def delete(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, name)

    def wait_phase(self, name: str, phase: str, timeout: float = 30) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") == phase else None

        try:
            return wait_until(reached, timeout, f"{name} to reach phase {phase}")  # type: ignore[return-value]
        except AssertionError as error:
            raise AssertionError(f"{error}; status is {self.status(name)}") from None

    def wait_condition(self, name: str, type_: str, value: str, timeout: float = 30) -> dict[str, Any]:
        """The job's status once its condition `type_` has status `value`."""
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            found = [cond for cond in status.get("conditions") or [] if cond.get("type") == type_]
            return status if found and found[0].get("status") == value else None

        try:
            return wait_until(reached, timeout, f"{name}: condition {type_} {value}")  # type: ignore[return-value]
        except AssertionError as error:
            raise AssertionError(f"{error}; status is {self.status(name)}") from None

    def pods(self, name: str, include_deleting: bool = False) -> list[client.V1Pod]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{labels.LABEL_JOB_NAME}={name}").items
        return [p for p in pods if include_deleting or p.metadata.deletion_timestamp is None]

    def wait_pods(self, name: str, count: int, attempt: int | None = None, timeout: float = 30) -> list[client.V1Pod]:
        def settled() -> list[client.V1Pod] | None:
            pods = self.pods(name, include_deleting=True)
            if len(pods) != count or any(p.metadata.deletion_timestamp for p in pods):
                return None
            if attempt is not None and any(p.metadata.labels[labels.LABEL_ATTEMPT] != str(attempt) for p in pods):
                return None
            return pods

        return wait_until(settled, timeout, f"{count} pods of {name} (attempt {attempt})")  # type: ignore[return-value]

    def finish(self, pod: str, exit_code: int, reason: str | None = None, message: str | None = None) -> None:
        """Plays the kubelet: the trainer container of `pod` terminated with exit_code (and a termination message)."""
        status = pod_status(labels.CONTAINER_NAME, "trainer:test", exit_code, reason, message=message)
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})

    def hang(self, pod: str, rank: int, step: int, dumps: str) -> None:
        """Plays the kubelet reporting a rank the runtime ended as hung at `step` (stacks in `dumps`)."""
        status = hung_status(labels.CONTAINER_NAME, "trainer:test", rank, step, dumps)
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})

    def evict(self, pod: str) -> None:
        """Plays the kubelet evicting a pod under node pressure."""
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": evicted_status()})

    def quota(self, name: str, hard: dict[str, str], **spec: Any) -> None:
        """Creates a ResourceQuota and waits for the quota controller to count it: until status.used is
        filled in, the API server refuses nothing by it."""
        self.core.create_namespaced_resource_quota(self.namespace, {"metadata": {"name": name},
                                                                    "spec": {"hard": hard, **spec}})

        def counted() -> bool:
            found = self.core.read_namespaced_resource_quota(name, self.namespace).status
            return found is not None and found.used is not None

        wait_until(counted, 30, f"ResourceQuota {name} counted")

    def events(self, name: str) -> list[client.CoreV1Event]:
        return [e for e in self.core.list_namespaced_event(self.namespace).items if e.involved_object.name == name]


def glob_for(namespace: str) -> str:
    """A namespace glob that matches this namespace and none that only starts with its name (`<ns>-b`)."""
    return f"{namespace[:-1]}?"


def another_operator_acts(kube_api: Any, namespace: str, within: float = 5.0) -> bool:
    """Whether an operator this test did not start serves `namespace` (one of another test session on a
    shared cluster, from a checkout whose operator serves every namespace): a job there gets a status."""
    jobs = Jobs(kube_api, namespace)
    jobs.create("canary", worldSize=1)
    try:
        wait_until(lambda: jobs.status("canary"), within, "a status written by another operator")
    except AssertionError:
        return False
    finally:
        jobs.delete("canary")
    return True


def client_as(kube_api: client.ApiClient, namespace: str, account: str) -> client.ApiClient:
    """An API client holding a token of namespace/account, as a rank's pod would."""
    core = client.CoreV1Api(kube_api)
    token = core.create_namespaced_service_account_token(account, namespace, {"spec": {"expirationSeconds": 600}})
    configuration = client.Configuration()
    configuration.host = kube_api.configuration.host
    configuration.ssl_ca_cert = kube_api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token.status.token}"}
    return client.ApiClient(configuration)


def kubeconfig_of(kube_api: client.ApiClient, account: str, namespace: str, admin: str, tmp_path: Path) -> Path:
    """A kubeconfig that acts as the ServiceAccount (a token for an hour)."""
    token = client.CoreV1Api(kube_api).create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}).status.token
    config = yaml.safe_load(Path(admin).read_text())
    config["users"] = [{"name": "operator", "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = "operator"
    path = tmp_path / f"{account}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def env_of(pod_or_container: client.V1Pod | dict[str, Any]) -> dict[str, Any]:
    """A container's env by name: the trainer's given a pod (a V1Pod, or a dict as the API serializes
    one or the operator builds it), else the container's given (as a chart renders it). Each a plain
    value, else the field path a downward-API value reads, else its valueFrom (a Secret's key)."""
    body = pod_or_container
    if not isinstance(body, dict):
        body = client.ApiClient().sanitize_for_serialization(body)
    container = next(x for x in body["spec"]["containers"] if x["name"] == labels.CONTAINER_NAME) if "spec" in body else body
    env: dict[str, Any] = {}
    for item in container.get("env") or []:
        source = item.get("valueFrom")
        field = (source or {}).get("fieldRef", {}).get("fieldPath")
        env[item["name"]] = item["value"] if "value" in item else field or source
    return env


class PodLives:
    """Every pod object of one job (by uid: restarts reuse the names) and whether it was deleted."""

    def __init__(self, jobs: Jobs, name: str) -> None:
        self.attempt_of: dict[str, str] = {}
        self.deleted: set[str] = set()
        self.lock = threading.Lock()
        self.error: Exception | None = None
        self._jobs, self._name = jobs, name
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PodLives:
        self._thread.start()
        assert self._ready.wait(10), "the pod watch did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _watch(self) -> None:
        # The API server may end a watch early (a slow reader, a timeout): go on from the last event seen,
        # and keep any failure to report it at the next check instead of losing it with the thread.
        resource_version: str | None = None
        try:
            while not self._stop.is_set():
                resource_version = self._watch_from(resource_version)
        except Exception as exc:  # noqa: BLE001 - re-raised by the checks
            self.error = exc
        finally:
            self._ready.set()

    def _watch_from(self, resource_version: str | None) -> str | None:
        kwargs = {"resource_version": resource_version} if resource_version else {}
        response = self._jobs.core.list_namespaced_pod(
            self._jobs.namespace, label_selector=f"{labels.LABEL_JOB_NAME}={self._name}", watch=True,
            timeout_seconds=300, _preload_content=False, **kwargs)
        self._ready.set()
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                if event["type"] == "ERROR":
                    raise RuntimeError(f"the pod watch failed: {event['object'].get('message')}")
                meta = event["object"]["metadata"]
                resource_version = meta["resourceVersion"]
                with self.lock:
                    self.attempt_of[meta["uid"]] = meta["labels"][labels.LABEL_ATTEMPT]
                    if event["type"] == "DELETED" or meta.get("deletionTimestamp"):
                        self.deleted.add(meta["uid"])
                if self._stop.is_set():
                    break
        finally:
            response.release_conn()
        return resource_version

    def _check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the pod watch of {self._name} broke: {self.error!r}") from self.error

    def created(self) -> Counter[str]:
        """Pods created per attempt."""
        self._check()
        with self.lock:
            return Counter(self.attempt_of.values())

    def deleted_of(self, attempt: int) -> int:
        self._check()
        with self.lock:
            return sum(1 for uid in self.deleted if self.attempt_of[uid] == str(attempt))
