"""The compose stack cannot run here (no Docker engine): check that it parses and that every
vqueues command in it is one the CLI accepts."""

from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from vqueues.cli import build_parser
from vqueues.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
VQ_SERVICES = {n: s for n, s in SERVICES.items() if s.get("image", "").startswith("vqueues:")}
ENV_NAMES = {f"VQ_{f.name.upper()}" for f in fields(Settings)}


def test_the_stack_has_three_brokers_the_topic_job_three_nodes_and_the_console():
    assert sorted(n for n in SERVICES if n.startswith("redpanda-")) == \
        ["redpanda-0", "redpanda-1", "redpanda-2"]
    assert sorted(n for n in VQ_SERVICES if n.startswith("node-")) == \
        ["node-0", "node-1", "node-2"]
    assert "topics" in VQ_SERVICES and SERVICES["topics"]["restart"] == "no"
    assert "redpandadata/console" in SERVICES["console"]["image"]


@pytest.mark.parametrize("name", sorted(VQ_SERVICES))
def test_every_vqueues_command_parses_with_the_cli(name):
    command = VQ_SERVICES[name]["command"]
    args = build_parser().parse_args(command)  # exits (SystemExit) on an unknown flag
    assert args.command in ("serve", "topics")
    for key in VQ_SERVICES[name].get("environment", {}):
        assert key in ENV_NAMES, f"{name}: {key} is not a setting"


def test_the_topics_job_creates_topics_with_replication_factor_3():
    args = build_parser().parse_args(VQ_SERVICES["topics"]["command"])
    assert args.replication_factor == 3 and args.partitions == 16


def test_nodes_publish_only_on_loopback_and_advertise_their_published_port():
    for name in ("node-0", "node-1", "node-2"):
        service = VQ_SERVICES[name]
        (port,) = service["ports"]
        host, published, _ = port.split(":")
        assert host == "127.0.0.1"
        args = build_parser().parse_args(service["command"])
        assert args.advertised_url == f"http://127.0.0.1:{published}"


def test_the_optional_pipeline_service_runs_the_pipeline_command():
    service = SERVICES["pipeline"]
    assert service["profiles"] == ["pipeline"]
    args = build_parser().parse_args(service["command"])
    assert args.command == "pipeline" and args.trigger == "1 minute"
    assert (ROOT / service["build"]["dockerfile"]).exists()


def test_the_dockerfile_installs_the_server_and_the_client():
    text = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["vqueues"]' in text and "./clients/python" in text
