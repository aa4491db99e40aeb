"""The chart's Grafana dashboard: its structure, every query naming a metric the operator really serves on
/metrics, and the opt-in ConfigMap and PodMonitor (no cluster needed; the chart parts need helm)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from ddp_operator import constants as c
from ddp_operator import metrics
from ddp_operator.endpoints import METRICS_PATH, Endpoint, Health
from helmchart import CHART, Helm, offline_helm, render

DASHBOARD = CHART / "dashboards" / "ddp-operator.json"
DATASOURCE = "${datasource}"
# The series a family's samples are named by, by its type: a labelled family with no child yet shows only its
# TYPE line. (prometheus_client's `_created` series, a child's, come as gauge families of their own.)
SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
          "summary": ("", "_count", "_sum"), "info": ("_info",)}
RUNNING_JOB = {"metadata": {"namespace": "team-a", "name": "train"},
               "status": {"phase": c.PHASE_RUNNING, "progress": {"samplesPerSecond": 812.5, "stepSeconds": 0.2}}}

# --- metric names in PromQL --------------------------------------------------------------------------------------
STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
VARIABLES = re.compile(r"\$(?:\{[^}]*\}|\w+)")  # Grafana's: $__rate_interval, ${datasource}, $job
MATCHERS = re.compile(r"\{[^{}]*\}")
RANGES = re.compile(r"\[[^\[\]]*\]")  # [5m], [1h:1m]
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE)
NUMBERS = re.compile(r"(?<![\w:])\d[\w.]*")  # 0.99, 1e3, offset 1h30m
IDENTIFIER = re.compile(r"[A-Za-z_:][\w:]*")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
            "inf", "nan", "atan2"}
LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers, less string literals, label matchers,
    ranges, grouping labels, numbers, functions and aggregations (an identifier before a parenthesis) and keywords."""
    rest = STRINGS.sub(" ", expr)
    for pattern in (VARIABLES, MATCHERS, RANGES, GROUPING, NUMBERS):
        rest = pattern.sub(" ", rest)
    return {m.group() for m in IDENTIFIER.finditer(rest)
            if m.group().lower() not in KEYWORDS and not rest[m.end():].lstrip().startswith("(")}


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows too, rows left out."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable (label_values' selector)."""
    for panel in panels(dashboard):
        for target in panel["targets"]:
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            found = LABEL_VALUES.match(query)
            assert found, f"variable {variable['name']}: {query!r} is not label_values(<selector>, <label>)"
            yield f"variable {variable['name']!r}", found.group(1)


@pytest.fixture(scope="module")
def exported() -> dict[str, str]:
    """Series name -> its family's name, for every series the operator serves on /metrics, read as Prometheus
    reads it: the operator's registry with its job collector (fed one Running job), through its own endpoint."""
    collector = metrics.JobCollector(lambda: [RUNNING_JOB])
    REGISTRY.register(collector)
    endpoint = Endpoint("127.0.0.1", 0, Health())
    endpoint.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}{METRICS_PATH}", timeout=10) as response:
            text = response.read().decode()
    finally:
        endpoint.stop()
        REGISTRY.unregister(collector)
    names: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SERIES.get(family.type, ("",)):
            names.setdefault(family.name + suffix, family.name)
        for sample in family.samples:
            names.setdefault(sample.name, family.name)
    return names


def unknown(expr: str, exported: dict[str, str]) -> list[str]:
    return sorted(metric_names(expr) - exported.keys())


# --- the extractor -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("expr, names", [
    ('sum by (phase) (ddp_operator_jobs{job=~"$job"})', {"ddp_operator_jobs"}),
    ('histogram_quantile(0.99, sum by (queue, le) (rate(ddp_operator_reconcile_seconds_bucket[$__rate_interval])))',
     {"ddp_operator_reconcile_seconds_bucket"}),
    ('sum(rate(a_sum[1h])) / sum(rate(a_count[1h:5m] offset 1h30m)) * 100', {"a_sum", "a_count"}),
    ('rate(process_cpu_seconds_total{job=~"$job"}[5m]) and on (job, instance) ddp_operator_leader', {
        "process_cpu_seconds_total", "ddp_operator_leader"}),
    ('sum without (pod) (x{code!~"2..", name="not_a_metric{}"}) > bool 0 unless ON(le) y', {"x", "y"}),
    ('max(a) by (le) or count_values("b", c) + topk(5, d{e="f"}) AND group_left(g) h', {"a", "c", "d", "h"}),
])
def test_the_extractor_finds_the_metric_names_only(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_a_misspelt_or_suffixless_metric_is_named(exported: dict[str, str]) -> None:
    expr = 'histogram_quantile(0.9, sum by (le) (rate(ddp_operator_time_to_runing_seconds_bucket{job=~"$job"}[5m])))'
    assert unknown(expr, exported) == ["ddp_operator_time_to_runing_seconds_bucket"]
    # A counter or histogram is served by its samples' names, never its family's.
    assert unknown("rate(ddp_operator_pods_created[5m]) + ddp_operator_time_to_running_seconds", exported) == [
        "ddp_operator_pods_created", "ddp_operator_time_to_running_seconds"]
    assert unknown("rate(ddp_operator_pods_created_total[5m]) + ddp_operator_gang_restarts_total", exported) == []


# --- the dashboard -----------------------------------------------------------------------------------------------
def test_the_dashboard_is_well_formed_and_every_panel_asks_the_chosen_datasource() -> None:
    dashboard = load()
    assert dashboard["uid"] == "ddp-operator" and dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert {"job", "namespace"} <= variables.keys()
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"]["uid"] == DATASOURCE, variable["name"]
    every = [*dashboard["panels"], *(p for row in dashboard["panels"] for p in row.get("panels", []))]
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), ids
    for panel in panels(dashboard):
        where = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE}, where
        assert panel["targets"], where
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys() and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, where
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"{where} {target['refId']}"
            assert target.get("datasource", panel["datasource"])["uid"] == DATASOURCE, f"{where} {target['refId']}"


def test_every_query_names_only_metrics_the_operator_exports(exported: dict[str, str]) -> None:
    found = {}
    for where, expr in queries(load()):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        found[where] = unknown(expr, exported)
    assert {where: names for where, names in found.items() if names} == {}


def test_every_query_selects_the_operators_job() -> None:
    """Each selector of an operator metric carries the $job matcher (the job variable's own query aside);
    process_* metrics, which every Python target exports, are kept to the targets exporting ddp_operator_leader."""
    for where, expr in queries(load()):
        for name in metric_names(expr):
            if not name.startswith(f"{metrics.NAMESPACE}_"):
                assert re.search(r"\band on \(job, instance\) ddp_operator_leader\b", expr), f"{where}: {expr}"
            elif where != "variable 'job'":
                matchers = re.findall(rf"(?<![\w:]){name}(?![\w:])(\{{[^}}]*\}})?", expr)
                assert matchers and all('job=~"$job"' in m for m in matchers), f"{where}: {expr}"


def test_every_metric_the_operator_defines_has_a_panel(exported: dict[str, str]) -> None:
    families = set(exported.values())
    defined = {f for f in families if f.startswith(f"{metrics.NAMESPACE}_")
               and not (f.endswith("_created") and f.removesuffix("_created") in families)}
    shown = {exported.get(name) for _, expr in queries(load()) for name in metric_names(expr)}
    assert defined - shown == set()


# --- the chart ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def helm() -> Helm:
    found = offline_helm()
    if found is None:
        pytest.fail("no helm: neither localcluster/cluster.sh's build (`make cluster-build`) nor one on PATH")
    return found


def test_the_dashboard_and_the_pod_monitor_are_off_by_default(helm: Helm) -> None:
    assert not {"ConfigMap", "PodMonitor"} & set(render(helm))


def test_the_dashboard_configmap_carries_the_sidecars_label_and_the_dashboard(helm: Helm) -> None:
    objects = render(helm, "--set", "grafana.dashboard.enabled=true")
    configmap = objects["ConfigMap"]
    assert configmap["metadata"]["namespace"] == "ops" and configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in configmap["metadata"]
    assert configmap["data"].keys() == {"ddp-operator.json"}
    assert configmap["data"]["ddp-operator.json"] == DASHBOARD.read_text().rstrip("\n")
    assert json.loads(configmap["data"]["ddp-operator.json"]) == load()

    moved = render(helm, "--set", "grafana.dashboard.enabled=true", "--set", "grafana.dashboard.namespace=monitoring",
                   "--set-json", 'grafana.dashboard.labels={"grafana_dashboard": null, "dashboards": "ddp"}',
                   "--set", "grafana.dashboard.annotations.grafana_folder=DDP")["ConfigMap"]["metadata"]
    assert moved["namespace"] == "monitoring" and moved["annotations"] == {"grafana_folder": "DDP"}
    assert moved["labels"]["dashboards"] == "ddp" and "grafana_dashboard" not in moved["labels"]


def test_the_pod_monitor_scrapes_the_operator_pods_metrics_port(helm: Helm) -> None:
    objects = render(helm, "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.podMonitor.interval=15s",
                     "--set", "metrics.podMonitor.labels.release=prom")
    monitor = objects["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["metadata"]["namespace"] == "ops"
    deployment = objects["Deployment"]["spec"]
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["selector"]["matchLabels"]
    # honorLabels: the job gauges keep their own namespace label (the DDPJob's), which the dashboard filters by.
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s",
                                                       "honorLabels": True}]
    container = deployment["template"]["spec"]["containers"][0]
    assert any(port["name"] == "metrics" for port in container["ports"])
    assert "Service" not in objects and "ServiceMonitor" not in objects

    service_monitor = render(helm, "--set", "metrics.service.enabled=true", "--set", "metrics.serviceMonitor.enabled=true")
    assert service_monitor["ServiceMonitor"]["spec"]["endpoints"][0]["honorLabels"] is True
    both = helm("template", "rel", str(CHART), "--set", "metrics.service.enabled=true", "--set",
                "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true", check=False)
    assert both.returncode != 0 and "scrape the same pods twice" in both.stderr, both.stderr


@pytest.mark.parametrize("setting, named", [
    ("grafana.bogus=1", "'bogus' not allowed"),
    ("grafana.dashboard.bogus=1", "'bogus' not allowed"),
    ("grafana.dashboard.enabled=maybe", "enabled"),
    ("grafana.dashboard.namespace=Not_A_Namespace", "namespace"),
    ("metrics.podMonitor.interval=soon", "interval"),
    ("metrics.podMonitor.bogus=1", "'bogus' not allowed"),
])
def test_schema_refuses_unknown_and_bad_values(helm: Helm, setting: str, named: str) -> None:
    refused = helm("template", "rel", str(CHART), "--set", setting, check=False)
    assert refused.returncode != 0 and named in refused.stderr, refused.stderr
