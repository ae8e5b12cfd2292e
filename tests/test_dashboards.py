"""The Grafana dashboard and the Prometheus alert rules under deploy/ use only metrics a node
exports, and the compose stack mounts them in its monitoring profile."""

import json
import re
from pathlib import Path

import yaml

from tests.support import http

ROOT = Path(__file__).resolve().parents[1]
METRIC = re.compile(r"\b((?:vq|process)_[a-z0-9_]+)\b")
SUFFIXES = ("_bucket", "_count", "_sum")


def used_metrics() -> set[str]:
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/vqueues.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    names = set()
    for expr in exprs:
        for name in METRIC.findall(expr):
            for suffix in SUFFIXES:
                if name.endswith(suffix):
                    name = name[:-len(suffix)]
            names.add(name)
    return names


def test_every_metric_the_dashboard_and_the_rules_use_is_exported_by_a_node(node):
    status, _ = http("GET", f"{node.url}/healthz")
    assert status == 200
    import urllib.request
    with urllib.request.urlopen(f"{node.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    exported = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            exported.add(name)
            if kind == "counter":
                exported.add(name + "_total")
        elif line and not line.startswith("#"):
            exported.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    used = used_metrics()
    assert len(used) >= 15
    missing = sorted(m for m in used if m not in exported)
    assert missing == [], f"not exported by a node: {missing}"


def test_the_compose_monitoring_profile_mounts_the_rules_and_the_dashboard():
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prom, grafana = services["prometheus"], services["grafana"]
    assert prom["profiles"] == grafana["profiles"] == ["monitoring"]
    for service in (prom, grafana):
        for volume in service["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["node-0:8080", "node-1:8080", "node-2:8080"]
