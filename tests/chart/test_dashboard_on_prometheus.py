"""The chart's Grafana dashboard evaluated by a real Prometheus: every panel's query, as Grafana sends it, draws a
series from the chart's operator scraped through the chart's own ServiceMonitor and PodMonitor.

The operator runs as the chart's pod on the local cluster's real node (its image, its RBAC, leader election);
its job's ranks are on kwok's fake nodes, where the test plays the kubelet (a rank that fails, for a gang
restart) and rank 0 (its progress, written with the trainer's own status sink). Prometheus (localcluster/
prometheus.sh's build, on loopback) scrapes it with scrape configs that tests/prometheus.py translates from the
monitors `helm template` renders, as the Prometheus Operator's config generation writes them: running the
Prometheus Operator itself would take one more large Go build, its CRDs and a Prometheus object only to write
that file. Both monitors at once, so the dashboard is evaluated for each one's `job` label. The operator serves
another namespace than its own, so the training panels' `namespace` label is the DDPJob's only if the
monitors' honorLabels reaches Prometheus.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from chart.test_grafana_dashboard import load, panels
from ddp_operator import constants as c
from ddp_operator.endpoints import Endpoint, Health
from ddp_trainer.jobstatus import JobStatusSink
from helmchart import CHART, Helm, helm_for, offline_helm, ready_operators
from kube import Cluster, Jobs, own_namespace_in, wait_until
from procs import is_loopback, listening_addresses
from prometheus import Prometheus, UnsupportedMonitor, prometheus, scrape_configs, wait_for_targets

RELEASE = "ddp-operator"
# The monitors' scrape interval, and the data source's "scrape interval" in Grafana, which $__rate_interval uses.
SCRAPE_SECONDS = 2  # the scrape timeout too: room for a busy node's answer
MONITORS = {"PodMonitor": "podMonitor", "ServiceMonitor": "serviceMonitor"}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
GRAFANA_REGEX_SPECIALS = re.compile(r"([\\^$.|?*+()\[\]{}])")


# --- what Grafana sends ------------------------------------------------------------------------------------------
def rate_interval(step: float, scrape: float) -> float:
    """Grafana's $__rate_interval: max($__interval + the data source's scrape interval, 4 x that interval)."""
    return max(step + scrape, 4 * scrape)


def regex_value(values: list[str]) -> str:
    """A multi-value variable in a regex matcher, as Grafana's Prometheus data source writes it: each value
    escaped (a backslash doubled inside the PromQL string), several in (a|b)."""
    escaped = [GRAFANA_REGEX_SPECIALS.sub(r"\\\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else f"({'|'.join(escaped)})"


def interpolate(expr: str, variables: dict[str, str]) -> str:
    """The query with the dashboard's variables and Grafana's built-ins replaced; an unknown one fails, named."""
    def value(found: re.Match[str]) -> str:
        name = found.group(1) or found.group(2)
        if name not in variables:
            raise AssertionError(f"{expr!r} uses ${name}, which this test does not give a value")
        return variables[name]

    return VARIABLE.sub(value, expr)


def label_values_query(variable: dict[str, Any]) -> tuple[str, str]:
    """(selector, label) of a label_values(<selector>, <label>) query variable."""
    query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
    found = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
    assert found, f"variable {variable['name']}: {query!r} is not label_values(<selector>, <label>)"
    return found.group(1), found.group(2)


def draws(series: list[dict[str, Any]]) -> bool:
    """Whether a matrix has a point Grafana would draw (NaN, from 0/0 or a quantile of no rate, is drawn as nothing)."""
    return any(not math.isnan(float(v)) for s in series for _, v in s["values"])


def panel_failures(server: Prometheus, dashboard: dict[str, Any], variables: dict[str, str], start: float,
                   end: float) -> list[str]:
    """Each panel query that returns no series, only NaN, or series without a label its legend shows."""
    failures = []
    for panel in panels(dashboard):
        for target in panel["targets"]:
            where = f"panel {panel['title']!r} {target['refId']}"
            expr = interpolate(target["expr"], variables)
            series = server.query_range(expr, start, end, SCRAPE_SECONDS)
            if not series:
                failures.append(f"{where}: no series for {expr}")
            elif not draws(series):
                failures.append(f"{where}: only NaN for {expr}")
            for label in LEGEND_LABEL.findall(target.get("legendFormat", "")):
                if any(label not in s["metric"] for s in series):
                    failures.append(f"{where}: legend {{{{{label}}}}} is not a label of {expr}: "
                                    f"{[s['metric'] for s in series]}")
    return failures


# --- the chart's monitors ----------------------------------------------------------------------------------------
def rendered_monitor(helm: Helm, kind: str, namespace: str, *values: str) -> dict[str, Any]:
    """The chart's ServiceMonitor or PodMonitor as the release would create it, from `helm template`."""
    key = MONITORS[kind]
    docs = yaml.safe_load_all(helm("template", RELEASE, str(CHART), "-n", namespace, *values,
                                   "--set", f"metrics.{key}.enabled=true",
                                   "--set", f"metrics.{key}.interval={SCRAPE_SECONDS}s").stdout)
    found = [doc for doc in docs if doc and doc["kind"] == kind]
    assert len(found) == 1, f"the chart rendered {len(found)} {kind}s"
    return found[0]


@pytest.fixture
def offline() -> Helm:
    found = offline_helm()
    if found is None:
        pytest.fail("no helm: neither localcluster/cluster.sh's build (`make cluster-build`) nor one on PATH")
    return found


def test_the_monitors_become_the_prometheus_operators_scrape_configs(offline: Helm) -> None:
    values = ("--set", "metrics.service.enabled=true")
    pod = scrape_configs(rendered_monitor(offline, "PodMonitor", "ops", *values), "/k")
    service = scrape_configs(rendered_monitor(offline, "ServiceMonitor", "ops", *values), "/k")
    assert [config["job_name"] for config in pod + service] == [
        f"podMonitor/ops/{RELEASE}/0", f"serviceMonitor/ops/{RELEASE}/0"]
    for config, role in ((pod[0], "pod"), (service[0], "endpoints")):
        assert config["kubernetes_sd_configs"] == [{"role": role, "kubeconfig_file": "/k", "namespaces": {"names": ["ops"]}}]
        assert config["honor_labels"] is True
        assert (config["scrape_interval"], config["metrics_path"]) == (f"{SCRAPE_SECONDS}s", "/metrics")
    keeps = [(r["source_labels"][0], r["regex"]) for r in pod[0]["relabel_configs"] if r.get("action") == "keep"]
    assert ("__meta_kubernetes_pod_label_app_kubernetes_io_name", "(ddp-operator);true") in keeps
    assert ("__meta_kubernetes_pod_container_port_name", "metrics") in keeps
    assert {"target_label": "job", "replacement": f"ops/{RELEASE}"} in pod[0]["relabel_configs"]
    assert {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"} in \
        service[0]["relabel_configs"]


def test_a_monitor_field_the_translation_does_not_know_is_refused_by_name(offline: Helm) -> None:
    monitor = rendered_monitor(offline, "PodMonitor", "ops")
    monitor["spec"]["podMetricsEndpoints"][0]["tlsConfig"] = {"insecureSkipVerify": True}
    with pytest.raises(UnsupportedMonitor, match=r"spec\.podMetricsEndpoints\[0\]\.tlsConfig"):
        scrape_configs(monitor, "/k")
    monitor = rendered_monitor(offline, "ServiceMonitor", "ops", "--set", "metrics.service.enabled=true")
    monitor["spec"]["selector"]["matchExpressions"] = [{"key": "a", "operator": "Exists"}]
    with pytest.raises(UnsupportedMonitor, match=r"spec\.endpoints\[0\]\.selector\.matchExpressions"):
        scrape_configs(monitor, "/k")


@pytest.mark.parametrize("expr, variables, sent", [
    ('rate(a{job=~"$job"}[$__rate_interval])', {"job": "x", "__rate_interval": "4s"}, 'rate(a{job=~"x"}[4s])'),
    ('b{job=~"${job}", ns=~"$namespace"}', {"job": regex_value(["p/q", "r.s"]), "namespace": "n"},
     'b{job=~"(p/q|r\\\\.s)", ns=~"n"}'),
])
def test_queries_are_sent_as_grafana_sends_them(expr: str, variables: dict[str, str], sent: str) -> None:
    assert interpolate(expr, variables) == sent
    assert rate_interval(1, 1) == 4 and rate_interval(30, 15) == 60


def panel(title: str, expr: str, legend: str = "") -> dict[str, Any]:
    return {"type": "timeseries", "title": title, "targets": [{"refId": "A", "expr": expr, "legendFormat": legend}]}


def test_a_query_that_draws_nothing_is_named_with_its_panel() -> None:
    """The check itself, against Prometheus scraping this process's operator endpoint (its metrics registry):
    a query of a metric that does not exist, one that is NaN throughout and a legend label the series lack
    are each named; a query that draws passes."""
    endpoint = Endpoint("127.0.0.1", 0, Health())
    endpoint.start()
    config = {"job_name": "unit", "scrape_interval": f"{SCRAPE_SECONDS}s",
              "static_configs": [{"targets": [f"127.0.0.1:{endpoint.port}"]}]}
    try:
        with prometheus([config]) as server:
            started = time.time()
            wait_until(lambda: server.query('count_over_time(ddp_operator_leader{job="unit"}[1m]) >= 3'), 30,
                       "three scrapes of the operator's endpoint")
            dashboard = {"panels": [
                panel("Leader", 'max by (instance) (ddp_operator_leader{job=~"$job"})', "{{instance}}"),
                panel("Misspelt", 'sum(rate(ddp_operator_pods_creatd_total{job=~"$job"}[$__rate_interval]))'),
                panel("No rate", 'histogram_quantile(0.5, sum by (le) '
                                 '(rate(ddp_operator_time_to_running_seconds_bucket{job=~"$job"}[$__rate_interval])))'),
                panel("Unlabelled", 'ddp_operator_leader{job=~"$job"}', "{{pod}}"),
            ]}
            failures = panel_failures(server, dashboard, {"job": "unit", "__rate_interval": "4s"}, started, time.time())
    finally:
        endpoint.stop()
    assert [f.split(": ")[0] for f in failures] == ["panel 'Misspelt' A", "panel 'No rate' A", "panel 'Unlabelled' A"]
    assert failures[0].endswith('no series for sum(rate(ddp_operator_pods_creatd_total{job=~"unit"}[4s]))'), failures
    assert "only NaN" in failures[1] and "legend {{pod}}" in failures[2], failures


# --- the dashboard on Prometheus ---------------------------------------------------------------------------------
@pytest.fixture
def jobs_namespace(kube_api) -> Iterator[str]:
    """The namespace the release serves: not its own."""
    with own_namespace_in(kube_api) as name:
        yield name


@pytest.mark.node
@pytest.mark.images
@pytest.mark.timeout(600)
def test_every_panel_draws_from_prometheus_scraping_the_charts_monitors(
        cluster: Cluster, kube_api, crd: None, images_on_the_node: None, own_namespace: str,
        jobs_namespace: str) -> None:
    helm = helm_for(cluster)
    values = ("--set", f"watchNamespaces={{{jobs_namespace}}}", "--set", "metrics.service.enabled=true")
    monitors = [rendered_monitor(helm, kind, own_namespace, *values) for kind in MONITORS]
    configs = [config for monitor in monitors for config in scrape_configs(monitor, cluster.kubeconfig)]
    dashboard = load()
    with prometheus(configs) as server:
        listening = listening_addresses([server.process.pid])
        assert listening and all(is_loopback(a) for a in listening), listening
        helm("install", RELEASE, str(CHART), "-n", own_namespace, "--skip-crds", *values)
        try:
            evaluate_while_a_job_runs(server, dashboard, kube_api, own_namespace, jobs_namespace,
                                      [config["job_name"] for config in configs])
        finally:
            helm("uninstall", RELEASE, "-n", own_namespace, check=False)
    assert server.process.poll() is not None and not server.folder.exists()


def evaluate_while_a_job_runs(server: Prometheus, dashboard: dict[str, Any], kube_api: Any, release_namespace: str,
                              jobs_namespace: str, scrape_jobs: list[str]) -> None:
    started = time.time()
    operator = wait_until(lambda: ready_operators(Jobs(kube_api, release_namespace)), 180,
                          "the operator's pod to be Ready")[0]  # type: ignore[index]
    targets = wait_for_targets(server, scrape_jobs)
    assert {t["scrapeUrl"] for t in targets} == {f"http://{operator.status.pod_ip}:8080/metrics"}, targets

    jobs = Jobs(kube_api, jobs_namespace)
    # A short grace: kwok removes a deleted pod at a random moment within it, and the restart waits for that.
    jobs.create("watched", worldSize=2, backoffLimit=2, template={"spec": {"terminationGracePeriodSeconds": 1}})
    jobs.wait_phase("watched", c.PHASE_RUNNING, timeout=120)
    window = f"{rate_interval(SCRAPE_SECONDS, SCRAPE_SECONDS):g}s"

    def scraped(expr: str) -> bool:
        return len(server.query(f"count by (job) ({expr})")) == len(scrape_jobs)

    # The reconcile passes' series are born with the job's first: scraped before the restart's passes, a
    # rate over them shows those.
    wait_until(lambda: scraped("ddp_operator_reconcile_seconds_count"), 60, "Prometheus to scrape the reconcile passes")
    JobStatusSink(jobs_namespace, "watched", api_client=kube_api)(
        {"epoch": 1, "step": 40, "samplesPerSecond": 512.5, "stepSeconds": 0.125})
    jobs.finish("watched-1", 1)  # a program failure: the gang restarts
    jobs.wait_pods("watched", 2, attempt=1, timeout=120)
    jobs.wait_phase("watched", c.PHASE_RUNNING, timeout=120)
    # What the job did, scraped twice within $__rate_interval by each monitor's job, for a rate to have two
    # points (a busy node answers some scrapes late, and a scrape past its timeout leaves a gap), the
    # restart's reconcile passes within one such window.
    for metric in ("ddp_operator_gang_restarts_total", "ddp_operator_job_samples_per_second"):
        wait_until(lambda: scraped(f"count_over_time({metric}[{window}]) >= 2"), 60,
                   f"Prometheus to scrape {metric} twice within {window} from each of {scrape_jobs}")
    wait_until(lambda: scraped(f"increase(ddp_operator_reconcile_seconds_count[{window}]) > 0"), 60,
               f"Prometheus to see reconcile passes within {window} from each of {scrape_jobs}")
    end = time.time()
    # The range's points are start + k * step: aligned on `end`, the last one is the moment just awaited.
    started = end - math.ceil((end - started) / SCRAPE_SECONDS) * SCRAPE_SECONDS

    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    job_selector, job_label = label_values_query(variables["job"])
    found_jobs = server.label_values(job_label, job_selector, started, end)
    assert found_jobs == sorted({f"{release_namespace}/{RELEASE}", f"{RELEASE}-metrics"}), found_jobs
    step = SCRAPE_SECONDS
    failures = []
    for job in found_jobs:
        given = {"job": regex_value([job]), "__rate_interval": f"{rate_interval(step, SCRAPE_SECONDS):g}s"}
        ns_selector, ns_label = label_values_query(variables["namespace"])
        namespaces = server.label_values(ns_label, interpolate(ns_selector, given), started, end)
        assert namespaces == [jobs_namespace], f"job {job}: the namespace variable offers {namespaces}"
        given["namespace"] = regex_value(namespaces)
        failures += [f"job {job}: {failure}" for failure in panel_failures(server, dashboard, given, started, end)]
    assert not failures, "\n".join(failures)
