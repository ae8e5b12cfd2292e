"""The local Kafka cluster's storage tool, run for real: the formatting step every Kafka test
stands on (the whole cluster starts in `conftest.kafka_cluster`)."""

import subprocess

import pytest

from vqueues.kafka.local_cluster import POM, format_arguments
from vqueues.maven import JarsUnavailable, fetch_jars, java


def test_an_id_that_starts_with_a_dash_formats_a_node(tmp_path):
    """One id in 64 starts with "-"; argparse read it as an option and a CI run failed."""
    try:
        binary, libs = java("the storage tool"), fetch_jars(POM)
    except JarsUnavailable as exc:
        pytest.skip(f"needs real Apache Kafka: {exc}")
    config = tmp_path / "server.properties"
    config.write_text("\n".join([
        "node.id=1", "process.roles=broker,controller",
        "controller.quorum.voters=1@127.0.0.1:9999", "controller.listener.names=CONTROLLER",
        "listeners=PLAINTEXT://127.0.0.1:9998,CONTROLLER://127.0.0.1:9999",
        f"log.dirs={tmp_path / 'data'}", ""]))
    cid = "-" + "A" * 21
    done = subprocess.run([binary, "-cp", f"{libs}/*", "kafka.tools.StorageTool",
                           *format_arguments(cid, config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"cluster.id={cid}" in (tmp_path / "data" / "meta.properties").read_text()
