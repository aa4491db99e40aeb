"""A real Prometheus on loopback for the tests, scraping what the chart's ServiceMonitor or PodMonitor selects.

Prometheus reads scrape configs, not ServiceMonitor or PodMonitor objects: the Prometheus Operator turns each
into a scrape config. Rather than run the Prometheus Operator (one more large Go build, its CRDs and a
Prometheus object, to produce a config file), `scrape_config` translates a rendered monitor itself, the way
prometheus-operator's generateServiceMonitorConfig and generatePodMonitorConfig do (pkg/prometheus/promcfg.go:
the same job name, kubernetes_sd_configs role and namespaces, and relabelings, less the sharding rule, which
keeps every target with one shard), for the fields the chart's monitors use; any other field is refused by
name, so a monitor the translation would get wrong fails loudly instead. Service discovery asks the test
cluster's API server with its kubeconfig.

`prometheus` runs localcluster/prometheus.sh's build (Prometheus's module, pinned in localcluster/go/prometheus)
with that config, listening on 127.0.0.1 only, in a folder of its own; it stops when the context ends or the
process that started it dies (PR_SET_PDEATHSIG), and its folder goes with it.
"""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kube import REPO, wait_until
from ports import free_port

SCRIPT = REPO / "localcluster" / "prometheus.sh"
START_SECONDS = 60.0
STOP_SECONDS = 10.0

# The fields of a monitor the translation knows; anything else is refused (UnsupportedMonitor).
MONITOR_SPEC_FIELDS = {"ServiceMonitor": {"selector", "namespaceSelector", "endpoints"},
                       "PodMonitor": {"selector", "namespaceSelector", "podMetricsEndpoints"}}
ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "honorLabels", "scheme"}
SELECTOR_FIELDS = {"matchLabels"}
NAMESPACE_SELECTOR_FIELDS = {"matchNames", "any"}
# Endpoints, prometheus-operator's default discovery role for a ServiceMonitor (a Prometheus object's
# serviceDiscoveryRole: EndpointSlice changes it).
SERVICE_ROLE = "endpoints"
INVALID_LABEL_CHARACTERS = re.compile(r"[^a-zA-Z0-9_]")


class UnsupportedMonitor(ValueError):
    """A monitor with a field the translation does not know; the message names the field."""


class PrometheusError(RuntimeError):
    """Prometheus did not start, or its API answered an error; the message says which, with its log's end."""


# --- monitor to scrape config ------------------------------------------------------------------------------------
def _sanitized(label: str) -> str:
    return INVALID_LABEL_CHARACTERS.sub("_", label)


def _refuse_unknown(found: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(found) - known)
    if unknown:
        raise UnsupportedMonitor(f"{where}.{unknown[0]}: not translated into a scrape config by tests/prometheus.py "
                                 f"(it knows {', '.join(sorted(known))})")


def _selector_keeps(selector: Mapping[str, Any], meta: str, where: str) -> list[dict[str, Any]]:
    """A keep rule per matchLabels entry, sorted by key, as prometheus-operator writes them."""
    _refuse_unknown(selector, SELECTOR_FIELDS, f"{where}.selector")
    return [{"action": "keep",
             "source_labels": [f"__meta_kubernetes_{meta}_label_{_sanitized(key)}",
                               f"__meta_kubernetes_{meta}_labelpresent_{_sanitized(key)}"],
             "regex": f"({value});true"}
            for key, value in sorted((selector.get("matchLabels") or {}).items())]


def _namespaces(spec: Mapping[str, Any], own: str, where: str) -> dict[str, Any]:
    """kubernetes_sd_configs' namespaces: the monitor's own by default, matchNames, or all with `any`."""
    selector = spec.get("namespaceSelector") or {}
    _refuse_unknown(selector, NAMESPACE_SELECTOR_FIELDS, f"{where}.namespaceSelector")
    if selector.get("any"):
        return {}
    return {"namespaces": {"names": list(selector.get("matchNames") or [own])}}


def _endpoint_settings(endpoint: Mapping[str, Any], where: str) -> dict[str, Any]:
    _refuse_unknown(endpoint, ENDPOINT_FIELDS, where)
    if not endpoint.get("port"):
        raise UnsupportedMonitor(f"{where}.port: missing; the translation selects the endpoint by port name")
    settings: dict[str, Any] = {"honor_labels": bool(endpoint.get("honorLabels", False))}
    for field, key in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout"), ("path", "metrics_path"),
                       ("scheme", "scheme")):
        if endpoint.get(field):
            settings[key] = endpoint[field]
    return settings


RUNNING_FILTER = {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}
JOB_NAME_TO_TMP = {"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}


def _pod_monitor_config(monitor: Mapping[str, Any], index: int, endpoint: Mapping[str, Any],
                        kubeconfig: str) -> dict[str, Any]:
    meta, spec = monitor["metadata"], monitor["spec"]
    where = f"PodMonitor {meta['name']}: spec.podMetricsEndpoints[{index}]"
    settings = _endpoint_settings(endpoint, where)
    port = endpoint["port"]
    relabel = [JOB_NAME_TO_TMP, RUNNING_FILTER, *_selector_keeps(spec.get("selector") or {}, "pod", where),
               {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port},
               {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
               {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
               {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
               {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
               {"target_label": "endpoint", "replacement": port}]
    return {"job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}", **settings,
            "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": kubeconfig,
                                       **_namespaces(spec, meta["namespace"], where)}],
            "relabel_configs": relabel}


def _service_monitor_config(monitor: Mapping[str, Any], index: int, endpoint: Mapping[str, Any],
                            kubeconfig: str) -> dict[str, Any]:
    meta, spec = monitor["metadata"], monitor["spec"]
    where = f"ServiceMonitor {meta['name']}: spec.endpoints[{index}]"
    settings = _endpoint_settings(endpoint, where)
    port = endpoint["port"]
    target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    relabel = [JOB_NAME_TO_TMP, *_selector_keeps(spec.get("selector") or {}, "service", where),
               {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port},
               {"source_labels": target, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}",
                "target_label": "node"},
               {"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}",
                "target_label": "pod"},
               {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
               {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
               {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
               {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
               RUNNING_FILTER,
               {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
               {"target_label": "endpoint", "replacement": port}]
    return {"job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{index}", **settings,
            "kubernetes_sd_configs": [{"role": SERVICE_ROLE, "kubeconfig_file": kubeconfig,
                                       **_namespaces(spec, meta["namespace"], where)}],
            "relabel_configs": relabel}


def scrape_configs(monitor: Mapping[str, Any], kubeconfig: str) -> list[dict[str, Any]]:
    """The scrape configs the Prometheus Operator makes of a rendered ServiceMonitor or PodMonitor, one per
    endpoint, discovering targets through the API server of `kubeconfig`."""
    kind = monitor.get("kind", "")
    if kind not in MONITOR_SPEC_FIELDS:
        raise UnsupportedMonitor(f"kind {kind!r}: expected a ServiceMonitor or a PodMonitor")
    spec = monitor.get("spec") or {}
    _refuse_unknown(spec, MONITOR_SPEC_FIELDS[kind], f"{kind} {monitor['metadata']['name']}: spec")
    if kind == "PodMonitor":
        return [_pod_monitor_config(monitor, i, ep, kubeconfig) for i, ep in enumerate(spec.get("podMetricsEndpoints") or [])]
    return [_service_monitor_config(monitor, i, ep, kubeconfig) for i, ep in enumerate(spec.get("endpoints") or [])]


# --- the server --------------------------------------------------------------------------------------------------
def binary() -> Path:
    """The pinned Prometheus, built on first use (localcluster/prometheus.sh; `make test` builds it first)."""
    result = subprocess.run(["bash", str(SCRIPT), "bin"], capture_output=True, text=True)
    if result.returncode != 0:
        raise PrometheusError(f"localcluster/prometheus.sh bin failed:\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Prometheus:
    """A running Prometheus: its HTTP API at `url`, its process and folder (config, TSDB, log)."""

    url: str
    process: subprocess.Popen[bytes]
    folder: Path

    @property
    def log(self) -> Path:
        return self.folder / "prometheus.log"

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """GET /api/v1/<path>: its `data`, or PrometheusError with the error Prometheus gave."""
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:  # 400 or 422: a query it could not parse or run
            body = json.load(error)
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The matrix of a range query, as Grafana's time series panels ask it."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}s")
        return list(data["result"])

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """What Grafana's label_values(<match>, <label>) asks: /api/v1/label/<label>/values with match[]."""
        return sorted(self.api(f"label/{label}/values", **{"match[]": [match]}, start=f"{start:.3f}", end=f"{end:.3f}"))

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str, process: subprocess.Popen[bytes]) -> bool:
    if process.poll() is not None:
        return True  # said by the caller
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:  # not listening yet, or 503 while it starts
        return False


@contextmanager
def prometheus(configs: Sequence[Mapping[str, Any]]) -> Iterator[Prometheus]:
    """Prometheus with these scrape configs on 127.0.0.1 (a free port), yielded once it is ready; stopped,
    and its folder removed, when the context ends."""
    executable = binary()
    folder = Path(tempfile.mkdtemp(prefix="ddp-prometheus-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        (folder / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": list(configs)}, sort_keys=False))
        url = f"http://127.0.0.1:{free_port()}"
        args = [str(executable), f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address={url.removeprefix('http://')}"]
        with open(folder / "prometheus.log", "wb") as log:
            process = subprocess.Popen(args, cwd=folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       preexec_fn=_die_with_parent)
        server = Prometheus(url, process, folder)
        wait_until(lambda: _ready(url, process), START_SECONDS, f"Prometheus at {url} to be ready")
        if process.poll() is not None:
            raise PrometheusError(f"Prometheus exited with code {process.returncode}:\n{server.tail()}")
        yield server
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(folder, ignore_errors=True)


def wait_for_targets(server: Prometheus, jobs: Sequence[str], timeout: float = 60) -> list[dict[str, Any]]:
    """The active targets once each scrape job (job_name) has one that is up."""
    def all_up() -> list[dict[str, Any]] | None:
        targets = server.active_targets()
        up = {t["scrapePool"] for t in targets if t["health"] == "up"}
        return targets if set(jobs) <= up else None

    try:
        return wait_until(all_up, timeout, f"Prometheus to scrape {', '.join(jobs)}", interval=0.5)  # type: ignore[return-value]
    except AssertionError as error:
        seen = [(t["scrapePool"], t["scrapeUrl"], t["health"], t["lastError"]) for t in server.active_targets()]
        raise AssertionError(f"{error}; its active targets: {seen}\n{server.tail()}") from None
