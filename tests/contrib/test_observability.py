"""contrib/observability: the Prometheus scrape configuration and the Grafana dashboard.

The dashboard must be valid JSON that names only metrics the server exports: every PromQL expression's metric names
are checked against the names `spinf.server.metrics.Metrics` registers (as the text format writes them: ``_total`` for
counters, ``_bucket``, ``_sum`` and ``_count`` for histograms) and, in the slow run, against a running tiny
server's ``/metrics``. The one exception is GPU memory, which the server does not export: it comes from NVIDIA's
dcgm-exporter, and only the names listed in `DCGM_METRICS` may be used, from the job the scrape configuration has.
The scrape configuration is checked by Debian's ``promtool`` (the ``prometheus`` package; .ci/run installs it),
which is built without Kubernetes discovery, so that job is checked with static targets in its place, and its
relabelling is replayed here on the labels and annotations of contrib/kubernetes/deployment.yaml.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from contrib.loadtest.harness import ServerProcess, score_body
from spinf.server.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "contrib" / "observability"
DASHBOARD = HERE / "grafana-dashboard.json"
PROMETHEUS = HERE / "prometheus.yml"
DEPLOYMENT = ROOT / "contrib" / "kubernetes" / "deployment.yaml"
DCGM_JOB = "dcgm-exporter"
DCGM_METRICS = frozenset({"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"})  # dcgm-exporter's frame-buffer MiB
# what the issue asks the dashboard to show, as words its panel titles use
PANELS = ("calls/s", "tokens/s", "queue depth", "pass time", "gpu memory", "floor-cache hit rate", "429")
PROMQL_WORDS = frozenset({"and", "or", "unless", "offset", "bool", "inf", "nan"})
GRAFANA_VARIABLES = frozenset({"__rate_interval", "__interval", "__range"})


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: the identifiers left once strings, label matchers, ranges and
    grouping clauses are taken out, other than functions (followed by ``(``) and operators."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", expr):
        if not expr[match.end() :].lstrip().startswith("(") and match[0].lower() not in PROMQL_WORDS:
            names.add(match[0])
    return names


def exported(metrics: Metrics) -> set[str]:
    """The sample names ``metrics`` writes in the text format, whether or not a labelled child exists yet."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created")}
    return {
        family.name + suffix for family in metrics.registry.collect() for suffix in suffixes.get(family.type, ("",))
    }


def scrape_jobs() -> list[dict]:
    return yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(board: dict) -> list[str]:
    """Every PromQL expression: the panels' targets and the templating queries."""
    found = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", variable["definition"]))
    return found


def unknown_metrics(board: dict, names: set[str]) -> set[str]:
    return {name for expr in expressions(board) for name in metric_names(expr)} - names - DCGM_METRICS


def test_metric_names_are_read_from_promql():
    expr = 'sum by (le) (rate(spinf_pass_seconds_bucket{job=~"$job", le!="1e3"}[$__rate_interval])) / 1e3'
    assert metric_names(expr) == {"spinf_pass_seconds_bucket"}
    assert metric_names("histogram_quantile(0.99, x_bucket) and on (pod) up offset 5m") == {"x_bucket", "up"}


def test_the_dashboard_is_valid_json_with_a_panel_for_each_figure():
    board = dashboard()
    assert board["uid"] and board["title"]
    titles = " | ".join(panel["title"].lower() for panel in board["panels"])
    for words in PANELS:
        assert words in titles, words
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["targets"] and all(target["expr"].strip() for target in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"


def test_the_dashboard_uses_only_variables_it_defines():
    board = dashboard()
    defined = {variable["name"] for variable in board["templating"]["list"]} | GRAFANA_VARIABLES
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(board["panels"]) + json.dumps(board["templating"])))
    assert used <= defined, used - defined


def test_the_dashboard_names_only_metrics_the_server_exports():
    names = exported(Metrics())
    assert "spinf_requests_total" in names and "spinf_pass_seconds_bucket" in names
    assert unknown_metrics(dashboard(), names) == set()
    misspelt = {"panels": [{"targets": [{"expr": "rate(spinf_request_total[5m])"}]}], "templating": {"list": []}}
    assert unknown_metrics(misspelt, names) == {"spinf_request_total"}


def test_the_gpu_metrics_come_from_a_job_the_scrape_configuration_has():
    board = dashboard()
    used = {name for expr in expressions(board) for name in metric_names(expr)} & DCGM_METRICS
    assert used, "the GPU memory panel reads dcgm-exporter"
    jobs = {job["job_name"] for job in scrape_jobs()}
    (gpu_job,) = [variable for variable in board["templating"]["list"] if variable["name"] == "gpu_job"]
    assert gpu_job["query"] == DCGM_JOB and DCGM_JOB in jobs


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            raise RuntimeError("promtool is not installed: .ci/run installs it (apt-get install prometheus)")
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    return found


def _with_static_targets(config: dict) -> dict:
    """The configuration with each Kubernetes discovery replaced by one static target (Debian's promtool knows no
    kubernetes_sd_configs); the relabelling stays, so promtool checks it."""
    for job in config["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": ["10.0.0.7:8000"]}]
    return config


def test_promtool_accepts_the_scrape_configuration(tmp_path):
    promtool = _promtool()
    config = yaml.safe_load(PROMETHEUS.read_text())
    pods = [job for job in config["scrape_configs"] if "kubernetes_sd_configs" in job]
    assert [job["kubernetes_sd_configs"] for job in pods] == [[{"role": "pod"}]]
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(_with_static_targets(config)))
    result = subprocess.run([promtool, "check", "config", checked], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(checked.read_text().replace("regex: (.+)", "regex: (.+"))
    assert subprocess.run([promtool, "check", "config", broken], capture_output=True, timeout=60).returncode != 0


def _meta_name(prefix: str, key: str) -> str:
    return prefix + re.sub(r"[^A-Za-z0-9_]", "_", key)


def relabel(labels: dict[str, str], rules: list[dict]) -> dict[str, str] | None:
    """Prometheus's keep and replace relabelling (the two actions the configuration uses); None when dropped."""
    labels = dict(labels)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep" and match is None:
            return None
        if action == "replace" and match is not None:
            replacement = re.sub(r"\$(\d+)", r"\\\1", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(replacement)
    return labels


def test_the_pod_job_scrapes_the_deployments_pods_at_their_metrics_port():
    (pods,) = [job for job in scrape_jobs() if "kubernetes_sd_configs" in job]
    template = yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]
    meta = {"__address__": "10.0.0.7:8000", "__metrics_path__": "/wrong", "__meta_kubernetes_namespace": "ml"}
    meta["__meta_kubernetes_pod_name"] = "spinf-serve-0"
    for key, value in template["metadata"]["labels"].items():
        meta[_meta_name("__meta_kubernetes_pod_label_", key)] = value
    for key, value in template["metadata"]["annotations"].items():
        meta[_meta_name("__meta_kubernetes_pod_annotation_", key)] = value
    target = relabel(meta, pods["relabel_configs"])
    port = template["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert target is not None
    assert target["__address__"] == f"10.0.0.7:{port}" and target["__metrics_path__"] == "/metrics"
    assert target["pod"] == "spinf-serve-0" and target["namespace"] == "ml"
    other = {**meta, _meta_name("__meta_kubernetes_pod_label_", "app.kubernetes.io/name"): "other"}
    assert relabel(other, pods["relabel_configs"]) is None


@pytest.mark.slow
def test_the_dashboard_names_only_metrics_a_running_server_exports(tmp_path):
    server = ServerProcess(tmp_path)
    try:
        assert httpx.post(f"{server.url}/v1/score", json=score_body(), timeout=60).status_code == 200
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        assert server.stop() == 0, server.output()
    names = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    assert unknown_metrics(dashboard(), names) == set()
    assert names <= exported(Metrics())  # the fast test's names are the server's
